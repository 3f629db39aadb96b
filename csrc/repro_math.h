// exp and log from IEEE float32 operations alone, host and device, bit for
// bit reference/repro_math.py (see there for the method and accuracy). Every operation is
// one correctly rounded one: exp's polynomial steps are fused multiply-adds (fma: one
// rounding of a * b + c), every other multiply and add is rounded on its own (the CPU
// build passes -ffp-contract=off, and device code uses __fmul_rn/__fadd_rn, which nvcc
// never contracts into an FMA).
#pragma once
#include <cmath>
#include <cstdint>
#include <cstring>

#include "token_ids.h"

namespace specops {
namespace repro {

#if defined(__CUDA_ARCH__)
SPECOPS_HOST_DEVICE float mul(float a, float b) { return __fmul_rn(a, b); }
SPECOPS_HOST_DEVICE float add(float a, float b) { return __fadd_rn(a, b); }
SPECOPS_HOST_DEVICE float sub(float a, float b) { return __fsub_rn(a, b); }
SPECOPS_HOST_DEVICE float div(float a, float b) { return __fdiv_rn(a, b); }
SPECOPS_HOST_DEVICE float fma(float a, float b, float c) { return __fmaf_rn(a, b, c); }
#else
SPECOPS_HOST_DEVICE float mul(float a, float b) { return a * b; }
SPECOPS_HOST_DEVICE float add(float a, float b) { return a + b; }
SPECOPS_HOST_DEVICE float sub(float a, float b) { return a - b; }
SPECOPS_HOST_DEVICE float div(float a, float b) { return a / b; }
SPECOPS_HOST_DEVICE float fma(float a, float b, float c) { return std::fma(a, b, c); }  // one rounding
#endif

SPECOPS_HOST_DEVICE float from_bits(int32_t bits) {
  float f;
  memcpy(&f, &bits, sizeof f);
  return f;
}

SPECOPS_HOST_DEVICE int32_t to_bits(float f) {
  int32_t bits;
  memcpy(&bits, &f, sizeof bits);
  return bits;
}

constexpr float kLog2e = 1.4426950408889634f;

// exp(x) from its first step's result y = x log2(e) (rounded): 2^y for y <= 0, 0 below -125.
SPECOPS_HOST_DEVICE float exp_of_exponent(float y) {
  constexpr float kCoefficients[8] = {
      2.1651645511155948e-05f, 0.00014299429312814027f, 0.001342980656772852f,
      0.009613536298274994f,   0.05550529062747955f,    0.2402263581752777f,
      0.6931471824645996f,     1.0f};
  if (y < -125.0f) return 0.0f;
  const float n = floorf(y);
  const float f = sub(y, n);
  float acc = kCoefficients[0];
  for (int i = 1; i < 8; ++i) acc = fma(acc, f, kCoefficients[i]);
  return mul(acc, from_bits((static_cast<int32_t>(n) + 127) << 23));
}

// exp(x) for x <= 0; 0 below 2^-125.
SPECOPS_HOST_DEVICE float exp(float x) { return exp_of_exponent(mul(x, kLog2e)); }

// log(u) for normal u > 0.
SPECOPS_HOST_DEVICE float log(float u) {
  constexpr float kSeries[5] = {2.0f / 9.0f, 2.0f / 7.0f, 2.0f / 5.0f, 2.0f / 3.0f, 2.0f};
  const int32_t bits = to_bits(u);
  int32_t e = (bits >> 23) - 127;
  float m = from_bits((bits & 0x7FFFFF) | 0x3F800000);
  if (m > 1.4142135f) {
    m = mul(m, 0.5f);
    e += 1;
  }
  const float s = div(sub(m, 1.0f), add(m, 1.0f));
  const float s2 = mul(s, s);
  float acc = kSeries[0];
  for (int i = 1; i < 5; ++i) acc = add(mul(acc, s2), kSeries[i]);
  return add(mul(static_cast<float>(e), 0.6931471805599453f), mul(acc, s));
}

}  // namespace repro
}  // namespace specops
