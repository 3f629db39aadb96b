"""Device functions the fused ``verify`` kernels share: Philox4x32-10 (reference/philox.py)
and exp/log/Exp(1) built from IEEE float32 operations (reference/repro_math.py), bit for
bit, plus the per-element steps of the processed distribution (reference/verify.py).

Every float operation is a separate rounded one: kernels using these are launched with
enable_fp_fusion=False, and divisions are tl.math.div_rn (a plain float32 ``/`` lowers to
the approximate div.full on the GPU).
"""

from __future__ import annotations

import triton
import triton.language as tl

FIXED_SCALE = tl.constexpr(1099511627776.0)  # 2^40: normaliser sums
MASS_SCALE = tl.constexpr(4294967296.0)  # 2^32: top-p masses
TOP_P_SCALE = tl.constexpr(16777216.0)  # 2^24: top_p and the acceptance uniform
INDEX_MAX = tl.constexpr(2**31 - 1)


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
def race_words(seed, position, v_begin, BLOCK_V: tl.constexpr):
    """Words ``v_begin .. v_begin + BLOCK_V - 1`` of the race stream (PURPOSE_SAMPLE = 1):
    word v is word ``v % 4`` of Philox block ``v // 4``, so one Philox call serves four
    vocab entries. ``v_begin`` is a multiple of 4."""
    blocks = v_begin // 4 + tl.arange(0, BLOCK_V // 4)
    w0, w1, w2, w3 = philox_words(seed, position, 1, blocks)
    # join(join(w0, w2), join(w1, w3))[n, a, c] is word 2a + c of block n.
    return tl.reshape(tl.join(tl.join(w0, w2), tl.join(w1, w3)), [BLOCK_V])


@triton.jit
def repro_exp(x):
    y = x * 1.4426950408889634
    n = tl.floor(y)
    f = y - n
    acc = f * 0.0 + 2.1651645511155948e-05
    acc = acc * f + 0.00014299429312814027
    acc = acc * f + 0.001342980656772852
    acc = acc * f + 0.009613536298274994
    acc = acc * f + 0.05550529062747955
    acc = acc * f + 0.2402263581752777
    acc = acc * f + 0.6931471824645996
    acc = acc * f + 1.0
    n_int = tl.maximum(n, -125.0).to(tl.int32)
    out = acc * ((n_int + 127) << 23).to(tl.float32, bitcast=True)
    return tl.where(y < -125.0, 0.0, out)


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
def repro_exponential(word):
    v = (word.to(tl.float32) + 0.5) * 2.3283064365386963e-10
    x = -v
    s = tl.math.div_rn(x, 2.0 + x)
    s2 = s * s
    acc = s2 * 0.0 + 1.0 / 13.0
    acc = acc * s2 + 1.0 / 11.0
    acc = acc * s2 + 1.0 / 9.0
    acc = acc * s2 + 1.0 / 7.0
    acc = acc * s2 + 1.0 / 5.0
    acc = acc * s2 + 1.0 / 3.0
    acc = acc * s2 + 1.0
    small = -((s * acc) * 2.0)
    one_minus = 1.0 - v
    large = -repro_log(tl.where(one_minus > 0.0, one_minus, 1.0))
    large = tl.where(one_minus > 0.0, large, float("inf"))
    return tl.where(v < 0.5, small, large)


# 1 +- 2^-12, over 6x the worst relative error of a step below (3.7e-5: the exponent
# argument's roundings over |y| <= 125, the fast exp2, repro_exp's own error).
BOUND_UP = tl.constexpr(1.000244140625)
BOUND_DOWN = tl.constexpr(0.999755859375)
# Exact scores below this involve subnormal probabilities (score <= p / E, E >= 2^-33),
# where a fast path that flushed them could bound too low: every entry of positive weight
# gets at least this bound.
SCORE_FLOOR = tl.constexpr(1.1e-28)


@triton.jit
def race_score_bound(z, q, word, exclude, max_logit, log2e_over_t, kth, inv_z1, p_min, inv_z2):
    """An upper bound of the exact race score ``div_rn(r, repro_exponential(word))`` (-1
    where r <= 0) from the hardware's fast exp2 and log2. The exact path rounds every step
    to float32 and its exp/log are within ~1e-5 relative of the true functions; the fast
    ones are within ~1e-5 too (arguments up to 125 in magnitude), so a 2^-12 margin at each
    step keeps the bound safe; rounding is monotone, so p_ub >= p gives
    fl(p_ub - q) >= fl(p - q). E = -log(1 - v) >= v + v^2/2 + ... + v^5/5 on [0, 1); above 1/2,
    1 - v is exact and the fast log2 is tight. ``inv_z1``, ``inv_z2``: 1 / normalisers."""
    w = tl.where(z >= kth, tl.exp2((z - max_logit) * log2e_over_t) * BOUND_UP, 0.0)
    p = tl.where(w * inv_z1 * BOUND_UP >= p_min, w * inv_z2 * BOUND_UP, 0.0)
    r = tl.where(exclude, 0.0, p - q)
    v = (word.to(tl.float32) + 0.5) * 2.3283064365386963e-10
    e_large = tl.where(v >= 0.5, -tl.log2(1.0 - v) * 0.6931471805599453, 0.0)
    e_small = v * (1.0 + v * (0.5 + v * (0.3333333 + v * (0.25 + v * 0.2))))  # within 1% below 1/2
    e = tl.maximum(e_small, e_large) * BOUND_DOWN
    bound = tl.where(r > 0.0, tl.math.div_rn(r, e) * BOUND_UP, -1.0)
    return tl.where((w > 0.0) & ~exclude, tl.maximum(bound, SCORE_FLOOR), bound)


@triton.jit
def log_prob(p):
    """repro_log clamped to the smallest normal float (its domain)."""
    return repro_log(tl.maximum(p, 1.1754943508222875e-38))


@triton.jit
def load_logits(row_ptr, v, mask):
    """float32 logits, NaN and +-inf as -inf (probability 0); -inf where masked."""
    z = tl.load(row_ptr + v, mask=mask, other=float("-inf")).to(tl.float32)
    return tl.where(tl.abs(z) < float("inf"), z, float("-inf"))  # NaN compares false too


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
def probs(z, max_logit, temperature, kth, z1, p_min, z2):
    """p_v after top-k, normalisation by z1, top-p (p >= p_min), renormalisation by z2."""
    w = weights(z, max_logit, temperature, kth)
    return tl.math.div_rn(tl.where(tl.math.div_rn(w, z1) >= p_min, w, 0.0), z2)
