// Pass 2 of the CUDA verify kernel (verify_cuda.cu): the sampled token of a row, by
// inversion from integer masses (scan_for_token over a slice, or draw_from_blocks from the
// row's block masses on the screened path) or by the residual proposals
// (propose_residual), and the warp-level scans they share.
#pragma once
#include <cstdint>

#include "cluster_reduce.cuh"
#include "philox.h"
#include "repro_math.h"
#include "token_ids.h"
#include "verify.h"
#include "verify_cuda_common.cuh"
#include "verify_math.cuh"

namespace specops {
namespace verify_device {

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

// The block masses of a sampled row as the draws from them scan it: thread t takes the
// contiguous run [first, last) of blocks (at most 6: V <= 16 slices of 24576), whose
// masses sum to `sum`; `inclusive` is the prefix through its run and `total` the row's.
// Block `minus_block` counts `minus` less (an excluded entry's term). The masses were
// written in this launch: read from L2.
struct BlockRuns {
  const int64_t* masses;  // [num_blocks]
  int64_t minus_block, minus;
  int64_t first, last, sum, inclusive, total;

  __device__ int64_t mass(int64_t g) const { return __ldcg(masses + g) - (g == minus_block ? minus : 0); }

  // Whether this thread's run holds u (0 <= u < total); if so, the block that does and
  // u's offset within it.
  __device__ bool locate(int64_t u, int64_t* block, int64_t* offset) const {
    if (u < inclusive - sum || u >= inclusive) return false;
    int64_t below = inclusive - sum, g = first;
    while (g < last - 1 && u >= below + mass(g)) below += mass(g++);
    *block = g;
    *offset = u - below;
    return true;
  }
};

__device__ inline BlockRuns scan_block_runs(const int64_t* block_masses, int64_t num_blocks, int64_t minus_block,
                                            int64_t minus, int64_t* warp_totals) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t run = (num_blocks + kThreads - 1) / kThreads;
  BlockRuns r{block_masses, minus_block, minus};
  r.first = min(threadIdx.x * run, num_blocks);
  r.last = min(r.first + run, num_blocks);
  r.sum = 0;
  for (int64_t g = r.first; g < r.last; ++g) r.sum += r.mass(g);
  r.inclusive = warp_inclusive_sum(r.sum);
  if (lane == 31) warp_totals[warp] = r.inclusive;
  __syncthreads();
  r.total = 0;
  for (int w = 0; w < kWarps; ++w) {
    if (w < warp) r.inclusive += warp_totals[w];
    r.total += warp_totals[w];
  }
  return r;
}

// Entries [begin, end) of block g of a row cut into slices of `slice` (block g is block
// g % blocks of CTA g / blocks's slice).
struct BlockRange {
  int64_t begin, end;
};
__device__ __forceinline__ BlockRange block_range(int64_t g, int64_t blocks, int64_t slice, int64_t vocab) {
  const int64_t slice_lo = min(g / blocks * slice, vocab), slice_hi = min(slice_lo + slice, vocab);
  const int64_t begin = min(slice_lo + g % blocks * kMassBlock, slice_hi);
  return BlockRange{begin, min(begin + kMassBlock, slice_hi)};
}

// Within one lane's 8 consecutive entries from v0 (those below `end`) of masses m: the
// index of the entry whose mass holds `offset`, given the masses `below` the lane's
// first; -1 if none does.
__device__ __forceinline__ int entry_holding(const int64_t (&m)[8], int64_t v0, int64_t end, int64_t below,
                                             int64_t offset) {
  int hit = -1;
#pragma unroll
  for (int j = 0; j < 8; ++j) {
    if (hit < 0 && v0 + j < end) {
      below += m[j];
      if (below > offset) hit = j;
    }
  }
  return hit;
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
  const BlockRuns runs = scan_block_runs(block_masses, num_blocks, -1, 0, s.warp_totals);
  if (runs.total == 0) return -1;  // no proposal: the same in every thread and CTA
  // The thread whose run holds U_t finds its block: the runs partition [0, M_W).
  for (int t = 0; t < kProposals; ++t) {
    const int64_t u = static_cast<int64_t>(__umul64hi(s.x[t], static_cast<uint64_t>(runs.total)));
    int64_t g, offset;
    if (runs.locate(u, &g, &offset)) {
      s.block[t] = static_cast<int32_t>(g);
      s.offset[t] = offset;
    }
  }
  __syncthreads();
  for (int t = warp; t < kProposals; t += kWarps) {
    // Lane l takes entries [8 l, 8 l + 8) of the block (blocks start on multiples of 8, so
    // groups of 4 stay aligned).
    const int64_t offset = s.offset[t];
    const BlockRange range = block_range(s.block[t], blocks, slice, vocab);
    const int64_t end = range.end, v0 = range.begin + 8 * lane;
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
      const int hit = entry_holding(m, v0, end, lane_inclusive - lane_mass, offset);
      int32_t token = -1;
#pragma unroll
      for (int j = 0; j < 8; ++j) {  // unrolled: the arrays stay in registers
        if (j == hit) {
          // Signed comparison, as the reference's: a NaN residual (NaN draft prob)
          // converts to INT64_MIN and rejects.
          const int64_t residual = fixed_point(residual_weight(w[j], masses.q[v0 + j], masses.st.z2), kFixedScale);
          if (static_cast<int64_t>(__umul64hi(s.y[t], static_cast<uint64_t>(m[j]))) < residual) {
            token = static_cast<int32_t>(v0 + j);
            s.z[t] = z[j];
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

// The screened path's token of a bonus row or an n-gram rejection (no draft probs): the
// inversion of the whole-row scan below (U = floor(X M / 2^64), X the position's sample
// draw, M the row's masses less the excluded draft's term), with U located among the
// row's block masses (screened_row_stats stored them, the same terms) and then inside its
// block by warp 0, a lane per 8 entries: the same token, from one block of the row. Every
// thread of the CTA calls it; the token returns in thread 0 (0 when M = 0, as in the
// whole-row draw), its logit in token_z. `at`: two int64 of shared memory.
template <typename scalar_t>
__device__ int64_t draw_from_blocks(const SampledRow<scalar_t>& masses, const int64_t* block_masses,
                                    int64_t num_blocks, int64_t blocks, int64_t slice, int64_t vocab, uint64_t x,
                                    int64_t* warp_totals, int64_t* at, float* token_z) {
  int64_t minus_block = -1, minus = 0;
  if (masses.excluded >= 0 && masses.excluded < vocab) {
    const int64_t v = masses.excluded, c = v / slice;
    minus_block = c * blocks + (v - c * slice) / kMassBlock;
    const float w = processed_weight(sanitise(to_float(masses.row[v])), v, masses.st, masses.temperature);
    minus = fixed_point(w, kFixedScale);
  }
  if (threadIdx.x == 0) at[0] = at[1] = 0;  // ordered before the owner's writes by the scan's barrier
  const BlockRuns runs = scan_block_runs(block_masses, num_blocks, minus_block, minus, warp_totals);
  if (runs.total == 0) {
    *token_z = sanitise(to_float(masses.row[0]));
    return 0;
  }
  runs.locate(static_cast<int64_t>(__umul64hi(x, static_cast<uint64_t>(runs.total))), &at[0], &at[1]);
  __syncthreads();
  if (threadIdx.x >= 32) return -1;
  const int lane = threadIdx.x;
  const int64_t offset = at[1];
  const BlockRange range = block_range(at[0], blocks, slice, vocab);
  const int64_t end = range.end, v0 = range.begin + 8 * lane;
  float z[8];
  int64_t m[8], lane_mass = 0;
  load4(masses.row, v0, end, masses.vec, z);
  load4(masses.row, v0 + 4, end, masses.vec, z + 4);
#pragma unroll
  for (int j = 0; j < 8; ++j) {
    m[j] = v0 + j < end ? masses.mass(z[j], 0.f, v0 + j) : 0;
    lane_mass += m[j];
  }
  const int64_t lane_inclusive = warp_inclusive_sum(lane_mass);
  const int owner = pick_lane(lane_inclusive, offset, 32);
  // The entry whose mass holds the offset; the block's last entry only if the stored
  // masses and these terms disagree (never with valid inputs).
  const int entry = entry_holding(m, v0, end, lane_inclusive - lane_mass, offset);
  int64_t token = end - 1;
  float token_logit = 0.f;
#pragma unroll
  for (int j = 0; j < 8; ++j) {  // unrolled: the arrays stay in registers
    if (j == entry) {
      token = v0 + j;
      token_logit = z[j];
    }
  }
  const bool hit = __ballot_sync(kFullMask, lane == owner && entry >= 0) != 0;
  token = __shfl_sync(kFullMask, token, owner);
  token_logit = __shfl_sync(kFullMask, token_logit, owner);
  if (!hit) {
    token = end - 1;
    token_logit = sanitise(to_float(masses.row[end - 1]));
  }
  *token_z = token_logit;
  return token;
}

// Where U falls, as warp 0 of each CTA finds it: the total M, and the warp whose part of
// this CTA's slice holds U (-1 when U lies in another CTA) with U's offset within it.
struct SampleTarget {
  int64_t total;
  int64_t offset;
  int warp;
};

}  // namespace verify_device
}  // namespace specops
