// Entry points of the verification-sampling ops, shared by the CPU and CUDA files, and
// the argument checks both run before launching (one place, so the messages agree).
#pragma once
#include <ATen/ATen.h>

#include <optional>

#include "token_ids.h"

namespace specops {

// ---- argument validation (sampling_checks.cpp). Each returns the sizes it checked. ----
struct RaggedSizes {
  int64_t batch;       // B
  int64_t num_tokens;  // T
  int64_t vocab;       // V (0 where the op has no vocab axis)
  int64_t width;       // S + 1 (0 where the op has no output rows)
};

RaggedSizes check_expand_to_tokens(const at::Tensor& values, const at::Tensor& cu_num_draft_tokens,
                                   int64_t num_tokens, std::optional<double> replace_from);

RaggedSizes check_rejection_greedy_sample(const at::Tensor& output_token_ids,
                                          const at::Tensor& cu_num_draft_tokens,
                                          const at::Tensor& draft_token_ids,
                                          const at::Tensor& target_argmax,
                                          const at::Tensor& bonus_token_ids,
                                          const std::optional<at::Tensor>& is_greedy);

RaggedSizes check_rejection_random_sample(
    const at::Tensor& output_token_ids, const at::Tensor& cu_num_draft_tokens,
    const at::Tensor& draft_token_ids, const std::optional<at::Tensor>& draft_probs,
    const at::Tensor& target_probs, const at::Tensor& bonus_token_ids,
    const at::Tensor& recovered_token_ids, const at::Tensor& uniform_probs,
    const std::optional<at::Tensor>& is_greedy);

RaggedSizes check_sample_recovered_tokens(const at::Tensor& cu_num_draft_tokens,
                                          const at::Tensor& draft_token_ids,
                                          const std::optional<at::Tensor>& draft_probs,
                                          const at::Tensor& target_probs,
                                          const at::Tensor& exponentials);

inline TokenIds token_ids(const at::Tensor& t) {
  return TokenIds{t.data_ptr(), t.scalar_type() == at::kLong};
}

inline const bool* optional_bool_ptr(const std::optional<at::Tensor>& t) {
  return t.has_value() ? t->data_ptr<bool>() : nullptr;
}

inline const float* optional_float_ptr(const std::optional<at::Tensor>& t) {
  return t.has_value() ? t->data_ptr<float>() : nullptr;
}

}  // namespace specops
