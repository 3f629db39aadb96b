// Small helpers shared by the host and device code of the sampling kernels.
#pragma once
#include <cstdint>

#if defined(__CUDACC__)
#define SPECOPS_HOST_DEVICE __host__ __device__ __forceinline__
#else
#define SPECOPS_HOST_DEVICE inline
#endif

namespace specops {

// Token ids arrive as int32 or int64 (engines use both); one flag picks the load so the
// kernels need no template per combination of id tensors.
struct TokenIds {
  const void* data;
  bool is_int64;
  SPECOPS_HOST_DEVICE int64_t operator[](int64_t i) const {
    return is_int64 ? static_cast<const int64_t*>(data)[i]
                    : static_cast<int64_t>(static_cast<const int32_t*>(data)[i]);
  }
};

// The rows [start, end) request b owns, clamped into [0, num_tokens] and to at most
// max_spec_len drafts, so that inconsistent cu_num_draft_tokens (when the Python layer's
// value checks were turned off) can never index out of bounds.
struct DraftRange {
  int64_t start;
  int64_t count;
};

SPECOPS_HOST_DEVICE DraftRange draft_range(const int32_t* cu_num_draft_tokens, int64_t b,
                                           int64_t num_tokens, int64_t max_spec_len) {
  int64_t start = b == 0 ? 0 : cu_num_draft_tokens[b - 1];
  int64_t end = cu_num_draft_tokens[b];
  start = start < 0 ? 0 : (start > num_tokens ? num_tokens : start);
  end = end < start ? start : (end > num_tokens ? num_tokens : end);
  int64_t count = end - start;
  return DraftRange{start, count > max_spec_len ? max_spec_len : count};
}

// u * q < p with q > 0: accepts with probability min(1, p / q) for u ~ U[0, 1) and never
// accepts a token of target probability 0. No FMA can form here (no addition).
SPECOPS_HOST_DEVICE bool accepts(float uniform, float draft_prob, float target_prob) {
  return draft_prob > 0.f && uniform * draft_prob < target_prob;
}

// Exponential-race score r / E; a residual that is not positive (or NaN) scores -1, so
// it never beats a positive residual whose score underflowed to 0.
SPECOPS_HOST_DEVICE float race_score(float residual, float exponential) {
  return residual > 0.f ? residual / exponential : -1.f;
}

}  // namespace specops
