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
//    memory; then, from shared memory alone: the top-k threshold (a radix selection over
//    the float order, 4 rounds of 8 bits, only when asked: cluster_radix.cuh), the weights
//    and their fixed-point sum, the top-p cut (the same over the probabilities' bits,
//    weighted by their masses, only when asked) and the final normaliser, and p of the
//    slot's draft token. On draft rows of random requests with draft probs, also the
//    block masses: sum floor(w_v 2^40) over blocks of 256 entries of each CTA's slice
//    (from the slice's start, the last one shorter), 8 bytes per block. Every row is read
//    from DRAM once.
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
//
// The screened path (verify_screen.cuh), for tokens-only calls without top-k or top-p of
// at least kScreenMinBatch requests: pass 1 is a plain grid (slots x splits) that streams
// each row once for its max, first argmax and an approximate normaliser; pass 2, a
// programmatic dependent launch in clusters of C CTAs (one a request, as pass 2 above; C
// the largest whose B clusters are all resident), settles the acceptance tests from those
// where they lie outside a 2^-9 band, and computes the exact statistics above (without
// top-k / top-p: the max from pass 1, so one streaming read of the row and no shared-memory
// copy) only of the row it samples and of any row whose test it leaves open, with the
// block masses of the row it samples; then samples as above, except that a bonus row or
// n-gram rejection draws its token from those block masses and one block of logits
// (draw_from_blocks) instead of the whole-row scan. The exact normaliser's repro exp then
// runs on about one row a request.
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
#include <map>
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
#include "verify_cuda_common.cuh"
#include "verify_math.cuh"
#include "verify_row_stats.cuh"
#include "verify_sample.cuh"
#include "verify_screen.cuh"

namespace specops {
namespace {

using namespace verify_device;  // verify_cuda_common.cuh, verify_row_stats.cuh, verify_sample.cuh, verify_screen.cuh

// ---------------------------------------------------------------------------------------
// Pass 1: row statistics. Grid: persistent clusters of C CTAs x kThreads (as many as fit
// at once), each taking output slots (b, i) in turn (a slot's work: verify_row_stats.cuh);
// dynamic shared memory: one row slice of `slice` floats. Reads each target and bonus row
// once; while a cluster reduces and computes one slot, the next slot's slices are
// prefetched into L2.

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
  __shared__ int64_t radix_bins[2][256], radix_totals[kWarps], radix_picked[2];
  cg::cluster_group cluster = cg::this_cluster();
  ClusterReducer<kWarps> reducer{warp_slots, exchange, &result, 0};
  ClusterRadix<kThreads> radix{radix_bins, radix_totals, radix_picked, 0};
  const int64_t num_clusters = gridDim.x / cluster.num_blocks();
  for (int64_t slot = blockIdx.x / cluster.num_blocks(); slot < num_slots; slot += num_clusters) {
    __syncthreads();  // every thread is done with the previous slot's slice
    const int64_t next_slot = slot + num_clusters < num_slots ? slot + num_clusters : -1;
    row_stats_slot(cluster, reducer, radix, row_slice, target, bonus, draft, cu, temperature, top_k, top_p, stats,
                   block_masses, num_tokens, vocab, width, slice, greedy_needs_probs, slot, next_slot);
  }
  cluster.sync();  // peers may still read this CTA's exchange slots and histograms
}

// ---------------------------------------------------------------------------------------
// Pass 2: decisions and the sampled token (the sampling: verify_sample.cuh). Grid: B
// clusters of C CTAs x kThreads. Moves a few bytes per draft, plus per random request its
// chosen logits row (and draft-probs row) once and, from L2, an eighth of one CTA's slice
// of them again. kScreened (verify_screen.cuh): the steps' statistics come from pass 1's
// partials, and the cluster computes the exact statistics of the rows it must (the row to
// sample, and any row whose test the screen leaves open), each CTA streaming its slice.

// The screened walk of one request: every CTA of the cluster runs it alike and returns the
// row to sample (the first rejected draft, or the bonus row), whose exact statistics (and,
// with draft probs, block masses) it has stored (screened_row_stats: each CTA streams its
// slice of that row once, from the row max pass 1 found). Greedy rows need none: their
// argmax comes from the partials (step_argmax, which the caller writes out).
template <typename scalar_t>
__device__ int64_t screened_choice(
    cg::cluster_group& cluster, const scalar_t* target, const scalar_t* bonus, TokenIds draft,
    const float* draft_probs, const float* temperature, RowStats* stats, int64_t* block_masses,
    const float* part_max, const int64_t* part_arg, const float* part_approx, int64_t splits, int64_t b,
    const DraftRange& r, int64_t seed, int64_t position, int64_t vocab, int64_t width, int64_t slice,
    int64_t* step_argmax) {
  __shared__ Slot warp_slots[kWarps], exchange[2], result;
  __shared__ float step_max[kMaxScreenSteps], step_approx[kMaxScreenSteps];
  __shared__ int64_t stop_shared;
  __shared__ bool unsettled_shared;
  ClusterReducer<kWarps> reducer{warp_slots, exchange, &result, 0};
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const float t = temperature[b];
  const bool greedy = t == 0.f;
  // Pass 1's partials are read only past this point (a programmatic dependent launch).
  asm volatile("griddepcontrol.wait;" ::: "memory");
  const float scale = greedy ? 0.f : repro::kLog2e / t;
  for (int64_t i = warp; i <= r.count; i += kWarps) {
    const StepStats st = combine_partials(part_max, part_arg, part_approx, b * width + i, splits, scale);
    if (lane == 0) {
      step_max[i] = st.max_logit;
      step_argmax[i] = st.argmax;
      step_approx[i] = st.approx;
    }
  }
  __syncthreads();
  int64_t from = 0;
  while (true) {
    if (warp == 0) {
      // Lane l tests step first + l; the first step not surely accepted stops the walk.
      int64_t stop = r.count;
      bool unsettled = false;
      for (int64_t first = from; first < r.count; first += 32) {
        const int64_t i = first + lane;
        Verdict verdict = Verdict::kAccept;
        if (i < r.count) {
          const int64_t x = draft[r.start + i];
          if (greedy) {
            verdict = x == step_argmax[i] ? Verdict::kAccept : Verdict::kReject;
          } else {
            const bool in_vocab = x >= 0 && x < vocab;
            const float q = !in_vocab ? 0.f : (draft_probs != nullptr ? draft_probs[(r.start + i) * vocab + x] : 1.f);
            const float u = uniform_from_word(philox_block(seed, position + i, kPurposeAccept, 0).w[0]);
            const scalar_t* row = target + (r.start + i) * vocab;
            const float z_x = in_vocab ? sanitise(to_float(row[x])) : -INFINITY;
            verdict = screen_test(u * q, q, in_vocab, z_x, StepStats{step_max[i], step_argmax[i], step_approx[i]}, t);
          }
        }
        const unsigned stops = __ballot_sync(kFullMask, verdict != Verdict::kAccept);
        if (stops != 0) {
          const int at = __ffs(stops) - 1;
          stop = first + at;
          unsettled = __shfl_sync(kFullMask, verdict == Verdict::kUnsettled, at);
          break;
        }
      }
      if (lane == 0) {
        stop_shared = stop;
        unsettled_shared = unsettled;
      }
    }
    __syncthreads();
    const int64_t stop = stop_shared;
    const bool unsettled = unsettled_shared;
    __syncthreads();  // every thread has read them before warp 0 may write them again
    if (greedy) return stop;
    // The exact statistics of the stopping row, then (their writes visible to the cluster)
    // the exact test where the screen left it open.
    // Block masses for the proposals at a rejection with draft probs, or the draw of a
    // bonus row or n-gram rejection (draw_from_blocks).
    const bool drafted = stop < r.count;
    const int64_t slot = b * width + stop, rank = cluster.block_rank();
    const int64_t blocks = blocks_per_slice(slice);
    const int64_t lo = min(rank * slice, vocab), hi = min(lo + slice, vocab);
    int64_t* masses = block_masses + (slot * cluster.num_blocks() + rank) * blocks;
    screened_row_stats(cluster, reducer, drafted ? target + (r.start + stop) * vocab : bonus + b * vocab,
                       step_max[stop], step_argmax[stop], t, drafted ? draft[r.start + stop] : -1, stats + slot,
                       masses, lo, hi, blocks);
    __threadfence();
    cluster.sync();
    if (!unsettled) return stop;
    const float q = draft_probs != nullptr ? draft_probs[(r.start + stop) * vocab + draft[r.start + stop]] : 1.f;
    const float u = uniform_from_word(philox_block(seed, position + stop, kPurposeAccept, 0).w[0]);
    if (!accepts(u, q, load_stats_cg(stats + b * width + stop).p_token)) return stop;
    from = stop + 1;
  }
}

// Screened: 3 CTAs an SM (80 registers, 36-44 bytes spilled, sm_90), so more clusters
// are resident at once: H100, B=64 random 163.1 -> 140.4 us a graph replay, B=16 54.1 ->
// 49.7, against 2 CTAs at 122-126 registers (bench/NOTES.md).
template <typename scalar_t, bool kScreened>
__global__ void __launch_bounds__(kThreads, kScreened ? 3 : 2) verify_decide_kernel(
    const scalar_t* __restrict__ target,      // [T, V]
    const scalar_t* __restrict__ bonus,       // [B, V]
    TokenIds draft,                           // [T]
    const float* __restrict__ draft_probs,    // [T, V] or null (n-gram)
    const int32_t* __restrict__ cu,           // [B]
    const float* __restrict__ temperature,    // [B]
    const int64_t* __restrict__ seeds,        // [B]
    const int64_t* __restrict__ positions,    // [B]
    RowStats* stats,                          // [B, width]: read (pass 1's), or written here (kScreened)
    int64_t* block_masses,                    // [B * width, C * ceil(slice / 256)] or null (n-gram)
    const float* __restrict__ part_max,       // [B * width, splits] (kScreened)
    const int64_t* __restrict__ part_arg,     // [B * width, splits] (kScreened)
    const float* __restrict__ part_approx,    // [B * width, splits] (kScreened)
    int32_t* __restrict__ out,                // [B, width]
    int32_t* __restrict__ num_accepted,       // [B]
    float* __restrict__ logprobs,             // [B, width] or null
    int64_t num_tokens, int64_t vocab, int64_t width, int64_t slice, int64_t splits) {
  __shared__ int64_t chosen_shared;
  __shared__ int64_t warp_mass[kWarps];
  __shared__ int64_t slice_mass;  // read by the peers
  __shared__ SampleTarget sample;
  __shared__ int64_t scan_totals[kWarps];
  __shared__ int scan_first;
  __shared__ int64_t draw_at[2];  // kScreened: the block and offset of a draw from block masses
  __shared__ Proposals proposals;
  __shared__ int64_t step_argmax[kScreened ? kMaxScreenSteps : 1];
  cg::cluster_group cluster = cg::this_cluster();
  const int64_t rank = cluster.block_rank();
  const int64_t b = blockIdx.x / cluster.num_blocks();
  const DraftRange r = draft_range(cu, b, num_tokens, width - 1);
  const float t = temperature[b];
  const bool greedy = t == 0.f;
  const RowStats* row_stats = stats + b * width;
  const int64_t seed = seeds[b], position = positions[b];

  int64_t chosen;  // first rejected row, or r.count for the bonus row
  if constexpr (kScreened) {
    chosen = screened_choice(cluster, target, bonus, draft, draft_probs, temperature, stats, block_masses, part_max,
                             part_arg, part_approx, splits, b, r, seed, position, vocab, width, slice, step_argmax);
  } else {
    // Every CTA finds the row to sample: the first draft whose acceptance test fails (the
    // bonus row when none does). Warp 0 tests 32 drafts at a time, a lane each, so every
    // draft's loads are in flight at once (one thread walking them in turn waited on two
    // loads a draft); a ballot picks the first failure.
    if (threadIdx.x < 32) {
      int64_t first_failure = r.count;
      for (int64_t first = 0; first < r.count; first += 32) {
        const int64_t i = first + threadIdx.x;
        bool fails = false;
        if (i < r.count) {
          const int64_t x = draft[r.start + i];
          if (greedy) {
            fails = x != row_stats[i].argmax;
          } else if (x < 0 || x >= vocab) {
            fails = true;
          } else {
            const float q = draft_probs != nullptr ? draft_probs[(r.start + i) * vocab + x] : 1.f;
            const float u = uniform_from_word(philox_block(seed, position + i, kPurposeAccept, 0).w[0]);
            fails = !accepts(u, q, row_stats[i].p_token);
          }
        }
        const unsigned failures = __ballot_sync(kFullMask, fails);
        if (failures != 0) {  // the same in every lane
          first_failure = first + __ffs(failures) - 1;
          break;
        }
      }
      if (threadIdx.x == 0) chosen_shared = first_failure;
    }
    __syncthreads();
    chosen = chosen_shared;
  }
  // The chosen row's statistics (kScreened: written in this launch, possibly by a peer).
  const RowStats chosen_stats = kScreened ? (greedy ? RowStats{} : load_stats_cg(row_stats + chosen))
                                          : row_stats[chosen];
  auto argmax_of = [&](int64_t i) -> int64_t { return kScreened ? step_argmax[i] : row_stats[i].argmax; };
  auto write_row = [&](int64_t last_token, float last_p) {
    int32_t* row_out = out + b * width;
    for (int64_t i = 0; i < width; ++i) {
      int32_t token = -1;
      float lp = 0.f;
      if (i < chosen) {
        token = static_cast<int32_t>(greedy ? argmax_of(i) : draft[r.start + i]);
        if (logprobs != nullptr) lp = log_prob(row_stats[i].p_token);
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
    if (rank == 0 && threadIdx.x == 0) write_row(argmax_of(chosen), chosen_stats.p_token);
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
                                    chosen_stats,
                                    Temperature(t)};
  if (kScreened && q == nullptr) {
    // A bonus row or n-gram rejection: from the block masses the cluster stored (every CTA
    // computes the same token, so rank 0 alone draws it; no cluster barrier follows).
    if (rank != 0) return;
    const int64_t num_blocks = cluster.num_blocks() * blocks_per_slice(slice);
    const PhiloxWords draw = philox_block(seed, position + chosen, kPurposeSample, 0);
    float token_z;
    const int64_t token = draw_from_blocks(masses, block_masses + (b * width + chosen) * num_blocks, num_blocks,
                                           blocks_per_slice(slice), slice, vocab,
                                           draw.w[0] | (uint64_t{draw.w[1]} << 32), scan_totals, draw_at, &token_z);
    if (threadIdx.x == 0) write_row(token, processed_p(token_z, token, masses.st, masses.temperature));
    return;
  }
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

// Tuning override (bench/NOTES.md): SPECOPS_VERIFY_CLUSTER=1|2|4|8|16 where the slice
// fits; 0 when unset or not one of those.
int forced_cluster_size(int64_t vocab) {
  const char* forced = std::getenv("SPECOPS_VERIFY_CLUSTER");
  if (forced == nullptr) return 0;
  const int c = std::atoi(forced);
  const bool valid = c == 1 || c == 2 || c == 4 || c == 8 || c == 16;
  return valid && (vocab + c - 1) / c * int64_t{4} <= kMaxSliceBytes ? c : 0;
}

// Rows per cluster CTA: slices of at most 4096 logits while that takes at most 8 CTAs
// (portable clusters), 16 CTAs when the batch is too small to fill the GPU or the slice
// would not fit in shared memory.
int cluster_size(int64_t vocab, int64_t slots, int num_sms) {
  if (const int c = forced_cluster_size(vocab)) return c;
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

// The function attributes (clusters of 16, large dynamic shared memory) of the kernels
// of one storage type, once per device.
template <typename scalar_t>
void configure_kernels(int device) {
  static std::mutex mutex;
  static uint64_t configured = 0;  // a bit per device: function attributes are per device
  const std::lock_guard<std::mutex> lock(mutex);
  const uint64_t bit = uint64_t{1} << (device % 64);
  if (configured & bit) return;
  allow_large_clusters(verify_row_stats_kernel<scalar_t>, kMaxSliceBytes);
  allow_large_clusters(verify_decide_kernel<scalar_t, false>, kMaxSliceBytes);
  allow_large_clusters(verify_decide_kernel<scalar_t, true>, kMaxSliceBytes);
  configured |= bit;
}

// The screened pass 2's cluster size (one cluster a request): the largest C whose B
// clusters are all resident at once, else (several waves whatever C) the smallest C, so
// that fewer CTAs repeat a request's walk and proposals. A slice holds at most
// kMaxSliceBytes / 4 entries (the whole-row scan of the residual fallback holds a warp's
// part of one in registers) and, past C = 1, at least kMinScreenSlice. Every CTA runs a
// long fixed part (the walk, the cluster reductions, the proposals) besides its slice,
// and a cluster left to a second wave doubles it: H100, B=16 k=4 V=128256 random, C=16
// (14 clusters resident at 2 CTAs an SM, before the 3-CTA bound below) 77.4 us a graph
// replay, C=8 61.2 (bench/NOTES.md).
constexpr int64_t kMinScreenSlice = 2048;
template <typename scalar_t>
int screened_cluster_size(int64_t vocab, int64_t batch, int device) {
  if (const int c = forced_cluster_size(vocab)) return c;
  configure_kernels<scalar_t>(device);
  int fewest = 0;
  for (int c = kMaxCluster; c >= 1; c /= 2) {
    const int64_t slice = slice_for(vocab, c);
    if (slice * int64_t{4} > kMaxSliceBytes) break;
    if (c > 1 && slice < kMinScreenSlice) continue;
    fewest = c;
    if (resident_clusters(verify_decide_kernel<scalar_t, true>, kThreads, c, 0, device) >= batch) return c;
  }
  return fewest > 0 ? fewest : kMaxCluster;  // no slice fits: the caller's check names the vocab
}

// CTAs of the screened pass 1 resident on the device at once (occupancy x SMs; the float
// instantiation stands for the three, whose register counts match), once per device.
int64_t resident_partial_ctas(int device, int num_sms) {
  static std::mutex mutex;
  static std::map<int, int64_t> cache;
  const std::lock_guard<std::mutex> lock(mutex);
  const auto found = cache.find(device);
  if (found != cache.end()) return found->second;
  int per_sm = 0;
  C10_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, verify_row_partials_kernel<float>, kThreads, 0));
  return cache[device] = int64_t{std::max(per_sm, 1)} * num_sms;
}

// The screened pass 1's split of a row: as many splits as one wave of resident CTAs holds
// over every slot (each CTA then loops over its split with its loads in flight, rather
// than a second, partial wave of short CTAs), each at least 2048 entries and a multiple
// of 4 kThreads.
int64_t screen_split_len(int64_t vocab, int64_t slots, int64_t resident) {
  const int64_t splits = std::clamp<int64_t>(resident / slots, 1, (vocab + 2047) / 2048);
  const int64_t step = 4 * kThreads;
  return ((vocab + splits - 1) / splits + step - 1) / step * step;
}

// Pass 1's partials (screened path): per slot and split, the max, its first index and the
// approximate normaliser.
struct Partials {
  float* max;
  int64_t* arg;
  float* approx;
  int64_t split_len;
  int64_t splits;
};

template <typename scalar_t>
void launch_verify(const at::Tensor& target_logits, const at::Tensor& bonus_logits, TokenIds draft,
                   const float* draft_probs, const int32_t* cu, const float* temperature, const int32_t* top_k,
                   const float* top_p, const int64_t* seeds, const int64_t* positions, RowStats* stats,
                   int64_t* block_masses, int32_t* out, int32_t* num_accepted, float* logprobs, const VerifySizes& s,
                   int cluster, const Partials* partials) {
  configure_kernels<scalar_t>(target_logits.get_device());
  const auto stream = c10::cuda::getCurrentCUDAStream();
  const int64_t slice = slice_for(s.vocab, cluster);
  const auto* target = static_cast<const scalar_t*>(target_logits.data_ptr());
  const auto* bonus = static_cast<const scalar_t*>(bonus_logits.data_ptr());
  const int64_t num_slots = s.batch * s.width;
  const size_t smem = slice * sizeof(float);
  if (partials != nullptr) {
    const Partials& p = *partials;
    verify_row_partials_kernel<scalar_t><<<dim3(static_cast<unsigned>(num_slots), static_cast<unsigned>(p.splits)),
                                           kThreads, 0, stream>>>(target, bonus, cu, temperature, p.max, p.arg,
                                                                  p.approx, s.num_tokens, s.vocab, s.width,
                                                                  p.split_len);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    // SPECOPS_VERIFY_PDL=0: pass 2 as a plain launch (A/B runs).
    const char* pdl_setting = std::getenv("SPECOPS_VERIFY_PDL");
    const bool programmatic = pdl_setting == nullptr || std::string(pdl_setting) != "0";
    launch_clusters(verify_decide_kernel<scalar_t, true>, s.batch, cluster, kThreads, 0, stream, programmatic, target,
                    bonus, draft, draft_probs, cu, temperature, seeds, positions, stats, block_masses,
                    static_cast<const float*>(p.max), static_cast<const int64_t*>(p.arg),
                    static_cast<const float*>(p.approx), out, num_accepted, logprobs, s.num_tokens, s.vocab,
                    s.width, slice, p.splits);
    return;
  }
  const int64_t clusters = std::min<int64_t>(
      num_slots, resident_clusters(verify_row_stats_kernel<scalar_t>, kThreads, cluster, smem, target_logits.get_device()));
  launch_clusters(verify_row_stats_kernel<scalar_t>, clusters, cluster, kThreads, smem, stream, false, target, bonus,
                  draft, cu, temperature, top_k, top_p, stats, block_masses, num_slots, s.num_tokens, s.vocab, s.width,
                  slice, logprobs != nullptr);
  launch_clusters(verify_decide_kernel<scalar_t, false>, s.batch, cluster, kThreads, 0, stream, false, target, bonus,
                  draft, draft_probs, cu, temperature, seeds, positions, stats, block_masses,
                  static_cast<const float*>(nullptr), static_cast<const int64_t*>(nullptr),
                  static_cast<const float*>(nullptr), out, num_accepted, logprobs, s.num_tokens, s.vocab, s.width,
                  slice, int64_t{0});
}

// Whether a call takes the screened path (verify_screen.cuh): tokens only, no top-k or
// top-p, at most kMaxScreenSteps steps a request, and without draft probs (n-gram: its
// draws from block masses beat the whole-row scan at every batch) or with a batch of at
// least kScreenMinBatch requests (smaller ones with draft probs run faster on the two
// full passes: bench/NOTES.md). SPECOPS_VERIFY_SCREEN=1 / 0 forces it on / off where it
// applies (tests and A/B runs).
constexpr int64_t kScreenMinBatch = 8;
bool screened_call(bool filtered, bool return_logprobs, bool has_draft_probs, int64_t batch, int64_t width) {
  if (filtered || return_logprobs || width > kMaxScreenSteps) return false;
  const char* setting = std::getenv("SPECOPS_VERIFY_SCREEN");
  if (setting != nullptr && (std::string(setting) == "0" || std::string(setting) == "1")) {
    return std::string(setting) == "1";
  }
  return !has_draft_probs || batch >= kScreenMinBatch;
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
  const bool screened = screened_call(top_k.has_value() || top_p.has_value(), return_logprobs,
                                      draft_probs.has_value(), s.batch, s.width);
  // Screened: pass 2's clusters, one a request, compute the exact statistics.
  const int device = target_logits.get_device();
  int cluster = 0;
  if (!screened) {
    cluster = cluster_size(s.vocab, s.batch * s.width, num_sms);
  } else {
    switch (target_logits.scalar_type()) {  // the instantiation pass 2 launches
      case at::kHalf: cluster = screened_cluster_size<__half>(s.vocab, s.batch, device); break;
      case at::kBFloat16: cluster = screened_cluster_size<__nv_bfloat16>(s.vocab, s.batch, device); break;
      default: cluster = screened_cluster_size<float>(s.vocab, s.batch, device); break;
    }
  }
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
  // Block masses of every draft slot of a random request, for the residual proposals
  // (with draft probs only; pass 1 writes every entry pass 2 may read), and on the
  // screened path of the slot each request samples (pass 2 writes them).
  const int64_t mass_blocks = cluster * blocks_per_slice(slice_for(s.vocab, cluster));
  const bool needs_masses = draft_probs.has_value() || screened;
  at::Tensor block_masses = at::empty({needs_masses ? s.batch * s.width : 0, mass_blocks},
                                      target_logits.options().dtype(at::kLong));
  Partials partials{};
  at::Tensor partial_buffers;
  if (screened) {
    partials.split_len = screen_split_len(s.vocab, s.batch * s.width,
                                          resident_partial_ctas(target_logits.get_device(), num_sms));
    partials.splits = (s.vocab + partials.split_len - 1) / partials.split_len;
    const int64_t n = s.batch * s.width * partials.splits;
    partial_buffers = at::empty({4 * n}, target_logits.options().dtype(at::kInt));  // max, approx, then arg (int64)
    partials.max = reinterpret_cast<float*>(partial_buffers.data_ptr<int32_t>());
    partials.approx = partials.max + n;
    partials.arg = reinterpret_cast<int64_t*>(partials.approx + n);
  }
  const TokenIds draft{draft_token_ids.data_ptr(), draft_token_ids.scalar_type() == at::kLong};
  const auto launch = [&](auto tag) {  // the kernels read 16-bit storage as CUDA's own types
    using scalar_t = decltype(tag);
    launch_verify<scalar_t>(
        target_logits, bonus_logits, draft, draft_probs.has_value() ? draft_probs->data_ptr<float>() : nullptr,
        cu_num_draft_tokens.data_ptr<int32_t>(), temperature.data_ptr<float>(),
        top_k.has_value() ? top_k->data_ptr<int32_t>() : nullptr,
        top_p.has_value() ? top_p->data_ptr<float>() : nullptr, seeds.data_ptr<int64_t>(),
        positions.data_ptr<int64_t>(), reinterpret_cast<RowStats*>(stats.data_ptr()),
        needs_masses ? block_masses.data_ptr<int64_t>() : nullptr, out.data_ptr<int32_t>(),
        num_accepted.data_ptr<int32_t>(), return_logprobs ? logprobs.data_ptr<float>() : nullptr, s, cluster,
        screened ? &partials : nullptr);
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
