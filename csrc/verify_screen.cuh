// The screened path of the CUDA verify kernel (verify_cuda.cu), for calls without top-k,
// top-p or log-probabilities: pass 1 streams every row once for its max, first argmax and
// an approximate normaliser (hardware exp2), split across CTAs; pass 2 settles most
// acceptance tests from those and computes the exact statistics (screened_row_stats below,
// the integers of verify_row_stats.cuh) of the one row each request samples, inside its
// cluster, instead of every row's.
//
// Why it stays exact: p(x) = w(x) / z2 with z2 the exact fixed-point sum (z2 >= 1: the
// max's weight is exactly 1). The approximate sum differs from it by less than 1e-4,
// relative: the exp arguments by a few float32 roundings of values <= 64 in magnitude
// (terms further down weigh < 2^-64 each), each ex2.approx by <= 2 ulp, the online
// rescales of a thread's sum by one such factor per new maximum, the fixed-point
// truncation by <= V 2^-40, the float32 sums by (entries per thread + 10) ulp. A test is
// settled only when u q(x) lies outside p'(x) (1 +- 2^-9), p' = w(x) / approximate sum:
// 20x that bound, so the exact test gives the same answer. Any other test (and a row with
// no finite logit) is decided from the exact statistics.
#pragma once
#include <cstdint>

#include "cluster_reduce.cuh"
#include "philox.h"
#include "repro_math.h"
#include "token_ids.h"
#include "verify_cuda_common.cuh"
#include "verify_math.cuh"

namespace specops {
namespace verify_device {

constexpr float kScreenMargin = 0.001953125f;  // 2^-9: the band around p'(x) left to the exact test
constexpr int kMaxScreenSteps = 64;            // steps per request the screened pass 2 holds (width)

__device__ __forceinline__ float fast_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

// Pass 1 of the screened path. Grid (slots, splits) of kThreads: CTA (slot, s) reads
// entries [s split_len, (s + 1) split_len) of the slot's row once and stores their max,
// its first index and sum_v 2^((z_v - max) log2(e) / T) (no sum on greedy rows). A
// programmatic dependent launch may start pass 2 at once: it waits for this grid.
template <typename scalar_t>
__global__ void __launch_bounds__(kThreads) verify_row_partials_kernel(
    const scalar_t* __restrict__ target,  // [T, V]
    const scalar_t* __restrict__ bonus,   // [B, V]
    const int32_t* __restrict__ cu,       // [B]
    const float* __restrict__ temperature,  // [B]
    float* __restrict__ part_max,         // [slots, splits]
    int64_t* __restrict__ part_arg,       // [slots, splits]
    float* __restrict__ part_approx,      // [slots, splits]
    int64_t num_tokens, int64_t vocab, int64_t width, int64_t split_len) {
  asm volatile("griddepcontrol.launch_dependents;");
  __shared__ Slot warp_best[kWarps];
  __shared__ float warp_sum[kWarps];
  const int64_t slot = blockIdx.x, split = blockIdx.y;
  const int64_t b = slot / width, i = slot % width;
  const DraftRange r = draft_range(cu, b, num_tokens, width - 1);
  if (i > r.count) return;
  const scalar_t* row = i < r.count ? target + (r.start + i) * vocab : bonus + b * vocab;
  const float t = temperature[b];
  const float scale = t == 0.f ? 0.f : repro::kLog2e / t;  // log2(e) / T; greedy: no sum
  const int64_t lo = min(split * split_len, vocab), hi = min(lo + split_len, vocab);
  const bool vec = reinterpret_cast<uintptr_t>(row) % (4 * sizeof(scalar_t)) == 0;
  // Per thread: the max with strict > over entries in increasing order (its first index),
  // and the sum relative to it, rescaled when the max grows.
  float best = -INFINITY, approx = 0.f;
  int64_t best_index = INT64_MAX;
  for (int64_t base = lo + 4 * threadIdx.x; base < hi; base += 4 * kThreads * kUnroll) {
    float x[kUnroll][4];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) load4(row, base + 4 * kThreads * u, hi, vec, x[u]);
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const float z = x[u][j];  // sanitised; -inf past the split
        if (z > best) {
          if (scale != 0.f) approx = (best == -INFINITY ? 0.f : approx * fast_exp2((best - z) * scale)) + 1.f;
          best = z;
          best_index = base + 4 * kThreads * u + j;
        } else if (scale != 0.f && z != -INFINITY) {
          approx += fast_exp2((z - best) * scale);
        }
      }
    }
  }
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  Slot top = warp_reduce(Slot{best, best_index}, MaxCombine{});
  if (lane == 0) warp_best[warp] = top;
  __syncthreads();
  top = warp_reduce(lane < kWarps ? warp_best[lane] : MaxCombine::identity(), MaxCombine{});
  top = Slot{__shfl_sync(kFullMask, top.f, 0), __shfl_sync(kFullMask, top.i, 0)};
  const float split_max = top.f;
  float sum = best == -INFINITY ? 0.f : approx * fast_exp2((best - split_max) * scale);
  for (int offset = 16; offset > 0; offset /= 2) sum += __shfl_xor_sync(kFullMask, sum, offset);
  if (lane == 0) warp_sum[warp] = sum;
  __syncthreads();
  if (threadIdx.x == 0) {
    float total = 0.f;
    for (int w = 0; w < kWarps; ++w) total += warp_sum[w];
    const int64_t out = slot * gridDim.y + split;
    part_max[out] = split_max;
    part_arg[out] = top.i;
    part_approx[out] = scale != 0.f ? total : 0.f;
  }
}

// One step's statistics from pass 1's partials: the max, its first index (0 when no logit
// is finite, like argmax) and the approximate normaliser.
struct StepStats {
  float max_logit;
  int64_t argmax;
  float approx;
};

// Combines the partials of `slot` across its splits: one warp, its lanes striding through
// the splits. Every lane returns the result.
__device__ inline StepStats combine_partials(const float* part_max, const int64_t* part_arg, const float* part_approx,
                                             int64_t slot, int64_t splits, float scale) {
  const int lane = threadIdx.x % 32;
  Slot top = MaxCombine::identity();
  for (int64_t s = lane; s < splits; s += 32) top = MaxCombine{}(top, Slot{part_max[slot * splits + s], part_arg[slot * splits + s]});
  top = warp_reduce(top, MaxCombine{});
  const float best = __shfl_sync(kFullMask, top.f, 0);
  const int64_t argmax = __shfl_sync(kFullMask, top.i, 0);
  float sum = 0.f;
  for (int64_t s = lane; s < splits; s += 32) {
    const float m = part_max[slot * splits + s];
    if (m != -INFINITY) sum += part_approx[slot * splits + s] * fast_exp2((m - best) * scale);
  }
  for (int offset = 16; offset > 0; offset /= 2) sum += __shfl_xor_sync(kFullMask, sum, offset);
  return StepStats{best, best == -INFINITY ? 0 : argmax, sum};
}

// The screen's verdict on one acceptance test: settled (accepted or rejected) from the
// approximate normaliser, or left to the exact statistics.
enum class Verdict { kAccept, kReject, kUnsettled };

__device__ __forceinline__ Verdict screen_test(float scaled, float q, bool in_vocab, float z_x, const StepStats& st,
                                               float temperature) {
  if (!in_vocab || !(q > 0.f)) return Verdict::kReject;  // the exact test rejects these too
  const bool trusted = st.max_logit != -INFINITY && st.approx >= 1.f - kScreenMargin && st.approx < INFINITY;
  if (!trusted) return Verdict::kUnsettled;
  const float p = __fdiv_rn(weight(z_x, st.max_logit, Temperature(temperature)), st.approx);
  if (scaled < p * (1.f - kScreenMargin)) return Verdict::kAccept;
  if (scaled >= p * (1.f + kScreenMargin)) return Verdict::kReject;
  return Verdict::kUnsettled;
}

// The exact statistics of the row a screened request stops at (no top-k or top-p), by
// its cluster in pass 2, from the row's max and first argmax (pass 1's partials: a max
// does not round): each CTA streams its slice [lo, hi) once from global memory, with no
// shared-memory copy and no max reduction. A warp takes whole blocks of kMassBlock
// entries (two groups of 4 a lane, kScreenBlocksInFlight blocks loaded before any is
// summed), so each block's fixed-point mass is one warp sum, stored when `block_masses`
// (this CTA's blocks_per_slice entries, those past the row's end 0) is given; then one
// cluster sum gives z1 = z2, and the CTA that holds `token` stores its p. The same
// integers and floats as row_stats_slot (verify_row_stats.cuh) without its filters.
constexpr int kScreenBlocksInFlight = 4;

template <typename scalar_t>
__device__ void screened_row_stats(cg::cluster_group& cluster, ClusterReducer<kWarps>& reducer, const scalar_t* row,
                                   float max_logit, int64_t argmax, float temperature, int64_t token, RowStats* out,
                                   int64_t* block_masses, int64_t lo, int64_t hi, int64_t blocks) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const bool first_thread = cluster.block_rank() == 0 && threadIdx.x == 0;
  if (max_logit == -INFINITY) {  // no finite logit: all mass on token 0
    if (first_thread) *out = RowStats{max_logit, 0, -INFINITY, 1.f, 0, 1.f, token == 0 ? 1.f : 0.f, 0};
    for (int64_t k = threadIdx.x; block_masses != nullptr && k < blocks; k += kThreads) {
      block_masses[k] = lo == 0 && k == 0 ? fixed_point(1.f, kFixedScale) : 0;
    }
    return;
  }
  const Temperature scale(temperature);
  const bool vec = reinterpret_cast<uintptr_t>(row) % (4 * sizeof(scalar_t)) == 0;
  int64_t fixed = 0;
  for (int64_t first = warp; first < blocks; first += kWarps * kScreenBlocksInFlight) {
    float x[kScreenBlocksInFlight][2][4];
#pragma unroll
    for (int u = 0; u < kScreenBlocksInFlight; ++u) {
      const int64_t v = lo + (first + u * kWarps) * kMassBlock + 4 * lane;
      load4(row, v, hi, vec, x[u][0]);
      load4(row, v + kMassBlock / 2, hi, vec, x[u][1]);
    }
#pragma unroll
    for (int u = 0; u < kScreenBlocksInFlight; ++u) {
      int64_t mass = 0;
#pragma unroll
      for (int h = 0; h < 2; ++h) {
#pragma unroll
        for (int j = 0; j < 4; ++j) mass += fixed_point(weight(x[u][h][j], max_logit, scale), kFixedScale);
      }
      fixed += mass;
      if (block_masses != nullptr) {
        for (int offset = 16; offset > 0; offset /= 2) mass += __shfl_xor_sync(kFullMask, mass, offset);
        const int64_t k = first + u * kWarps;
        if (lane == 0 && k < blocks) block_masses[k] = mass;
      }
    }
  }
  const float z = repro::mul(__ll2float_rn(reducer.sum(cluster, fixed)), 1.0f / kFixedScale);
  if (first_thread) {
    out->max_logit = max_logit;
    out->argmax = static_cast<int32_t>(argmax);
    out->kth = -INFINITY;
    out->z1 = z;
    out->top_p_cut = 0;
    out->z2 = z;
  }
  if (threadIdx.x == 0 && token >= lo && token < hi) {
    out->p_token = repro::div(weight(sanitise(to_float(row[token])), max_logit, scale), z);
  }
}

// A RowStats written in this launch by another CTA of the cluster: read from L2 (.cg), past
// an L1 line that an earlier read of a neighbouring slot may hold.
__device__ __forceinline__ RowStats load_stats_cg(const RowStats* p) {
  static_assert(sizeof(RowStats) == 32, "two 16-byte loads");
  const int4 a = __ldcg(reinterpret_cast<const int4*>(p));
  const int4 c = __ldcg(reinterpret_cast<const int4*>(p) + 1);
  RowStats st;
  int4* words = reinterpret_cast<int4*>(&st);
  words[0] = a;
  words[1] = c;
  return st;
}

}  // namespace verify_device
}  // namespace specops
