// Argument checks of sampling_value_stats (devices, dtypes, contiguity; no device sync).
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

}  // namespace specops
