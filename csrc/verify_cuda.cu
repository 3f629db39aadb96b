// CUDA kernel of the fused verify op: from target logits to emitted tokens, bit for bit
// reference/verify.py (the same float32 steps in the same order, exact fixed-point
// normalisers, repro_math.h's exp/log, Philox draws).
//
// Two launches, both in thread-block clusters of C CTAs that split one vocabulary row
// (C = 1..16, chosen from V and the number of rows so that small batches fill the GPU):
//
// 1. Row statistics. Grid: as many clusters as fit at once, each taking output slots (b, i)
//    in turn: draft row i of request b, or its bonus row at i = num_drafts (slots past
//    that are skipped); the next slot's slices are prefetched into L2 meanwhile.
//    Each CTA copies its slice of the row into shared memory (sanitised to float32) while
//    taking the max and argmax; the cluster combines them through distributed shared
//    memory; then, from shared memory alone: the top-k threshold (a 32-step bisection
//    over the float order, only when asked), the weights and their fixed-point sum, the
//    top-p cut (a 31-step bisection over the probabilities' bits, only when asked) and the
//    final normaliser, and p of the slot's draft token. Every row is read from DRAM once.
// 2. Decision and race. Grid: B clusters. Each CTA walks its request's acceptance tests
//    (Philox uniforms against the stored p of the drafts), so every CTA knows the first
//    rejected row (or the bonus row); random requests then race on that one row only, the
//    vocabulary split over the cluster, recomputing p from the stored statistics; rank 0
//    writes the request's output row. Moves one residual row pair per random request.
#include <ATen/ATen.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <cooperative_groups.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <torch/library.h>

#include <algorithm>
#include <cfloat>
#include <cstdint>
#include <cstdlib>
#include <mutex>
#include <string>

#include "check_messages.h"
#include "cluster_launch.cuh"
#include "cluster_reduce.cuh"
#include "philox.h"
#include "repro_math.h"
#include "token_ids.h"
#include "verify.h"
#include "verify_math.cuh"

namespace specops {
namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr int kMaxCluster = 16;
constexpr int kUnroll = 8;  // groups of 4 logits loaded per thread before use
constexpr int kRaceUnroll = 4;  // the same in the race, which holds more state per thread
constexpr int64_t kMaxSliceBytes = 96 * 1024;  // shared-memory slice of a row per CTA

// An element of the race whose score bound could beat the warp's best: evaluated exactly.
struct Candidate {
  int64_t index;
  uint32_t word;  // its Philox word (the Exp(1) draw)
  float z;        // its sanitised logit
};

// ---------------------------------------------------------------------------------------
// Pass 1: row statistics. Grid: persistent clusters of C CTAs x kThreads (as many as fit
// at once), each taking output slots (b, i) in turn; dynamic shared memory: one row slice
// of `slice` floats. Reads each target and bonus row once; while a cluster reduces and
// computes one slot, the next slot's slices are prefetched into L2.

// The logits row of slot (b, i): draft row i of request b, its bonus row at i = count,
// null past it.
template <typename scalar_t>
__device__ const scalar_t* slot_row(const scalar_t* target, const scalar_t* bonus, const int32_t* cu, int64_t slot,
                                    int64_t num_tokens, int64_t vocab, int64_t width) {
  const int64_t b = slot / width, i = slot % width;
  const DraftRange r = draft_range(cu, b, num_tokens, width - 1);
  if (i > r.count) return nullptr;
  return i < r.count ? target + (r.start + i) * vocab : bonus + b * vocab;
}

template <typename scalar_t>
__device__ void row_stats_slot(
    cg::cluster_group& cluster, ClusterReducer<kWarps>& reducer, float* row_slice, const scalar_t* target,
    const scalar_t* bonus, TokenIds draft, const int32_t* cu, const float* temperature, const int32_t* top_k,
    const float* top_p, RowStats* stats, int64_t num_tokens, int64_t vocab, int64_t width, int64_t slice,
    bool greedy_needs_probs, int64_t slot, int64_t next_slot) {
  const int64_t rank = cluster.block_rank();
  const int64_t b = slot / width, i = slot % width;
  const DraftRange r = draft_range(cu, b, num_tokens, width - 1);
  if (i > r.count) return;  // the whole cluster skips the slot together
  const SlotParams sp = slot_params(b, temperature, top_k, top_p);
  const scalar_t* row = i < r.count ? target + (r.start + i) * vocab : bonus + b * vocab;
  const int64_t lo = min(rank * slice, vocab), hi = min(lo + slice, vocab), n = hi - lo;
  const bool vec = reinterpret_cast<uintptr_t>(row) % (4 * sizeof(scalar_t)) == 0;

  Slot best{-INFINITY, 0.f, INT64_MAX};
  // kUnroll independent loads in flight per thread before any is used.
  for (int64_t base = lo + 4 * threadIdx.x; base < hi; base += 4 * kThreads * kUnroll) {
    float x[kUnroll][4];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) load4(row, base + 4 * kThreads * u, hi, vec, x[u]);
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t v = base + 4 * kThreads * u;
      for (int j = 0; j < 4 && v + j < hi; ++j) {
        row_slice[v - lo + j] = x[u][j];
        if (x[u][j] > best.f) best = Slot{x[u][j], 0.f, v + j};
      }
    }
  }
  if (next_slot >= 0) {  // DRAM fetches the next slice while this one is reduced
    const scalar_t* next = slot_row(target, bonus, cu, next_slot, num_tokens, vocab, width);
    if (next != nullptr) {
      const char* bytes = reinterpret_cast<const char*>(next + lo);
      for (int64_t offset = 128 * threadIdx.x; offset < n * int64_t{sizeof(scalar_t)}; offset += 128 * kThreads) {
        asm volatile("prefetch.global.L2 [%0];" ::"l"(bytes + offset));
      }
    }
  }
  const Slot top = reducer.reduce(cluster, best, MaxCombine{});
  const float max_logit = top.f;
  const int64_t argmax = max_logit == -INFINITY ? 0 : top.i;  // all -inf: token 0, like argmax
  const bool drafted = i < r.count;
  const int64_t token = sp.greedy ? argmax : (drafted ? draft[r.start + i] : -1);
  RowStats* out = stats + slot;
  if ((sp.greedy && !greedy_needs_probs) || max_logit == -INFINITY) {
    if (rank == 0 && threadIdx.x == 0) {
      *out = RowStats{max_logit, static_cast<int32_t>(argmax), -INFINITY, 1.f, 0, 1.f,
                      token == 0 ? 1.f : 0.f, 0};  // no finite logit: all mass on token 0
    }
    return;
  }

  float kth = -INFINITY;  // keep z >= the top_k-th largest logit, ties included
  if (sp.top_k > 0 && sp.top_k < vocab) {
    uint32_t key = 0;  // the largest key with count(order_key(z) >= key) >= top_k
    for (int bit = 31; bit >= 0; --bit) {
      const uint32_t candidate = key | (1u << bit);
      int64_t count = 0;
      for (int64_t j = threadIdx.x; j < n; j += kThreads) count += order_key(row_slice[j]) >= candidate;
      if (reducer.sum(cluster, count) >= sp.top_k) key = candidate;
    }
    kth = key_to_float(key);
  }
  int64_t fixed = 0;
  const Temperature temperature_scale(sp.temperature);
#pragma unroll 4
  for (int64_t j = threadIdx.x; j < n; j += kThreads) {
    const float w = row_slice[j] >= kth ? weight(row_slice[j], max_logit, temperature_scale) : 0.f;
    row_slice[j] = w;
    fixed += fixed_point(w, kFixedScale);
  }
  const float z1 = repro::mul(__ll2float_rn(reducer.sum(cluster, fixed)), 1.0f / kFixedScale);
  float z2 = z1;
  uint32_t cut = 0;
  if (sp.top_p < 1.f) {
    // Keep v when the mass strictly above p_v is below top_p: the kept set is {p >= cut},
    // cut the smallest float (as bits) whose strictly-greater mass passes the test.
    int64_t mass = 0;
    for (int64_t j = threadIdx.x; j < n; j += kThreads) mass += fixed_point(repro::div(row_slice[j], z1), kMassScale);
    const int64_t total = reducer.sum(cluster, mass);
    const int64_t threshold = max(int64_t{1}, static_cast<int64_t>(floorf(repro::mul(sp.top_p, kTopPScale))));
    auto passes = [&](uint32_t t) {
      int64_t above = 0;
      for (int64_t j = threadIdx.x; j < n; j += kThreads) {
        const float p = repro::div(row_slice[j], z1);
        if (__float_as_uint(p) > t) above += fixed_point(p, kMassScale);
      }
      return reducer.sum(cluster, above) * (int64_t{1} << 24) < threshold * total;
    };
    if (!passes(0)) {
      uint32_t failing = 0;  // the largest bits that fail
      for (int bit = 30; bit >= 0; --bit) {
        const uint32_t candidate = failing | (1u << bit);
        if (!passes(candidate)) failing = candidate;
      }
      cut = failing + 1;
    }
    if (cut != 0) {
      fixed = 0;
      for (int64_t j = threadIdx.x; j < n; j += kThreads) {
        if (__float_as_uint(repro::div(row_slice[j], z1)) < cut) row_slice[j] = 0.f;
        fixed += fixed_point(row_slice[j], kFixedScale);
      }
      z2 = repro::mul(__ll2float_rn(reducer.sum(cluster, fixed)), 1.0f / kFixedScale);
    }
  }
  if (rank == 0 && threadIdx.x == 0) {
    out->max_logit = max_logit;
    out->argmax = static_cast<int32_t>(argmax);
    out->kth = kth;
    out->z1 = z1;
    out->top_p_cut = cut;
    out->z2 = z2;
  }
  // The CTA whose slice holds the token stores its probability (row_slice holds the final
  // weights; a draft id outside the vocab is never read and rejects in pass 2).
  if (threadIdx.x == 0 && token >= lo && token < hi) out->p_token = repro::div(row_slice[token - lo], z2);
}

template <typename scalar_t>
__global__ void __launch_bounds__(kThreads) verify_row_stats_kernel(
    const scalar_t* __restrict__ target,      // [T, V]
    const scalar_t* __restrict__ bonus,       // [B, V]
    TokenIds draft,                           // [T]
    const int32_t* __restrict__ cu,           // [B]
    const float* __restrict__ temperature,    // [B]
    const int32_t* __restrict__ top_k,        // [B] or null
    const float* __restrict__ top_p,          // [B] or null
    RowStats* __restrict__ stats,             // [B, width]
    int64_t num_slots, int64_t num_tokens, int64_t vocab, int64_t width, int64_t slice, bool greedy_needs_probs) {
  extern __shared__ float row_slice[];  // [slice]: logits, then weights
  __shared__ Slot warp_slots[kWarps], exchange[2], result;
  cg::cluster_group cluster = cg::this_cluster();
  ClusterReducer<kWarps> reducer{warp_slots, exchange, &result, 0};
  const int64_t num_clusters = gridDim.x / cluster.num_blocks();
  for (int64_t slot = blockIdx.x / cluster.num_blocks(); slot < num_slots; slot += num_clusters) {
    __syncthreads();  // every thread is done with the previous slot's slice
    const int64_t next_slot = slot + num_clusters < num_slots ? slot + num_clusters : -1;
    row_stats_slot(cluster, reducer, row_slice, target, bonus, draft, cu, temperature, top_k, top_p, stats,
                   num_tokens, vocab, width, slice, greedy_needs_probs, slot, next_slot);
  }
  cluster.sync();  // peers may still read this CTA's exchange slots
}

// ---------------------------------------------------------------------------------------
// Pass 2: decisions and the race. Grid: B clusters of C CTAs x kThreads. Moves a few
// bytes per draft, plus one logits row (and its draft-probs row) per random request.
template <typename scalar_t>
__global__ void __launch_bounds__(kThreads, 2) verify_decide_kernel(
    const scalar_t* __restrict__ target,      // [T, V]
    const scalar_t* __restrict__ bonus,       // [B, V]
    TokenIds draft,                           // [T]
    const float* __restrict__ draft_probs,    // [T, V] or null (n-gram)
    const int32_t* __restrict__ cu,           // [B]
    const float* __restrict__ temperature,    // [B]
    const int64_t* __restrict__ seeds,        // [B]
    const int64_t* __restrict__ positions,    // [B]
    const RowStats* __restrict__ stats,       // [B, width]
    int32_t* __restrict__ out,                // [B, width]
    int32_t* __restrict__ num_accepted,       // [B]
    float* __restrict__ logprobs,             // [B, width] or null
    int64_t num_tokens, int64_t vocab, int64_t width, int64_t slice) {
  __shared__ Slot warp_slots[kWarps], exchange[2], result;
  __shared__ Candidate candidates[kWarps][64];  // per warp: at most 31 left over + 32 new
  __shared__ int64_t chosen_shared;
  cg::cluster_group cluster = cg::this_cluster();
  const int64_t rank = cluster.block_rank();
  const int64_t b = blockIdx.x / cluster.num_blocks();
  const DraftRange r = draft_range(cu, b, num_tokens, width - 1);
  const float t = temperature[b];
  const bool greedy = t == 0.f;
  const RowStats* row_stats = stats + b * width;
  const int64_t seed = seeds[b], position = positions[b];

  // Every CTA walks the acceptance tests (a few loads per draft) to find the row to race.
  if (threadIdx.x == 0) {
    int64_t i = 0;
    for (; i < r.count; ++i) {
      const int64_t x = draft[r.start + i];
      if (greedy) {
        if (x != row_stats[i].argmax) break;
        continue;
      }
      if (x < 0 || x >= vocab) break;
      const float q = draft_probs != nullptr ? draft_probs[(r.start + i) * vocab + x] : 1.f;
      const float u = uniform_from_word(philox_block(seed, position + i, kPurposeAccept, 0).w[0]);
      if (!accepts(u, q, row_stats[i].p_token)) break;
    }
    chosen_shared = i;
  }
  __syncthreads();
  const int64_t chosen = chosen_shared;  // first rejected row, or r.count for the bonus row
  auto write_row = [&](int64_t last_token, float last_p) {
    int32_t* row_out = out + b * width;
    for (int64_t i = 0; i < width; ++i) {
      int32_t token = -1;
      float lp = 0.f;
      if (i < chosen) {
        token = static_cast<int32_t>(greedy ? row_stats[i].argmax : draft[r.start + i]);
        lp = log_prob(row_stats[i].p_token);
      } else if (i == chosen) {
        token = static_cast<int32_t>(last_token);
        lp = log_prob(last_p);
      }
      row_out[i] = token;
      if (logprobs != nullptr) logprobs[b * width + i] = lp;
    }
    num_accepted[b] = static_cast<int32_t>(chosen);
  };
  if (greedy) {
    if (rank == 0 && threadIdx.x == 0) write_row(row_stats[chosen].argmax, row_stats[chosen].p_token);
    return;
  }

  // The race on the chosen row: argmax_v r_v / E_v, r the residual at a rejection (p - q,
  // or p without the draft for n-gram) and p itself on the bonus row.
  const RowStats st = row_stats[chosen];
  const bool rejected = chosen < r.count;
  const scalar_t* row = rejected ? target + (r.start + chosen) * vocab : bonus + b * vocab;
  const float* q = rejected && draft_probs != nullptr ? draft_probs + (r.start + chosen) * vocab : nullptr;
  const int64_t rejected_token = rejected ? draft[r.start + chosen] : -1;
  const int64_t race_position = position + chosen;
  const int64_t lo = min(rank * slice, vocab), hi = min(lo + slice, vocab);
  const bool vec = reinterpret_cast<uintptr_t>(row) % (4 * sizeof(scalar_t)) == 0;
  const Temperature temperature_scale(t);
  // An upper bound of every score of the row: r <= p = w / z2, w <= a fast exp with
  // margins, E >= v (E = -log(1 - v) >= v). An element whose bound is below the warp's
  // best score so far cannot win (strictly, so ties cannot be lost) and skips the exact p,
  // q and E. The rest queue per warp and are evaluated 32 at a time, one per lane, so the
  // exact path runs dense instead of once per element for a single lane.
  const bool bounded = st.max_logit != -INFINITY;
  const float approx_inverse = bounded ? __frcp_rn(t) : 0.f;
  const float inverse_z2 = __frcp_rn(st.z2);  // z2 >= 1: the argmax keeps weight 1
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  Candidate* queue = candidates[warp];
  int queued = 0;       // warp-uniform
  float warp_best = -INFINITY;  // warp-uniform: the best score any lane has seen
  Slot best{-INFINITY, 0.f, INT64_MAX};
  auto evaluate = [&](int count) {  // the first `count` queued candidates, one per lane
    if (lane < count) {
      const Candidate c = queue[lane];
      const float p = processed_p(c.z, c.index, st, temperature_scale);
      float residual = p;
      if (q != nullptr) {
        residual = repro::sub(p, q[c.index]);
      } else if (rejected && c.index == rejected_token) {
        residual = 0.f;
      }
      best = MaxCombine{}(best, Slot{race_score(residual, repro::exponential(c.word)), p, c.index});
    }
    float m = best.f;
    for (int offset = 16; offset > 0; offset /= 2) m = fmaxf(m, __shfl_xor_sync(0xFFFFFFFFu, m, offset));
    warp_best = m;
  };
  // Tiles are CTA-uniform, so every lane of a warp runs the same iterations (ballots).
  for (int64_t tile = lo; tile < hi; tile += 4 * kThreads * kRaceUnroll) {
    float zs[kRaceUnroll][4];  // kRaceUnroll independent loads in flight per thread before any is used
#pragma unroll
    for (int u = 0; u < kRaceUnroll; ++u) load4(row, tile + 4 * (threadIdx.x + kThreads * u), hi, vec, zs[u]);
#pragma unroll
    for (int u = 0; u < kRaceUnroll; ++u) {
      const int64_t v = tile + 4 * (threadIdx.x + kThreads * u);
      if (tile + 4 * kThreads * u >= hi) break;  // uniform: no lane of this CTA has work left
      const PhiloxWords words = philox_block(seed, race_position, kPurposeSample, static_cast<uint32_t>(v / 4));
      for (int j = 0; j < 4; ++j) {
        bool needed = v + j < hi;
        if (needed && bounded && warp_best > 0.f) {
          const float uniform = __fmul_rn(__fadd_rn(static_cast<float>(words.w[j]), 0.5f), 2.3283064365386963e-10f);
          const float p_bound = (__expf((zs[u][j] - st.max_logit) * approx_inverse) * 1.001f + 1e-30f) * inverse_z2;
          needed = !(p_bound * 1.001f < warp_best * uniform);
        }
        const unsigned mask = __ballot_sync(0xFFFFFFFFu, needed);
        if (needed) queue[queued + __popc(mask & ((1u << lane) - 1))] = Candidate{v + j, words.w[j], zs[u][j]};
        queued += __popc(mask);
        __syncwarp();
        if (queued >= 32) {
          evaluate(32);
          __syncwarp();
          if (lane < queued - 32) queue[lane] = queue[32 + lane];
          queued -= 32;
          __syncwarp();
        }
      }
    }
  }
  evaluate(queued);
  ClusterReducer<kWarps> reducer{warp_slots, exchange, &result, 0};
  const Slot winner = reducer.reduce(cluster, best, MaxCombine{});
  if (rank == 0 && threadIdx.x == 0) write_row(winner.i, winner.g);
  cluster.sync();  // peers may still read this CTA's exchange slots
}

// ---------------------------------------------------------------------------------------
// Launcher.

// Rows per cluster CTA: slices of at most 4096 logits while that takes at most 8 CTAs
// (portable clusters), 16 CTAs when the batch is too small to fill the GPU or the slice
// would not fit in shared memory.
int cluster_size(int64_t vocab, int64_t slots, int num_sms) {
  // Tuning override (bench/NOTES.md): SPECOPS_VERIFY_CLUSTER=1|2|4|8|16 where the slice fits.
  if (const char* forced = std::getenv("SPECOPS_VERIFY_CLUSTER")) {
    const int c = std::atoi(forced);
    if ((c == 1 || c == 2 || c == 4 || c == 8 || c == 16) && (vocab + c - 1) / c * int64_t{4} <= kMaxSliceBytes) {
      return c;
    }
  }
  int c = 1;
  while (c < 8 && (vocab + c - 1) / c > 4096) c *= 2;
  const bool too_big = (vocab + c - 1) / c * int64_t{4} > kMaxSliceBytes;
  const bool too_few = slots * c < num_sms && vocab / 16 >= 4096;
  return (c == 8 && (too_big || too_few)) ? 16 : c;
}

int64_t slice_for(int64_t vocab, int c) {
  const int64_t slice = (vocab + c - 1) / c;
  return (slice + 7) / 8 * 8;  // 8-aligned starts keep every group of 4 in one slice
}

template <typename scalar_t>
void launch_verify(const at::Tensor& target_logits, const at::Tensor& bonus_logits, TokenIds draft,
                   const float* draft_probs, const int32_t* cu, const float* temperature, const int32_t* top_k,
                   const float* top_p, const int64_t* seeds, const int64_t* positions, RowStats* stats,
                   int32_t* out, int32_t* num_accepted, float* logprobs, const VerifySizes& s, int cluster) {
  static std::mutex mutex;
  static uint64_t configured = 0;  // a bit per device: function attributes are per device
  {
    const std::lock_guard<std::mutex> lock(mutex);
    const uint64_t bit = uint64_t{1} << (target_logits.get_device() % 64);
    if (!(configured & bit)) {
      allow_large_clusters(verify_row_stats_kernel<scalar_t>, kMaxSliceBytes);
      allow_large_clusters(verify_decide_kernel<scalar_t>, kMaxSliceBytes);
      configured |= bit;
    }
  }
  const auto stream = c10::cuda::getCurrentCUDAStream();
  const int64_t slice = slice_for(s.vocab, cluster);
  const auto* target = static_cast<const scalar_t*>(target_logits.data_ptr());
  const auto* bonus = static_cast<const scalar_t*>(bonus_logits.data_ptr());
  const int64_t num_slots = s.batch * s.width;
  const size_t smem = slice * sizeof(float);
  const int64_t clusters = std::min<int64_t>(
      num_slots, resident_clusters(verify_row_stats_kernel<scalar_t>, kThreads, cluster, smem, target_logits.get_device()));
  launch_clusters(verify_row_stats_kernel<scalar_t>, clusters, cluster, kThreads, smem, stream, target, bonus, draft, cu,
                  temperature, top_k, top_p, stats, num_slots, s.num_tokens, s.vocab, s.width, slice,
                  logprobs != nullptr);
  launch_clusters(verify_decide_kernel<scalar_t>, s.batch, cluster, kThreads, 0, stream, target, bonus, draft,
                  draft_probs, cu, temperature, seeds, positions, static_cast<const RowStats*>(stats), out,
                  num_accepted, logprobs, s.num_tokens, s.vocab, s.width, slice);
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> verify_cuda(
    const at::Tensor& target_logits, const at::Tensor& bonus_logits, const at::Tensor& draft_token_ids,
    const std::optional<at::Tensor>& draft_probs, const at::Tensor& cu_num_draft_tokens,
    const std::optional<at::Tensor>& temperature_arg, const std::optional<at::Tensor>& top_k,
    const std::optional<at::Tensor>& top_p, const at::Tensor& seeds, const at::Tensor& positions,
    int64_t max_spec_len, bool return_logprobs) {
  const VerifySizes s = check_verify(target_logits, bonus_logits, draft_token_ids, draft_probs,
                                     cu_num_draft_tokens, temperature_arg, top_k, top_p, seeds, positions,
                                     max_spec_len);
  const c10::cuda::CUDAGuard guard(target_logits.device());
  // No temperature: every request greedy (this kernel reads per-request values either way).
  const at::Tensor temperature = temperature_arg.has_value()
                                     ? *temperature_arg
                                     : at::zeros({s.batch}, target_logits.options().dtype(at::kFloat));
  int major = 0, num_sms = 0;
  C10_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, target_logits.get_device()));
  C10_CUDA_CHECK(cudaDeviceGetAttribute(&num_sms, cudaDevAttrMultiProcessorCount, target_logits.get_device()));
  TORCH_CHECK(major >= 9, "the CUDA verify kernel needs thread-block clusters (sm_90 or newer), this GPU is sm_",
              num(major), "x: use backend='triton'");
  const int cluster = cluster_size(s.vocab, s.batch * s.width, num_sms);
  TORCH_CHECK_VALUE(slice_for(s.vocab, cluster) * int64_t{4} <= kMaxSliceBytes,
                    "target_logits vocab must be at most ", num(kMaxSliceBytes / 4 * kMaxCluster),
                    " for the CUDA verify kernel, got ", num(s.vocab), ": use backend='triton'");
  TORCH_CHECK_VALUE(s.batch * s.width * kMaxCluster <= INT32_MAX, "batch * (max_spec_len + 1) is too large, got ",
                    num(s.batch * s.width));
  at::Tensor out = at::empty({s.batch, s.width}, cu_num_draft_tokens.options());
  at::Tensor num_accepted = at::empty({s.batch}, cu_num_draft_tokens.options());
  at::Tensor logprobs = return_logprobs ? at::empty({s.batch, s.width}, temperature.options())
                                        : at::zeros({0, 0}, temperature.options());
  if (s.batch == 0) return {out, num_accepted, logprobs};
  at::Tensor stats = at::empty({s.batch * s.width * static_cast<int64_t>(sizeof(RowStats))},
                               target_logits.options().dtype(at::kByte));
  const TokenIds draft{draft_token_ids.data_ptr(), draft_token_ids.scalar_type() == at::kLong};
  const auto launch = [&](auto tag) {  // the kernels read 16-bit storage as CUDA's own types
    using scalar_t = decltype(tag);
    launch_verify<scalar_t>(
        target_logits, bonus_logits, draft, draft_probs.has_value() ? draft_probs->data_ptr<float>() : nullptr,
        cu_num_draft_tokens.data_ptr<int32_t>(), temperature.data_ptr<float>(),
        top_k.has_value() ? top_k->data_ptr<int32_t>() : nullptr,
        top_p.has_value() ? top_p->data_ptr<float>() : nullptr, seeds.data_ptr<int64_t>(),
        positions.data_ptr<int64_t>(), reinterpret_cast<RowStats*>(stats.data_ptr()), out.data_ptr<int32_t>(),
        num_accepted.data_ptr<int32_t>(), return_logprobs ? logprobs.data_ptr<float>() : nullptr, s, cluster);
  };
  switch (target_logits.scalar_type()) {  // check_verify admits these three
    case at::kHalf: launch(__half{}); break;
    case at::kBFloat16: launch(__nv_bfloat16{}); break;
    default: launch(float{}); break;
  }
  return {out, num_accepted, logprobs};
}

}  // namespace

TORCH_LIBRARY_IMPL(specops, CUDA, m) { m.impl("verify", &verify_cuda); }

}  // namespace specops
