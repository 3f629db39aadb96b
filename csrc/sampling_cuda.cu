// CUDA kernels of the verification-sampling ops. Same float32 arithmetic as the C++ CPU
// kernels (token_ids.h), so every backend returns bit for bit what reference/sampling.py
// returns given the same random draws.
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

#include "rejection_rows.h"
#include "sampling.h"

namespace specops {
namespace {

constexpr int kRequestThreads = 128;

int64_t blocks_for(int64_t n, int64_t threads) { return (n + threads - 1) / threads; }

// ---------------------------------------------------------------------------------------
// expand_to_tokens. Grid: ceil(B / 128) x 128 threads; one thread writes one request's
// rows. Moves B values in and T values out.
template <typename T>
__global__ void expand_to_tokens_kernel(const T* __restrict__ values,              // [B]
                                        const int32_t* __restrict__ cu,            // [B]
                                        T* __restrict__ out,                       // [T]
                                        int64_t batch, int64_t num_tokens, bool replace,
                                        T replace_from, T replace_to) {
  const int64_t b = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
  if (b >= batch) return;
  const DraftRange r = draft_range(cu, b, num_tokens, num_tokens);
  T v = values[b];
  if (replace && v == replace_from) v = replace_to;
  for (int64_t t = r.start; t < r.start + r.count; ++t) out[t] = v;
}

// ---------------------------------------------------------------------------------------
// rejection_greedy_sample / rejection_random_sample. Grid: ceil(B / 128) x 128 threads;
// one thread walks one request's drafts and writes its whole output row. A few bytes per
// draft (ids, and for random two probabilities gathered from the [T, V] rows).
__device__ __forceinline__ bool owns_row(const bool* is_greedy, int64_t b, bool greedy_op) {
  return is_greedy == nullptr || is_greedy[b] == greedy_op;
}

__global__ void rejection_greedy_sample_kernel(int32_t* __restrict__ out,          // [B, S + 1]
                                               const int32_t* __restrict__ cu,      // [B]
                                               TokenIds draft,                      // [T]
                                               TokenIds target_argmax,              // [T]
                                               TokenIds bonus,                      // [B]
                                               const bool* __restrict__ is_greedy,  // [B] or null
                                               int64_t batch, int64_t num_tokens, int64_t width) {
  const int64_t b = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
  if (b >= batch || !owns_row(is_greedy, b, true)) return;
  greedy_row(out + b * width, width, draft_range(cu, b, num_tokens, width - 1), draft, target_argmax,
             bonus[b]);
}

__global__ void rejection_random_sample_kernel(int32_t* __restrict__ out,             // [B, S + 1]
                                               const int32_t* __restrict__ cu,         // [B]
                                               TokenIds draft,                         // [T]
                                               const float* __restrict__ draft_probs,  // [T, V] or null
                                               const float* __restrict__ target_probs, // [T, V]
                                               TokenIds bonus,                         // [B]
                                               TokenIds recovered,                     // [T]
                                               const float* __restrict__ uniform,      // [T]
                                               const bool* __restrict__ is_greedy,     // [B] or null
                                               int64_t batch, int64_t num_tokens, int64_t vocab,
                                               int64_t width) {
  const int64_t b = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
  if (b >= batch || !owns_row(is_greedy, b, false)) return;
  random_row(out + b * width, width, draft_range(cu, b, num_tokens, width - 1), draft, draft_probs,
             target_probs, vocab, recovered, uniform, bonus[b]);
}

// ---------------------------------------------------------------------------------------
// sample_recovered_tokens: argmax_v r_v / E_v over each draft row, split across programs.
//
// Grid: (T, num_splits) x kRecoveredThreads. Program (t, s) scans vocab chunk s of row t:
// reads target_probs[t], draft_probs[t] (if any) and exponentials[request of t] over the
// chunk once, 16-byte loads, several in flight per thread, and writes one candidate. With
// one split the winner is written straight to the output; otherwise recovered_combine
// reduces each row's candidates. Bytes: T*V*4 (p) + T*V*4 (q) + B*V*4 (E; a request's k
// rows reread its E row, mostly from L2) + T*num_splits*8 + T*4.
constexpr int kRecoveredThreads = 256;
// float4 loads of each input in flight per thread: n-gram rows stream two inputs, not
// three, so they take twice the depth to keep as many bytes in flight.
template <bool kHasDraftProbs>
constexpr int kRecoveredUnroll = kHasDraftProbs ? 4 : 8;

struct Candidate {
  float score;
  int32_t index;
};

// Higher score wins; equal scores go to the lower index, so the reduction order does not
// change the result (NaN never wins: it only appears for invalid exponentials).
__device__ __forceinline__ Candidate better(Candidate a, Candidate b) {
  return (b.score > a.score || (b.score == a.score && b.index < a.index)) ? b : a;
}

__device__ __forceinline__ Candidate warp_best(Candidate c) {
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) {
    Candidate other{__shfl_xor_sync(0xffffffffu, c.score, offset),
                    __shfl_xor_sync(0xffffffffu, c.index, offset)};
    c = better(c, other);
  }
  return c;
}

template <int kThreads>
__device__ Candidate block_best(Candidate c) {
  __shared__ Candidate warp_winners[kThreads / 32];
  c = warp_best(c);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (lane == 0) warp_winners[warp] = c;
  __syncthreads();
  if (warp == 0) {
    c = lane < kThreads / 32 ? warp_winners[lane] : Candidate{-INFINITY, 0};
    c = warp_best(c);
  }
  return c;  // valid in thread 0
}

// The request whose rows hold token t: the first b with cu[b] > t (batch if none).
__device__ int64_t request_of(const int32_t* __restrict__ cu, int64_t batch, int64_t t) {
  int64_t lo = 0, hi = batch;
  while (lo < hi) {
    const int64_t mid = (lo + hi) / 2;
    if (cu[mid] > t) hi = mid; else lo = mid + 1;
  }
  return lo;
}

template <bool kHasDraftProbs>
__device__ __forceinline__ void consider(Candidate& best, float p, float q, float e, int64_t v,
                                         int64_t token) {
  const float residual = kHasDraftProbs ? p - q : (v == token ? 0.f : p);
  const float score = race_score(residual, e);
  if (score > best.score) best = Candidate{score, static_cast<int32_t>(v)};  // ascending v
}

template <bool kHasDraftProbs, bool kVec>
__global__ void __launch_bounds__(kRecoveredThreads)
    recovered_scan_kernel(const float* __restrict__ target_probs,  // [T, V]
                          const float* __restrict__ draft_probs,   // [T, V] or null
                          const float* __restrict__ exponentials,  // [B, V]
                          const int32_t* __restrict__ cu,          // [B]
                          TokenIds draft,                          // [T]
                          int64_t batch, int64_t vocab, int64_t chunk,
                          Candidate* __restrict__ partials,        // [T, num_splits]
                          int32_t* __restrict__ recovered) {       // [T] (num_splits == 1)
  const int64_t t = blockIdx.x;
  __shared__ int64_t request;
  if (threadIdx.x == 0) request = request_of(cu, batch, t);
  __syncthreads();
  Candidate best{-INFINITY, 0};
  if (request < batch) {
    const int64_t begin = blockIdx.y * chunk;
    const int64_t end = min(vocab, begin + chunk);
    const int64_t token = draft[t];
    const float* p = target_probs + t * vocab;
    const float* q = kHasDraftProbs ? draft_probs + t * vocab : nullptr;
    const float* e = exponentials + request * vocab;
    int64_t v = begin;
    if (kVec) {  // chunk, vocab and the row starts are multiples of 4 floats
      constexpr int kUnroll = kRecoveredUnroll<kHasDraftProbs>;
      constexpr int64_t kStep = 4 * kRecoveredThreads * kUnroll;
      for (; v + kStep <= end; v += kStep) {
        float4 pv[kUnroll], qv[kUnroll], ev[kUnroll];
#pragma unroll
        for (int u = 0; u < kUnroll; ++u) {
          const int64_t at = v + 4 * (threadIdx.x + u * kRecoveredThreads);
          pv[u] = __ldcs(reinterpret_cast<const float4*>(p + at));
          if (kHasDraftProbs) qv[u] = __ldcs(reinterpret_cast<const float4*>(q + at));
          ev[u] = __ldg(reinterpret_cast<const float4*>(e + at));
        }
#pragma unroll
        for (int u = 0; u < kUnroll; ++u) {
          const int64_t at = v + 4 * (threadIdx.x + u * kRecoveredThreads);
          const float4 qq = kHasDraftProbs ? qv[u] : make_float4(0.f, 0.f, 0.f, 0.f);
          consider<kHasDraftProbs>(best, pv[u].x, qq.x, ev[u].x, at + 0, token);
          consider<kHasDraftProbs>(best, pv[u].y, qq.y, ev[u].y, at + 1, token);
          consider<kHasDraftProbs>(best, pv[u].z, qq.z, ev[u].z, at + 2, token);
          consider<kHasDraftProbs>(best, pv[u].w, qq.w, ev[u].w, at + 3, token);
        }
      }
      // Tail of the chunk: whole float4s, one per thread per step.
      for (int64_t at = v + 4 * threadIdx.x; at < end; at += 4 * kRecoveredThreads) {
        const float4 pp = __ldcs(reinterpret_cast<const float4*>(p + at));
        const float4 qq = kHasDraftProbs ? __ldcs(reinterpret_cast<const float4*>(q + at))
                                         : make_float4(0.f, 0.f, 0.f, 0.f);
        const float4 ee = __ldg(reinterpret_cast<const float4*>(e + at));
        consider<kHasDraftProbs>(best, pp.x, qq.x, ee.x, at + 0, token);
        consider<kHasDraftProbs>(best, pp.y, qq.y, ee.y, at + 1, token);
        consider<kHasDraftProbs>(best, pp.z, qq.z, ee.z, at + 2, token);
        consider<kHasDraftProbs>(best, pp.w, qq.w, ee.w, at + 3, token);
      }
    } else {
      for (int64_t at = v + threadIdx.x; at < end; at += kRecoveredThreads) {
        consider<kHasDraftProbs>(best, __ldcs(p + at), kHasDraftProbs ? __ldcs(q + at) : 0.f,
                                 __ldg(e + at), at, token);
      }
    }
  }
  best = block_best<kRecoveredThreads>(best);
  if (threadIdx.x == 0) {
    if (gridDim.y == 1) {
      recovered[t] = best.index;
    } else {
      partials[t * gridDim.y + blockIdx.y] = best;
    }
  }
}

// Grid: ceil(T / 8) x 256 threads; one warp reduces one row's num_splits candidates.
__global__ void recovered_combine_kernel(const Candidate* __restrict__ partials,  // [T, splits]
                                         int32_t* __restrict__ recovered,         // [T]
                                         int64_t num_tokens, int num_splits) {
  const int64_t t = (blockIdx.x * int64_t{blockDim.x} + threadIdx.x) / 32;
  const int lane = threadIdx.x % 32;
  if (t >= num_tokens) return;  // whole warps leave together
  Candidate best{-INFINITY, 0};
  for (int s = lane; s < num_splits; s += 32) best = better(best, partials[t * num_splits + s]);
  best = warp_best(best);
  if (lane == 0) recovered[t] = best.index;
}

// Splits per row. The grid should fill its last wave: with 256 rows and 528 resident
// programs, 3 splits (768 programs) leave the second wave half empty while 2 splits run
// in one full wave. So: the split count whose grid fills its last wave best, among those
// that keep chunks of at least kMinChunk floats (long enough streams) and no more than
// kMaxWaves waves; ties go to fewer splits (fewer partials to combine).
constexpr int64_t kMinChunk = 4096;
constexpr int64_t kMaxWaves = 8;

int64_t recovered_num_splits(int64_t num_tokens, int64_t vocab, int64_t resident) {
  const int64_t most = std::min<int64_t>(std::max<int64_t>(1, vocab / kMinChunk), 1024);
  int64_t best = 1;
  double best_fill = 0.0;
  for (int64_t splits = 1; splits <= most; ++splits) {
    const int64_t programs = num_tokens * splits;
    const int64_t waves = (programs + resident - 1) / resident;
    if (waves > kMaxWaves && splits > 1) break;
    const double fill = static_cast<double>(programs) / static_cast<double>(waves * resident);
    if (fill > best_fill + 1e-6) {
      best = splits;
      best_fill = fill;
    }
  }
  return best;
}

using ScanKernel = void (*)(const float*, const float*, const float*, const int32_t*, TokenIds,
                            int64_t, int64_t, int64_t, Candidate*, int32_t*);

// Programs of scan kernel `variant` that fit on `device` at once (occupancy x SMs),
// measured once per variant and device.
int64_t resident_programs(ScanKernel kernel, int variant, int device) {
  constexpr int kMaxDevices = 64;
  static std::atomic<int64_t> cache[4][kMaxDevices] = {};
  if (device < kMaxDevices && cache[variant][device].load() > 0) return cache[variant][device].load();
  int per_sm = 0, sms = 0;
  C10_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, kRecoveredThreads, 0));
  C10_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  const int64_t resident = std::max<int64_t>(1, int64_t{per_sm} * sms);
  if (device < kMaxDevices) cache[variant][device].store(resident);
  return resident;
}

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

// ---------------------------------------------------------------------------------------
// Launchers: validate (sampling_checks.cpp), then launch on the current stream.

at::Tensor expand_to_tokens_cuda(const at::Tensor& values, const at::Tensor& cu_num_draft_tokens,
                                 int64_t num_tokens, std::optional<double> replace_from,
                                 double replace_to) {
  const RaggedSizes s = check_expand_to_tokens(values, cu_num_draft_tokens, num_tokens, replace_from);
  const c10::cuda::CUDAGuard guard(values.device());
  at::Tensor out = at::zeros({num_tokens}, values.options());
  if (s.batch == 0 || num_tokens == 0) return out;
  const auto stream = c10::cuda::getCurrentCUDAStream();
  const dim3 grid(blocks_for(s.batch, kRequestThreads));
  const int32_t* cu = cu_num_draft_tokens.data_ptr<int32_t>();
  switch (values.scalar_type()) {
    case at::kFloat:
      expand_to_tokens_kernel<float><<<grid, kRequestThreads, 0, stream>>>(
          values.data_ptr<float>(), cu, out.data_ptr<float>(), s.batch, num_tokens,
          replace_from.has_value(), static_cast<float>(replace_from.value_or(0.0)),
          static_cast<float>(replace_to));
      break;
    case at::kInt:
      expand_to_tokens_kernel<int32_t><<<grid, kRequestThreads, 0, stream>>>(
          values.data_ptr<int32_t>(), cu, out.data_ptr<int32_t>(), s.batch, num_tokens, false, 0, 0);
      break;
    default:
      expand_to_tokens_kernel<int64_t><<<grid, kRequestThreads, 0, stream>>>(
          values.data_ptr<int64_t>(), cu, out.data_ptr<int64_t>(), s.batch, num_tokens, false, 0, 0);
  }
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return out;
}

void rejection_greedy_sample_cuda(at::Tensor& output_token_ids, const at::Tensor& cu_num_draft_tokens,
                                  const at::Tensor& draft_token_ids, const at::Tensor& target_argmax,
                                  const at::Tensor& bonus_token_ids,
                                  const std::optional<at::Tensor>& is_greedy) {
  const RaggedSizes s = check_rejection_greedy_sample(output_token_ids, cu_num_draft_tokens,
                                                      draft_token_ids, target_argmax,
                                                      bonus_token_ids, is_greedy);
  if (s.batch == 0) return;
  const c10::cuda::CUDAGuard guard(output_token_ids.device());
  rejection_greedy_sample_kernel<<<blocks_for(s.batch, kRequestThreads), kRequestThreads, 0,
                                   c10::cuda::getCurrentCUDAStream()>>>(
      output_token_ids.data_ptr<int32_t>(), cu_num_draft_tokens.data_ptr<int32_t>(),
      token_ids(draft_token_ids), token_ids(target_argmax), token_ids(bonus_token_ids),
      optional_bool_ptr(is_greedy), s.batch, s.num_tokens, s.width);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

void rejection_random_sample_cuda(at::Tensor& output_token_ids, const at::Tensor& cu_num_draft_tokens,
                                  const at::Tensor& draft_token_ids,
                                  const std::optional<at::Tensor>& draft_probs,
                                  const at::Tensor& target_probs, const at::Tensor& bonus_token_ids,
                                  const at::Tensor& recovered_token_ids,
                                  const at::Tensor& uniform_probs,
                                  const std::optional<at::Tensor>& is_greedy) {
  const RaggedSizes s = check_rejection_random_sample(
      output_token_ids, cu_num_draft_tokens, draft_token_ids, draft_probs, target_probs,
      bonus_token_ids, recovered_token_ids, uniform_probs, is_greedy);
  if (s.batch == 0) return;
  const c10::cuda::CUDAGuard guard(output_token_ids.device());
  rejection_random_sample_kernel<<<blocks_for(s.batch, kRequestThreads), kRequestThreads, 0,
                                   c10::cuda::getCurrentCUDAStream()>>>(
      output_token_ids.data_ptr<int32_t>(), cu_num_draft_tokens.data_ptr<int32_t>(),
      token_ids(draft_token_ids), optional_float_ptr(draft_probs), target_probs.data_ptr<float>(),
      token_ids(bonus_token_ids), token_ids(recovered_token_ids), uniform_probs.data_ptr<float>(),
      optional_bool_ptr(is_greedy), s.batch, s.num_tokens, s.vocab, s.width);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

at::Tensor sample_recovered_tokens_cuda(const at::Tensor& cu_num_draft_tokens,
                                        const at::Tensor& draft_token_ids,
                                        const std::optional<at::Tensor>& draft_probs,
                                        const at::Tensor& target_probs,
                                        const at::Tensor& exponentials) {
  const RaggedSizes s = check_sample_recovered_tokens(cu_num_draft_tokens, draft_token_ids,
                                                      draft_probs, target_probs, exponentials);
  const c10::cuda::CUDAGuard guard(target_probs.device());
  at::Tensor out = at::empty({s.num_tokens}, cu_num_draft_tokens.options());
  if (s.num_tokens == 0) return out;
  const float* q = optional_float_ptr(draft_probs);
  const bool vec = s.vocab % 4 == 0 && aligned16(target_probs.data_ptr()) &&
                   aligned16(exponentials.data_ptr()) && (q == nullptr || aligned16(q));
  const ScanKernel variants[4] = {recovered_scan_kernel<false, false>, recovered_scan_kernel<false, true>,
                                  recovered_scan_kernel<true, false>, recovered_scan_kernel<true, true>};
  const int variant = 2 * (q != nullptr) + vec;
  const ScanKernel kernel = variants[variant];
  const int64_t resident = resident_programs(kernel, variant, target_probs.get_device());
  int64_t splits = recovered_num_splits(s.num_tokens, s.vocab, resident);
  int64_t chunk = (s.vocab + splits - 1) / splits;
  chunk = (chunk + 3) / 4 * 4;  // float4-aligned chunk starts
  splits = (s.vocab + chunk - 1) / chunk;
  TORCH_CHECK(s.num_tokens <= INT32_MAX, "num_tokens must be below 2^31, got ",
              std::to_string(s.num_tokens));
  at::Tensor partials;
  Candidate* partials_ptr = nullptr;
  if (splits > 1) {
    partials = at::empty({s.num_tokens, splits, 2}, target_probs.options());  // {score, index}
    partials_ptr = reinterpret_cast<Candidate*>(partials.data_ptr<float>());
  }
  const auto stream = c10::cuda::getCurrentCUDAStream();
  const dim3 grid(static_cast<unsigned>(s.num_tokens), static_cast<unsigned>(splits));
  kernel<<<grid, kRecoveredThreads, 0, stream>>>(
      target_probs.data_ptr<float>(), q, exponentials.data_ptr<float>(),
      cu_num_draft_tokens.data_ptr<int32_t>(), token_ids(draft_token_ids), s.batch, s.vocab, chunk,
      partials_ptr, out.data_ptr<int32_t>());
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  if (splits > 1) {
    constexpr int kCombineThreads = 256;
    recovered_combine_kernel<<<blocks_for(s.num_tokens * 32, kCombineThreads), kCombineThreads, 0,
                               stream>>>(partials_ptr, out.data_ptr<int32_t>(), s.num_tokens,
                                         static_cast<int>(splits));
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  }
  return out;
}

}  // namespace

TORCH_LIBRARY_IMPL(specops, CUDA, m) {
  m.impl("expand_to_tokens", &expand_to_tokens_cuda);
  m.impl("rejection_greedy_sample", &rejection_greedy_sample_cuda);
  m.impl("rejection_random_sample", &rejection_random_sample_cuda);
  m.impl("sample_recovered_tokens", &sample_recovered_tokens_cuda);
}

}  // namespace specops
