// The value statistics behind the ops' value checks (specops/_checks.py): one op a family,
// sampling_value_stats and paged_attention_value_stats, that reads every checked tensor once
// and returns the few numbers the checks decide on, so that validate=True costs one launch
// pair and one device sync. reference/checks.py states the same statistics in torch.
#pragma once
#include <ATen/ATen.h>

#include <cstdint>
#include <optional>

#include "token_ids.h"

namespace specops {

// Slots of the float64 [kNumValueStats] result. Counts are cu[0] and each step
// cu[b] - cu[b - 1]; with no requests (no ids) the min slot holds 2^63 - 1 and the max slot
// -2^63, as doubles. The flags are 0 or 1.
enum ValueStat : int {
  kMinCount = 0,       // smallest draft count
  kMaxCount = 1,       // largest draft count
  kLastCu = 2,         // cu[B - 1] (0 when B = 0)
  kMinId = 3,          // smallest token id
  kMaxId = 4,          // largest token id
  kTargetNonFinite = 5,  // target_logits holds NaN or +-inf
  kBonusNonFinite = 6,   // bonus_logits holds NaN or +-inf
  kBadTemperature = 7,   // some temperature is not >= 0 (NaN included)
  kBadTopP = 8,          // some top_p is not > 0 (NaN included)
  kNumValueStats = 9,
};

// The tensors sampling_value_stats reads, checked: every one on cu's device and contiguous,
// cu and ids int32 | int64, logits float32 | bfloat16 | float16, temperature and top_p
// float32. Shapes are free: each tensor is read as its flat numel.
struct ValueStatsArgs {
  const at::Tensor& cu;                       // cu_num_draft_tokens [B]
  const std::optional<at::Tensor>& ids;       // token ids [T]
  const std::optional<at::Tensor>& target;    // target_logits [T, V]
  const std::optional<at::Tensor>& bonus;     // bonus_logits [B, V]
  const std::optional<at::Tensor>& temperature;  // [B]
  const std::optional<at::Tensor>& top_p;        // [B]
};

void check_sampling_value_stats(const ValueStatsArgs& args);

// Slots of paged_attention_value_stats's float64 [kNumAttentionStats] result (empty min /
// max slots as above, with no sequence).
enum AttentionStat : int {
  kFirstQueryCu = 0,   // cu_query_lens[0]
  kLastQueryCu = 1,    // cu_query_lens[B]
  kMinQueryLen = 2,    // smallest cu_query_lens[b + 1] - cu_query_lens[b]
  kMinSlack = 3,       // smallest seq_lens[b] - query length b
  kMostBlocks = 4,     // largest ceil(max(seq_lens[b], 0) / block_size)
  kBadBlockId = 5,     // 1 if a block id a sequence uses (the first ceil(seq_len / block_size)
                       // of its row, at most max_blocks) is outside [0, num_blocks)
  kNumAttentionStats = 6,
};

// block_table [B, max_blocks], seq_lens [B], cu_query_lens [B + 1], all int32, contiguous, on
// one device; block_size >= 1.
void check_paged_attention_value_stats(const at::Tensor& block_table, const at::Tensor& seq_lens,
                                       const at::Tensor& cu_query_lens, int64_t block_size);

// The blocks a sequence of seq_len keys uses (a negative length uses none).
SPECOPS_HOST_DEVICE int64_t blocks_used(int64_t seq_len, int64_t block_size) {
  return seq_len > 0 ? (seq_len + block_size - 1) / block_size : 0;
}

// A float32, bfloat16 or float16 value is NaN or +-inf iff its exponent bits are all ones:
// the logits are tested on their bits, so every dtype is one integer test an element.
constexpr uint32_t kFloat32ExponentBits = 0x7F800000u;
constexpr uint32_t kBFloat16ExponentBits = 0x7F80u;
constexpr uint32_t kFloat16ExponentBits = 0x7C00u;

inline uint32_t exponent_bits_of(at::ScalarType dtype) {
  return dtype == at::kFloat ? kFloat32ExponentBits
                             : dtype == at::kBFloat16 ? kBFloat16ExponentBits : kFloat16ExponentBits;
}

SPECOPS_HOST_DEVICE bool non_finite_bits(uint32_t bits, uint32_t exponent_bits) {
  return (bits & exponent_bits) == exponent_bits;
}

// A 32-bit word of logits: one float32, or two 16-bit values (exponent_bits < 2^16).
SPECOPS_HOST_DEVICE bool word_non_finite(uint32_t word, uint32_t exponent_bits) {
  if (exponent_bits > 0xFFFFu) return non_finite_bits(word, exponent_bits);
  return non_finite_bits(word & 0xFFFFu, exponent_bits) | non_finite_bits(word >> 16, exponent_bits);
}

}  // namespace specops
