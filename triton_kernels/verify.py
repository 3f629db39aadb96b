"""Triton kernel of the fused ``verify`` op, bit for bit reference/verify.py.

First version, written for exactness: one program per request walks its rows and makes
several passes over each (max; top-k threshold by bisection over the float order when
asked; exact fixed-point normaliser; top-p threshold by bisection when asked; the race at
the first rejected row or the bonus row). It has not been tuned (no vocab split across
programs); every float operation is a separate rounded one (launched with
enable_fp_fusion=False; divisions are tl.math.div_rn, since a plain float32 ``/`` lowers to
the approximate div.full), exp/log/Exp(1) follow reference/repro_math.py and the draws
reference/philox.py. Loops bounded at run time are ``while`` loops: the interpreter cannot
bound ``range`` by a tensor.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .ragged import draft_range

BLOCK_V = tl.constexpr(1024)
FIXED_SCALE = tl.constexpr(1099511627776.0)  # 2^40
MASS_SCALE = tl.constexpr(4294967296.0)  # 2^32
TOP_P_SCALE = tl.constexpr(16777216.0)  # 2^24


@triton.jit
def _philox(c0, c1, c2, c3, k0, k1):
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
def _words(seed, position, purpose, block):
    """Philox words of stream (seed, position, purpose) at counter index `block` (a tensor)."""
    zero = block.to(tl.uint32) * 0
    p_lo = (position & 0xFFFFFFFF).to(tl.uint32) + zero
    p_hi = ((position >> 32) & 0xFFFFFFFF).to(tl.uint32) + zero
    k_lo = (seed & 0xFFFFFFFF).to(tl.uint32) + zero
    k_hi = ((seed >> 32) & 0xFFFFFFFF).to(tl.uint32) + zero
    return _philox(p_lo, p_hi, zero + purpose, block.to(tl.uint32), k_lo, k_hi)


@triton.jit
def _repro_exp(x):
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
def _repro_log(u):
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
def _repro_exponential(word):
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
    large = -_repro_log(tl.where(one_minus > 0.0, one_minus, 1.0))
    large = tl.where(one_minus > 0.0, large, float("inf"))
    return tl.where(v < 0.5, small, large)


@triton.jit
def _logits(row_ptr, v, vocab):
    """float32 logits, NaN and +-inf as -inf (probability 0)."""
    z = tl.load(row_ptr + v, mask=v < vocab, other=float("-inf")).to(tl.float32)
    finite = (z == z) & (tl.abs(z) < float("inf"))
    return tl.where(finite, z, float("-inf"))


@triton.jit
def _order_key(z):  # order-preserving int32 key of a float
    bits = z.to(tl.int32, bitcast=True)
    return tl.where(bits >= 0, bits, bits ^ 0x7FFFFFFF)


@triton.jit
def _count_at_least(row_ptr, vocab, key):
    count = 0
    off = 0
    while off < vocab:
        v = off + tl.arange(0, BLOCK_V)
        z = _logits(row_ptr, v, vocab)
        count += tl.sum(((_order_key(z) >= key) & (v < vocab)).to(tl.int32), axis=0)
        off += BLOCK_V
    return count


@triton.jit
def _weights(z, max_logit, temperature, kth):
    return tl.where(z >= kth, _repro_exp(tl.math.div_rn(z - max_logit, temperature)), 0.0)


@triton.jit
def _probs(z, max_logit, temperature, kth, z1, p_min, z2):
    """p_v after top-k, normalisation by z1, top-p (p >= p_min), renormalisation by z2."""
    w = _weights(z, max_logit, temperature, kth)
    return tl.math.div_rn(tl.where(tl.math.div_rn(w, z1) >= p_min, w, 0.0), z2)


@triton.jit
def _fixed_sum(row_ptr, vocab, max_logit, temperature, kth, z1, p_min, USE_P_MIN: tl.constexpr):
    total = tl.zeros([], tl.int64)
    off = 0
    while off < vocab:
        v = off + tl.arange(0, BLOCK_V)
        w = _weights(_logits(row_ptr, v, vocab), max_logit, temperature, kth)
        if USE_P_MIN:
            w = tl.where(tl.math.div_rn(w, z1) >= p_min, w, 0.0)
        w = tl.where(v < vocab, w, 0.0)
        total += tl.sum(tl.floor(w * FIXED_SCALE).to(tl.int64), axis=0)
        off += BLOCK_V
    return total.to(tl.float32) * (1.0 / FIXED_SCALE)


@triton.jit
def _mass_above(row_ptr, vocab, max_logit, temperature, kth, z1, t):
    above = tl.zeros([], tl.int64)
    off = 0
    while off < vocab:
        v = off + tl.arange(0, BLOCK_V)
        p = tl.math.div_rn(_weights(_logits(row_ptr, v, vocab), max_logit, temperature, kth), z1)
        p = tl.where(v < vocab, p, 0.0)
        above += tl.sum(tl.where(p > t, tl.floor(p * MASS_SCALE).to(tl.int64), 0), axis=0)
        off += BLOCK_V
    return above


@triton.jit
def _row_max(row_ptr, vocab):
    m = float("-inf")
    off = 0
    while off < vocab:
        m = tl.maximum(m, tl.max(_logits(row_ptr, off + tl.arange(0, BLOCK_V), vocab), axis=0))
        off += BLOCK_V
    return m


@triton.jit
def _keep_first_max(values, v, best, best_index):
    """Running argmax over blocks: the block's maximum replaces ``best`` only when strictly
    greater, and within a block ties go to the lowest index, so the first maximum wins."""
    block_best = tl.max(values, axis=0)
    block_index = tl.min(tl.where(values == block_best, v, 2147483647), axis=0)
    better = block_best > best
    return tl.where(better, block_best, best), tl.where(better, block_index, best_index)


@triton.jit
def _argmax(row_ptr, vocab):
    best = float("-inf")
    best_index = 0
    off = 0
    while off < vocab:
        v = off + tl.arange(0, BLOCK_V)
        z = tl.where(v < vocab, _logits(row_ptr, v, vocab), float("-inf"))
        best, best_index = _keep_first_max(z, v, best, best_index)
        off += BLOCK_V
    return best_index


@triton.jit
def _race(row_ptr, q_row_ptr, vocab, max_logit, temperature, kth, z1, p_min, z2, draft, seed, position,
          MODE: tl.constexpr):
    """argmax_v r_v / E_v; MODE 0: r = p (bonus), 1: max(p - q, 0), 2: p without the draft."""
    best = float("-inf")
    best_index = 0
    off = 0
    while off < vocab:
        v = off + tl.arange(0, BLOCK_V)
        p = _probs(_logits(row_ptr, v, vocab), max_logit, temperature, kth, z1, p_min, z2)
        if MODE == 1:
            r = p - tl.load(q_row_ptr + v, mask=v < vocab, other=0.0)
        elif MODE == 2:
            r = tl.where(v == draft, 0.0, p)
        else:
            r = p
        w0, w1, w2, w3 = _words(seed, position, 1, v // 4)
        lane = v % 4
        word = tl.where(lane == 0, w0, tl.where(lane == 1, w1, tl.where(lane == 2, w2, w3)))
        score = tl.where(r > 0.0, tl.math.div_rn(r, _repro_exponential(word)), -1.0)
        score = tl.where(v < vocab, score, float("-inf"))
        best, best_index = _keep_first_max(score, v, best, best_index)
        off += BLOCK_V
    return best_index


@triton.jit
def _log_prob(p):
    return _repro_log(tl.maximum(p, 1.1754943508222875e-38))


# Grid (B,). Program b verifies request b: for each of its draft rows and then its bonus
# row, the processed distribution (passes over the row), the acceptance test from its
# Philox uniform, and at the first rejection (or the bonus row) the race. Bytes: each row
# it reaches several times (2 passes + 32 per top-k bisection + 31 per top-p bisection +
# 1 race pass), untuned.
@triton.jit(do_not_specialize=["num_tokens", "vocab", "width"])
def _verify_kernel(
    out_ptr,  # [B, width] int32
    num_accepted_ptr,  # [B] int32
    logprobs_ptr,  # [B, width] float32 (written when RETURN_LOGPROBS)
    target_ptr,  # [T, V] float32 | bfloat16 | float16
    bonus_ptr,  # [B, V]
    draft_ptr,  # [T] int32 | int64
    draft_probs_ptr,  # [T, V] float32 (read when HAS_DRAFT_PROBS)
    cu_ptr,  # [B] int32
    temperature_ptr,  # [B] float32
    top_k_ptr,  # [B] int32 (read when HAS_TOP_K)
    top_p_ptr,  # [B] float32 (read when HAS_TOP_P)
    seeds_ptr,  # [B] int64
    positions_ptr,  # [B] int64
    num_tokens,
    vocab,
    width,
    HAS_DRAFT_PROBS: tl.constexpr,
    HAS_TOP_K: tl.constexpr,
    HAS_TOP_P: tl.constexpr,
    RETURN_LOGPROBS: tl.constexpr,
):
    b = tl.program_id(0)
    start, count = draft_range(cu_ptr, b, num_tokens, width - 1)
    temperature = tl.load(temperature_ptr + b)
    seed = tl.load(seeds_ptr + b)
    position0 = tl.load(positions_ptr + b)
    top_k = tl.load(top_k_ptr + b) if HAS_TOP_K else 0
    top_p = tl.load(top_p_ptr + b) if HAS_TOP_P else 1.0
    greedy = temperature == 0.0
    out_row = out_ptr + b.to(tl.int64) * width
    lp_row = logprobs_ptr + b.to(tl.int64) * width
    i = tl.zeros([], tl.int32)
    done = tl.zeros([], tl.int32)
    accepted = tl.zeros([], tl.int32)
    while done == 0:
        is_bonus = i == count
        t = start + i
        row_ptr = tl.where(is_bonus, bonus_ptr + b.to(tl.int64) * vocab, target_ptr + t.to(tl.int64) * vocab)
        max_logit = _row_max(row_ptr, vocab)
        no_finite = max_logit == float("-inf")
        draft = tl.load(draft_ptr + t, mask=~is_bonus, other=0).to(tl.int64)
        in_vocab = (draft >= 0) & (draft < vocab) & ~is_bonus
        token = tl.zeros([], tl.int32)
        log_p = tl.zeros([], tl.float32)
        if greedy:
            token = _argmax(row_ptr, vocab)
            if RETURN_LOGPROBS:
                z1 = _fixed_sum(row_ptr, vocab, max_logit, 1.0, float("-inf"), 1.0, 0.0, False)
                z_t = _logits(row_ptr, token + tl.arange(0, 1), vocab)
                p_t = tl.sum(tl.math.div_rn(_weights(z_t, max_logit, 1.0, float("-inf")), z1), axis=0)
                log_p = tl.where(no_finite, 0.0, tl.sum(_log_prob(p_t + tl.zeros([1], tl.float32)), axis=0))
            done = (is_bonus | (draft != token)).to(tl.int32)
            accepted = tl.where(done != 0, i, accepted)
        else:
            kth = tl.full([], float("-inf"), tl.float32)
            if HAS_TOP_K:
                if (top_k > 0) & (top_k < vocab):
                    lo = _order_key(float("-inf") + tl.zeros([], tl.float32)).to(tl.int64)
                    hi = _order_key(max_logit + tl.zeros([], tl.float32)).to(tl.int64)
                    while lo < hi:
                        mid = lo + (hi - lo + 1) // 2
                        if _count_at_least(row_ptr, vocab, mid.to(tl.int32)) >= top_k:
                            lo = mid
                        else:
                            hi = mid - 1
                    bits = tl.where(lo >= 0, lo, lo ^ 0x7FFFFFFF).to(tl.int32)
                    kth = bits.to(tl.float32, bitcast=True)
            z1 = _fixed_sum(row_ptr, vocab, max_logit, temperature, kth, 1.0, 0.0, False)
            p_min = tl.zeros([], tl.float32)
            z2 = z1
            if HAS_TOP_P:
                if top_p < 1.0:
                    total = _mass_above(row_ptr, vocab, max_logit, temperature, kth, z1, -1.0)
                    threshold = tl.maximum(tl.floor(top_p * TOP_P_SCALE).to(tl.int64), 1)
                    lo = tl.zeros([], tl.int64)
                    hi = tl.zeros([], tl.int64) + 0x3F800000
                    while lo < hi:
                        mid = (lo + hi) // 2
                        t_mid = mid.to(tl.int32).to(tl.float32, bitcast=True)
                        above = _mass_above(row_ptr, vocab, max_logit, temperature, kth, z1, t_mid)
                        if above * 16777216 < threshold * total:
                            hi = mid
                        else:
                            lo = mid + 1
                    p_min = lo.to(tl.int32).to(tl.float32, bitcast=True)
                    z2 = _fixed_sum(row_ptr, vocab, max_logit, temperature, kth, z1, p_min, True)
            x = tl.where(in_vocab, draft, 0)
            z_x = _logits(row_ptr, x + tl.arange(0, 1), vocab)
            p_x = tl.sum(_probs(z_x, max_logit, temperature, kth, z1, p_min, z2), axis=0)
            p_x = tl.where(no_finite, tl.where(x == 0, 1.0, 0.0), p_x)
            q_x = 1.0
            if HAS_DRAFT_PROBS:
                q_x = tl.load(draft_probs_ptr + t.to(tl.int64) * vocab + x, mask=in_vocab, other=0.0)
            w0, w1, w2, w3 = _words(seed, position0 + i, 0, tl.zeros([1], tl.int32))
            u = tl.sum((w0 >> 8).to(tl.float32), axis=0) * (1.0 / TOP_P_SCALE)
            ok = in_vocab & (q_x > 0.0) & (u * q_x < p_x)
            if ok:
                token = x.to(tl.int32)
            else:
                if no_finite:
                    token = 0
                elif is_bonus:
                    token = _race(row_ptr, draft_probs_ptr, vocab, max_logit, temperature, kth, z1, p_min, z2,
                                  x, seed, position0 + i, 0)
                elif HAS_DRAFT_PROBS:
                    token = _race(row_ptr, draft_probs_ptr + t.to(tl.int64) * vocab, vocab, max_logit, temperature,
                                  kth, z1, p_min, z2, x, seed, position0 + i, 1)
                else:
                    token = _race(row_ptr, draft_probs_ptr, vocab, max_logit, temperature, kth, z1, p_min, z2,
                                  tl.where(in_vocab, draft, -1), seed, position0 + i, 2)
                done = tl.full([], 1, tl.int32)
                accepted = i
            if RETURN_LOGPROBS:
                z_t = _logits(row_ptr, token + tl.arange(0, 1), vocab)
                p_t = tl.sum(_probs(z_t, max_logit, temperature, kth, z1, p_min, z2), axis=0)
                p_t = tl.where(no_finite, tl.where(token == 0, 1.0, 0.0), p_t)
                log_p = tl.sum(_log_prob(p_t + tl.zeros([1], tl.float32)), axis=0)
        tl.store(out_row + i, token.to(tl.int32))
        if RETURN_LOGPROBS:
            tl.store(lp_row + i, log_p)
        i += 1
    tl.store(num_accepted_ptr + b, accepted.to(tl.int32))
    while i < width:
        tl.store(out_row + i, -1)
        if RETURN_LOGPROBS:
            tl.store(lp_row + i, 0.0)
        i += 1


def verify(
    target_logits, bonus_logits, draft_token_ids, draft_probs, cu_num_draft_tokens, temperature, top_k, top_p,
    seeds, positions, max_spec_len, return_logprobs=False,
):
    """Launcher; arguments already validated (specops/_checks.py)."""
    batch, vocab = bonus_logits.shape
    width = max_spec_len + 1
    out = torch.full((batch, width), -1, dtype=torch.int32, device=target_logits.device)
    num_accepted = torch.zeros(batch, dtype=torch.int32, device=target_logits.device)
    logprobs = torch.zeros((batch, width) if return_logprobs else (0, 0), dtype=torch.float32,
                           device=target_logits.device)
    if batch == 0:
        return out, num_accepted, logprobs
    _verify_kernel[(batch,)](
        out, num_accepted, logprobs if return_logprobs else out, target_logits, bonus_logits, draft_token_ids,
        draft_probs if draft_probs is not None else temperature, cu_num_draft_tokens, temperature,
        top_k if top_k is not None else cu_num_draft_tokens, top_p if top_p is not None else temperature,
        seeds, positions, target_logits.shape[0], vocab, width,
        HAS_DRAFT_PROBS=draft_probs is not None, HAS_TOP_K=top_k is not None, HAS_TOP_P=top_p is not None,
        RETURN_LOGPROBS=return_logprobs, enable_fp_fusion=False,
    )
    return out, num_accepted, logprobs
