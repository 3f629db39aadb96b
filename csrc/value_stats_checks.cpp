// Argument checks of sampling_value_stats and paged_attention_value_stats (devices,
// dtypes, contiguity, and the attention tables' shapes; no device sync).
#include <string>

#include "check_messages.h"
#include "value_stats.h"

namespace specops {
namespace {

void check_one(const std::optional<at::Tensor>& t, const char* name, const at::Tensor& cu,
               std::initializer_list<at::ScalarType> dtypes, const char* dtype_names) {
  if (!t.has_value()) return;
  TORCH_CHECK_VALUE(t->device() == cu.device(), name, " must be on the same device as cu_num_draft_tokens (",
                    cu.device().str(), "), got ", t->device().str());
  bool known = false;
  for (const auto dtype : dtypes) known = known || t->scalar_type() == dtype;
  TORCH_CHECK_TYPE(known, name, " must be ", dtype_names, ", got ", t->scalar_type());
  TORCH_CHECK_VALUE(t->is_contiguous(), name, " must be contiguous");
}

}  // namespace

void check_sampling_value_stats(const ValueStatsArgs& args) {
  const at::Tensor& cu = args.cu;
  TORCH_CHECK_TYPE(cu.scalar_type() == at::kInt || cu.scalar_type() == at::kLong,
                   "cu_num_draft_tokens must be int32 or int64, got ", cu.scalar_type());
  TORCH_CHECK_VALUE(cu.is_contiguous(), "cu_num_draft_tokens must be contiguous");
  check_one(args.ids, "token_ids", cu, {at::kInt, at::kLong}, "int32 or int64");
  check_one(args.target, "target_logits", cu, {at::kFloat, at::kBFloat16, at::kHalf},
            "float32, bfloat16 or float16");
  check_one(args.bonus, "bonus_logits", cu, {at::kFloat, at::kBFloat16, at::kHalf},
            "float32, bfloat16 or float16");
  check_one(args.temperature, "temperature", cu, {at::kFloat}, "float32");
  check_one(args.top_p, "top_p", cu, {at::kFloat}, "float32");
}

void check_paged_attention_value_stats(const at::Tensor& block_table, const at::Tensor& seq_lens,
                                       const at::Tensor& cu_query_lens, int64_t block_size) {
  const auto int32_table = [&](const at::Tensor& t, const char* name) {
    TORCH_CHECK_VALUE(t.device() == block_table.device(), name, " must be on the same device as block_table (",
                      block_table.device().str(), "), got ", t.device().str());
    TORCH_CHECK_TYPE(t.scalar_type() == at::kInt, name, " must be int32, got ", t.scalar_type());
    TORCH_CHECK_VALUE(t.is_contiguous(), name, " must be contiguous");
  };
  int32_table(block_table, "block_table");
  int32_table(seq_lens, "seq_lens");
  int32_table(cu_query_lens, "cu_query_lens");
  TORCH_CHECK_VALUE(block_table.dim() == 2, "block_table must have shape [batch, max_blocks], got ",
                    shape_str(block_table));
  const int64_t batch = block_table.size(0);
  TORCH_CHECK_VALUE(seq_lens.dim() == 1 && seq_lens.size(0) == batch, "seq_lens must have shape [batch] = [",
                    num(batch), "], got ", shape_str(seq_lens));
  TORCH_CHECK_VALUE(cu_query_lens.dim() == 1 && cu_query_lens.size(0) == batch + 1,
                    "cu_query_lens must have shape [batch + 1] = [", num(batch + 1), "], got ",
                    shape_str(cu_query_lens));
  TORCH_CHECK_VALUE(block_size >= 1, "block_size must be >= 1, got ", num(block_size));
}

}  // namespace specops
