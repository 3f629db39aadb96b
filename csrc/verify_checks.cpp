// Argument checks of verify (shapes, dtypes, devices; no device sync). Numbers go into
// messages through std::to_string (see check_messages.h for why).
#include <string>

#include "check_messages.h"
#include "verify.h"

namespace specops {
namespace {

void same_device(const at::Tensor& t, const char* name, const at::Tensor& ref) {
  TORCH_CHECK_VALUE(t.device() == ref.device(), name, " must be on the same device as target_logits (",
                    ref.device().str(), "), got ", t.device().str());
}

void vector(const at::Tensor& t, const char* name, int64_t size, const char* size_name,
            at::ScalarType dtype, const at::Tensor& ref) {
  same_device(t, name, ref);
  TORCH_CHECK_TYPE(t.scalar_type() == dtype, name, " must be ", dtype, ", got ", t.scalar_type());
  TORCH_CHECK_VALUE(t.dim() == 1 && t.size(0) == size, name, " must have shape [", size_name, "] = [",
                    std::to_string(size), "], got ", shape_str(t));
  TORCH_CHECK_VALUE(t.is_contiguous(), name, " must be contiguous");
}

void rows(const at::Tensor& t, const char* name, int64_t count, const char* count_name, int64_t vocab,
          const at::Tensor& ref) {
  same_device(t, name, ref);
  TORCH_CHECK_VALUE(t.dim() == 2 && t.size(0) == count && t.size(1) == vocab, name, " must have shape [",
                    count_name, ", vocab] = [", std::to_string(count), ", ", std::to_string(vocab),
                    "], got ", shape_str(t));
  TORCH_CHECK_VALUE(t.is_contiguous(), name, " must be contiguous");
}

}  // namespace

VerifySizes check_verify(const at::Tensor& target_logits, const at::Tensor& bonus_logits,
                         const at::Tensor& draft_token_ids, const std::optional<at::Tensor>& draft_probs,
                         const at::Tensor& cu_num_draft_tokens, const std::optional<at::Tensor>& temperature,
                         const std::optional<at::Tensor>& top_k, const std::optional<at::Tensor>& top_p,
                         const at::Tensor& seeds, const at::Tensor& positions, int64_t max_spec_len) {
  const auto dtype = target_logits.scalar_type();
  TORCH_CHECK_TYPE(dtype == at::kFloat || dtype == at::kBFloat16 || dtype == at::kHalf,
                   "target_logits must be float32, bfloat16 or float16, got ", dtype);
  TORCH_CHECK_VALUE(target_logits.dim() == 2 && target_logits.size(1) >= 1,
                    "target_logits must have shape [num_tokens, vocab], got ", shape_str(target_logits));
  TORCH_CHECK_VALUE(target_logits.is_contiguous(), "target_logits must be contiguous");
  const int64_t num_tokens = target_logits.size(0), vocab = target_logits.size(1);
  TORCH_CHECK_VALUE(vocab <= (int64_t{1} << 30), "target_logits vocab must be at most 2^30, got ",
                    std::to_string(vocab));
  TORCH_CHECK_VALUE(cu_num_draft_tokens.dim() == 1, "cu_num_draft_tokens must have shape [batch], got ",
                    shape_str(cu_num_draft_tokens));
  const int64_t batch = cu_num_draft_tokens.size(0);
  vector(cu_num_draft_tokens, "cu_num_draft_tokens", batch, "batch", at::kInt, target_logits);
  TORCH_CHECK_TYPE(bonus_logits.scalar_type() == dtype, "bonus_logits must be ", dtype,
                   " like target_logits, got ", bonus_logits.scalar_type());
  rows(bonus_logits, "bonus_logits", batch, "batch", vocab, target_logits);
  same_device(draft_token_ids, "draft_token_ids", target_logits);
  TORCH_CHECK_TYPE(draft_token_ids.scalar_type() == at::kInt || draft_token_ids.scalar_type() == at::kLong,
                   "draft_token_ids must be int32 or int64, got ", draft_token_ids.scalar_type());
  TORCH_CHECK_VALUE(draft_token_ids.dim() == 1 && draft_token_ids.size(0) == num_tokens,
                    "draft_token_ids must have shape [num_tokens] = [", std::to_string(num_tokens),
                    "], got ", shape_str(draft_token_ids));
  TORCH_CHECK_VALUE(draft_token_ids.is_contiguous(), "draft_token_ids must be contiguous");
  if (draft_probs.has_value()) {
    TORCH_CHECK_TYPE(draft_probs->scalar_type() == at::kFloat, "draft_probs must be Float, got ",
                     draft_probs->scalar_type());
    rows(*draft_probs, "draft_probs", num_tokens, "num_tokens", vocab, target_logits);
  }
  if (temperature.has_value()) vector(*temperature, "temperature", batch, "batch", at::kFloat, target_logits);
  if (top_k.has_value()) vector(*top_k, "top_k", batch, "batch", at::kInt, target_logits);
  if (top_p.has_value()) vector(*top_p, "top_p", batch, "batch", at::kFloat, target_logits);
  vector(seeds, "seeds", batch, "batch", at::kLong, target_logits);
  vector(positions, "positions", batch, "batch", at::kLong, target_logits);
  TORCH_CHECK_VALUE(max_spec_len >= 0, "max_spec_len must be >= 0, got ", std::to_string(max_spec_len));
  return VerifySizes{batch, num_tokens, vocab, max_spec_len + 1};
}

}  // namespace specops
