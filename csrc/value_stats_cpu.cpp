// C++ CPU kernels of sampling_value_stats and paged_attention_value_stats: one pass over
// each checked tensor.
#include <torch/library.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <limits>

#include "sampling.h"  // token_ids
#include "value_stats.h"

namespace specops {
namespace {

// Whether a logits tensor holds NaN or +-inf, tested on each element's bits.
bool any_non_finite(const std::optional<at::Tensor>& logits) {
  if (!logits.has_value() || logits->numel() == 0) return false;
  const uint32_t exponent_bits = exponent_bits_of(logits->scalar_type());
  const int64_t n = logits->numel();
  const char* data = static_cast<const char*>(logits->data_ptr());
  if (logits->element_size() == 4) {
    for (int64_t i = 0; i < n; ++i) {
      uint32_t bits;
      std::memcpy(&bits, data + 4 * i, 4);
      if (non_finite_bits(bits, exponent_bits)) return true;
    }
    return false;
  }
  for (int64_t i = 0; i < n; ++i) {
    uint16_t bits;
    std::memcpy(&bits, data + 2 * i, 2);
    if (non_finite_bits(bits, exponent_bits)) return true;
  }
  return false;
}

template <typename Bad>
bool any_float(const std::optional<at::Tensor>& t, Bad bad) {
  if (!t.has_value()) return false;
  const float* v = t->data_ptr<float>();
  return std::any_of(v, v + t->numel(), bad);
}

at::Tensor sampling_value_stats_cpu(const at::Tensor& cu_num_draft_tokens, const std::optional<at::Tensor>& ids_arg,
                                    const std::optional<at::Tensor>& target_logits,
                                    const std::optional<at::Tensor>& bonus_logits,
                                    const std::optional<at::Tensor>& temperature,
                                    const std::optional<at::Tensor>& top_p) {
  check_sampling_value_stats({cu_num_draft_tokens, ids_arg, target_logits, bonus_logits, temperature, top_p});
  constexpr int64_t kMax = std::numeric_limits<int64_t>::max(), kMin = std::numeric_limits<int64_t>::min();
  int64_t min_count = kMax, max_count = kMin, previous = 0;
  const int64_t batch = cu_num_draft_tokens.numel();
  const TokenIds cu_values = token_ids(cu_num_draft_tokens);  // int32 | int64
  for (int64_t b = 0; b < batch; ++b) {
    const int64_t cu = cu_values[b];
    min_count = std::min(min_count, cu - previous);
    max_count = std::max(max_count, cu - previous);
    previous = cu;
  }
  int64_t min_id = kMax, max_id = kMin;
  if (ids_arg.has_value()) {
    const TokenIds ids = token_ids(*ids_arg);
    for (int64_t i = 0; i < ids_arg->numel(); ++i) min_id = std::min(min_id, ids[i]), max_id = std::max(max_id, ids[i]);
  }
  at::Tensor out = at::empty({kNumValueStats}, cu_num_draft_tokens.options().dtype(at::kDouble));
  double* stats = out.data_ptr<double>();
  stats[kMinCount] = static_cast<double>(min_count);
  stats[kMaxCount] = static_cast<double>(max_count);
  stats[kLastCu] = static_cast<double>(previous);
  stats[kMinId] = static_cast<double>(min_id);
  stats[kMaxId] = static_cast<double>(max_id);
  stats[kTargetNonFinite] = any_non_finite(target_logits);
  stats[kBonusNonFinite] = any_non_finite(bonus_logits);
  stats[kBadTemperature] = any_float(temperature, [](float t) { return !(t >= 0.f); });
  stats[kBadTopP] = any_float(top_p, [](float p) { return !(p > 0.f); });
  return out;
}

at::Tensor paged_attention_value_stats_cpu(const at::Tensor& block_table, const at::Tensor& seq_lens,
                                           const at::Tensor& cu_query_lens, int64_t block_size, int64_t num_blocks) {
  check_paged_attention_value_stats(block_table, seq_lens, cu_query_lens, block_size);
  const int64_t batch = block_table.size(0), max_blocks = block_table.size(1);
  const int32_t* table = block_table.data_ptr<int32_t>();
  const int32_t* lens = seq_lens.data_ptr<int32_t>();
  const int32_t* cu = cu_query_lens.data_ptr<int32_t>();
  int64_t min_query_len = std::numeric_limits<int64_t>::max(), min_slack = min_query_len;
  int64_t most_blocks = std::numeric_limits<int64_t>::min();
  bool bad_block_id = false;
  for (int64_t b = 0; b < batch; ++b) {
    const int64_t query_len = int64_t{cu[b + 1]} - cu[b];
    const int64_t used = blocks_used(lens[b], block_size);
    min_query_len = std::min(min_query_len, query_len);
    min_slack = std::min(min_slack, lens[b] - query_len);
    most_blocks = std::max(most_blocks, used);
    for (int64_t j = 0; j < std::min(used, max_blocks); ++j) {
      const int64_t id = table[b * max_blocks + j];
      bad_block_id = bad_block_id || id < 0 || id >= num_blocks;
    }
  }
  at::Tensor out = at::empty({kNumAttentionStats}, block_table.options().dtype(at::kDouble));
  double* stats = out.data_ptr<double>();
  stats[kFirstQueryCu] = cu[0];
  stats[kLastQueryCu] = cu[batch];
  stats[kMinQueryLen] = static_cast<double>(min_query_len);
  stats[kMinSlack] = static_cast<double>(min_slack);
  stats[kMostBlocks] = static_cast<double>(most_blocks);
  stats[kBadBlockId] = bad_block_id;
  return out;
}

}  // namespace

TORCH_LIBRARY_IMPL(specops, CPU, m) {
  m.impl("sampling_value_stats", &sampling_value_stats_cpu);
  m.impl("paged_attention_value_stats", &paged_attention_value_stats_cpu);
}

}  // namespace specops
