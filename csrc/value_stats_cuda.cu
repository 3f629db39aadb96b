// CUDA kernels of sampling_value_stats and paged_attention_value_stats: the statistics of
// the ops' value checks (csrc/value_stats.h), each op in two launches, read by the caller in
// one device sync.
//
// logits_non_finite_kernel: grid of at most 8 CTAs an SM x 256 threads, striding over the
//   target then the bonus logits in 16-byte words; each CTA writes two flags. Moves every
//   logit once (4 V (T + B) bytes in float32), the dominant cost of the checks.
// value_stats_finish_kernel: one CTA of 1024 threads; reduces the CTAs' flags and reads
//   cu_num_draft_tokens, the ids, temperature and top_p (B and T elements) itself.
// block_ids_in_range_kernel: grid of at most 8 CTAs an SM x 256 threads over the block
//   table's B x max_blocks entries (each reads an entry only if its sequence uses it); a flag
//   a CTA.
// attention_stats_finish_kernel: one CTA of 1024 threads; reduces the flags and reads
//   seq_lens and cu_query_lens (B elements).
#include <ATen/ATen.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime.h>
#include <torch/library.h>

#include <algorithm>
#include <climits>
#include <cstdint>

#include "value_stats.h"

namespace specops {
namespace {

constexpr int kScanThreads = 256;
constexpr int kScanUnroll = 4;  // 16-byte words in flight a thread
constexpr int kScanCtasPerSm = 8;
constexpr int kFinishThreads = 1024;

struct LogitsView {
  const unsigned char* data;  // null: no tensor
  int64_t numel;
  int element_size;          // 4 or 2
  uint32_t exponent_bits;    // value_stats.h
};

// Whether this thread's share of one logits tensor holds a non-finite value: the 16-byte
// words of its aligned middle strided over the grid, the few elements before and after it
// by the first threads.
__device__ bool thread_sees_non_finite(const LogitsView v, int64_t thread, int64_t threads) {
  if (v.data == nullptr || v.numel == 0) return false;
  const auto address = reinterpret_cast<uintptr_t>(v.data);
  const int64_t lead = static_cast<int64_t>((16 - address % 16) % 16) / v.element_size;
  const int64_t head = lead < v.numel ? lead : v.numel;
  const int64_t per_word = 16 / v.element_size;
  const int64_t words = (v.numel - head) / per_word;
  const int64_t tail_start = head + words * per_word;
  bool bad = false;
  auto element = [&](int64_t i) {
    const uint32_t bits = v.element_size == 4 ? reinterpret_cast<const uint32_t*>(v.data)[i]
                                              : reinterpret_cast<const uint16_t*>(v.data)[i];
    return non_finite_bits(bits, v.exponent_bits);
  };
  if (thread < head) bad = element(thread);
  if (thread < v.numel - tail_start) bad |= element(tail_start + thread);
  const uint4* body = reinterpret_cast<const uint4*>(v.data + head * v.element_size);
  int64_t w = thread;
  for (; w + (kScanUnroll - 1) * threads < words; w += kScanUnroll * threads) {
    uint4 word[kScanUnroll];
#pragma unroll
    for (int u = 0; u < kScanUnroll; ++u) word[u] = __ldcs(body + w + u * threads);  // read once: stream
#pragma unroll
    for (int u = 0; u < kScanUnroll; ++u) {
      bad |= word_non_finite(word[u].x, v.exponent_bits) | word_non_finite(word[u].y, v.exponent_bits) |
             word_non_finite(word[u].z, v.exponent_bits) | word_non_finite(word[u].w, v.exponent_bits);
    }
  }
  for (; w < words; w += threads) {
    const uint4 word = __ldcs(body + w);
    bad |= word_non_finite(word.x, v.exponent_bits) | word_non_finite(word.y, v.exponent_bits) |
           word_non_finite(word.z, v.exponent_bits) | word_non_finite(word.w, v.exponent_bits);
  }
  return bad;
}

__global__ void logits_non_finite_kernel(LogitsView target,  // [T, V]
                                         LogitsView bonus,   // [B, V]
                                         int32_t* __restrict__ flags) {  // [gridDim.x]: bit 0 target, bit 1 bonus
  const int64_t thread = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
  const int64_t threads = gridDim.x * int64_t{blockDim.x};
  const bool target_bad = __syncthreads_or(thread_sees_non_finite(target, thread, threads));
  const bool bonus_bad = __syncthreads_or(thread_sees_non_finite(bonus, thread, threads));
  if (threadIdx.x == 0) flags[blockIdx.x] = int32_t{target_bad} | int32_t{bonus_bad} << 1;
}

__device__ __forceinline__ int64_t smaller(int64_t a, int64_t b) { return a < b ? a : b; }
__device__ __forceinline__ int64_t larger(int64_t a, int64_t b) { return a > b ? a : b; }

__device__ int64_t load_int(const void* data, bool is_int64, int64_t i) {
  return is_int64 ? static_cast<const int64_t*>(data)[i] : int64_t{static_cast<const int32_t*>(data)[i]};
}

// The CTA-wide min (or max) of one int64 a thread (every thread of the CTA calls it).
__device__ int64_t block_extreme(int64_t v, bool take_max) {
  __shared__ int64_t warp_values[kFinishThreads / 32];
  for (int offset = 16; offset > 0; offset /= 2) {
    const auto other = static_cast<int64_t>(__shfl_xor_sync(0xffffffffu, static_cast<long long>(v), offset));
    v = take_max ? larger(v, other) : smaller(v, other);
  }
  __syncthreads();  // the shared slots may still be read by a previous call
  if (threadIdx.x % 32 == 0) warp_values[threadIdx.x / 32] = v;
  __syncthreads();
  for (int i = 0; i < static_cast<int>(blockDim.x / 32); ++i) {
    v = take_max ? larger(v, warp_values[i]) : smaller(v, warp_values[i]);
  }
  return v;
}

__global__ void value_stats_finish_kernel(const void* __restrict__ cu, bool cu_int64, int64_t batch,  // [B]
                                          const void* __restrict__ ids, bool ids_int64, int64_t num_ids,  // [T]
                                          const float* __restrict__ temperature, int64_t num_temperature,  // [B]
                                          const float* __restrict__ top_p, int64_t num_top_p,              // [B]
                                          const int32_t* __restrict__ flags, int num_flags,  // [scan CTAs]
                                          double* __restrict__ out) {                        // [kNumValueStats]
  int64_t count_lo = LLONG_MAX, count_hi = LLONG_MIN;
  for (int64_t b = threadIdx.x; b < batch; b += blockDim.x) {
    const int64_t count = load_int(cu, cu_int64, b) - (b > 0 ? load_int(cu, cu_int64, b - 1) : 0);
    count_lo = smaller(count_lo, count), count_hi = larger(count_hi, count);
  }
  int64_t id_lo = LLONG_MAX, id_hi = LLONG_MIN;
  for (int64_t i = threadIdx.x; i < num_ids; i += blockDim.x) {
    const int64_t id = load_int(ids, ids_int64, i);
    id_lo = smaller(id_lo, id), id_hi = larger(id_hi, id);
  }
  int32_t flag = 0;
  for (int i = threadIdx.x; i < num_flags; i += blockDim.x) flag |= flags[i];
  bool bad_temperature = false, bad_top_p = false;
  for (int64_t b = threadIdx.x; b < num_temperature; b += blockDim.x) bad_temperature |= !(temperature[b] >= 0.f);
  for (int64_t b = threadIdx.x; b < num_top_p; b += blockDim.x) bad_top_p |= !(top_p[b] > 0.f);
  const bool target_bad = __syncthreads_or(flag & 1);
  const bool bonus_bad = __syncthreads_or(flag & 2);
  bad_temperature = __syncthreads_or(bad_temperature);
  bad_top_p = __syncthreads_or(bad_top_p);
  count_lo = block_extreme(count_lo, false), count_hi = block_extreme(count_hi, true);
  id_lo = block_extreme(id_lo, false), id_hi = block_extreme(id_hi, true);
  if (threadIdx.x != 0) return;
  out[kMinCount] = static_cast<double>(count_lo);
  out[kMaxCount] = static_cast<double>(count_hi);
  out[kLastCu] = batch > 0 ? static_cast<double>(load_int(cu, cu_int64, batch - 1)) : 0.0;
  out[kMinId] = static_cast<double>(id_lo);
  out[kMaxId] = static_cast<double>(id_hi);
  out[kTargetNonFinite] = target_bad;
  out[kBonusNonFinite] = bonus_bad;
  out[kBadTemperature] = bad_temperature;
  out[kBadTopP] = bad_top_p;
}

__global__ void block_ids_in_range_kernel(const int32_t* __restrict__ block_table,  // [B, max_blocks]
                                          const int32_t* __restrict__ seq_lens,     // [B]
                                          int64_t max_blocks, int64_t entries, int64_t block_size,
                                          int64_t num_blocks,
                                          int32_t* __restrict__ flags) {  // [gridDim.x]
  bool bad = false;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < entries; i += gridDim.x * int64_t{blockDim.x}) {
    const int64_t b = i / max_blocks;
    if (i - b * max_blocks < blocks_used(seq_lens[b], block_size)) {
      const int64_t id = block_table[i];
      bad |= id < 0 || id >= num_blocks;
    }
  }
  bad = __syncthreads_or(bad);
  if (threadIdx.x == 0) flags[blockIdx.x] = bad;
}

__global__ void attention_stats_finish_kernel(const int32_t* __restrict__ seq_lens,       // [B]
                                              const int32_t* __restrict__ cu_query_lens,  // [B + 1]
                                              int64_t batch, int64_t block_size,
                                              const int32_t* __restrict__ flags, int num_flags,  // [scan CTAs]
                                              double* __restrict__ out) {  // [kNumAttentionStats]
  int64_t query_lo = LLONG_MAX, slack_lo = LLONG_MAX, blocks_hi = LLONG_MIN;
  for (int64_t b = threadIdx.x; b < batch; b += blockDim.x) {
    const int64_t query_len = int64_t{cu_query_lens[b + 1]} - cu_query_lens[b];
    query_lo = smaller(query_lo, query_len);
    slack_lo = smaller(slack_lo, seq_lens[b] - query_len);
    blocks_hi = larger(blocks_hi, blocks_used(seq_lens[b], block_size));
  }
  bool bad = false;
  for (int i = threadIdx.x; i < num_flags; i += blockDim.x) bad |= flags[i] != 0;
  bad = __syncthreads_or(bad);
  query_lo = block_extreme(query_lo, false), slack_lo = block_extreme(slack_lo, false);
  blocks_hi = block_extreme(blocks_hi, true);
  if (threadIdx.x != 0) return;
  out[kFirstQueryCu] = cu_query_lens[0];
  out[kLastQueryCu] = cu_query_lens[batch];
  out[kMinQueryLen] = static_cast<double>(query_lo);
  out[kMinSlack] = static_cast<double>(slack_lo);
  out[kMostBlocks] = static_cast<double>(blocks_hi);
  out[kBadBlockId] = bad;
}

int scan_ctas_for(int64_t items, int64_t per_cta, int device) {
  int num_sms = 0;
  C10_CUDA_CHECK(cudaDeviceGetAttribute(&num_sms, cudaDevAttrMultiProcessorCount, device));
  return static_cast<int>(std::clamp<int64_t>((items + per_cta - 1) / per_cta, 1, int64_t{kScanCtasPerSm} * num_sms));
}

LogitsView view_of(const std::optional<at::Tensor>& t) {
  if (!t.has_value()) return LogitsView{nullptr, 0, 4, kFloat32ExponentBits};
  return LogitsView{static_cast<const unsigned char*>(t->data_ptr()), t->numel(),
                    static_cast<int>(t->element_size()), exponent_bits_of(t->scalar_type())};
}

int64_t words_of(const LogitsView& v) { return v.numel * v.element_size / 16; }

at::Tensor sampling_value_stats_cuda(const at::Tensor& cu_num_draft_tokens,
                                     const std::optional<at::Tensor>& token_ids,
                                     const std::optional<at::Tensor>& target_logits,
                                     const std::optional<at::Tensor>& bonus_logits,
                                     const std::optional<at::Tensor>& temperature,
                                     const std::optional<at::Tensor>& top_p) {
  check_sampling_value_stats({cu_num_draft_tokens, token_ids, target_logits, bonus_logits, temperature, top_p});
  const c10::cuda::CUDAGuard guard(cu_num_draft_tokens.device());
  const auto stream = c10::cuda::getCurrentCUDAStream();
  at::Tensor out = at::empty({kNumValueStats}, cu_num_draft_tokens.options().dtype(at::kDouble));
  const LogitsView target = view_of(target_logits), bonus = view_of(bonus_logits);
  // Enough CTAs for every word in flight once, at most kScanCtasPerSm an SM; at least one,
  // whose threads also take the elements outside the aligned middles (fewer than 8 each).
  const int scan_ctas = scan_ctas_for(std::max(words_of(target), words_of(bonus)), int64_t{kScanThreads} * kScanUnroll,
                                      cu_num_draft_tokens.get_device());
  const bool any_logits = target.numel > 0 || bonus.numel > 0;
  at::Tensor flags = at::empty({any_logits ? scan_ctas : 0}, cu_num_draft_tokens.options().dtype(at::kInt));
  if (any_logits) {
    logits_non_finite_kernel<<<scan_ctas, kScanThreads, 0, stream>>>(target, bonus, flags.data_ptr<int32_t>());
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  }
  const auto numel = [](const std::optional<at::Tensor>& t) { return t.has_value() ? t->numel() : int64_t{0}; };
  const auto data = [](const std::optional<at::Tensor>& t) { return t.has_value() ? t->data_ptr() : nullptr; };
  value_stats_finish_kernel<<<1, kFinishThreads, 0, stream>>>(
      cu_num_draft_tokens.data_ptr(), cu_num_draft_tokens.scalar_type() == at::kLong, cu_num_draft_tokens.numel(),
      data(token_ids), token_ids.has_value() && token_ids->scalar_type() == at::kLong, numel(token_ids),
      static_cast<const float*>(data(temperature)), numel(temperature), static_cast<const float*>(data(top_p)),
      numel(top_p), flags.data_ptr<int32_t>(), static_cast<int>(flags.numel()), out.data_ptr<double>());
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return out;
}

at::Tensor paged_attention_value_stats_cuda(const at::Tensor& block_table, const at::Tensor& seq_lens,
                                            const at::Tensor& cu_query_lens, int64_t block_size, int64_t num_blocks) {
  check_paged_attention_value_stats(block_table, seq_lens, cu_query_lens, block_size);
  const c10::cuda::CUDAGuard guard(block_table.device());
  const auto stream = c10::cuda::getCurrentCUDAStream();
  at::Tensor out = at::empty({kNumAttentionStats}, block_table.options().dtype(at::kDouble));
  const int64_t batch = block_table.size(0), max_blocks = block_table.size(1), entries = batch * max_blocks;
  const int scan_ctas = scan_ctas_for(entries, int64_t{kScanThreads} * kScanUnroll, block_table.get_device());
  at::Tensor flags = at::empty({entries > 0 ? scan_ctas : 0}, block_table.options());
  if (entries > 0) {
    block_ids_in_range_kernel<<<scan_ctas, kScanThreads, 0, stream>>>(
        block_table.data_ptr<int32_t>(), seq_lens.data_ptr<int32_t>(), max_blocks, entries, block_size, num_blocks,
        flags.data_ptr<int32_t>());
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  }
  attention_stats_finish_kernel<<<1, kFinishThreads, 0, stream>>>(
      seq_lens.data_ptr<int32_t>(), cu_query_lens.data_ptr<int32_t>(), batch, block_size, flags.data_ptr<int32_t>(),
      static_cast<int>(flags.numel()), out.data_ptr<double>());
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return out;
}

}  // namespace

TORCH_LIBRARY_IMPL(specops, CUDA, m) {
  m.impl("sampling_value_stats", &sampling_value_stats_cuda);
  m.impl("paged_attention_value_stats", &paged_attention_value_stats_cuda);
}

}  // namespace specops
