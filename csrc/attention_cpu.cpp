// C++ CPU kernels of the paged-attention ops: reshape_and_cache and paged_attention.
// Float32 accumulation whatever the cache dtype. They never read or write out of bounds,
// even when the Python value checks were skipped: slots outside the cache are skipped,
// block ids outside [0, num_blocks) are masked out, sequence lengths are clamped to what
// the block table can address, and query ranges are clamped to the query rows.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "attention.h"

namespace specops {
namespace {

// ---- reshape_and_cache: one task per new token, copying Hkv * D elements twice ----

template <typename scalar_t>
void copy_row(const scalar_t* src, scalar_t* dst, int64_t count) {
  std::copy(src, src + count, dst);
}

void reshape_and_cache_cpu(const at::Tensor& key,          // [N, Hkv, D]
                           const at::Tensor& value,        // [N, Hkv, D]
                           at::Tensor key_cache,           // [num_blocks, block_size, Hkv, D]
                           at::Tensor value_cache,         // [num_blocks, block_size, Hkv, D]
                           const at::Tensor& slot_mapping  // [N] int64, -1 = padding
) {
  const CacheSizes s = check_reshape_and_cache(key, value, key_cache, value_cache, slot_mapping);
  const int64_t row = s.num_kv_heads * s.head_dim;  // a slot's elements: caches are contiguous
  const int64_t num_slots = s.num_blocks * s.block_size;
  const int64_t* slots = slot_mapping.data_ptr<int64_t>();
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, key.scalar_type(), "reshape_and_cache_cpu", [&] {
    const scalar_t* k = key.data_ptr<scalar_t>();
    const scalar_t* v = value.data_ptr<scalar_t>();
    scalar_t* kc = key_cache.data_ptr<scalar_t>();
    scalar_t* vc = value_cache.data_ptr<scalar_t>();
    at::parallel_for(0, s.num_tokens, 16, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) {
        const int64_t slot = slots[i];
        if (slot < 0 || slot >= num_slots) continue;  // -1: padding; beyond the cache: skipped
        copy_row(k + i * row, kc + slot * row, row);
        copy_row(v + i * row, vc + slot * row, row);
      }
    });
  });
}

// ---- paged_attention: one task per (query row, head) ----

// The sequence and in-sequence index of every query row (-1: no sequence owns the row).
struct RowOwner {
  int64_t seq;
  int64_t index;  // j, 0-based among the sequence's query rows
  int64_t q_len;
};

std::vector<RowOwner> row_owners(const int32_t* cu, int64_t batch, int64_t num_query_tokens) {
  std::vector<RowOwner> owners(num_query_tokens, RowOwner{-1, 0, 0});
  for (int64_t b = 0; b < batch; ++b) {
    const int64_t start = std::clamp<int64_t>(cu[b], 0, num_query_tokens);
    const int64_t end = std::clamp<int64_t>(cu[b + 1], start, num_query_tokens);
    for (int64_t t = start; t < end; ++t) owners[t] = RowOwner{b, t - start, end - start};
  }
  return owners;
}

// One query row of one head over its visible keys, two passes over float32 logits:
// reads (visible keys) * D elements of each cache, writes D outputs and one LSE.
template <typename scalar_t>
void attend_row(const scalar_t* q,            // [D]
                const scalar_t* key_cache,    // [num_blocks, block_size, Hkv, D]
                const scalar_t* value_cache,  // [num_blocks, block_size, Hkv, D]
                const int32_t* blocks,        // [max_blocks], this sequence's block table row
                int64_t kv_head, int64_t first_key, int64_t last_key, const AttentionSizes& s, float scale,
                float soft_cap, std::vector<float>& logits, std::vector<float>& acc, scalar_t* out,
                float* lse) {
  const int64_t d = s.head_dim;
  const int64_t token_stride = s.num_kv_heads * d;
  logits.assign(std::max<int64_t>(last_key - first_key + 1, 0), 0.0f);
  std::fill(acc.begin(), acc.end(), 0.0f);
  float max_logit = -std::numeric_limits<float>::infinity();
  const auto offset_of = [&](int64_t j) -> int64_t {  // element offset of key j, -1 if unmapped
    const int64_t block = blocks[j / s.block_size];
    if (block < 0 || block >= s.num_blocks) return -1;
    return (block * s.block_size + j % s.block_size) * token_stride + kv_head * d;
  };
  for (int64_t j = first_key; j <= last_key; ++j) {
    const int64_t offset = offset_of(j);
    float logit = -std::numeric_limits<float>::infinity();
    if (offset >= 0) {
      const scalar_t* k = key_cache + offset;
      float dot = 0.0f;
      for (int64_t i = 0; i < d; ++i) dot += static_cast<float>(q[i]) * static_cast<float>(k[i]);
      logit = dot * scale;
      if (soft_cap > 0.0f) logit = soft_cap * std::tanh(logit / soft_cap);
    }
    logits[j - first_key] = logit;
    max_logit = std::max(max_logit, logit);
  }
  if (max_logit == -std::numeric_limits<float>::infinity()) {  // no visible key
    for (int64_t i = 0; i < d; ++i) out[i] = static_cast<scalar_t>(0.0f);
    if (lse != nullptr) *lse = max_logit;
    return;
  }
  float sum = 0.0f;
  for (int64_t j = first_key; j <= last_key; ++j) {
    const int64_t offset = offset_of(j);
    if (offset < 0) continue;
    const float p = std::exp(logits[j - first_key] - max_logit);
    sum += p;
    const scalar_t* v = value_cache + offset;
    for (int64_t i = 0; i < d; ++i) acc[i] += p * static_cast<float>(v[i]);
  }
  for (int64_t i = 0; i < d; ++i) out[i] = static_cast<scalar_t>(acc[i] / sum);
  if (lse != nullptr) *lse = max_logit + std::log(sum);
}

std::tuple<at::Tensor, at::Tensor> paged_attention_cpu(
    const at::Tensor& query,          // [Q, Hq, D]
    const at::Tensor& key_cache,      // [num_blocks, block_size, Hkv, D]
    const at::Tensor& value_cache,    // [num_blocks, block_size, Hkv, D]
    const at::Tensor& block_table,    // [B, max_blocks] int32
    const at::Tensor& seq_lens,       // [B] int32
    const at::Tensor& cu_query_lens,  // [B + 1] int32
    double scale, int64_t sliding_window, double soft_cap, bool return_lse,
    int64_t max_query_len) {  // a tiling hint: checked, not needed here
  const AttentionSizes s = check_paged_attention(query, key_cache, value_cache, block_table, seq_lens,
                                                 cu_query_lens, sliding_window, soft_cap, max_query_len);
  at::Tensor out = at::empty_like(query);  // [Q, Hq, D]
  at::Tensor lse = return_lse ? at::empty({s.num_query_tokens, s.num_heads}, query.options().dtype(at::kFloat))
                              : at::empty({0, 0}, query.options().dtype(at::kFloat));
  const std::vector<RowOwner> owners =
      row_owners(cu_query_lens.data_ptr<int32_t>(), s.batch, s.num_query_tokens);
  const int32_t* lens = seq_lens.data_ptr<int32_t>();
  const int32_t* table = block_table.data_ptr<int32_t>();
  const int64_t max_keys = s.max_blocks * s.block_size;  // what a block-table row can address
  const int64_t group = s.num_heads / s.num_kv_heads;
  float* lse_ptr = return_lse ? lse.data_ptr<float>() : nullptr;
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, query.scalar_type(), "paged_attention_cpu", [&] {
    const scalar_t* q = query.data_ptr<scalar_t>();
    const scalar_t* kc = key_cache.data_ptr<scalar_t>();
    const scalar_t* vc = value_cache.data_ptr<scalar_t>();
    scalar_t* o = out.data_ptr<scalar_t>();
    at::parallel_for(0, s.num_query_tokens * s.num_heads, 4, [&](int64_t begin, int64_t end) {
      std::vector<float> logits, acc(s.head_dim);
      for (int64_t task = begin; task < end; ++task) {
        const int64_t t = task / s.num_heads, h = task % s.num_heads;
        const RowOwner owner = owners[t];
        int64_t first_key = 0, last_key = -1;  // inclusive range of visible keys
        if (owner.seq >= 0) {
          const int64_t seq_len = std::clamp<int64_t>(lens[owner.seq], 0, max_keys);
          const int64_t position = seq_len - owner.q_len + owner.index;  // bottom-right causal
          last_key = std::min(position, seq_len - 1);
          if (sliding_window > 0) first_key = std::max<int64_t>(0, position - sliding_window + 1);
        }
        const int32_t* blocks = table + std::max<int64_t>(owner.seq, 0) * s.max_blocks;
        attend_row<scalar_t>(q + task * s.head_dim, kc, vc, blocks, h / group, first_key, last_key, s,
                             static_cast<float>(scale), static_cast<float>(soft_cap), logits, acc,
                             o + task * s.head_dim, lse_ptr != nullptr ? lse_ptr + task : nullptr);
      }
    });
  });
  return {out, lse};
}

}  // namespace

TORCH_LIBRARY_IMPL(specops, CPU, m) {
  m.impl("reshape_and_cache", &reshape_and_cache_cpu);
  m.impl("paged_attention", &paged_attention_cpu);
}

}  // namespace specops
