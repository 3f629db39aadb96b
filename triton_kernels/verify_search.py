"""Top-k and top-p thresholds of the Triton ``verify``: an exact 16-ary search over int32
keys, one launch per round, each row split across programs whose partials add exactly.

Each program adds ``sum weight_v [key_v > c]`` for 16 candidates c over its split (int64,
exact); the next round's programs combine the partials and narrow the interval. 8 rounds
cover 32 bits.
"""

from __future__ import annotations

import triton
import triton.language as tl

from .verify_math import MASS_SCALE, TOP_P_SCALE, chain_launch, from_order_key, load_logits, order_key, weights
from .verify_slots import request_params, row_fixed_sum, row_max_argmax, slot_row

NUM_CANDIDATES = tl.constexpr(16)  # thresholds tested per search round
SEARCH_ROUNDS = tl.constexpr(8)  # 16-ary search: 16^8 = 2^32 covers any float key interval
TOP_K_MODE = tl.constexpr(0)
TOP_P_MODE = tl.constexpr(1)


@triton.jit
def _narrow(agg_ptr, lo, hi, num_splits, bound, SCALE: tl.constexpr, USE_TOTAL: tl.constexpr,
            BLOCK_S: tl.constexpr):
    """One search step: the smallest c in [lo, hi] with ``A(c) * SCALE < bound`` (true at
    hi), A(c) the summed partials of the candidates ``lo + j * step`` (j < 16) below hi.
    USE_TOTAL: bound is multiplied by the summed total (column 16), as top-p needs."""
    s = tl.arange(0, BLOCK_S)
    j = tl.arange(0, 2 * NUM_CANDIDATES)  # columns 0..16 used (arange needs a power of 2)
    tile = tl.load(agg_ptr + s[:, None] * (NUM_CANDIDATES + 1) + j[None, :],
                   mask=(s < num_splits)[:, None] & (j <= NUM_CANDIDATES)[None, :], other=0)
    agg = tl.sum(tile, axis=0)  # A(c_j) for j < 16, then the total
    if USE_TOTAL:
        bound = bound * tl.sum(tl.where(j == NUM_CANDIDATES, agg, 0), axis=0)
    step = tl.maximum((hi - lo + NUM_CANDIDATES - 1) // NUM_CANDIDATES, 1)
    candidate = lo + j.to(tl.int64) * step
    valid = (j < NUM_CANDIDATES) & (candidate < hi)
    holds = agg * SCALE < bound
    new_hi = tl.min(tl.where(valid & holds, candidate, hi), axis=0)
    new_lo = tl.max(tl.where(valid & ~holds, candidate + 1, lo), axis=0)
    return new_lo, new_hi


@triton.jit
def search_interval(state_ptr, agg_ptr, search_round, slot, num_slots, num_splits, lo, hi, bound,
                    MODE: tl.constexpr, BLOCK_S: tl.constexpr):
    """The search interval of a slot before round ``search_round`` (SEARCH_ROUNDS: the
    result, lo == hi). (lo, hi): the initial interval, used in round 0."""
    if search_round > 0:
        previous = slot.to(tl.int64) + (search_round - 1) * num_slots
        lo = tl.load(state_ptr + previous * 2)
        hi = tl.load(state_ptr + previous * 2 + 1)
        agg = agg_ptr + previous * num_splits * (NUM_CANDIDATES + 1)
        if MODE == TOP_K_MODE:
            lo, hi = _narrow(agg, lo, hi, num_splits, bound, 1, False, BLOCK_S)
        else:
            lo, hi = _narrow(agg, lo, hi, num_splits, bound, 16777216, True, BLOCK_S)
    return lo, hi


@triton.jit
def top_k_initial(max_logit):
    """Top-k search interval over order keys: [key(-inf), key(max)], as int64."""
    low = order_key(tl.full([], float("-inf"), tl.float32)).to(tl.int64)
    return low, order_key(max_logit + tl.zeros([], tl.float32)).to(tl.int64)


@triton.jit
def top_p_initial(top_p):
    """Top-p search interval over probability bits [0, bits(1.0)] and its bound factor
    max(1, floor(top_p 2^24))."""
    threshold = tl.maximum(tl.floor(top_p * TOP_P_SCALE).to(tl.int64), 1)
    return tl.zeros([], tl.int64), tl.zeros([], tl.int64) + 0x3F800000, threshold


@triton.jit
def row_kth(state_ptr, agg_ptr, slot, num_slots, num_splits, uses_top_k, top_k, max_logit, BLOCK_S: tl.constexpr):
    """The top-k threshold of a slot once its search is done (-inf without top-k)."""
    kth = tl.full([], float("-inf"), tl.float32)
    if uses_top_k:
        lo, hi = top_k_initial(max_logit)
        lo, hi = search_interval(state_ptr, agg_ptr, SEARCH_ROUNDS, slot, num_slots, num_splits, lo, hi,
                                 top_k.to(tl.int64), TOP_K_MODE, BLOCK_S)
        kth = from_order_key(hi)
    return kth


@triton.jit
def row_p_min(state_ptr, agg_ptr, slot, num_slots, num_splits, uses_top_p, top_p, BLOCK_S: tl.constexpr):
    """The top-p threshold of a slot once its search is done: keep p >= p_min (0 without)."""
    p_min = tl.zeros([], tl.float32)
    if uses_top_p:
        lo, hi, threshold = top_p_initial(top_p)
        lo, hi = search_interval(state_ptr, agg_ptr, SEARCH_ROUNDS, slot, num_slots, num_splits, lo, hi,
                                 threshold, TOP_P_MODE, BLOCK_S)
        p_min = hi.to(tl.int32).to(tl.float32, bitcast=True)
    return p_min


# Grid (batch * width, num_splits), one launch per round. Program (slot, s) narrows the
# slot's interval from the previous round's partials (split 0 records it), then adds
# ``A(c) = sum weight_v [key_v > c]`` over its split for the round's 16 candidates c:
# top-k: key = order key of the logit, weight 1 (c* = key of the k-th largest logit);
# top-p: key = bits of p = w / z1, weight floor(p 2^32), and the total mass (column 16).
# Bytes: the row once per round, for the slots that use the threshold only.
@triton.jit(do_not_specialize=["num_tokens", "width", "search_round"])
def threshold_search_kernel(
    state_ptr,  # [SEARCH_ROUNDS, batch * width, 2] int64: (lo, hi) before each round
    agg_ptr,  # [SEARCH_ROUNDS, batch * width, num_splits, 17] int64
    part_max_ptr,  # [batch * width, num_splits] float32
    part_arg_ptr,  # [batch * width, num_splits] int32
    top_k_state_ptr,  # top-k search of the same shapes (read in TOP_P_MODE)
    top_k_agg_ptr,
    part_sum_ptr,  # [batch * width, num_splits] int64: z1 partials (read in TOP_P_MODE)
    target_ptr,  # [num_tokens, vocab]
    bonus_ptr,  # [batch, vocab]
    cu_ptr,  # [batch] int32
    temperature_ptr,  # [batch] float32
    top_k_ptr,  # [batch] int32
    top_p_ptr,  # [batch] float32
    num_tokens,
    vocab,
    width,
    split_len,
    search_round,
    MODE: tl.constexpr,
    HAS_TOP_K: tl.constexpr,
    HAS_TOP_P: tl.constexpr,
    BLOCK_V: tl.constexpr,
    BLOCK_S: tl.constexpr,
    PDL: tl.constexpr = False,
):
    chain_launch(PDL)
    slot = tl.program_id(0)
    split = tl.program_id(1)
    num_slots = tl.num_programs(0)
    num_splits = tl.num_programs(1)
    b = slot // width
    i = slot % width
    row_ptr, _start, count = slot_row(cu_ptr, target_ptr, bonus_ptr, b, i, num_tokens, vocab, width)
    temperature, uses_top_k, top_k, uses_top_p, top_p = request_params(
        b, vocab, temperature_ptr, top_k_ptr, top_p_ptr, HAS_TOP_K, HAS_TOP_P)
    uses = uses_top_k if MODE == TOP_K_MODE else uses_top_p
    if (i <= count) & uses:
        max_logit, _argmax = row_max_argmax(part_max_ptr, part_arg_ptr, slot, num_splits, BLOCK_S)
        kth = tl.full([], float("-inf"), tl.float32)
        z1 = tl.full([], 1.0, tl.float32)
        if MODE == TOP_K_MODE:
            lo, hi = top_k_initial(max_logit)
            bound = top_k.to(tl.int64)
        else:
            if HAS_TOP_K:
                kth = row_kth(top_k_state_ptr, top_k_agg_ptr, slot, num_slots, num_splits, uses_top_k, top_k,
                              max_logit, BLOCK_S)
            z1 = row_fixed_sum(part_sum_ptr, slot, num_splits, BLOCK_S)
            lo, hi, bound = top_p_initial(top_p)
        lo, hi = search_interval(state_ptr, agg_ptr, search_round, slot, num_slots, num_splits, lo, hi, bound,
                                 MODE, BLOCK_S)
        here = slot.to(tl.int64) + search_round * num_slots
        if split == 0:
            tl.store(state_ptr + here * 2, lo)
            tl.store(state_ptr + here * 2 + 1, hi)
        j = tl.arange(0, NUM_CANDIDATES)
        candidate = lo + j.to(tl.int64) * tl.maximum((hi - lo + NUM_CANDIDATES - 1) // NUM_CANDIDATES, 1)
        above = tl.zeros([NUM_CANDIDATES], tl.int64)
        total = tl.zeros([BLOCK_V], tl.int64)
        v_begin = split * split_len
        offset = 0
        while offset < split_len:
            v = v_begin + offset + tl.arange(0, BLOCK_V)
            z = load_logits(row_ptr, v, v < vocab)
            if MODE == TOP_K_MODE:
                key = order_key(z).to(tl.int64)
                weight = (v < vocab).to(tl.int64)
            else:
                p = tl.math.div_rn(weights(z, max_logit, temperature, kth), z1)
                key = p.to(tl.int32, bitcast=True).to(tl.int64)
                weight = tl.where(v < vocab, tl.floor(p * MASS_SCALE).to(tl.int64), 0)
            above += tl.sum(tl.where(key[:, None] > candidate[None, :], weight[:, None], 0), axis=0)
            total += weight
            offset += BLOCK_V
        out = agg_ptr + (here * num_splits + split) * (NUM_CANDIDATES + 1)
        tl.store(out + j, above)
        tl.store(out + NUM_CANDIDATES, tl.sum(total, axis=0))
