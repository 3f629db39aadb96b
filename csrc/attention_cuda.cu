// CUDA kernels of the paged-attention ops: reshape_and_cache, and the launchers of
// paged_attention (kernel in paged_attention_kernel.cuh) and of its split-KV merge.
// Arguments are checked by the checks the CPU kernels share (attention_checks.cpp), plus
// what this kernel covers: float16/bfloat16, head_dim 64/128/256, GQA group <= 16.
// Everything is sized from shapes alone (no device-to-host copy), so both ops can be
// captured in a CUDA graph.
#include <ATen/ATen.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime.h>
#include <torch/library.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <string>

#include "attention.h"
#include "check_messages.h"
#include "paged_attention_kernel.cuh"

namespace specops {
namespace {

// ---------------------------------------------------------------------------------------
// reshape_and_cache. Grid: N programs; program i copies token i's key and value rows
// (Hkv * D elements each, contiguous in the inputs and in a cache slot) into slot
// slot_mapping[i], in `Unit`-sized pieces (16 bytes when sizes and addresses allow).
// Slot -1 (padding) and slots outside the cache are skipped. Bytes: 4 rows per token.
template <typename Unit>
__global__ void reshape_and_cache_kernel(const Unit* __restrict__ key,        // [N, row]
                                         const Unit* __restrict__ value,      // [N, row]
                                         Unit* __restrict__ key_cache,        // [num_slots, row]
                                         Unit* __restrict__ value_cache,      // [num_slots, row]
                                         const int64_t* __restrict__ slots,   // [N]
                                         int64_t num_slots, int64_t row_units) {
  const int64_t i = blockIdx.x;
  const int64_t slot = slots[i];
  if (slot < 0 || slot >= num_slots) return;
  for (int64_t u = threadIdx.x; u < row_units; u += blockDim.x) {
    key_cache[slot * row_units + u] = key[i * row_units + u];
    value_cache[slot * row_units + u] = value[i * row_units + u];
  }
}

bool aligned_to(const void* p, int64_t bytes) { return reinterpret_cast<uintptr_t>(p) % bytes == 0; }

template <typename Unit>
void launch_reshape_and_cache(const at::Tensor& key, const at::Tensor& value, at::Tensor& key_cache,
                              at::Tensor& value_cache, const at::Tensor& slot_mapping, int64_t num_tokens,
                              int64_t num_slots, int64_t row_bytes) {
  const int64_t row_units = row_bytes / static_cast<int64_t>(sizeof(Unit));
  const int threads = static_cast<int>(std::min<int64_t>(256, (row_units + 31) / 32 * 32));
  reshape_and_cache_kernel<Unit><<<static_cast<unsigned>(num_tokens), threads, 0,
                                   c10::cuda::getCurrentCUDAStream()>>>(
      static_cast<const Unit*>(key.data_ptr()), static_cast<const Unit*>(value.data_ptr()),
      static_cast<Unit*>(key_cache.data_ptr()), static_cast<Unit*>(value_cache.data_ptr()),
      slot_mapping.data_ptr<int64_t>(), num_slots, row_units);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

void reshape_and_cache_cuda(const at::Tensor& key,          // [N, Hkv, D]
                            const at::Tensor& value,        // [N, Hkv, D]
                            at::Tensor key_cache,           // [num_blocks, block_size, Hkv, D]
                            at::Tensor value_cache,         // [num_blocks, block_size, Hkv, D]
                            const at::Tensor& slot_mapping  // [N] int64, -1 = padding
) {
  const CacheSizes s = check_reshape_and_cache(key, value, key_cache, value_cache, slot_mapping);
  TORCH_CHECK_VALUE(key_cache.is_cuda(), "key_cache must be a CUDA tensor, got ", key_cache.device().str());
  TORCH_CHECK_VALUE(s.num_tokens <= INT32_MAX, "key must have fewer than 2^31 rows, got ", shape_str(key));
  if (s.num_tokens == 0) return;
  const c10::cuda::CUDAGuard guard(key_cache.device());
  const int64_t row_bytes = s.num_kv_heads * s.head_dim * static_cast<int64_t>(key.element_size());
  const int64_t num_slots = s.num_blocks * s.block_size;
  const auto fits = [&](int64_t unit) {
    return row_bytes % unit == 0 && aligned_to(key.data_ptr(), unit) && aligned_to(value.data_ptr(), unit) &&
           aligned_to(key_cache.data_ptr(), unit) && aligned_to(value_cache.data_ptr(), unit);
  };
  if (fits(16)) {
    launch_reshape_and_cache<uint4>(key, value, key_cache, value_cache, slot_mapping, s.num_tokens, num_slots,
                                    row_bytes);
  } else if (fits(4)) {
    launch_reshape_and_cache<uint32_t>(key, value, key_cache, value_cache, slot_mapping, s.num_tokens,
                                       num_slots, row_bytes);
  } else {  // every supported dtype is at least 2 bytes wide
    launch_reshape_and_cache<uint16_t>(key, value, key_cache, value_cache, slot_mapping, s.num_tokens,
                                       num_slots, row_bytes);
  }
}

// ---------------------------------------------------------------------------------------
// Split-KV merge. Grid: ceil(Q * Hq / 4) programs of 4 warps; one warp per (query row,
// head): out = sum_s exp(lse_s - m) * out_s / sum_s exp(lse_s - m), m = max_s lse_s, which
// is exact because each out_s is its split's normalised output. Lane s holds split s's
// weight (S <= 32); each lane owns 4 consecutive dims (float4 loads) of every 128. Every
// split's partial row is loaded at once, beside the LSEs: every split program writes its
// rows (an empty split zeros, LSE -inf), and a split of weight 0 is left out by a select,
// never multiplied in. (Loaded only where the weight is > 0, each load waited on the one
// before: 9.9 us at B = 1, 32 splits, H100.) Bytes: S * (D + 1) floats in and D elements +
// one LSE out per row. On sm_90 a programmatic dependent launch: its programs are placed
// as the attention programs finish and wait for the attention grid before any read.
constexpr int kMaxSplits = 32;  // one split per lane of the merge

template <typename Element>
__global__ void merge_splits_kernel(uint16_t* __restrict__ out,                // [Q * Hq, D]
                                    float* __restrict__ lse,                   // [Q * Hq] or null
                                    const float* __restrict__ partial_out,     // [S, Q * Hq, D]
                                    const float* __restrict__ partial_lse,     // [S, Q * Hq]
                                    int64_t rows, int head_dim, int num_splits) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");  // the attention grid's writes are visible
#endif
  const int64_t row = blockIdx.x * int64_t{blockDim.x / 32} + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (row >= rows) return;
  const float split_lse = lane < num_splits ? partial_lse[lane * rows + row] : -INFINITY;
  for (int d0 = 0; d0 < head_dim; d0 += 128) {  // every lane alike: the shuffles need the whole warp
    const int d = d0 + 4 * lane;
    const bool active = d < head_dim;
    float4 x[kMaxSplits];
#pragma unroll
    for (int s = 0; s < kMaxSplits; ++s) {
      x[s] = s < num_splits && active
                 ? *reinterpret_cast<const float4*>(partial_out + (s * rows + row) * head_dim + d)
                 : make_float4(0.f, 0.f, 0.f, 0.f);
    }
    float m = split_lse;
#pragma unroll
    for (int offset = 16; offset > 0; offset /= 2) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, offset));
    const float weight = m == -INFINITY ? 0.f : expf(split_lse - m);  // 0 for an empty split
    float total = weight;
#pragma unroll
    for (int offset = 16; offset > 0; offset /= 2) total += __shfl_xor_sync(0xffffffffu, total, offset);
    const float inv = total > 0.f ? 1.f / total : 0.f;  // no visible key in any split: zeros
    float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
    for (int s = 0; s < kMaxSplits; ++s) {
      const float w = __shfl_sync(0xffffffffu, weight, s);
      const bool used = s < num_splits && w > 0.f;  // else 0 x 0: a split's garbage never enters
      const float u = used ? w : 0.f;
      const float4 v = used ? x[s] : make_float4(0.f, 0.f, 0.f, 0.f);
      acc = make_float4(fmaf(u, v.x, acc.x), fmaf(u, v.y, acc.y), fmaf(u, v.z, acc.z), fmaf(u, v.w, acc.w));
    }
    if (active) {
      const uint32_t lo = pack_pair(Element::from_float(acc.x * inv), Element::from_float(acc.y * inv));
      const uint32_t hi = pack_pair(Element::from_float(acc.z * inv), Element::from_float(acc.w * inv));
      *reinterpret_cast<uint2*>(out + row * head_dim + d) = make_uint2(lo, hi);
    }
    if (d == 0 && lse != nullptr) lse[row] = total > 0.f ? m + logf(total) : -INFINITY;
  }
}

// ---------------------------------------------------------------------------------------
// paged_attention launcher.

constexpr int64_t kMaxWorkspaceBytes = int64_t{256} << 20;  // partial outputs of all splits

// The combinations this kernel covers; anything else raises here (specops.ops then picks
// the Triton kernel by default, see specops/ops.py).
void check_cuda_support(const at::Tensor& query, const at::Tensor& key_cache, const at::Tensor& value_cache,
                        const AttentionSizes& s) {
  TORCH_CHECK_VALUE(query.is_cuda(), "query must be a CUDA tensor, got ", query.device().str());
  TORCH_CHECK_TYPE(query.scalar_type() == at::kHalf || query.scalar_type() == at::kBFloat16,
                   "query must be float16 or bfloat16 for the CUDA paged_attention kernel, got ",
                   query.scalar_type(), " (the Triton kernel covers float32)");
  TORCH_CHECK_VALUE(s.head_dim == 64 || s.head_dim == 128 || s.head_dim == 256,
                    "query head_dim must be 64, 128 or 256 for the CUDA paged_attention kernel, got ",
                    num(s.head_dim));
  const int64_t group = s.num_heads / s.num_kv_heads;
  TORCH_CHECK_VALUE(group <= 16, "num_heads / num_kv_heads (the GQA group) must be at most 16 for the CUDA ",
                    "paged_attention kernel, got ", num(s.num_heads), " / ", num(s.num_kv_heads));
  TORCH_CHECK_VALUE(s.max_blocks * s.block_size < INT32_MAX && s.num_blocks * s.block_size < INT32_MAX,
                    "block_table must address fewer than 2^31 keys (max_blocks * block_size = ",
                    num(s.max_blocks * s.block_size), ") and key_cache hold fewer than 2^31 slots, got key_cache ",
                    shape_str(key_cache));
  TORCH_CHECK_VALUE(s.num_query_tokens < INT32_MAX / 16 && s.batch < INT32_MAX / 16,
                    "query must have fewer than 2^27 rows, got ", shape_str(query));
  TORCH_CHECK_VALUE(aligned_to(query.data_ptr(), 16) && aligned_to(key_cache.data_ptr(), 16) &&
                        aligned_to(value_cache.data_ptr(), 16),
                    "query, key_cache and value_cache must start at 16-byte aligned addresses for the CUDA "
                    "paged_attention kernel");
}

// sm_90 or newer: the merge may be a programmatic dependent launch (griddepcontrol).
bool supports_programmatic_launch(int device) {
  constexpr int kMaxDevices = 64;
  static std::atomic<int> cache[kMaxDevices] = {};  // 0 unknown, 1 no, 2 yes
  if (device < kMaxDevices && cache[device].load() != 0) return cache[device].load() == 2;
  int major = 0;
  C10_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
  if (device < kMaxDevices) cache[device].store(major >= 9 ? 2 : 1);
  return major >= 9;
}

// Programs of one kernel variant resident on the whole device (occupancy x SMs), after
// raising its dynamic shared-memory limit; measured once per variant and device.
template <typename Element, int kHeadDim, int kMTiles, bool kCapOrWindow>
int64_t prepare_variant(int device) {
  constexpr int kMaxDevices = 64;
  static std::atomic<int64_t> cache[kMaxDevices] = {};
  if (device < kMaxDevices && cache[device].load() > 0) return cache[device].load();
  const auto kernel = paged_attention_kernel<Element, kHeadDim, kMTiles, kCapOrWindow>;
  constexpr int bytes = AttentionSmem<kHeadDim, kMTiles>::kBytes;
  C10_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes));
  int per_sm = 0, sms = 0;
  C10_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, kAttentionThreads, bytes));
  C10_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  TORCH_CHECK(per_sm > 0, "paged_attention: the CUDA kernel does not fit on this GPU (shared memory ",
              std::to_string(bytes), " bytes per program)");
  const int64_t resident = int64_t{per_sm} * sms;
  if (device < kMaxDevices) cache[device].store(resident);
  return resident;
}

// Row chunks in flight per sequence (C) and KV splits (S), from shapes alone: C spreads
// long query runs (prefill) over programs; S fills the GPU when B * Hkv * C cannot.
template <typename Element, int kHeadDim, int kMTiles, bool kCapOrWindow>
void launch_paged_attention(PagedAttentionParams& p, const AttentionSizes& s, const at::Tensor& query,
                            at::Tensor& out, at::Tensor& lse, bool return_lse) {
  constexpr int kRows = 16 * kMTiles;
  const int64_t resident = prepare_variant<Element, kHeadDim, kMTiles, kCapOrWindow>(query.get_device());
  const int64_t rows_per_chunk = kRows / p.group;
  const int64_t mean_q_len = (s.num_query_tokens + s.batch - 1) / s.batch;
  const int64_t chunk_programs = std::max<int64_t>(1, (mean_q_len + rows_per_chunk - 1) / rows_per_chunk);
  const int64_t base = s.batch * s.num_kv_heads * chunk_programs;
  const int64_t max_tiles = (s.max_blocks * s.block_size + kTileKeys - 1) / kTileKeys;
  const int64_t split_bytes = s.num_query_tokens * s.num_heads * s.head_dim * 4;  // one split's partials
  int64_t splits = std::max<int64_t>(1, resident / base);
  splits = std::min({splits, max_tiles, int64_t{kMaxSplits}, kMaxWorkspaceBytes / std::max<int64_t>(split_bytes, 1)});
  splits = std::max<int64_t>(splits, 1);
  const int64_t programs = base * splits;
  TORCH_CHECK_VALUE(programs <= INT32_MAX, "paged_attention: too many programs for one launch (batch ",
                    num(s.batch), ", num_kv_heads ", num(s.num_kv_heads), ")");
  p.num_chunk_programs = static_cast<int>(chunk_programs);
  p.num_splits = static_cast<int>(splits);
  at::Tensor partial_out, partial_lse;
  if (splits > 1) {
    const auto options = query.options().dtype(at::kFloat);
    partial_out = at::empty({splits, s.num_query_tokens, s.num_heads, s.head_dim}, options);
    partial_lse = at::empty({splits, s.num_query_tokens, s.num_heads}, options);
    p.partial_out = partial_out.data_ptr<float>();
    p.partial_lse = partial_lse.data_ptr<float>();
  }
  const auto stream = c10::cuda::getCurrentCUDAStream();
  paged_attention_kernel<Element, kHeadDim, kMTiles, kCapOrWindow>
      <<<static_cast<unsigned>(programs), kAttentionThreads, AttentionSmem<kHeadDim, kMTiles>::kBytes, stream>>>(p);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  if (splits > 1) {
    const int64_t rows = s.num_query_tokens * s.num_heads;
    constexpr int kMergeThreads = 128;  // 4 rows per program
    cudaLaunchConfig_t config = {};
    config.gridDim = dim3(static_cast<unsigned>((rows + 3) / 4));
    config.blockDim = dim3(kMergeThreads);
    config.stream = stream;
    cudaLaunchAttribute attribute[1];
    attribute[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attribute[0].val.programmaticStreamSerializationAllowed = 1;
    config.attrs = attribute;
    config.numAttrs = supports_programmatic_launch(query.get_device()) ? 1 : 0;
    C10_CUDA_CHECK(cudaLaunchKernelEx(&config, merge_splits_kernel<Element>, static_cast<uint16_t*>(out.data_ptr()),
                                      return_lse ? lse.data_ptr<float>() : nullptr,
                                      static_cast<const float*>(p.partial_out), static_cast<const float*>(p.partial_lse),
                                      rows, static_cast<int>(s.head_dim), p.num_splits));
  }
}

// Tile rows (16 x kMTiles) for the mean query run of the batch: enough for q_len x group
// rows in one chunk, within 128 float32 accumulators per thread (kMTiles x D <= 256).
template <typename Element, bool kCapOrWindow>
void dispatch_head_dim(PagedAttentionParams& p, const AttentionSizes& s, const at::Tensor& query, at::Tensor& out,
                       at::Tensor& lse, bool return_lse) {
  const int64_t rows = (s.num_query_tokens + s.batch - 1) / s.batch * p.group;
  switch (s.head_dim) {
    case 64:
      if (rows <= 16) return launch_paged_attention<Element, 64, 1, kCapOrWindow>(p, s, query, out, lse, return_lse);
      if (rows <= 32) return launch_paged_attention<Element, 64, 2, kCapOrWindow>(p, s, query, out, lse, return_lse);
      return launch_paged_attention<Element, 64, 4, kCapOrWindow>(p, s, query, out, lse, return_lse);
    case 128:
      if (rows <= 16) return launch_paged_attention<Element, 128, 1, kCapOrWindow>(p, s, query, out, lse, return_lse);
      return launch_paged_attention<Element, 128, 2, kCapOrWindow>(p, s, query, out, lse, return_lse);
    default:
      return launch_paged_attention<Element, 256, 1, kCapOrWindow>(p, s, query, out, lse, return_lse);
  }
}

template <typename Element>
void dispatch_features(PagedAttentionParams& p, const AttentionSizes& s, const at::Tensor& query, at::Tensor& out,
                       at::Tensor& lse, bool return_lse) {
  if (p.soft_cap > 0.f || p.sliding_window > 0) {
    return dispatch_head_dim<Element, true>(p, s, query, out, lse, return_lse);
  }
  return dispatch_head_dim<Element, false>(p, s, query, out, lse, return_lse);
}

std::tuple<at::Tensor, at::Tensor> paged_attention_cuda(
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
  check_cuda_support(query, key_cache, value_cache, s);
  const c10::cuda::CUDAGuard guard(query.device());
  at::Tensor out = at::empty_like(query);  // [Q, Hq, D]
  at::Tensor lse = return_lse ? at::empty({s.num_query_tokens, s.num_heads}, query.options().dtype(at::kFloat))
                              : at::empty({0, 0}, query.options().dtype(at::kFloat));
  if (s.batch == 0 || s.num_query_tokens == 0) return {out, lse};
  if (s.num_blocks == 0) {  // an empty cache: no key to see, and no address to pass cp.async
    out.zero_();
    if (return_lse) lse.fill_(-INFINITY);
    return {out, lse};
  }
  const int64_t max_keys = s.max_blocks * s.block_size;
  PagedAttentionParams p{};
  p.out = out.data_ptr();
  p.lse = return_lse ? lse.data_ptr<float>() : nullptr;
  p.query = static_cast<const uint16_t*>(query.data_ptr());
  p.key_cache = static_cast<const uint16_t*>(key_cache.data_ptr());
  p.value_cache = static_cast<const uint16_t*>(value_cache.data_ptr());
  p.block_table = block_table.data_ptr<int32_t>();
  p.seq_lens = seq_lens.data_ptr<int32_t>();
  p.cu_query_lens = cu_query_lens.data_ptr<int32_t>();
  p.scale = static_cast<float>(scale);
  p.soft_cap = static_cast<float>(soft_cap);
  // A window at least as long as any sequence hides nothing: the same as no window.
  p.sliding_window = sliding_window >= max_keys ? 0 : static_cast<int>(sliding_window);
  p.num_query_tokens = static_cast<int>(s.num_query_tokens);
  p.num_heads = static_cast<int>(s.num_heads);
  p.num_kv_heads = static_cast<int>(s.num_kv_heads);
  p.group = static_cast<int>(s.num_heads / s.num_kv_heads);
  p.num_blocks = static_cast<int>(s.num_blocks);
  p.block_size = static_cast<int>(s.block_size);
  p.block_shift = s.block_size > 0 && (s.block_size & (s.block_size - 1)) == 0 ? __builtin_ctzll(s.block_size) : -1;
  p.max_blocks = static_cast<int>(s.max_blocks);
  p.batch = static_cast<int>(s.batch);
  if (query.scalar_type() == at::kHalf) {
    dispatch_features<HalfElement>(p, s, query, out, lse, return_lse);
  } else {
    dispatch_features<Bf16Element>(p, s, query, out, lse, return_lse);
  }
  return {out, lse};
}

}  // namespace

TORCH_LIBRARY_IMPL(specops, CUDA, m) {
  m.impl("reshape_and_cache", &reshape_and_cache_cuda);
  m.impl("paged_attention", &paged_attention_cuda);
}

}  // namespace specops
