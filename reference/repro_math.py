"""exp and log built from IEEE float32 operations alone, so every backend computes them bit
for bit alike (the libraries' expf/logf differ in the last ulp between CPU, CUDA and
Triton). Every line is one correctly rounded float32 operation, in this order: exp's
polynomial steps are fused multiply-adds (one rounding of a * b + c: ``fma``), every other
multiply and add is rounded on its own, so kernels must not contract them into FMAs (C++:
-ffp-contract=off or explicit __fmul_rn/__fadd_rn, __fmaf_rn where fused; Triton:
enable_fp_fusion=False, tl.fma where fused).

Accuracy: exp within 8e-8 relative for arguments near 0, growing as |x| * 2^-24 (the
rounding of x * log2(e)); log within 1e-6 absolute on (0, 1]. Both are far inside what a
float32 softmax needs; their value is that they are the same everywhere.
"""

from __future__ import annotations

import torch

LOG2E = 1.4426950408889634  # rounded to float32 where used
LN2 = 0.6931471805599453
SQRT2 = 1.4142135
# 2^f on [0, 1), degree 7 (Chebyshev fit), Horner from the highest coefficient.
EXP2_COEFFICIENTS = (
    2.1651645511155948e-05,
    0.00014299429312814027,
    0.001342980656772852,
    0.009613536298274994,
    0.05550529062747955,
    0.2402263581752777,
    0.6931471824645996,
    1.0,
)
# log(m) = 2 atanh(s), s = (m - 1) / (m + 1): 2 (s + s^3/3 + ... + s^9/9), Horner in s^2.
LOG_SERIES = (2.0 / 9.0, 2.0 / 7.0, 2.0 / 5.0, 2.0 / 3.0, 2.0)
EXP_LOWEST = -125.0  # below 2^-125 the result is flushed to 0 (no subnormal outputs)


def _f32(value: float) -> torch.Tensor:
    return torch.tensor(value, dtype=torch.float32)


def fma(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor | float) -> torch.Tensor:
    """a * b + c for float32 tensors with one rounding, as a GPU's fma.rn.f32 and C's fmaf.
    In float64 the product is exact (24 + 24 bits) and the sum s rounds once more; TwoSum
    gives that rounding's error e exactly, and s with e != 0 is moved to the odd one of its
    two float64 neighbours around the exact value (rounding to odd). Rounding that to
    float32 is then the exact value rounded once (53 >= 24 + 2 bits: Boldo and Melquiond's
    theorem), where rounding s alone could round twice."""
    p = a.double() * b.double()
    c = torch.as_tensor(c, dtype=torch.float32).double()
    s = p + c
    b_virtual = s - p
    e = (p - (s - b_virtual)) + (c - b_virtual)  # s + e = p + c exactly
    bits = s.view(torch.int64)
    # Inexact s with an even last bit: the odd neighbour is one ulp away in magnitude, up
    # where e has s's sign (|p + c| > |s|), down where it has the other.
    up = (e > 0) == (s > 0)
    odd = torch.where(up, bits + 1, bits - 1)
    bits = torch.where((e != 0) & (bits & 1 == 0), odd, bits)
    return bits.view(torch.float64).float()


def repro_exp(x: torch.Tensor) -> torch.Tensor:
    """exp(x) for float32 x <= 0 (softmax numerators after subtracting the max)."""
    y = x * _f32(LOG2E)
    n = torch.floor(y)
    f = y - n  # exact: y and floor(y) share their leading bits
    acc = torch.full_like(f, EXP2_COEFFICIENTS[0])
    for c in EXP2_COEFFICIENTS[1:]:
        acc = fma(acc, f, c)
    n_int = n.clamp(min=EXP_LOWEST).to(torch.int32)
    scale = ((n_int + 127) << 23).view(torch.float32)  # 2^n from its bits
    out = acc * scale  # exact
    return torch.where(y < EXP_LOWEST, torch.zeros_like(out), out)


def repro_log(u: torch.Tensor) -> torch.Tensor:
    """log(u) for normal float32 u > 0."""
    bits = u.view(torch.int32)
    e = (bits >> 23) - 127
    m = ((bits & 0x7FFFFF) | 0x3F800000).view(torch.float32)  # u = m * 2^e, m in [1, 2)
    big = m > _f32(SQRT2)
    m = torch.where(big, m * _f32(0.5), m)  # m in [sqrt(1/2), sqrt(2)): small s below
    e = torch.where(big, e + 1, e)
    s = (m - _f32(1.0)) / (m + _f32(1.0))
    s2 = s * s
    acc = torch.full_like(s, LOG_SERIES[0])
    for c in LOG_SERIES[1:]:
        acc = acc * s2
        acc = acc + _f32(c)
    log_m = acc * s
    return e.to(torch.float32) * _f32(LN2) + log_m

