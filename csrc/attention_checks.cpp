// Argument checks of the paged-attention ops (shapes, dtypes, devices; no device sync).
// Numbers go into messages through std::to_string (see check_messages.h for why).
#include <string>

#include "check_messages.h"
#include "attention.h"

namespace specops {
namespace {

void same_device(const at::Tensor& t, const char* name, const at::Tensor& ref, const char* ref_name) {
  TORCH_CHECK_VALUE(t.device() == ref.device(), name, " must be on the same device as ", ref_name, " (",
                    ref.device().str(), "), got ", t.device().str());
}

void floating(const at::Tensor& t, const char* name) {
  const auto dtype = t.scalar_type();
  TORCH_CHECK_TYPE(dtype == at::kFloat || dtype == at::kBFloat16 || dtype == at::kHalf, name,
                   " must be float32, bfloat16 or float16, got ", dtype);
}

void contiguous(const at::Tensor& t, const char* name) {
  TORCH_CHECK_VALUE(t.is_contiguous(), name, " must be contiguous");
}

// key_cache [num_blocks, block_size, Hkv, D]; value_cache the same shape and dtype.
void check_caches(const at::Tensor& key_cache, const at::Tensor& value_cache) {
  floating(key_cache, "key_cache");
  TORCH_CHECK_VALUE(key_cache.dim() == 4 && key_cache.size(1) >= 1 && key_cache.size(2) >= 1,
                    "key_cache must have shape [num_blocks, block_size, num_kv_heads, head_dim], got ",
                    shape_str(key_cache));
  contiguous(key_cache, "key_cache");
  same_device(value_cache, "value_cache", key_cache, "key_cache");
  TORCH_CHECK_TYPE(value_cache.scalar_type() == key_cache.scalar_type(), "value_cache must be ",
                   key_cache.scalar_type(), " like key_cache, got ", value_cache.scalar_type());
  TORCH_CHECK_VALUE(value_cache.sizes() == key_cache.sizes(), "value_cache must have the shape of key_cache ",
                    shape_str(key_cache), ", got ", shape_str(value_cache));
  contiguous(value_cache, "value_cache");
}

// An int32 vector [size].
void int_vector(const at::Tensor& t, const char* name, int64_t size, const char* size_name,
                const at::Tensor& ref) {
  same_device(t, name, ref, "query");
  TORCH_CHECK_TYPE(t.scalar_type() == at::kInt, name, " must be int32, got ", t.scalar_type());
  TORCH_CHECK_VALUE(t.dim() == 1 && t.size(0) == size, name, " must have shape [", size_name, "] = [",
                    std::to_string(size), "], got ", shape_str(t));
  contiguous(t, name);
}

// key or value [N, Hkv, D], dtype and (Hkv, D) of key_cache.
void new_rows(const at::Tensor& t, const char* name, const at::Tensor& key_cache) {
  same_device(t, name, key_cache, "key_cache");
  TORCH_CHECK_TYPE(t.scalar_type() == key_cache.scalar_type(), name, " must be ", key_cache.scalar_type(),
                   " like key_cache, got ", t.scalar_type());
  TORCH_CHECK_VALUE(t.dim() == 3 && t.size(1) == key_cache.size(2) && t.size(2) == key_cache.size(3), name,
                    " must have shape [num_tokens, num_kv_heads, head_dim] with num_kv_heads = ",
                    std::to_string(key_cache.size(2)), " and head_dim = ", std::to_string(key_cache.size(3)),
                    " as in key_cache, got ", shape_str(t));
  contiguous(t, name);
}

}  // namespace

CacheSizes check_reshape_and_cache(const at::Tensor& key, const at::Tensor& value, const at::Tensor& key_cache,
                                   const at::Tensor& value_cache, const at::Tensor& slot_mapping) {
  check_caches(key_cache, value_cache);
  const int64_t num_kv_heads = key_cache.size(2), head_dim = key_cache.size(3);
  new_rows(key, "key", key_cache);
  new_rows(value, "value", key_cache);
  const int64_t num_tokens = key.size(0);
  TORCH_CHECK_VALUE(value.size(0) == num_tokens, "value must have as many rows as key (",
                    std::to_string(num_tokens), "), got ", shape_str(value));
  same_device(slot_mapping, "slot_mapping", key_cache, "key_cache");
  TORCH_CHECK_TYPE(slot_mapping.scalar_type() == at::kLong, "slot_mapping must be int64, got ",
                   slot_mapping.scalar_type());
  TORCH_CHECK_VALUE(slot_mapping.dim() == 1 && slot_mapping.size(0) == num_tokens,
                    "slot_mapping must have shape [num_tokens] = [", std::to_string(num_tokens), "], got ",
                    shape_str(slot_mapping));
  contiguous(slot_mapping, "slot_mapping");
  return CacheSizes{num_tokens, key_cache.size(0), key_cache.size(1), num_kv_heads, head_dim};
}

AttentionSizes check_paged_attention(const at::Tensor& query, const at::Tensor& key_cache,
                                     const at::Tensor& value_cache, const at::Tensor& block_table,
                                     const at::Tensor& seq_lens, const at::Tensor& cu_query_lens,
                                     int64_t sliding_window, double soft_cap, int64_t max_query_len) {
  floating(query, "query");
  TORCH_CHECK_VALUE(query.dim() == 3 && query.size(1) >= 1 && query.size(2) >= 1,
                    "query must have shape [num_query_tokens, num_heads, head_dim], got ", shape_str(query));
  contiguous(query, "query");
  same_device(key_cache, "key_cache", query, "query");
  check_caches(key_cache, value_cache);
  TORCH_CHECK_TYPE(key_cache.scalar_type() == query.scalar_type(), "key_cache must be ", query.scalar_type(),
                   " like query, got ", key_cache.scalar_type());
  const int64_t num_heads = query.size(1), head_dim = query.size(2), num_kv_heads = key_cache.size(2);
  TORCH_CHECK_VALUE(key_cache.size(3) == head_dim, "key_cache head_dim must equal query's (",
                    std::to_string(head_dim), "), got ", shape_str(key_cache));
  TORCH_CHECK_VALUE(num_heads % num_kv_heads == 0, "query num_heads (", std::to_string(num_heads),
                    ") must be divisible by key_cache num_kv_heads (", std::to_string(num_kv_heads), ")");
  same_device(block_table, "block_table", query, "query");
  TORCH_CHECK_TYPE(block_table.scalar_type() == at::kInt, "block_table must be int32, got ",
                   block_table.scalar_type());
  TORCH_CHECK_VALUE(block_table.dim() == 2, "block_table must have shape [batch, max_blocks], got ",
                    shape_str(block_table));
  contiguous(block_table, "block_table");
  const int64_t batch = block_table.size(0);
  int_vector(seq_lens, "seq_lens", batch, "batch", query);
  int_vector(cu_query_lens, "cu_query_lens", batch + 1, "batch + 1", query);
  TORCH_CHECK_VALUE(sliding_window >= 0, "sliding_window must be >= 0 (0 = off), got ",
                    std::to_string(sliding_window));
  TORCH_CHECK_VALUE(soft_cap >= 0, "soft_cap must be >= 0 (0 = off), got ", std::to_string(soft_cap));
  TORCH_CHECK_VALUE(max_query_len >= 0, "max_query_len must be >= 0 (0 = unknown), got ",
                    std::to_string(max_query_len));
  return AttentionSizes{query.size(0), num_heads, num_kv_heads, head_dim, key_cache.size(0),
                        key_cache.size(1), batch, block_table.size(1)};
}

}  // namespace specops
