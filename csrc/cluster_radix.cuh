// Radix selection across the CTAs of a thread-block cluster (sm_90): over the keys of a
// row split into the CTAs' slices, each key with an integer weight, the key b at which the
// weight of the keys >= b, summed from the largest key down, first reaches a target:
//   reached(weight of keys > b) is false, reached(weight of keys >= b) is true.
// Four rounds of 8 bits from the top: each CTA adds its keys' weights into a 256-bin
// histogram of the next digit (only keys sharing the digits chosen so far), the cluster's
// histograms are summed through distributed shared memory, and one scan picks the digit.
// Four cluster barriers in all, where a bisection over the bits takes 32 reductions.
#pragma once
#include <cooperative_groups.h>

#include <cstdint>

namespace specops {

namespace cg = cooperative_groups;

struct RadixPick {
  bool found;     // false: even the weight of every key does not reach the target
  uint32_t key;   // the key b (when found)
  int64_t total;  // the weight of every key
};

// Shared state: two histograms used alternately (a CTA rewrites one only after the next
// cluster barrier, by which time every peer has read it), the scan's warp totals and the
// digit a round picked. kThreads must be 256: one bin a thread.
template <int kThreads>
struct ClusterRadix {
  static_assert(kThreads == 256, "one histogram bin a thread");
  static constexpr int kWarps = kThreads / 32;
  int64_t (*bins)[256];  // [2][256]
  int64_t* warp_totals;  // [kWarps]
  int64_t* picked;       // [2]: the digit, the weight above it
  int parity;

  // The weights of the CTA's keys whose digits above `shift` equal `prefix`'s, added into
  // `hist` by digit. Equal digits in a warp are added by one lane (match_any), so a
  // concentrated first digit (all logits share a few exponents) costs one atomic a group.
  // kUnit: every key weighs 1 (the group's weight is its size).
  template <bool kUnit, typename KeyWeight>
  __device__ void add_keys(int64_t* hist, int64_t n, KeyWeight key_weight, uint32_t prefix, int shift) {
    const unsigned lane = threadIdx.x % 32;
    for (int64_t first = threadIdx.x - lane; first < n; first += kThreads) {  // whole warps
      const int64_t j = first + lane;
      uint32_t key = 0;
      int64_t weight = 0;
      if (j < n) key_weight(j, key, weight);
      const bool in = j < n && weight != 0 &&
                      (static_cast<uint64_t>(key) >> (shift + 8)) == (static_cast<uint64_t>(prefix) >> (shift + 8));
      const unsigned active = __ballot_sync(0xFFFFFFFFu, in);
      if (in) {
        const unsigned digit = (key >> shift) & 255u;
        const unsigned peers = __match_any_sync(active, digit);
        int64_t sum = 0;
        if (kUnit) {
          sum = __popc(peers);
        } else {  // every lane of the group takes the same turns, so each shuffle has its whole mask
          for (unsigned rest = peers; rest != 0; rest &= rest - 1) {
            sum += __shfl_sync(peers, weight, __ffs(rest) - 1);
          }
        }
        if (lane == static_cast<unsigned>(__ffs(peers) - 1)) {
          atomicAdd(reinterpret_cast<unsigned long long*>(&hist[digit]), static_cast<unsigned long long>(sum));
        }
      }
    }
  }

  // Inclusive scan of one value a thread, in thread order; every warp's total is left in
  // warp_totals (their sum is the whole block's).
  __device__ int64_t inclusive_scan(int64_t value) {
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    for (int offset = 1; offset < 32; offset *= 2) {
      const int64_t below = __shfl_up_sync(0xFFFFFFFFu, value, offset);
      if (lane >= offset) value += below;
    }
    if (lane == 31) warp_totals[warp] = value;
    __syncthreads();
    for (int w = 0; w < warp; ++w) value += warp_totals[w];
    return value;
  }

  // The key b of the header for the CTA's keys [0, n) (key_weight(j, key, weight) gives
  // key j and its weight), reached(weight, total) monotone in weight, false at 0.
  template <bool kUnit, typename KeyWeight, typename Reached>
  __device__ RadixPick select(cg::cluster_group& cluster, int64_t n, KeyWeight key_weight, Reached reached) {
    uint32_t prefix = 0;
    int64_t above = 0;  // the weight of keys above every key that shares the chosen digits
    int64_t total = 0;
    for (int shift = 24; shift >= 0; shift -= 8) {
      int64_t* hist = bins[parity];
      hist[threadIdx.x] = 0;
      __syncthreads();
      add_keys<kUnit>(hist, n, key_weight, prefix, shift);
      cluster.sync();  // every CTA's histogram complete and visible to its peers
      // Thread t holds digit 255 - t of the cluster's histogram: the scan in thread order
      // sums the digits from the largest down.
      const unsigned digit = 255u - threadIdx.x;
      int64_t count = 0;
      for (unsigned peer = 0; peer < cluster.num_blocks(); ++peer) {
        count += cluster.map_shared_rank(hist, peer)[digit];
      }
      const int64_t through = inclusive_scan(count);  // digits >= this one
      parity ^= 1;
      if (shift == 24) {
        for (int w = 0; w < kWarps; ++w) total += warp_totals[w];
        if (!reached(total, total)) return RadixPick{false, 0, total};
      }
      // One digit is the crossing (reached at above + through, not at above + through -
      // count), as reached is monotone and holds at above + every weight of this round.
      if (reached(above + through, total) && !reached(above + through - count, total)) {
        picked[0] = digit;
        picked[1] = above + through - count;
      }
      __syncthreads();
      prefix |= static_cast<uint32_t>(picked[0]) << shift;
      above = picked[1];
      __syncthreads();  // picked and warp_totals are rewritten next round
    }
    return RadixPick{true, prefix, total};
  }
};

}  // namespace specops
