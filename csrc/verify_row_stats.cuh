// Pass 1 of the CUDA verify kernel (verify_cuda.cu): the statistics of one output slot's
// row, computed by a cluster of CTAs from its slices in shared memory.
#pragma once
#include <cstdint>

#include "cluster_radix.cuh"
#include "cluster_reduce.cuh"
#include "repro_math.h"
#include "token_ids.h"
#include "verify.h"
#include "verify_cuda_common.cuh"
#include "verify_math.cuh"

namespace specops {
namespace verify_device {

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

// The fixed-point masses floor(w 2^40) of the blocks of this CTA's slice [lo, lo + n) of
// a draft row: block k at sums[k], 0 for blocks past the row's end. `weights`: the final
// weights in shared memory, null for a row with no finite logit (w = 1 at token 0 alone).
// One warp per block, its lanes striding through it.
__device__ inline void store_block_masses(int64_t* sums, const float* weights, int64_t lo, int64_t n, int64_t blocks) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  for (int64_t k = warp; k < blocks; k += kWarps) {
    const int64_t end = min((k + 1) * kMassBlock, n);
    int64_t sum = 0;
    for (int64_t j = k * kMassBlock + lane; j < end; j += 32) {
      sum += fixed_point(weights != nullptr ? weights[j] : (lo + j == 0 ? 1.f : 0.f), kFixedScale);
    }
    for (int offset = 16; offset > 0; offset /= 2) sum += __shfl_xor_sync(kFullMask, sum, offset);
    if (lane == 0) sums[k] = sum;
  }
}

template <typename scalar_t>
__device__ void row_stats_slot(
    cg::cluster_group& cluster, ClusterReducer<kWarps>& reducer, ClusterRadix<kThreads>& radix, float* row_slice,
    const scalar_t* target, const scalar_t* bonus, TokenIds draft, const int32_t* cu, const float* temperature,
    const int32_t* top_k, const float* top_p, RowStats* stats, int64_t* block_masses, int64_t num_tokens,
    int64_t vocab, int64_t width, int64_t slice, bool greedy_needs_probs, int64_t slot, int64_t next_slot) {
  const int64_t rank = cluster.block_rank();
  const int64_t b = slot / width, i = slot % width;
  const DraftRange r = draft_range(cu, b, num_tokens, width - 1);
  if (i > r.count) return;  // the whole cluster skips the slot together
  const SlotParams sp = slot_params(b, temperature, top_k, top_p);
  const scalar_t* row = i < r.count ? target + (r.start + i) * vocab : bonus + b * vocab;
  const int64_t lo = min(rank * slice, vocab), hi = min(lo + slice, vocab), n = hi - lo;
  const bool vec = reinterpret_cast<uintptr_t>(row) % (4 * sizeof(scalar_t)) == 0;

  Slot best{-INFINITY, INT64_MAX};
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
        if (x[u][j] > best.f) best = Slot{x[u][j], v + j};
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
  // A draft row of a random request may be rejected with draft probs: pass 2's proposals
  // then need the block masses of its weights.
  // Keyed by slot, not token row: slots are unique even when cu_num_draft_tokens is not.
  const bool needs_block_masses = block_masses != nullptr && drafted && !sp.greedy;
  auto store_masses = [&](const float* weights) {
    const int64_t blocks = blocks_per_slice(slice);
    store_block_masses(block_masses + (slot * cluster.num_blocks() + rank) * blocks, weights, lo, n, blocks);
  };
  if ((sp.greedy && !greedy_needs_probs) || max_logit == -INFINITY) {
    if (rank == 0 && threadIdx.x == 0) {
      *out = RowStats{max_logit, static_cast<int32_t>(argmax), -INFINITY, 1.f, 0, 1.f,
                      token == 0 ? 1.f : 0.f, 0};  // no finite logit: all mass on token 0
    }
    if (needs_block_masses) store_masses(nullptr);
    return;
  }

  float kth = -INFINITY;  // keep z >= the top_k-th largest logit, ties included
  if (sp.top_k > 0 && sp.top_k < vocab) {
    // The largest key with count(order_key(z) >= key) >= top_k: the top_k-th largest key.
    const RadixPick pick = radix.template select<true>(
        cluster, n, [&](int64_t j, uint32_t& key, int64_t& weight) { key = order_key(row_slice[j]); weight = 1; },
        [&](int64_t count, int64_t) { return count >= sp.top_k; });
    kth = key_to_float(pick.key);
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
    // As a radix selection: keys p's bits, weights its fixed-point mass; the cut is the key
    // at which the mass from the top first reaches top_p of the total (none: no cut).
    const int64_t threshold = max(int64_t{1}, static_cast<int64_t>(floorf(repro::mul(sp.top_p, kTopPScale))));
    const RadixPick pick = radix.template select<false>(
        cluster, n,
        [&](int64_t j, uint32_t& key, int64_t& weight) {
          const float p = repro::div(row_slice[j], z1);
          key = __float_as_uint(p);
          weight = fixed_point(p, kMassScale);
        },
        [&](int64_t above, int64_t total) { return above * (int64_t{1} << 24) >= threshold * total; });
    if (pick.found) cut = pick.key;
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
  // Every thread's final weight is in shared memory: the last cluster sum synchronised.
  if (needs_block_masses) store_masses(row_slice);
}

}  // namespace verify_device
}  // namespace specops
