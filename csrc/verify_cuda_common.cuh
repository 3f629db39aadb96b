// Launch constants of the CUDA verify kernel (verify_cuda.cu), shared by its two passes
// (verify_row_stats.cuh, verify_sample.cuh).
#pragma once
#include <cstdint>

namespace specops {
namespace verify_device {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr int kMaxCluster = 16;
constexpr int kUnroll = 8;  // groups of 4 logits loaded per thread before use
constexpr int kSampleUnroll = 4;  // the same in pass 2's mass sums, which also load draft probs
constexpr int64_t kMaxSliceBytes = 96 * 1024;  // shared-memory slice of a row per CTA
constexpr int64_t kMassBlock = 256;  // entries per block of pass 1's block masses (verify_cuda.cu, 1)
constexpr int kProposals = 16;       // RESIDUAL_PROPOSALS of reference/verify.py
constexpr unsigned kFullMask = 0xFFFFFFFFu;

// The blocks of block masses: each CTA's slice cut into kMassBlock-entry blocks from its
// start (the last one shorter), so that a block never spans two CTAs whatever the slice.
__host__ __device__ __forceinline__ int64_t blocks_per_slice(int64_t slice) {
  return (slice + kMassBlock - 1) / kMassBlock;
}

}  // namespace verify_device
}  // namespace specops
