// The per-element arithmetic of the CUDA verify kernel, the same float32 steps as
// reference/verify.py: sanitised loads, the processed weights and probabilities from a
// row's statistics, fixed-point sums and masses, order keys for the threshold searches.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cfloat>
#include <cstdint>

#include "repro_math.h"

namespace specops {

constexpr float kFixedScale = 1099511627776.0f;  // 2^40: normaliser sums
constexpr float kMassScale = 4294967296.0f;      // 2^32: top-p masses
constexpr float kTopPScale = 16777216.0f;        // 2^24: top_p

// What pass 1 leaves for pass 2, per output slot (b, i).
struct RowStats {
  float max_logit;     // max sanitised logit; -inf: no finite logit (all mass on token 0)
  int32_t argmax;      // lowest index of the max
  float kth;           // top-k threshold (keep z >= kth); -inf: off
  float z1;            // fixed-point normaliser after top-k
  uint32_t top_p_cut;  // keep v when bits(w_v / z1) >= cut; 0: off
  float z2;            // final normaliser (z1 without top-p)
  float p_token;       // p of the draft token (random), of the argmax at T = 1 (greedy)
  int32_t unused;
};

struct SlotParams {
  float temperature;  // 1 for greedy rows (their log-probabilities are at T = 1)
  int64_t top_k;      // applied when 0 < top_k < V
  float top_p;        // applied when < 1
  bool greedy;
};

__device__ inline SlotParams slot_params(int64_t b, const float* temperature, const int32_t* top_k, const float* top_p) {
  const float t = temperature[b];
  if (t == 0.f) return SlotParams{1.f, 0, 1.f, true};
  return SlotParams{t, top_k != nullptr ? top_k[b] : 0, top_p != nullptr ? top_p[b] : 1.f, false};
}

__device__ __forceinline__ float sanitise(float x) { return isfinite(x) ? x : -INFINITY; }

__device__ __forceinline__ float to_float(float x) { return x; }
__device__ __forceinline__ float to_float(__half x) { return __half2float(x); }
__device__ __forceinline__ float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }

// Logits [v, v + 4) of a row (v % 4 == 0), sanitised; entries at or past `end` are -inf.
// `vec`: the row is aligned for one 16-byte (float) or 8-byte (16-bit) load per group.
template <typename scalar_t>
__device__ __forceinline__ void load4(const scalar_t* row, int64_t v, int64_t end, bool vec, float out[4]) {
  if (vec && v + 4 <= end) {
    if constexpr (sizeof(scalar_t) == 4) {
      const float4 x = *reinterpret_cast<const float4*>(row + v);
      out[0] = x.x, out[1] = x.y, out[2] = x.z, out[3] = x.w;
    } else {
      const uint2 x = *reinterpret_cast<const uint2*>(row + v);
      const scalar_t* h = reinterpret_cast<const scalar_t*>(&x);
      for (int j = 0; j < 4; ++j) out[j] = to_float(h[j]);
    }
    for (int j = 0; j < 4; ++j) out[j] = sanitise(out[j]);
    return;
  }
  for (int j = 0; j < 4; ++j) out[j] = v + j < end ? sanitise(to_float(row[v + j])) : -INFINITY;
}

// Monotone map of floats to unsigned keys (-0 just below +0).
__device__ __forceinline__ uint32_t order_key(float f) {
  const uint32_t u = __float_as_uint(f);
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

__device__ __forceinline__ float key_to_float(uint32_t key) {
  return __uint_as_float((key & 0x80000000u) ? (key & 0x7FFFFFFFu) : ~key);
}

// floor(x * scale) as an integer (x * scale < 2^63): one rounding-down conversion.
__device__ __forceinline__ int64_t fixed_point(float x, float scale) {
  return __float2ll_rd(repro::mul(x, scale));
}

// exp's first step, ((z - max) / T) log2(e), by the temperature. For a power of two T
// (T = 1 above all) it is one multiply by log2(e) / T, which is exact: (z - max) / T is
// exact unless subnormal, so both forms round the same real number once; where it is
// subnormal (or flushed), y is 0 one way and at most 2^-125 the other, and exp returns 1
// both ways (its polynomial at f = 1 is 2 exactly). Elsewhere a correctly rounded division,
// then the multiply.
struct Temperature {
  float t;
  float exponent_scale;  // log2(e) / t when t is a power of two, else 0
  __device__ explicit Temperature(float temperature) : t(temperature), exponent_scale(0.f) {
    const uint32_t bits = __float_as_uint(temperature);
    const uint32_t exponent = (bits >> 23) & 0xFFu;
    if ((bits & 0x807FFFFFu) == 0 && exponent >= 2 && exponent <= 253) {
      exponent_scale = repro::mul(__fdiv_rn(1.f, temperature), repro::kLog2e);
    }
  }
  __device__ __forceinline__ float exponent(float x) const {
    return exponent_scale != 0.f ? repro::mul(x, exponent_scale) : repro::mul(repro::div(x, t), repro::kLog2e);
  }
};

// The weight of a kept logit: exp((z - max) / T), the reference's rounded steps.
__device__ __forceinline__ float weight(float z, float max_logit, const Temperature& temperature) {
  return repro::exp_of_exponent(temperature.exponent(repro::sub(z, max_logit)));
}

// w_v after the top-k and top-p masks, from a row's statistics: pass 2's recomputation of
// the weights pass 1 summed from shared memory (the same operations), so floor(w_v 2^40)
// is exactly a term of the normaliser's fixed-point sum and p_v = w_v / z2.
__device__ __forceinline__ float processed_weight(float z, int64_t v, const RowStats& st,
                                                  const Temperature& temperature) {
  if (st.max_logit == -INFINITY) return v == 0 ? 1.f : 0.f;  // pass 1 stores z1 = z2 = 1 then
  float w = z >= st.kth ? weight(z, st.max_logit, temperature) : 0.f;
  if (st.top_p_cut != 0 && __float_as_uint(repro::div(w, st.z1)) < st.top_p_cut) w = 0.f;
  return w;
}

// p_v under the processed distribution.
__device__ __forceinline__ float processed_p(float z, int64_t v, const RowStats& st, const Temperature& temperature) {
  return repro::div(processed_weight(z, v, st, temperature), st.z2);
}

// max(w - q z2, 0): the residual max(p - q, 0) scaled by the normaliser, two rounded
// operations and no division. The comparison is std::max's, so a NaN passes through as
// on the CPU.
__device__ __forceinline__ float residual_weight(float w, float q, float z2) {
  const float x = repro::sub(w, repro::mul(q, z2));
  return x < 0.f ? 0.f : x;
}

// Draft probabilities [v, v + 4) of a row (v % 4 == 0) as stored (not sanitised: the CPU
// kernel reads them as they are); 0 at or past `end`.
__device__ __forceinline__ void load4_probs(const float* q, int64_t v, int64_t end, bool vec, float out[4]) {
  if (vec && v + 4 <= end) {
    const float4 x = *reinterpret_cast<const float4*>(q + v);
    out[0] = x.x, out[1] = x.y, out[2] = x.z, out[3] = x.w;
    return;
  }
  for (int j = 0; j < 4; ++j) out[j] = v + j < end ? q[v + j] : 0.f;
}

__device__ __forceinline__ float log_prob(float p) { return repro::log(fmaxf(p, FLT_MIN)); }

}  // namespace specops
