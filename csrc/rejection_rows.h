// One request's output row for the two rejection ops, shared by the C++ CPU and CUDA
// kernels so both walk the drafts with the same code.
#pragma once
#include <cstdint>

#include "token_ids.h"

namespace specops {

// Greedy: accept while the draft equals the target's argmax; emit the argmax at the first
// mismatch, else the bonus token; pad with -1. Writes all `width` entries of `row`.
SPECOPS_HOST_DEVICE void greedy_row(int32_t* row, int64_t width, DraftRange r, TokenIds draft,
                                    TokenIds target_argmax, int64_t bonus) {
  int64_t i = 0;
  bool all_accepted = true;
  for (; i < r.count; ++i) {
    const int64_t target = target_argmax[r.start + i];
    row[i] = static_cast<int32_t>(target);
    if (draft[r.start + i] != target) {
      all_accepted = false;
      ++i;
      break;
    }
  }
  if (all_accepted) row[i++] = static_cast<int32_t>(bonus);
  for (; i < width; ++i) row[i] = -1;
}

// Random: accept x_i when u_i * q_i(x_i) < p_i(x_i) (q = 1 without draft probs); emit the
// recovered token at the first rejection, else the bonus token; pad with -1. A draft id
// outside the vocab is never read and rejects. Rows are [T, vocab] float32.
SPECOPS_HOST_DEVICE void random_row(int32_t* row, int64_t width, DraftRange r, TokenIds draft,
                                    const float* draft_probs, const float* target_probs,
                                    int64_t vocab, TokenIds recovered, const float* uniform,
                                    int64_t bonus) {
  int64_t i = 0;
  bool all_accepted = true;
  for (; i < r.count; ++i) {
    const int64_t t = r.start + i;
    const int64_t token = draft[t];
    bool ok = false;
    if (token >= 0 && token < vocab) {
      const float q = draft_probs != nullptr ? draft_probs[t * vocab + token] : 1.f;
      ok = accepts(uniform[t], q, target_probs[t * vocab + token]);
    }
    if (!ok) {
      row[i++] = static_cast<int32_t>(recovered[t]);
      all_accepted = false;
      break;
    }
    row[i] = static_cast<int32_t>(token);
  }
  if (all_accepted) row[i++] = static_cast<int32_t>(bonus);
  for (; i < width; ++i) row[i] = -1;
}

}  // namespace specops
