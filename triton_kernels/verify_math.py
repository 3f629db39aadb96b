"""Device functions the fused ``verify`` kernels share: Philox4x32-10 (reference/philox.py)
and exp/log built from IEEE float32 operations (reference/repro_math.py), bit for bit,
the 64-bit multiply-high of the sampling draw, and the per-element steps of the processed
distribution (reference/verify.py).

Every float operation is a separate rounded one but exp's polynomial steps, which are
fused multiply-adds (tl.fma, fma.rn.f32 on the GPU): kernels using these are launched with
enable_fp_fusion=False, and divisions are tl.math.div_rn (a plain float32 ``/`` lowers to
the approximate div.full on the GPU).
"""

from __future__ import annotations

import os

import numpy as np
import triton
import triton.language as tl

FIXED_SCALE = tl.constexpr(1099511627776.0)  # 2^40: normaliser sums
MASS_SCALE = tl.constexpr(4294967296.0)  # 2^32: top-p masses
TOP_P_SCALE = tl.constexpr(16777216.0)  # 2^24: top_p and the acceptance uniform
INDEX_MAX = tl.constexpr(2**31 - 1)
RESIDUAL_PROPOSALS = tl.constexpr(16)  # reference/verify.py: proposals of a residual draw
PURPOSE_PROPOSE = tl.constexpr(2)  # reference/philox.py
LOG2E = tl.constexpr(1.4426950408889634)  # exp's first step (reference/repro_math.LOG2E), rounded to float32


def _fma_rounded_once(self, x, y, z):
    """The interpreter's fma for float32: a * b + c rounded once (reference/repro_math.fma's
    steps in numpy: the float64 sum rounded to odd, then to float32), where Triton 3.6's
    computes x * y + z in float32 numpy, two roundings; other types as Triton's. (Calling
    the reference's torch function instead took twice the time a call.)"""
    if not all(np.asarray(h.data).dtype == np.float32 for h in (x, y, z)):
        return _interpreter_fma(self, x, y, z)
    p = np.asarray(x.data, np.float64) * np.asarray(y.data, np.float64)  # exact
    c = np.asarray(z.data, np.float64)
    s = p + c
    b_virtual = s - p
    e = (p - (s - b_virtual)) + (c - b_virtual)  # s + e = p + c exactly
    bits = np.asarray(s).view(np.int64)
    odd = np.where((e > 0) == (s > 0), bits + 1, bits - 1)  # inexact s: its odd neighbour toward p + c
    bits = np.where((e != 0) & ((bits & 1) == 0), odd, bits)
    return TensorHandle(bits.view(np.float64).astype(np.float32), z.dtype.scalar)


if os.environ.get("TRITON_INTERPRET", "0") == "1":  # the GPU's fma.rn.f32 is rounded once already
    from triton.runtime.interpreter import InterpreterBuilder, TensorHandle

    _interpreter_fma = InterpreterBuilder.create_fma
    InterpreterBuilder.create_fma = _fma_rounded_once


@triton.jit
def chain_launch(PDL: tl.constexpr, WAITS: tl.constexpr = True):
    """Programmatic dependent launch (sm_90+), when PDL: the next launch of the chain may be
    scheduled now, and (WAITS) this one waits here until the launch before it has finished
    and its writes are visible. Every program of a PDL launch calls it before any early exit,
    so each launch still finishes after the one before it, and before reading anything a
    launch of the chain writes. The op's own inputs may be read before it: the chain's first
    launch is a plain one, started after their writers ended, and the launches after it
    start later still."""
    if PDL:
        if WAITS:
            tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()


@triton.jit
def philox(c0, c1, c2, c3, k0, k1):
    """Philox4x32-10 on uint32 tensors; returns the four output words."""
    for r in tl.static_range(10):
        if r > 0:
            k0 = k0 + 0x9E3779B9
            k1 = k1 + 0xBB67AE85
        hi0 = tl.umulhi(c0, 0xD2511F53)
        lo0 = c0 * 0xD2511F53
        hi1 = tl.umulhi(c2, 0xCD9E8D57)
        lo1 = c2 * 0xCD9E8D57
        c0, c1, c2, c3 = hi1 ^ c1 ^ k0, lo1, hi0 ^ c3 ^ k1, lo0
    return c0, c1, c2, c3


@triton.jit
def philox_words(seed, position, purpose, block):
    """Philox words of stream (seed, position, purpose) at counter index ``block`` (a tensor)."""
    zero = block.to(tl.uint32) * 0
    p_lo = (position & 0xFFFFFFFF).to(tl.uint32) + zero
    p_hi = ((position >> 32) & 0xFFFFFFFF).to(tl.uint32) + zero
    k_lo = (seed & 0xFFFFFFFF).to(tl.uint32) + zero
    k_hi = ((seed >> 32) & 0xFFFFFFFF).to(tl.uint32) + zero
    return philox(p_lo, p_hi, zero + purpose, block.to(tl.uint32), k_lo, k_hi)


@triton.jit
def _exp2_fraction(f):
    """2^f for f in [0, 1): Horner from the highest coefficient, a fused multiply-add a
    step, as the reference."""
    acc = tl.fma(f, 2.1651645511155948e-05, 0.00014299429312814027)
    acc = tl.fma(acc, f, 0.001342980656772852)
    acc = tl.fma(acc, f, 0.009613536298274994)
    acc = tl.fma(acc, f, 0.05550529062747955)
    acc = tl.fma(acc, f, 0.2402263581752777)
    acc = tl.fma(acc, f, 0.6931471824645996)
    return tl.fma(acc, f, 1.0)


@triton.jit
def exp_of_exponent(y):
    """repro_exp(x) from its first step's result, y = x log2(e) rounded to float32."""
    n = tl.maximum(tl.floor(y), -125.0)
    acc = _exp2_fraction(y - n)  # y - n >= 1 only where y < -125, which returns 0
    out = acc * ((n.to(tl.int32) + 127) << 23).to(tl.float32, bitcast=True)
    return tl.where(y < -125.0, 0.0, out)


@triton.jit
def repro_exp(x):
    return exp_of_exponent(x * LOG2E)


@triton.jit
def fixed_exp(x):
    """floor(repro_exp(x) 2^40) as int64, bit for bit, for x <= 0 or -inf."""
    return fixed_exp_of_exponent(x * LOG2E)


@triton.jit
def fixed_exp_of_exponent(y):
    """fixed_exp(x) from y = x log2(e) rounded to float32, in two float instructions fewer
    than the floor of exp_of_exponent's product: its result acc 2^n (n >= -125) is a normal
    float, so acc 2^(n + 40) is the same exact product; and where y < -125 (0 in repro_exp)
    f is clamped to 0 instead of the result selected: acc = 1, and 2^-85 floors to 0."""
    n = tl.maximum(tl.floor(y), -125.0)
    acc = _exp2_fraction(tl.maximum(y - n, 0.0))
    return (acc * ((n.to(tl.int32) + 167) << 23).to(tl.float32, bitcast=True)).to(tl.int64)


@triton.jit
def repro_log(u):
    bits = u.to(tl.int32, bitcast=True)
    e = (bits >> 23) - 127
    m = ((bits & 0x7FFFFF) | 0x3F800000).to(tl.float32, bitcast=True)
    big = m > 1.4142135
    m = tl.where(big, m * 0.5, m)
    e = tl.where(big, e + 1, e)
    s = tl.math.div_rn(m - 1.0, m + 1.0)
    s2 = s * s
    acc = s2 * 0.0 + 2.0 / 9.0
    acc = acc * s2 + 2.0 / 7.0
    acc = acc * s2 + 2.0 / 5.0
    acc = acc * s2 + 2.0 / 3.0
    acc = acc * s2 + 2.0
    return e.to(tl.float32) * 0.6931471805599453 + acc * s


@triton.jit
def mulhi64(x_lo, x_hi, m):
    """floor(X * m / 2^64) for X = x_lo + x_hi 2^32 (uint32 words) and 0 <= m < 2^63 (int64):
    the high word of the 128-bit product, from four exact 32 x 32-bit products."""
    m = m.to(tl.uint64)
    m_lo, m_hi = (m << 32) >> 32, m >> 32
    x_lo, x_hi = x_lo.to(tl.uint64), x_hi.to(tl.uint64)
    t = ((x_lo * m_lo) >> 32) + x_hi * m_lo  # < 2^64: (2^32 - 1)^2 + 2^32
    low = ((t << 32) >> 32) + x_lo * m_hi  # < 2^64
    return (x_hi * m_hi + (t >> 32) + (low >> 32)).to(tl.int64)


@triton.jit
def log_prob(p):
    """repro_log clamped to the smallest normal float (its domain)."""
    return repro_log(tl.maximum(p, 1.1754943508222875e-38))


@triton.jit
def finite_logits(raw):
    """float32 logits of loaded ones, NaN and +-inf as -inf (probability 0)."""
    z = raw.to(tl.float32)
    return tl.where(tl.abs(z) < float("inf"), z, float("-inf"))  # NaN compares false too


@triton.jit
def load_logits(row_ptr, v, mask):
    """float32 logits, NaN and +-inf as -inf (probability 0); -inf where masked."""
    return finite_logits(tl.load(row_ptr + v, mask=mask, other=float("-inf")))


@triton.jit
def order_key(z):
    """Order-preserving int32 key of a float."""
    bits = z.to(tl.int32, bitcast=True)
    return tl.where(bits >= 0, bits, bits ^ 0x7FFFFFFF)


@triton.jit
def from_order_key(key):
    """The float whose order_key is ``key`` (int64 holding an int32 value)."""
    bits = tl.where(key >= 0, key, key ^ 0x7FFFFFFF).to(tl.int32)
    return bits.to(tl.float32, bitcast=True)


@triton.jit
def weights(z, max_logit, temperature, kth):
    """exp((z - max) / T) for z >= kth (top-k), else 0."""
    return tl.where(z >= kth, repro_exp(tl.math.div_rn(z - max_logit, temperature)), 0.0)


@triton.jit
def top_p_weights(w, z1, p_min):
    """The weights top-p keeps (p = w / z1 >= p_min), 0 elsewhere; p_min = 0 keeps all."""
    return tl.where(tl.math.div_rn(w, z1) >= p_min, w, 0.0)


@triton.jit
def exponent_scale(temperature):
    """log2(e) / T when T is a power of two whose inverse is a normal float (T = 1 above
    all), else 0. Then exp's first step, ((z - max) / T) log2(e) rounded, equals
    (z - max) (log2(e) / T) rounded wherever it decides exp's result: log2(e) / T is exact,
    and so is (z - max) / T unless it is subnormal (or -inf past the float range, where the
    folded product is -inf too), so both round the same real number once. Where it is
    subnormal (or flushed), y is 0 one way and at most 2^-125 the other, and exp returns 1
    both ways (its polynomial at f = 1 is 2 exactly)."""
    bits = temperature.to(tl.int32, bitcast=True)
    exponent = (bits >> 23) & 0xFF
    power_of_two = (bits > 0) & ((bits & 0x7FFFFF) == 0) & (exponent >= 1) & (exponent <= 253)
    inverse = ((254 - exponent) << 23).to(tl.float32, bitcast=True)
    return tl.where(power_of_two, inverse * LOG2E, 0.0)


@triton.jit
def first_step(z, max_logit, temperature, MULTIPLY: tl.constexpr):
    """exp's first step, y = ((z - max) / T) log2(e) rounded, by the division; MULTIPLY:
    ``temperature`` holds log2(e) / T (exponent_scale: the step folded into one multiply,
    bit for bit)."""
    if MULTIPLY:
        y = (z - max_logit) * temperature
    else:
        y = tl.math.div_rn(z - max_logit, temperature) * LOG2E
    return y


@triton.jit
def _kept_weights(top_k_kept, y, z1, p_min, TOP_P: tl.constexpr):
    """exp from its first step's y where top-k keeps the entry (z >= kth), else 0; then
    (TOP_P) top-p's."""
    w = tl.where(top_k_kept, exp_of_exponent(y), 0.0)
    if TOP_P:
        w = top_p_weights(w, z1, p_min)
    return w


@triton.jit
def processed_weights(z, max_logit, temperature, kth, z1, p_min, MULTIPLY: tl.constexpr, TOP_P: tl.constexpr):
    """The processed weights: exp((z - max) / T) after top-k and (TOP_P) top-p, the terms of
    the exact normaliser. MULTIPLY: ``temperature`` holds log2(e) / T (first_step)."""
    return _kept_weights(z >= kth, first_step(z, max_logit, temperature, MULTIPLY), z1, p_min, TOP_P)


@triton.jit
def scaled_weights(z, max_logit, temperature, scale, kth, z1, p_min, TOP_P: tl.constexpr):
    """processed_weights at either temperature: exp's first step by one multiply where
    ``scale`` (exponent_scale(temperature)) is > 0, else by the division. The branch on the
    scalar holds that step alone, so a caller compiles the rest once, where processed_weights'
    constexpr MULTIPLY needs a copy of the caller's code for each form."""
    if scale > 0.0:
        y = first_step(z, max_logit, scale, True)
    else:
        y = first_step(z, max_logit, temperature, False)
    return _kept_weights(z >= kth, y, z1, p_min, TOP_P)


@triton.jit
def fixed_weights(z, max_logit, temperature, kth, MULTIPLY: tl.constexpr, HAS_TOP_K: tl.constexpr):
    """floor(w 2^40) as int64 of the processed weights without top-p (processed_weights), by
    fixed_exp; 0 where z = -inf. HAS_TOP_K False: kth is -inf (no compare issued).
    MULTIPLY: ``temperature`` holds log2(e) / T (first_step)."""
    y = first_step(z, max_logit, temperature, MULTIPLY)
    if HAS_TOP_K:
        y = tl.where(z >= kth, y, float("-inf"))
    return fixed_exp_of_exponent(y)


@triton.jit
def probs(z, max_logit, temperature, kth, z1, p_min, z2):
    """p_v after top-k, normalisation by z1, top-p (p >= p_min), renormalisation by z2."""
    return tl.math.div_rn(top_p_weights(weights(z, max_logit, temperature, kth), z1, p_min), z2)


@triton.jit
def acceptance_uniform(seed, position, block):
    """u in [0, 1) of the acceptance test at ``position`` (word 0 of its draw, 24 bits)."""
    w0, _w1, _w2, _w3 = philox_words(seed, position, 0, block)
    return (w0 >> 8).to(tl.float32) * (1.0 / TOP_P_SCALE)


@triton.jit
def exact_test(z_x, q_x, u, x, in_vocab, max_logit, temperature, kth, z1, p_min, z2):
    """(accepted, p(x)) of a random step's exact test u q(x) < p(x), scalars: z_x the
    draft's logit, x the draft (0 when not ``in_vocab``); every mass on token 0 when no
    logit is finite (max_logit = -inf)."""
    p_x = tl.sum(probs(z_x + tl.zeros([1], tl.float32), max_logit, temperature, kth, z1, p_min, z2), axis=0)
    p_x = tl.where(max_logit == float("-inf"), tl.where(x == 0, 1.0, 0.0), p_x)
    return in_vocab & (q_x > 0.0) & (u * q_x < p_x), p_x
