// Paged attention: argument checks shared by the CPU (and later CUDA) launchers.
// Shapes, dtypes and devices only; values (block ids, lengths) are checked by the Python
// layer (specops/_checks.py), and the kernels stay in bounds when that is skipped.
#pragma once
#include <ATen/ATen.h>

namespace specops {

struct CacheSizes {
  int64_t num_tokens;    // N, rows of key/value
  int64_t num_blocks;    // blocks in each cache
  int64_t block_size;    // tokens per block
  int64_t num_kv_heads;  // Hkv
  int64_t head_dim;      // D
};

struct AttentionSizes {
  int64_t num_query_tokens;  // Q, all query rows, flattened
  int64_t num_heads;         // Hq
  int64_t num_kv_heads;      // Hkv, divides Hq
  int64_t head_dim;          // D
  int64_t num_blocks;        // blocks in each cache
  int64_t block_size;        // tokens per block
  int64_t batch;             // B
  int64_t max_blocks;        // columns of block_table
};

CacheSizes check_reshape_and_cache(const at::Tensor& key, const at::Tensor& value, const at::Tensor& key_cache,
                                   const at::Tensor& value_cache, const at::Tensor& slot_mapping);

AttentionSizes check_paged_attention(const at::Tensor& query, const at::Tensor& key_cache,
                                     const at::Tensor& value_cache, const at::Tensor& block_table,
                                     const at::Tensor& seq_lens, const at::Tensor& cu_query_lens,
                                     int64_t sliding_window, double soft_cap, int64_t max_query_len);

}  // namespace specops
