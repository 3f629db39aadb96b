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


@triton.jit
def race_block_words(seed, position, blocks):
    """Philox words of the race stream (PURPOSE_SAMPLE = 1) at counter indices ``blocks``
    (a tensor): the key and the first three counter words stay scalars, so the key schedule
    and the first round's uniform half cost one thread-wide operation, not one per entry."""
    p_lo = (position & 0xFFFFFFFF).to(tl.uint32)
    p_hi = ((position >> 32) & 0xFFFFFFFF).to(tl.uint32)
    k_lo = (seed & 0xFFFFFFFF).to(tl.uint32)
    k_hi = ((seed >> 32) & 0xFFFFFFFF).to(tl.uint32)
    return philox(p_lo, p_hi, tl.full([], 1, tl.uint32), blocks.to(tl.uint32), k_lo, k_hi)


@triton.jit
def select_word(lane, w0, w1, w2, w3):
    """Word ``lane`` (the column of a [n, 4] tile) of each row's Philox block."""
    return tl.where(lane == 0, w0[:, None], tl.where(lane == 1, w1[:, None],
                                                     tl.where(lane == 2, w2[:, None], w3[:, None])))


@triton.jit
def race_score_bounds(z, q, word, exclude, max_logit, log2e_over_t, kth, inv_z1, p_min, inv_z2):
    """(upper, lower) bounds of each entry's exact race score ``div_rn(r, repro_exponential
    (word))`` (-1 where r <= 0), from the hardware's fast exp2 and approximate divisions.
    ``inv_z1``, ``inv_z2``: 1 / normalisers (approximate; the margins cover them).

    r: the exact path rounds every step to float32 and its exp is within ~1e-5 relative of
    the true one, the fast exp2 too (arguments up to 125 in magnitude): a 2^-12 margin at
    each step gives p_lo <= p <= p_hi (top-p keeps a token on the upper side when its upper
    bound passes, on the lower side when its lower bound does), and rounding is monotone, so
    fl(p_lo - q) <= fl(p - q) <= fl(p_hi - q).
    E = -log(1 - v), v = (word + 1/2) 2^-32 (the exact E is within a few ulp of it):
    E >= v >= s 2^-23 and, for v <= 1/2, E <= v + v^2 <= u (1 + u), u = (s + 1) 2^-23,
    s = word >> 9 (from the bits: no integer-to-float conversion). Above v = 1/2 the lower
    bound of the score is 0 (E is unbounded near v = 1).
    Exact scores below 1.1e-28 involve subnormal probabilities (score <= p / E, E >= 2^-33),
    which the fast path may flush to 0: every entry of positive weight gets at least that
    upper bound. The lower bound is -1 unless r_lo >= 2^-100 (7.9e-31), so that every step
    it bounds stays among normal floats (exact weights below 2^-125 are 0; subnormal
    quotients lose relative precision)."""
    w = tl.where(z >= kth, tl.exp2((z - max_logit) * log2e_over_t), 0.0)
    up2, down2 = BOUND_UP * BOUND_UP, BOUND_DOWN * BOUND_DOWN  # w's margin, then p's
    p_hi = tl.where(w * (inv_z1 * up2) >= p_min, w * (inv_z2 * up2), 0.0)
    p_lo = tl.where(w * (inv_z1 * down2) >= p_min, w * (inv_z2 * down2), 0.0)
    r_hi = tl.where(exclude, 0.0, p_hi - q)
    r_lo = tl.where(exclude, 0.0, p_lo - q)
    s = word >> 9
    e_lo = (s | 0x3F800000).to(tl.float32, bitcast=True) - 1.0
    u = (s + 0x3F800001).to(tl.float32, bitcast=True) - 1.0  # s + 1 = 2^23 carries into 2.0
    e_hi = u * (1.0 + u) * BOUND_UP
    upper = tl.where(r_hi > 0.0, r_hi / e_lo * BOUND_UP, -1.0)  # e_lo = 0: +inf
    upper = tl.where((w > 0.0) & ~exclude, tl.maximum(upper, 1.1e-28), upper)
    lower = tl.where(r_lo >= 7.9e-31, tl.where(u <= 0.5, r_lo / e_hi * BOUND_DOWN, 0.0), -1.0)
    return upper, lower


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
