// Reductions across the CTAs of a thread-block cluster (sm_90): every CTA contributes one
// value, every thread receives the combined one, through distributed shared memory.
#pragma once
#include <cooperative_groups.h>

#include <cstdint>

namespace specops {

namespace cg = cooperative_groups;

// One reduction value: a float and an integer, enough for every reduction here.
struct Slot {
  float f;    // max: value
  int64_t i;  // max: index (ties to the lowest); sums and counts
};

struct MaxCombine {
  static __device__ Slot identity() { return Slot{-INFINITY, INT64_MAX}; }
  __device__ Slot operator()(const Slot& a, const Slot& b) const {
    return (b.f > a.f || (b.f == a.f && b.i < a.i)) ? b : a;
  }
};

struct SumCombine {
  static __device__ Slot identity() { return Slot{0.f, 0}; }
  __device__ Slot operator()(const Slot& a, const Slot& b) const { return Slot{0.f, a.i + b.i}; }
};

template <typename Combine>
__device__ inline Slot warp_reduce(Slot s, Combine combine) {
  for (int offset = 16; offset > 0; offset /= 2) {
    Slot other;
    other.f = __shfl_down_sync(0xFFFFFFFFu, s.f, offset);
    other.i = __shfl_down_sync(0xFFFFFFFFu, s.i, offset);
    s = combine(s, other);
  }
  return s;
}

// The CTAs of a cluster combine one value each into a result every thread receives.
// Shared state: two exchange slots used alternately (a CTA rewrites a slot only after the
// next cluster barrier, by which time every peer has read it) and one broadcast cell.
template <int kWarps>
struct ClusterReducer {
  Slot* warp_slots;  // [kWarps]
  Slot* exchange;    // [2]
  Slot* result;      // [1]
  int parity;

  template <typename Combine>
  __device__ Slot reduce(cg::cluster_group& cluster, Slot value, Combine combine) {
    value = warp_reduce(value, combine);
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    if (lane == 0) warp_slots[warp] = value;
    __syncthreads();
    if (warp == 0) {  // the CTA's value, then each peer's slot read by one lane at once
      value = warp_reduce(lane < kWarps ? warp_slots[lane] : Combine::identity(), combine);
      if (lane == 0) exchange[parity] = value;
    }
    cluster.sync();
    if (warp == 0) {
      const unsigned peers = cluster.num_blocks();
      value = lane < peers ? *cluster.map_shared_rank(&exchange[parity], lane) : Combine::identity();
      value = warp_reduce(value, combine);
      if (lane == 0) *result = value;
    }
    parity ^= 1;
    __syncthreads();
    return *result;
  }

  __device__ int64_t sum(cg::cluster_group& cluster, int64_t value) {
    return reduce(cluster, Slot{0.f, value}, SumCombine{}).i;
  }
};

}  // namespace specops
