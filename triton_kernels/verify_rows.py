"""Row passes of the Triton ``verify``: statistics of every target and bonus row a request
may reach, each row split across ``num_splits`` programs whose partials combine exactly.

A *slot* is (request b, step i), ``slot = b * width + i``: step i < count is the request's
target row ``start + i``, step count its bonus row, later steps are empty (their programs
exit at once). Slots, not physical rows, carry the statistics, so a row two requests share
(inconsistent ``cu_num_draft_tokens`` with value checks off) is processed per request.

Partials and why they combine bit-exactly (reference/verify.py fixes the contract):
- max and first argmax: max of split maxima, lowest index among the splits reaching it;
- the fixed-point normaliser ``sum floor(w * 2^40)``: int64 partials, summed (integer
  addition is associative). ``w`` needs the row max first (w = exp((z - max) / T), and
  exp(a) * exp(b) is not exp(a + b) bit for bit), so the sum is a second pass;
- top-k / top-p thresholds: a 16-ary search, one launch per round; each program adds
  ``sum weight_v [key_v > c]`` for 16 candidates c over its split (int64, exact), the next
  round's programs combine the partials and narrow the interval. 8 rounds cover 32 bits.
"""

from __future__ import annotations

import triton
import triton.language as tl

from .ragged import draft_range
from .verify_math import (
    FIXED_SCALE,
    INDEX_MAX,
    MASS_SCALE,
    TOP_P_SCALE,
    chain_launch,
    fixed_weights,
    from_order_key,
    load_logits,
    order_key,
    processed_weights,
    weights,
)

NUM_CANDIDATES = tl.constexpr(16)  # thresholds tested per search round
SEARCH_ROUNDS = tl.constexpr(8)  # 16-ary search: 16^8 = 2^32 covers any float key interval
TOP_K_MODE = tl.constexpr(0)
TOP_P_MODE = tl.constexpr(1)


@triton.jit
def slot_row(cu_ptr, target_ptr, bonus_ptr, b, i, num_tokens, vocab, width):
    """(row pointer, start, count) of step i of request b (valid when i <= count)."""
    start, count = draft_range(cu_ptr, b, num_tokens, width - 1)
    row = (start + tl.minimum(i, count)).to(tl.int64) * vocab
    row_ptr = tl.where(i == count, bonus_ptr + b.to(tl.int64) * vocab, target_ptr + row)
    return row_ptr, start, count


@triton.jit
def request_params(b, vocab, temperature_ptr, top_k_ptr, top_p_ptr, HAS_TOP_K: tl.constexpr,
                   HAS_TOP_P: tl.constexpr):
    """(temperature, uses top-k, top_k, uses top-p, top_p) of request b; greedy requests
    use neither."""
    temperature = tl.load(temperature_ptr + b)
    top_k = tl.load(top_k_ptr + b) if HAS_TOP_K else 0
    top_p = tl.load(top_p_ptr + b) if HAS_TOP_P else 1.0
    uses_top_k = (temperature != 0.0) & (top_k > 0) & (top_k < vocab)
    uses_top_p = (temperature != 0.0) & (top_p < 1.0)
    return temperature, uses_top_k, top_k, uses_top_p, top_p


@triton.jit
def row_max_argmax(part_max_ptr, part_arg_ptr, slot, num_splits, BLOCK_S: tl.constexpr):
    """Combined (max logit, first index of it) of a slot (0 when no logit is finite)."""
    s = tl.arange(0, BLOCK_S)
    mask = s < num_splits
    offset = slot.to(tl.int64) * num_splits + s
    split_max = tl.load(part_max_ptr + offset, mask=mask, other=float("-inf"))
    split_arg = tl.load(part_arg_ptr + offset, mask=mask, other=INDEX_MAX)
    best = tl.max(split_max, axis=0)
    return best, tl.min(tl.where(split_max == best, split_arg, INDEX_MAX), axis=0)


@triton.jit
def _max_and_sum(max_a, sum_a, max_b, sum_b):
    return tl.maximum(max_a, max_b), sum_a + sum_b


@triton.jit
def row_max_fixed_sum(part_max_ptr, part_sum_ptr, slot, num_splits, sum_splits, BLOCK_S: tl.constexpr):
    """(combined max logit, row_fixed_sum, its integer total) of a slot: both partial rows
    loaded, then one reduction of the two (the index: greedy steps only, row_max_argmax).
    The integer total is also the sum of the slot's stored block sums (fixed_sum_kernel
    adds the same masses both ways)."""
    s = tl.arange(0, BLOCK_S)
    split_max = tl.load(part_max_ptr + slot.to(tl.int64) * num_splits + s, mask=s < num_splits,
                        other=float("-inf"))
    partial = tl.load(part_sum_ptr + slot.to(tl.int64) * sum_splits + s, mask=s < sum_splits, other=0)
    best, total = tl.reduce((split_max, partial), 0, _max_and_sum)
    return best, total.to(tl.float32) * (1.0 / FIXED_SCALE), total


@triton.jit
def row_fixed_total(part_sum_ptr, slot, num_splits, BLOCK_S: tl.constexpr):
    """sum_v floor(w_v 2^40) of a slot (int64, exact)."""
    s = tl.arange(0, BLOCK_S)
    partial = tl.load(part_sum_ptr + slot.to(tl.int64) * num_splits + s, mask=s < num_splits, other=0)
    return tl.sum(partial, axis=0)


@triton.jit
def row_fixed_sum(part_sum_ptr, slot, num_splits, BLOCK_S: tl.constexpr):
    """sum_v floor(w_v 2^40) 2^-40 of a slot, rounded once to float32."""
    return row_fixed_total(part_sum_ptr, slot, num_splits, BLOCK_S).to(tl.float32) * (1.0 / FIXED_SCALE)


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
def _scan_block(block_ptr, lane, offset, limit, best, best_offset, approx, neg_scale, MASKED: tl.constexpr,
                WITH_SUM: tl.constexpr):
    """_scan's step over one block of BLOCK_V entries at ``block_ptr`` (MASKED: the lanes
    below ``limit`` only, the row's last block)."""
    if MASKED:
        raw = tl.load(block_ptr + lane, mask=lane < limit, other=float("-inf")).to(tl.float32)
    else:
        raw = tl.load(block_ptr + lane).to(tl.float32)
    finite = tl.abs(raw) < float("inf")  # NaN compares false
    z = tl.where(finite, raw, float("-inf"))  # +-inf and NaN: probability 0 (load_logits)
    better = z > best
    if WITH_SUM:
        # One exp2 per entry: 2^(-|z - best| s) is the rescale of the old sum when z is
        # the new lane max, else the entry's own term (0 for z = -inf, also when the
        # lane has seen only -inf, whose difference is NaN).
        e = tl.where(finite, tl.exp2(tl.abs(z - best) * neg_scale), 0.0)
        approx = tl.where(better, approx * e + 1.0, approx + e)
    best = tl.maximum(best, z)
    best_offset = tl.where(better, offset, best_offset)
    return best, best_offset, approx


@triton.jit
def _scan(row_ptr, v_begin, split_len, vocab, neg_scale, WITH_SUM: tl.constexpr, BLOCK_V: tl.constexpr):
    """Per-lane (max, first index of it, approximate sum relative to the lane max) over
    [v_begin, v_begin + split_len) of a row; ``neg_scale`` = -log2(e) / T. WITH_SUM False
    (an all-greedy batch): the sums stay 0 and no exp2 is issued. The blocks inside the
    vocab load without a mask (no fill of masked lanes), the row's last partial one with
    it; a lane keeps the offset of the block holding its max (one select, no index add per
    entry)."""
    # Per-lane running max with strict >: each lane keeps its first maximum, so the
    # reduction's lowest index among equal maxima is the first one in the split.
    lane = tl.arange(0, BLOCK_V)
    best = tl.full([BLOCK_V], float("-inf"), tl.float32)
    best_offset = tl.zeros([BLOCK_V], tl.int32)
    approx = tl.zeros([BLOCK_V], tl.float32)  # per lane, relative to the lane's best
    end = tl.minimum(split_len, vocab - v_begin)
    whole = end - end % BLOCK_V
    offset = 0
    while offset < whole:
        best, best_offset, approx = _scan_block(row_ptr + v_begin + offset, lane, offset, BLOCK_V, best,
                                                best_offset, approx, neg_scale, False, WITH_SUM)
        offset += BLOCK_V
    if offset < end:
        best, best_offset, approx = _scan_block(row_ptr + v_begin + offset, lane, offset, end - offset, best,
                                                best_offset, approx, neg_scale, True, WITH_SUM)
    return best, v_begin + best_offset + lane, approx


# Grid (batch * width, num_splits). Program (slot, s) reads entries
# [s * split_len, (s + 1) * split_len) of the slot's row once: its max, first argmax, and
# an approximate normaliser sum_v 2^((z_v - m_s) log2(e) / T) relative to the split's max
# m_s (hardware exp2, online rescaling; unused in greedy rows). The approximate sums let
# the screen settle most acceptance tests without the exact normaliser (verify_screen.py),
# so the second, exact pass reads only the rows that need it. ALL_GREEDY: the caller
# promised every request is greedy (temperature not read, no sums: 0 stored). Bytes: the
# row once over all splits.
@triton.jit(do_not_specialize=["num_tokens", "width"])  # vocab % 16 == 0: vector loads
def row_max_kernel(
    part_max_ptr,  # [batch * width, num_splits] float32
    part_arg_ptr,  # [batch * width, num_splits] int32
    part_approx_ptr,  # [batch * width, num_splits] float32
    target_ptr,  # [num_tokens, vocab] float32 | bfloat16 | float16
    bonus_ptr,  # [batch, vocab]
    cu_ptr,  # [batch] int32
    temperature_ptr,  # [batch] float32 (not read when ALL_GREEDY)
    num_tokens,
    vocab,
    width,
    split_len,  # a multiple of BLOCK_V
    ALL_GREEDY: tl.constexpr,
    BLOCK_V: tl.constexpr,
    PDL: tl.constexpr = False,
):
    chain_launch(PDL, WAITS=False)  # the chain's first launch: a plain one
    slot = tl.program_id(0)
    split = tl.program_id(1)
    b = slot // width
    i = slot % width
    row_ptr, _start, count = slot_row(cu_ptr, target_ptr, bonus_ptr, b, i, num_tokens, vocab, width)
    if i <= count:
        v_begin = split * split_len
        out = slot.to(tl.int64) * tl.num_programs(1) + split
        if ALL_GREEDY:
            scale = 0.0
        else:
            temperature = tl.load(temperature_ptr + b)
            scale = tl.where(temperature == 0.0, 0.0, 1.4426950408889634 / temperature)  # greedy: unused
        best, best_index, approx = _scan(row_ptr, v_begin, split_len, vocab, -scale, not ALL_GREEDY, BLOCK_V)
        split_best = tl.max(best, axis=0)
        split_sum = tl.zeros([], tl.float32)
        if not ALL_GREEDY:
            lane_weight = tl.where(best == float("-inf"), 0.0, tl.exp2((best - split_best) * scale))
            split_sum = tl.sum(approx * lane_weight, axis=0)
        tl.store(part_max_ptr + out, split_best)
        tl.store(part_arg_ptr + out, tl.min(tl.where(best == split_best, best_index, INDEX_MAX), axis=0))
        tl.store(part_approx_ptr + out, split_sum)


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


# Grid (step_programs * batch * sum_splits,), split fastest, then request, then j: program
# (j, b, s) takes the j-th, (j + step_programs)-th, ... of the steps the screen marked in
# request b (marked[b] = (first step, number of steps)) and adds floor(w_v 2^40) over split
# s of its row (int64, exact), w = exp((z - max) / T) after top-k (SECOND: also top-p,
# p = w / z1 >= p_min). Greedy slots sum at T = 1 (log-probabilities). The launcher gives
# step_programs = 1 when usually one step a request is marked (no idle programs), the width
# when every step is. Bytes: the marked rows once per launch (usually the one row per
# request that samples).
@triton.jit(do_not_specialize=["num_tokens", "width", "row_splits", "batch"])
def fixed_sum_kernel(
    part_sum_ptr,  # [batch * width, sum_splits] int64, written
    block_sum_ptr,  # [batch * width, cdiv(vocab, MASS_BLOCK)] int64, written: the sums per block
    marked_ptr,  # [batch, 2] int32: the steps whose exact normaliser the decisions need
    part_max_ptr,  # [batch * width, num_splits] float32
    part_arg_ptr,  # [batch * width, num_splits] int32
    top_k_state_ptr,  # [SEARCH_ROUNDS, batch * width, 2] int64
    top_k_agg_ptr,  # [SEARCH_ROUNDS, batch * width, num_splits, 17] int64
    top_p_state_ptr,  # (SECOND) as top_k_state_ptr
    top_p_agg_ptr,  # (SECOND) as top_k_agg_ptr
    first_sum_ptr,  # (SECOND) [batch * width, sum_splits] int64: z1 partials
    target_ptr,  # [num_tokens, vocab]
    bonus_ptr,  # [batch, vocab]
    cu_ptr,  # [batch] int32
    temperature_ptr,  # [batch] float32
    top_k_ptr,  # [batch] int32
    top_p_ptr,  # [batch] float32
    num_tokens,
    vocab,
    width,
    split_len,  # this pass's split (sized for the rows expected to be marked)
    row_splits,  # the split count of the row max and search partials
    batch,
    SECOND: tl.constexpr,
    HAS_TOP_K: tl.constexpr,
    HAS_TOP_P: tl.constexpr,
    BLOCK_V: tl.constexpr,
    BLOCK_S: tl.constexpr,
    MASS_BLOCK: tl.constexpr,  # divides BLOCK_V: entries per stored block sum
    PDL: tl.constexpr = False,
):
    program = tl.program_id(0)
    num_splits = tl.cdiv(vocab, split_len)
    split = program % num_splits
    b = (program // num_splits) % batch
    j = program // (num_splits * batch)
    step_programs = tl.num_programs(0) // (num_splits * batch)
    num_slots = batch * width
    # Before the wait (PDL): the op's own inputs only (verify_math.chain_launch).
    temperature, uses_top_k, top_k, uses_top_p, top_p = request_params(
        b, vocab, temperature_ptr, top_k_ptr, top_p_ptr, HAS_TOP_K, HAS_TOP_P)
    temperature = tl.where(temperature == 0.0, 1.0, temperature)
    inverse = exact_inverse(temperature)
    chain_launch(PDL)
    first = tl.load(marked_ptr + b * 2)
    count = tl.load(marked_ptr + b * 2 + 1)
    if SECOND:
        count = tl.where(uses_top_p, count, 0)
    while j < count:
        i = tl.minimum(first + j, width - 1)  # j < the number marked: a reachable step
        slot = b * width + i
        row_ptr, _start, _count = slot_row(cu_ptr, target_ptr, bonus_ptr, b, i, num_tokens, vocab, width)
        max_logit, _argmax = row_max_argmax(part_max_ptr, part_arg_ptr, slot, row_splits, BLOCK_S)
        kth = tl.full([], float("-inf"), tl.float32)
        if HAS_TOP_K:
            kth = row_kth(top_k_state_ptr, top_k_agg_ptr, slot, num_slots, row_splits, uses_top_k, top_k,
                          max_logit, BLOCK_S)
        z1 = tl.full([], 1.0, tl.float32)
        p_min = tl.zeros([], tl.float32)
        if SECOND:
            z1 = row_fixed_sum(first_sum_ptr, slot, num_splits, BLOCK_S)
            p_min = row_p_min(top_p_state_ptr, top_p_agg_ptr, slot, num_slots, row_splits, uses_top_p, top_p,
                              BLOCK_S)
        blocks = block_sum_ptr + slot.to(tl.int64) * tl.cdiv(vocab, MASS_BLOCK)
        split_range = (row_ptr, blocks, split * split_len, split_len, vocab)
        if inverse > 0.0:  # T = 2^n: (z - max) / T is (z - max) * 2^-n, bit for bit
            total = _split_fixed_sum(*split_range, max_logit, inverse, kth, z1, p_min, True, SECOND, HAS_TOP_K,
                                     BLOCK_V, MASS_BLOCK)
        else:
            total = _split_fixed_sum(*split_range, max_logit, temperature, kth, z1, p_min, False, SECOND,
                                     HAS_TOP_K, BLOCK_V, MASS_BLOCK)
        tl.store(part_sum_ptr + slot.to(tl.int64) * num_splits + split, total)
        j += step_programs


@triton.jit
def exact_inverse(temperature):
    """1 / T when T is a power of two whose inverse is a normal float (then x / T equals
    x * (1 / T) exactly: both are the exact quotient, rounded once), else 0."""
    bits = temperature.to(tl.int32, bitcast=True)
    exponent = (bits >> 23) & 0xFF
    power_of_two = (bits > 0) & ((bits & 0x7FFFFF) == 0) & (exponent >= 1) & (exponent <= 253)
    return tl.where(power_of_two, ((254 - exponent) << 23).to(tl.float32, bitcast=True), 0.0)


@triton.jit
def _split_fixed_sum(row_ptr, blocks_ptr, v_begin, split_len, vocab, max_logit, temperature, kth, z1, p_min,
                     MULTIPLY: tl.constexpr, SECOND: tl.constexpr, HAS_TOP_K: tl.constexpr, BLOCK_V: tl.constexpr,
                     MASS_BLOCK: tl.constexpr):
    """sum floor(w_v 2^40) over [v_begin, v_begin + split_len) (int64, exact); the sum of
    each MASS_BLOCK entries to ``blocks_ptr`` (the masses verify_sample.py draws from).
    MULTIPLY: ``temperature`` holds 1 / T, an exact inverse (exact_inverse).
    The tile [LANE_GROUPS, WARP_GROUPS, REPS, SPAN] holds BLOCK_V entries so that each mass
    block lies in the registers of a few lanes of one warp (4 warps, 2048 entries, 128-entry
    blocks: 8 lanes of 16 entries; a warp's load covers 4 blocks, 128 contiguous bytes of
    each): a block sum is mostly a thread's own additions, then 3 shuffle steps, not 5.
    (Triton lays the contiguous SPAN fastest, then the dims in order: lanes go to SPAN and
    LANE_GROUPS, warps to WARP_GROUPS, registers to REPS.)"""
    REPS: tl.constexpr = (MASS_BLOCK + 31) // 32
    SPAN: tl.constexpr = MASS_BLOCK // REPS
    GROUPS: tl.constexpr = BLOCK_V // MASS_BLOCK
    LANE_GROUPS: tl.constexpr = GROUPS // ((GROUPS + 3) // 4)
    WARP_GROUPS: tl.constexpr = GROUPS // LANE_GROUPS
    block = tl.arange(0, LANE_GROUPS)[:, None] + tl.arange(0, WARP_GROUPS)[None, :] * LANE_GROUPS
    entry = ((block * MASS_BLOCK)[:, :, None, None] + tl.arange(0, REPS)[None, None, :, None] * SPAN
             + tl.arange(0, SPAN)[None, None, None, :])
    totals = tl.zeros([LANE_GROUPS, WARP_GROUPS], tl.int64)
    offset = 0
    while offset < split_len:
        v = v_begin + offset + entry
        z = load_logits(row_ptr, v, v < vocab)  # -inf past the vocab: mass 0
        if SECOND:
            w = processed_weights(z, max_logit, temperature, kth, z1, p_min, MULTIPLY, True)
            mass = tl.floor(w * FIXED_SCALE).to(tl.int64)
        else:
            mass = fixed_weights(z, max_logit, temperature, kth, MULTIPLY, HAS_TOP_K)
        blocks = tl.sum(tl.sum(mass, axis=2), axis=2)  # REPS (a thread's own entries) first, then SPAN
        first = v_begin + offset + block * MASS_BLOCK
        tl.store(blocks_ptr + first // MASS_BLOCK, blocks, mask=first < vocab)
        totals += blocks
        offset += BLOCK_V
    return tl.sum(tl.sum(totals, axis=1), axis=0)
