// Argument checks of the sampling ops, run by the CPU and CUDA launchers before any
// kernel. Shapes and dtypes only: checks of values (ids inside the vocab, consistent
// cu_num_draft_tokens) need a device sync, so the Python layer does them
// (specops/_checks.py) and the kernels stay memory-safe when they are skipped.
#include <ATen/ATen.h>

#include <string>

#include "check_messages.h"
#include "sampling.h"

namespace specops {
namespace {

void check_device(const at::Tensor& t, const char* name, const at::Tensor& ref, const char* ref_name) {
  TORCH_CHECK_VALUE(t.device() == ref.device(), name, " must be on the same device as ", ref_name,
                    " (", ref.device().str(), "), got ", t.device().str());
}

void check_dtype(const at::Tensor& t, const char* name, at::ScalarType dtype) {
  TORCH_CHECK_TYPE(t.scalar_type() == dtype, name, " must be ", dtype, ", got ", t.scalar_type());
}

void check_token_ids(const at::Tensor& t, const char* name) {
  TORCH_CHECK_TYPE(t.scalar_type() == at::kInt || t.scalar_type() == at::kLong, name,
                   " must be int32 or int64, got ", t.scalar_type());
}

void check_1d(const at::Tensor& t, const char* name, int64_t size, const char* size_name) {
  TORCH_CHECK_VALUE(t.dim() == 1 && t.size(0) == size, name, " must have shape [", size_name,
                    "] = [", num(size), "], got ", shape_str(t));
  TORCH_CHECK_VALUE(t.is_contiguous(), name, " must be contiguous");
}

void check_rows(const at::Tensor& t, const char* name, int64_t rows, const char* rows_name,
                int64_t vocab) {
  TORCH_CHECK_VALUE(t.dim() == 2 && t.size(0) == rows && t.size(1) == vocab, name,
                    " must have shape [", rows_name, ", vocab] = [", num(rows), ", ", num(vocab), "], got ",
                    shape_str(t));
  TORCH_CHECK_VALUE(t.is_contiguous(), name, " must be contiguous");
}

int64_t check_cu_num_draft_tokens(const at::Tensor& cu) {
  TORCH_CHECK_VALUE(cu.dim() == 1, "cu_num_draft_tokens must have shape [batch], got ",
                    shape_str(cu));
  check_dtype(cu, "cu_num_draft_tokens", at::kInt);
  TORCH_CHECK_VALUE(cu.is_contiguous(), "cu_num_draft_tokens must be contiguous");
  return cu.size(0);
}

void check_output(const at::Tensor& out, const at::Tensor& cu, int64_t batch) {
  check_device(out, "output_token_ids", cu, "cu_num_draft_tokens");
  check_dtype(out, "output_token_ids", at::kInt);
  TORCH_CHECK_VALUE(out.dim() == 2 && out.size(0) == batch && out.size(1) >= 1,
                    "output_token_ids must have shape [batch, max_spec_len + 1] with batch = ", num(batch),
                    ", got ", shape_str(out));
  TORCH_CHECK_VALUE(out.is_contiguous(), "output_token_ids must be contiguous");
}

void check_is_greedy(const std::optional<at::Tensor>& is_greedy, const at::Tensor& cu, int64_t batch) {
  if (!is_greedy.has_value()) return;
  check_device(*is_greedy, "is_greedy", cu, "cu_num_draft_tokens");
  check_dtype(*is_greedy, "is_greedy", at::kBool);
  check_1d(*is_greedy, "is_greedy", batch, "batch");
}

void check_ids_1d(const at::Tensor& t, const char* name, const at::Tensor& cu, int64_t size,
                  const char* size_name) {
  check_device(t, name, cu, "cu_num_draft_tokens");
  check_token_ids(t, name);
  check_1d(t, name, size, size_name);
}

}  // namespace

RaggedSizes check_expand_to_tokens(const at::Tensor& values, const at::Tensor& cu_num_draft_tokens,
                                   int64_t num_tokens, std::optional<double> replace_from) {
  const int64_t batch = check_cu_num_draft_tokens(cu_num_draft_tokens);
  check_device(values, "values", cu_num_draft_tokens, "cu_num_draft_tokens");
  const auto dtype = values.scalar_type();
  TORCH_CHECK_TYPE(dtype == at::kFloat || dtype == at::kInt || dtype == at::kLong,
                   "values must be float32, int32 or int64, got ", dtype);
  check_1d(values, "values", batch, "batch");
  TORCH_CHECK_VALUE(num_tokens >= 0, "num_tokens must be >= 0, got ", num(num_tokens));
  TORCH_CHECK_TYPE(!replace_from.has_value() || dtype == at::kFloat,
                   "replace_from is only supported for float32 values, got ", dtype);
  return RaggedSizes{batch, num_tokens, 0, 0};
}

RaggedSizes check_rejection_greedy_sample(const at::Tensor& output_token_ids,
                                          const at::Tensor& cu_num_draft_tokens,
                                          const at::Tensor& draft_token_ids,
                                          const at::Tensor& target_argmax,
                                          const at::Tensor& bonus_token_ids,
                                          const std::optional<at::Tensor>& is_greedy) {
  const int64_t batch = check_cu_num_draft_tokens(cu_num_draft_tokens);
  check_output(output_token_ids, cu_num_draft_tokens, batch);
  TORCH_CHECK_VALUE(draft_token_ids.dim() == 1, "draft_token_ids must have shape [num_tokens], got ",
                    shape_str(draft_token_ids));
  const int64_t num_tokens = draft_token_ids.size(0);
  check_ids_1d(draft_token_ids, "draft_token_ids", cu_num_draft_tokens, num_tokens, "num_tokens");
  check_ids_1d(target_argmax, "target_argmax", cu_num_draft_tokens, num_tokens, "num_tokens");
  check_ids_1d(bonus_token_ids, "bonus_token_ids", cu_num_draft_tokens, batch, "batch");
  check_is_greedy(is_greedy, cu_num_draft_tokens, batch);
  return RaggedSizes{batch, num_tokens, 0, output_token_ids.size(1)};
}

RaggedSizes check_rejection_random_sample(
    const at::Tensor& output_token_ids, const at::Tensor& cu_num_draft_tokens,
    const at::Tensor& draft_token_ids, const std::optional<at::Tensor>& draft_probs,
    const at::Tensor& target_probs, const at::Tensor& bonus_token_ids,
    const at::Tensor& recovered_token_ids, const at::Tensor& uniform_probs,
    const std::optional<at::Tensor>& is_greedy) {
  const int64_t batch = check_cu_num_draft_tokens(cu_num_draft_tokens);
  check_output(output_token_ids, cu_num_draft_tokens, batch);
  TORCH_CHECK_VALUE(draft_token_ids.dim() == 1, "draft_token_ids must have shape [num_tokens], got ",
                    shape_str(draft_token_ids));
  const int64_t num_tokens = draft_token_ids.size(0);
  check_ids_1d(draft_token_ids, "draft_token_ids", cu_num_draft_tokens, num_tokens, "num_tokens");
  check_device(target_probs, "target_probs", cu_num_draft_tokens, "cu_num_draft_tokens");
  check_dtype(target_probs, "target_probs", at::kFloat);
  TORCH_CHECK_VALUE(target_probs.dim() == 2, "target_probs must have shape [num_tokens, vocab], got ",
                    shape_str(target_probs));
  const int64_t vocab = target_probs.size(1);
  TORCH_CHECK_VALUE(vocab >= 1, "target_probs must have a vocab of at least 1, got ", shape_str(target_probs));
  check_rows(target_probs, "target_probs", num_tokens, "num_tokens", vocab);
  if (draft_probs.has_value()) {
    check_device(*draft_probs, "draft_probs", cu_num_draft_tokens, "cu_num_draft_tokens");
    check_dtype(*draft_probs, "draft_probs", at::kFloat);
    check_rows(*draft_probs, "draft_probs", num_tokens, "num_tokens", vocab);
  }
  check_ids_1d(bonus_token_ids, "bonus_token_ids", cu_num_draft_tokens, batch, "batch");
  check_ids_1d(recovered_token_ids, "recovered_token_ids", cu_num_draft_tokens, num_tokens, "num_tokens");
  check_device(uniform_probs, "uniform_probs", cu_num_draft_tokens, "cu_num_draft_tokens");
  check_dtype(uniform_probs, "uniform_probs", at::kFloat);
  check_1d(uniform_probs, "uniform_probs", num_tokens, "num_tokens");
  check_is_greedy(is_greedy, cu_num_draft_tokens, batch);
  return RaggedSizes{batch, num_tokens, vocab, output_token_ids.size(1)};
}

RaggedSizes check_sample_recovered_tokens(const at::Tensor& cu_num_draft_tokens,
                                          const at::Tensor& draft_token_ids,
                                          const std::optional<at::Tensor>& draft_probs,
                                          const at::Tensor& target_probs,
                                          const at::Tensor& exponentials) {
  const int64_t batch = check_cu_num_draft_tokens(cu_num_draft_tokens);
  TORCH_CHECK_VALUE(draft_token_ids.dim() == 1, "draft_token_ids must have shape [num_tokens], got ",
                    shape_str(draft_token_ids));
  const int64_t num_tokens = draft_token_ids.size(0);
  check_ids_1d(draft_token_ids, "draft_token_ids", cu_num_draft_tokens, num_tokens, "num_tokens");
  check_device(target_probs, "target_probs", cu_num_draft_tokens, "cu_num_draft_tokens");
  check_dtype(target_probs, "target_probs", at::kFloat);
  TORCH_CHECK_VALUE(target_probs.dim() == 2, "target_probs must have shape [num_tokens, vocab], got ",
                    shape_str(target_probs));
  const int64_t vocab = target_probs.size(1);
  TORCH_CHECK_VALUE(vocab >= 1, "target_probs must have a vocab of at least 1, got ", shape_str(target_probs));
  TORCH_CHECK_VALUE(vocab <= (int64_t{1} << 30), "target_probs vocab must be at most 2^30, got ", num(vocab));
  check_rows(target_probs, "target_probs", num_tokens, "num_tokens", vocab);
  if (draft_probs.has_value()) {
    check_device(*draft_probs, "draft_probs", cu_num_draft_tokens, "cu_num_draft_tokens");
    check_dtype(*draft_probs, "draft_probs", at::kFloat);
    check_rows(*draft_probs, "draft_probs", num_tokens, "num_tokens", vocab);
  }
  check_device(exponentials, "exponentials", cu_num_draft_tokens, "cu_num_draft_tokens");
  check_dtype(exponentials, "exponentials", at::kFloat);
  check_rows(exponentials, "exponentials", batch, "batch", vocab);
  return RaggedSizes{batch, num_tokens, vocab, 0};
}

}  // namespace specops
