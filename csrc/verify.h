// The fused verify op: argument checks shared by its CPU (and later CUDA) launcher.
#pragma once
#include <ATen/ATen.h>

#include <optional>

namespace specops {

struct VerifySizes {
  int64_t batch;       // B
  int64_t num_tokens;  // T
  int64_t vocab;       // V
  int64_t width;       // max_spec_len + 1
};

VerifySizes check_verify(const at::Tensor& target_logits, const at::Tensor& bonus_logits,
                         const at::Tensor& draft_token_ids, const std::optional<at::Tensor>& draft_probs,
                         const at::Tensor& cu_num_draft_tokens, const std::optional<at::Tensor>& temperature,
                         const std::optional<at::Tensor>& top_k, const std::optional<at::Tensor>& top_p,
                         const at::Tensor& seeds, const at::Tensor& positions, int64_t max_spec_len);

}  // namespace specops
