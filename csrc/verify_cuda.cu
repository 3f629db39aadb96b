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
//    final normaliser, and p of the slot's draft token. On draft rows of random requests
//    with draft probs, also the block masses: sum floor(w_v 2^40) over blocks of 256
//    entries of each CTA's slice (from the slice's start, the last one shorter), 8 bytes
//    per block. Every row is read from DRAM once.
// 2. Decision and sampling. Grid: B clusters. Each CTA walks its request's acceptance
//    tests (Philox uniforms against the stored p of the drafts), so every CTA knows the
//    first rejected row (or the bonus row). At a rejection with draft probs, every CTA
//    first tries the 16 residual proposals alike (so all take the same branch): a scan of
//    the row's block masses gives M_W and, by search, the block of each proposal's U;
//    one warp per proposal recomputes that block's masses from the logits, finds x_t by
//    an ordered prefix and tests it against the residual mass at x_t (each passes with
//    probability M_R / M_W, the residual's total). The first accepted one is the token.
//    When none is, and on other rows, random requests sample the row by
//    inversion from integer masses m_v = floor(x_v 2^40), recomputed from the stored
//    statistics: x = w, the processed weights (the normaliser's own terms), on the bonus
//    row and, without the rejected draft, at an n-gram rejection; x = max(w - q z2, 0) at
//    a rejection with draft probs. Each warp of each CTA sums the masses of its part of
//    the CTA's slice; the CTAs exchange their sums through distributed shared memory, so
//    each knows M and the masses below its slice; U = floor(X M / 2^64) (X the 64-bit
//    Philox draw of the position) falls in one warp's part, which its CTA rereads from L2
//    in one ordered scan (C_v <= U < C_v + m_v) to find the token, and writes the
//    request's output row. Moves the chosen row (and its draft-probs row) once per random
//    request, plus an eighth of one CTA's slice again; an accepted proposal moves instead
//    the row's block masses and 16 blocks of 256 logits per CTA.
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
#include <utility>

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
constexpr int kSampleUnroll = 4;  // the same in pass 2's mass sums, which also load draft probs
constexpr int64_t kMaxSliceBytes = 96 * 1024;  // shared-memory slice of a row per CTA
constexpr int64_t kMassBlock = 256;  // entries per block of pass 1's block masses (header, 1)
constexpr int kProposals = 16;       // RESIDUAL_PROPOSALS of reference/verify.py
constexpr unsigned kFullMask = 0xFFFFFFFFu;

// The blocks of block masses: each CTA's slice cut into kMassBlock-entry blocks from its
// start (the last one shorter), so that a block never spans two CTAs whatever the slice.
__host__ __device__ __forceinline__ int64_t blocks_per_slice(int64_t slice) {
  return (slice + kMassBlock - 1) / kMassBlock;
}

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

// The fixed-point masses floor(w 2^40) of the blocks of this CTA's slice [lo, lo + n) of
// a draft row: block k at sums[k], 0 for blocks past the row's end. `weights`: the final
// weights in shared memory, null for a row with no finite logit (w = 1 at token 0 alone).
// One warp per block, its lanes striding through it.
__device__ void store_block_masses(int64_t* sums, const float* weights, int64_t lo, int64_t n, int64_t blocks) {
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
    cg::cluster_group& cluster, ClusterReducer<kWarps>& reducer, float* row_slice, const scalar_t* target,
    const scalar_t* bonus, TokenIds draft, const int32_t* cu, const float* temperature, const int32_t* top_k,
    const float* top_p, RowStats* stats, int64_t* block_masses, int64_t num_tokens, int64_t vocab, int64_t width,
    int64_t slice, bool greedy_needs_probs, int64_t slot, int64_t next_slot) {
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
  // Every thread's final weight is in shared memory: the last cluster sum synchronised.
  if (needs_block_masses) store_masses(row_slice);
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
    int64_t* __restrict__ block_masses,       // [B * width, C * ceil(slice / 256)] or null (n-gram)
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
                   block_masses, num_tokens, vocab, width, slice, greedy_needs_probs, slot, next_slot);
  }
  cluster.sync();  // peers may still read this CTA's exchange slots
}

// ---------------------------------------------------------------------------------------
// Pass 2: decisions and the sampled token. Grid: B clusters of C CTAs x kThreads. Moves a
// few bytes per draft, plus per random request its chosen logits row (and draft-probs row)
// once and, from L2, an eighth of one CTA's slice of them again.

// Inclusive prefix sum over the lanes of a warp.
__device__ __forceinline__ int64_t warp_inclusive_sum(int64_t x) {
  const int lane = threadIdx.x % 32;
  for (int offset = 1; offset < 32; offset *= 2) {
    const int64_t y = __shfl_up_sync(kFullMask, x, offset);
    if (lane >= offset) x += y;
  }
  return x;
}

// The first of lanes [0, count) whose inclusive prefix exceeds `offset`: with non-negative
// masses, the one whose range holds it. The last one otherwise (only for invalid inputs,
// such as NaN draft probs, so that a token is still written); -1 when count is 0.
__device__ __forceinline__ int pick_lane(int64_t inclusive, int64_t offset, int64_t count) {
  const unsigned hits = __ballot_sync(kFullMask, threadIdx.x % 32 < count && inclusive > offset);
  return hits != 0 ? __ffs(hits) - 1 : static_cast<int>(count) - 1;
}

// The length of each of `parts` contiguous parts covering n entries, a multiple of 4 so
// that parts start on groups of 4 (slices start on multiples of 8), and how many of them
// hold entries.
constexpr __host__ __device__ int64_t part_length(int64_t n, int64_t parts) {
  return ((n + parts - 1) / parts + 3) / 4 * 4;
}
__device__ __forceinline__ int64_t parts_used(int64_t n, int64_t length) {
  return n == 0 ? 0 : (n + length - 1) / length;
}

// Groups of 4 per thread when a CTA scans one warp's part of a slice (3).
constexpr int kScanGroups = part_length(part_length(kMaxSliceBytes / 4, kWarps), kThreads) / 4;

// The integer masses of the sampled row (header), recomputed entry by entry from the row's
// statistics: floor(w 2^40) (0 for the rejected draft of an n-gram request) or, at a
// rejection with draft probs, floor(max(w - q z2, 0) 2^40).
template <typename scalar_t>
struct SampledRow {
  const scalar_t* row;  // [V] logits of the chosen row
  bool vec;             // row aligned for one load per group of 4
  const float* q;       // [V] draft probs of the rejected row, null otherwise
  bool q_vec;           // q aligned for one load per group of 4
  int64_t excluded;     // the rejected n-gram draft, -1 otherwise
  RowStats st;
  Temperature temperature;

  __device__ void load(int64_t v, int64_t end, float z[4], float qv[4]) const {
    load4(row, v, end, vec, z);
    if (q != nullptr) {
      load4_probs(q, v, end, q_vec, qv);
    } else {
      for (int j = 0; j < 4; ++j) qv[j] = 0.f;
    }
  }

  __device__ int64_t mass(float z, float qv, int64_t v) const {
    const float w = processed_weight(z, v, st, temperature);
    if (q != nullptr) return fixed_point(residual_weight(w, qv, st.z2), kFixedScale);
    return v == excluded ? 0 : fixed_point(w, kFixedScale);
  }

  // The masses of this lane's groups of 4 in its warp's part (ending at `end`): first
  // (the part's start + 4 lane), first + 128, ..., kSampleUnroll groups loaded before any
  // is used.
  __device__ int64_t lane_sum(int64_t first, int64_t end) const {
    int64_t total = 0;
    for (int64_t base = first; base < end; base += 4 * 32 * kSampleUnroll) {
      float z[kSampleUnroll][4], qv[kSampleUnroll][4];
#pragma unroll
      for (int u = 0; u < kSampleUnroll; ++u) load(base + 4 * 32 * u, end, z[u], qv[u]);
#pragma unroll
      for (int u = 0; u < kSampleUnroll; ++u) {
        for (int j = 0; j < 4; ++j) {
          const int64_t v = base + 4 * 32 * u + j;
          if (v < end) total += mass(z[u][j], qv[u][j], v);
        }
      }
    }
    return total;
  }
};

// The token whose mass holds `offset` within [begin, end) (begin % 4 == 0, at most
// 4 kScanGroups kThreads entries; the offset is below their total), by one ordered scan
// of the CTA: each thread keeps the masses of a contiguous part, the parts' inclusive
// prefixes come from warp shuffles and the warps' totals, and the first thread whose
// prefix exceeds the offset walks its part (the last thread with entries when none does:
// only invalid masses, such as from NaN draft probs, get there, and still give a token).
// Returns the token, and its logit in token_z, in that thread; -1 in the others.
template <typename scalar_t>
__device__ int64_t scan_for_token(const SampledRow<scalar_t>& masses, int64_t begin, int64_t end, int64_t offset,
                                  int64_t* warp_totals, int* first_thread, float* token_z) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t length = part_length(end - begin, kThreads);
  const int64_t first = min(begin + threadIdx.x * length, end), last = min(first + length, end);
  float z[kScanGroups][4], qv[kScanGroups][4];
  int64_t m[kScanGroups][4], sum = 0;
#pragma unroll
  for (int g = 0; g < kScanGroups; ++g) masses.load(first + 4 * g, last, z[g], qv[g]);
#pragma unroll
  for (int g = 0; g < kScanGroups; ++g) {
    for (int j = 0; j < 4; ++j) {
      const int64_t v = first + 4 * g + j;
      m[g][j] = v < last ? masses.mass(z[g][j], qv[g][j], v) : 0;
      sum += m[g][j];
    }
  }
  int64_t inclusive = warp_inclusive_sum(sum);
  if (lane == 31) warp_totals[warp] = inclusive;
  if (threadIdx.x == 0) *first_thread = kThreads;
  __syncthreads();
  for (int w = 0; w < warp; ++w) inclusive += warp_totals[w];
  const unsigned hits = __ballot_sync(kFullMask, first < last && inclusive > offset);
  if (lane == 0 && hits != 0) atomicMin(first_thread, warp * 32 + __ffs(hits) - 1);
  __syncthreads();
  const int64_t owner = *first_thread < kThreads ? *first_thread : parts_used(end - begin, length) - 1;
  if (threadIdx.x != owner) return -1;
  int64_t token = -1, cumulative = inclusive - sum;
#pragma unroll
  for (int g = 0; g < kScanGroups; ++g) {
    for (int j = 0; j < 4; ++j) {
      const int64_t v = first + 4 * g + j;
      if (token < 0 && v < last) {
        cumulative += m[g][j];
        if (cumulative > offset || v == last - 1) {
          token = v;
          *token_z = z[g][j];
        }
      }
    }
  }
  return token;
}

// Shared state of the residual proposals (header, 2).
struct Proposals {
  uint64_t x[kProposals];       // the 64-bit draw that picks proposal t
  uint64_t y[kProposals];       // the 64-bit draw of its acceptance test
  int64_t offset[kProposals];   // U_t - (the normaliser's masses below its block)
  int32_t block[kProposals];    // the block holding U_t
  int32_t token[kProposals];    // proposal t when accepted, -1 otherwise
  float z[kProposals];          // its sanitised logit
  int64_t warp_totals[kWarps];  // the block masses' scan
};

// The first accepted proposal of the residual draw at a rejection with draft probs (the
// reference's propose_residual): proposal t draws x_t by inversion from the normaliser's
// masses W_v = floor(w_v 2^40), with U_t = floor(X_t M_W / 2^64) located first among pass
// 1's block masses, then within its block by an ordered prefix of W recomputed from the
// logits (the same terms pass 1 summed); x_t is accepted when floor(Y_t W_x / 2^64) < R_x,
// R the residual masses. A warp per proposal (kProposals / kWarps each). Every CTA of the
// cluster computes the same answer from the same data, so all take the same branch after
// it. Returns the token in every thread, and its logit in token_z; -1 when none is
// accepted (or M_W = 0).
template <typename scalar_t>
__device__ int64_t propose_residual(const SampledRow<scalar_t>& masses,
                                    const int64_t* block_masses,  // [num_blocks] of the row
                                    int64_t num_blocks, int64_t blocks, int64_t slice, int64_t vocab, int64_t seed,
                                    int64_t position, Proposals& s, float* token_z) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (threadIdx.x < kProposals) {
    const PhiloxWords draw = philox_block(seed, position, kPurposePropose, threadIdx.x);
    s.x[threadIdx.x] = draw.w[0] | (uint64_t{draw.w[1]} << 32);
    s.y[threadIdx.x] = draw.w[2] | (uint64_t{draw.w[3]} << 32);
    s.block[threadIdx.x] = 0;  // stays so only for invalid (negative) masses: in bounds
    s.offset[threadIdx.x] = 0;
  }
  // Each thread takes a contiguous run of blocks (at most 6: V <= 16 slices of 24576).
  const int64_t run = (num_blocks + kThreads - 1) / kThreads;
  const int64_t first = min(threadIdx.x * run, num_blocks), last = min(first + run, num_blocks);
  int64_t sum = 0;
  for (int64_t g = first; g < last; ++g) sum += block_masses[g];
  int64_t inclusive = warp_inclusive_sum(sum);
  if (lane == 31) s.warp_totals[warp] = inclusive;
  __syncthreads();
  int64_t total = 0;
  for (int w = 0; w < kWarps; ++w) {
    if (w < warp) inclusive += s.warp_totals[w];
    total += s.warp_totals[w];
  }
  if (total == 0) return -1;  // no proposal: the same in every thread and CTA
  // The thread whose run holds U_t finds its block: the runs partition [0, M_W).
  for (int t = 0; t < kProposals; ++t) {
    const int64_t u = static_cast<int64_t>(__umul64hi(s.x[t], static_cast<uint64_t>(total)));
    if (u >= inclusive - sum && u < inclusive) {
      int64_t below = inclusive - sum, g = first;
      while (g < last - 1 && u >= below + block_masses[g]) below += block_masses[g++];
      s.block[t] = static_cast<int32_t>(g);
      s.offset[t] = u - below;
    }
  }
  __syncthreads();
  for (int t = warp; t < kProposals; t += kWarps) {
    // Block g is block g % blocks of CTA g / blocks's slice; lane l takes its entries
    // [8 l, 8 l + 8) (blocks start on multiples of 8, so groups of 4 stay aligned).
    const int64_t g = s.block[t], offset = s.offset[t];
    const int64_t slice_lo = min(g / blocks * slice, vocab), slice_hi = min(slice_lo + slice, vocab);
    const int64_t begin = min(slice_lo + g % blocks * kMassBlock, slice_hi), end = min(begin + kMassBlock, slice_hi);
    const int64_t v0 = begin + 8 * lane;
    float z[8], w[8];
    int64_t m[8], lane_mass = 0;
    load4(masses.row, v0, end, masses.vec, z);
    load4(masses.row, v0 + 4, end, masses.vec, z + 4);
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      w[j] = processed_weight(z[j], v0 + j, masses.st, masses.temperature);
      m[j] = v0 + j < end ? fixed_point(w[j], kFixedScale) : 0;
      lane_mass += m[j];
    }
    const int64_t lane_inclusive = warp_inclusive_sum(lane_mass);
    if (lane == pick_lane(lane_inclusive, offset, 32)) {
      // x_t is the entry whose mass holds the offset; none is found (and the proposal is
      // rejected) only if pass 1's block masses and these terms disagree.
      int64_t cumulative = lane_inclusive - lane_mass;
      bool found = false;
      int32_t token = -1;
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        if (!found && v0 + j < end) {
          cumulative += m[j];
          if (cumulative > offset) {
            found = true;
            // Signed comparison, as the reference's: a NaN residual (NaN draft prob)
            // converts to INT64_MIN and rejects.
            const int64_t residual = fixed_point(residual_weight(w[j], masses.q[v0 + j], masses.st.z2), kFixedScale);
            if (static_cast<int64_t>(__umul64hi(s.y[t], static_cast<uint64_t>(m[j]))) < residual) {
              token = static_cast<int32_t>(v0 + j);
              s.z[t] = z[j];
            }
          }
        }
      }
      s.token[t] = token;
    }
  }
  __syncthreads();
  for (int t = 0; t < kProposals; ++t) {
    if (s.token[t] >= 0) {
      *token_z = s.z[t];
      return s.token[t];
    }
  }
  return -1;
}

// Where U falls, as warp 0 of each CTA finds it: the total M, and the warp whose part of
// this CTA's slice holds U (-1 when U lies in another CTA) with U's offset within it.
struct SampleTarget {
  int64_t total;
  int64_t offset;
  int warp;
};

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
    const int64_t* __restrict__ block_masses, // [B * width, C * ceil(slice / 256)] or null (n-gram)
    int32_t* __restrict__ out,                // [B, width]
    int32_t* __restrict__ num_accepted,       // [B]
    float* __restrict__ logprobs,             // [B, width] or null
    int64_t num_tokens, int64_t vocab, int64_t width, int64_t slice) {
  __shared__ int64_t chosen_shared;
  __shared__ int64_t warp_mass[kWarps];
  __shared__ int64_t slice_mass;  // read by the peers
  __shared__ SampleTarget sample;
  __shared__ int64_t scan_totals[kWarps];
  __shared__ int scan_first;
  __shared__ Proposals proposals;
  cg::cluster_group cluster = cg::this_cluster();
  const int64_t rank = cluster.block_rank();
  const int64_t b = blockIdx.x / cluster.num_blocks();
  const DraftRange r = draft_range(cu, b, num_tokens, width - 1);
  const float t = temperature[b];
  const bool greedy = t == 0.f;
  const RowStats* row_stats = stats + b * width;
  const int64_t seed = seeds[b], position = positions[b];

  // Every CTA walks the acceptance tests (a few loads per draft) to find the row to sample.
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

  // The sampled token of the chosen row, by inversion from its integer masses (header). A
  // rejected draft outside the vocab excludes nothing: no index matches it.
  const bool rejected = chosen < r.count;
  const scalar_t* row = rejected ? target + (r.start + chosen) * vocab : bonus + b * vocab;
  const float* q = rejected && draft_probs != nullptr ? draft_probs + (r.start + chosen) * vocab : nullptr;
  const SampledRow<scalar_t> masses{row,
                                    reinterpret_cast<uintptr_t>(row) % (4 * sizeof(scalar_t)) == 0,
                                    q,
                                    reinterpret_cast<uintptr_t>(q) % 16 == 0,
                                    rejected && q == nullptr ? draft[r.start + chosen] : -1,
                                    row_stats[chosen],
                                    Temperature(t)};
  if (q != nullptr) {  // first the proposals, which need no pass over the row
    const int64_t num_blocks = cluster.num_blocks() * blocks_per_slice(slice);
    float token_z;
    const int64_t token = propose_residual(masses, block_masses + (b * width + chosen) * num_blocks, num_blocks,
                                           blocks_per_slice(slice), slice, vocab, seed, position + chosen,
                                           proposals, &token_z);
    if (token >= 0) {  // so in every CTA: none reaches the cluster barriers below
      if (rank == 0 && threadIdx.x == 0) write_row(token, processed_p(token_z, token, masses.st, masses.temperature));
      return;
    }
  }
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t lo = min(rank * slice, vocab), hi = min(lo + slice, vocab);
  // Each warp sums its contiguous part of the slice, its lanes striding through it.
  const int64_t part = part_length(hi - lo, kWarps);
  const int64_t warp_lo = min(lo + warp * part, hi), warp_hi = min(warp_lo + part, hi);
  const int64_t warp_total = warp_inclusive_sum(masses.lane_sum(warp_lo + 4 * lane, warp_hi));
  if (lane == 31) warp_mass[warp] = warp_total;
  __syncthreads();
  if (threadIdx.x == 0) {
    int64_t sum = 0;
    for (int w = 0; w < kWarps; ++w) sum += warp_mass[w];
    slice_mass = sum;
  }
  cluster.sync();
  if (warp == 0) {
    // Lane c holds CTA c's masses, then warp c's: U = floor(X M / 2^64) from the position's
    // 64-bit draw, and the first CTA, then warp, whose inclusive prefix exceeds it.
    const int64_t used_ctas = parts_used(vocab, slice);
    const int64_t cta_mass = lane < used_ctas ? *cluster.map_shared_rank(&slice_mass, lane) : 0;
    const int64_t cta_inclusive = warp_inclusive_sum(cta_mass);
    const int64_t total = __shfl_sync(kFullMask, cta_inclusive, 31);
    const PhiloxWords draw = philox_block(seed, position + chosen, kPurposeSample, 0);
    const uint64_t x = draw.w[0] | (uint64_t{draw.w[1]} << 32);
    const int64_t u = static_cast<int64_t>(__umul64hi(x, static_cast<uint64_t>(total)));
    const bool owner = pick_lane(cta_inclusive, u, used_ctas) == rank;
    const int64_t cta_offset = u - __shfl_sync(kFullMask, cta_inclusive - cta_mass, static_cast<int>(rank));
    const int64_t mass = lane < kWarps ? warp_mass[lane] : 0;
    const int64_t inclusive = warp_inclusive_sum(mass);
    const int owner_warp = pick_lane(inclusive, cta_offset, parts_used(hi - lo, part));
    const int64_t offset = cta_offset - __shfl_sync(kFullMask, inclusive - mass, owner_warp);
    if (lane == 0) sample = SampleTarget{total, offset, total != 0 && owner ? owner_warp : -1};
  }
  __syncthreads();
  // Done with the peers' shared memory; a CTA leaves only once every peer is done with its
  // own (the wait below), but need not wait for the scan meanwhile.
  auto arrival = cluster.barrier_arrive();
  if (sample.total == 0) {  // no mass at all: token 0, like the reference
    if (rank == 0 && threadIdx.x == 0) {
      write_row(0, processed_p(sanitise(to_float(row[0])), 0, masses.st, masses.temperature));
    }
  } else if (sample.warp >= 0) {  // U is in this CTA: it scans the part of the warp that holds U
    const int64_t begin = min(lo + sample.warp * part, hi), end = min(begin + part, hi);
    float token_z;
    const int64_t token = scan_for_token(masses, begin, end, sample.offset, scan_totals, &scan_first, &token_z);
    if (token >= 0) write_row(token, processed_p(token_z, token, masses.st, masses.temperature));
  }
  cluster.barrier_wait(std::move(arrival));
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
                   int64_t* block_masses, int32_t* out, int32_t* num_accepted, float* logprobs, const VerifySizes& s,
                   int cluster) {
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
                  temperature, top_k, top_p, stats, block_masses, num_slots, s.num_tokens, s.vocab, s.width, slice,
                  logprobs != nullptr);
  launch_clusters(verify_decide_kernel<scalar_t>, s.batch, cluster, kThreads, 0, stream, target, bonus, draft,
                  draft_probs, cu, temperature, seeds, positions, static_cast<const RowStats*>(stats),
                  static_cast<const int64_t*>(block_masses), out, num_accepted, logprobs, s.num_tokens, s.vocab,
                  s.width, slice);
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
  // Pass 1's block masses of every draft slot of a random request, for the residual
  // proposals (with draft probs only); pass 1 writes every entry pass 2 may read.
  const int64_t mass_blocks = cluster * blocks_per_slice(slice_for(s.vocab, cluster));
  at::Tensor block_masses = at::empty({draft_probs.has_value() ? s.batch * s.width : 0, mass_blocks},
                                      target_logits.options().dtype(at::kLong));
  const TokenIds draft{draft_token_ids.data_ptr(), draft_token_ids.scalar_type() == at::kLong};
  const auto launch = [&](auto tag) {  // the kernels read 16-bit storage as CUDA's own types
    using scalar_t = decltype(tag);
    launch_verify<scalar_t>(
        target_logits, bonus_logits, draft, draft_probs.has_value() ? draft_probs->data_ptr<float>() : nullptr,
        cu_num_draft_tokens.data_ptr<int32_t>(), temperature.data_ptr<float>(),
        top_k.has_value() ? top_k->data_ptr<int32_t>() : nullptr,
        top_p.has_value() ? top_p->data_ptr<float>() : nullptr, seeds.data_ptr<int64_t>(),
        positions.data_ptr<int64_t>(), reinterpret_cast<RowStats*>(stats.data_ptr()),
        draft_probs.has_value() ? block_masses.data_ptr<int64_t>() : nullptr, out.data_ptr<int32_t>(),
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
