"""The per-block counting of the Triton top-k / top-p searches (verify_search.py): a row
pass's steps of UNROLL blocks loaded and added into each lane's partials (keeping the keys
of the search interval when asked), and a kept round's rows of keys."""

from __future__ import annotations

import triton
import triton.language as tl

from .verify_math import MASS_SCALE, load_logits, order_key, processed_weights

TOP_K_MODE = tl.constexpr(0)
TOP_P_MODE = tl.constexpr(1)


@triton.jit
def kept_weight(key, present, MODE: tl.constexpr):
    """The weight of a kept key (0 where absent): 1 (top-k), floor(p 2^32) of p's bits (top-p)."""
    if MODE == TOP_K_MODE:
        weight = present.to(tl.int32)
    else:
        weight = tl.where(present, tl.floor(key.to(tl.float32, bitcast=True) * MASS_SCALE).to(tl.int64), 0)
    return weight


@triton.jit
def add_kept(key, row, lane_count, counts, from_lo, above_hi, stays, candidate, lo32, hi32, keys_ptr,
              MODE: tl.constexpr, BLOCK_V: tl.constexpr):
    """One kept row added into the per-lane partials; its keys of [lo, hi] moved down to row
    ``stays`` of their columns (stored only where that is another row)."""
    present = row < lane_count
    weight = kept_weight(key, present, MODE)
    counts += tl.where(key[None, :] > candidate[:, None], weight[None, :], 0)
    from_lo += tl.where(key >= lo32, weight, 0)
    above_hi += tl.where(key > hi32, weight, 0)
    stay = present & (key >= lo32) & (key <= hi32)
    tl.store(keys_ptr + stays.to(tl.int64) * BLOCK_V, key, mask=stay & (stays < row))
    return counts, from_lo, above_hi, stays + stay.to(tl.int32)


@triton.jit
def load_block(row_ptr, v, end):
    """One block of a row's logits (float32; -inf past ``end``) and where it lies inside."""
    inside = v < end
    return load_logits(row_ptr, v, inside), inside


@triton.jit
def load_step(row_ptr, first, end, UNROLL: tl.constexpr, BLOCK_V: tl.constexpr):
    """The UNROLL blocks of a step from entry ``first`` (lanes); unused ones the first's."""
    z0, in0 = load_block(row_ptr, first, end)
    z1, in1 = z0, in0
    z2, in2 = z0, in0
    z3, in3 = z0, in0
    if UNROLL > 1:
        z1, in1 = load_block(row_ptr, first + BLOCK_V, end)
    if UNROLL > 2:
        z2, in2 = load_block(row_ptr, first + 2 * BLOCK_V, end)
        z3, in3 = load_block(row_ptr, first + 3 * BLOCK_V, end)
    return z0, in0, z1, in1, z2, in2, z3, in3


@triton.jit
def live_list(sums_ptr, num_blocks, list_ptr, LIVE_BLOCKS: tl.constexpr):
    """The indices (ascending) of the first ``num_blocks`` block sums at ``sums_ptr`` that
    are not 0, stored compactly at ``list_ptr`` (the program's own LIVE_BLOCKS entries) and
    visible to the whole program; returns their number. One load of every sum at once, a
    scan and a scatter: no chain of loads a block."""
    index = tl.arange(0, LIVE_BLOCKS)
    live = tl.load(sums_ptr + index, mask=index < num_blocks, other=0) != 0
    rank = tl.cumsum(live.to(tl.int32), axis=0) - 1
    tl.store(list_ptr + rank, index, mask=live)
    tl.debug_barrier()  # the list visible to the whole program
    return tl.sum(live.to(tl.int32), axis=0)


@triton.jit
def clear_marks(marks_ptr, v_begin, end, BLOCK_V: tl.constexpr, MARK_BLOCKS: tl.constexpr):
    """Top-k's round 0, before its row pass: the split's block marks (a row's are z1's block
    sums, BLOCK_V entries a block, overwritten by z1) set to 0, visible to the whole
    program, whose row pass then sets to 1 each block holding a logit >= lo (mark_step)."""
    index = tl.arange(0, MARK_BLOCKS)
    tl.store(marks_ptr + v_begin // BLOCK_V + index, tl.zeros([MARK_BLOCKS], tl.int64),
             mask=index < tl.cdiv(end - v_begin, BLOCK_V))
    tl.debug_barrier()


@triton.jit
def mark_step(step, marks_ptr, lowest, UNROLL: tl.constexpr, BLOCK_V: tl.constexpr):
    """The marks (clear_marks) of a step's UNROLL blocks from ``marks_ptr``: 1 where a lane
    holds a logit >= ``lowest`` (the float of top-k's lo: every logit >= kth is; +inf: no
    marks), stored by those lanes only; z1 then reads the marked blocks alone (the others
    weigh 0)."""
    z0, in0, z1, in1, z2, in2, z3, in3 = step
    same = tl.zeros([BLOCK_V], tl.int32)
    one = tl.full([BLOCK_V], 1, tl.int64)
    tl.store(marks_ptr + same, one, mask=in0 & (z0 >= lowest))
    if UNROLL > 1:
        tl.store(marks_ptr + 1 + same, one, mask=in1 & (z1 >= lowest))
    if UNROLL > 2:
        tl.store(marks_ptr + 2 + same, one, mask=in2 & (z2 >= lowest))
        tl.store(marks_ptr + 3 + same, one, mask=in3 & (z3 >= lowest))


@triton.jit
def load_listed(row_ptr, list_ptr, listed, count, first_block, lane, end, BLOCK_V: tl.constexpr):
    """Block ``listed`` of a live list (of ``count``): its logits at the lanes, and where they
    lie inside (nowhere past the list: -inf, weight 0)."""
    block = tl.load(list_ptr + listed, mask=listed < count, other=-1)
    v = (first_block + block) * BLOCK_V + lane
    inside = (block >= 0) & (v < end)
    return load_logits(row_ptr, v, inside), inside


@triton.jit
def load_listed_step(row_ptr, list_ptr, listed, count, first_block, lane, end, UNROLL: tl.constexpr,
                     BLOCK_V: tl.constexpr):
    """load_step over the UNROLL live blocks from entry ``listed`` of a live list."""
    z0, in0 = load_listed(row_ptr, list_ptr, listed, count, first_block, lane, end, BLOCK_V)
    z1, in1 = z0, in0
    z2, in2 = z0, in0
    z3, in3 = z0, in0
    if UNROLL > 1:
        z1, in1 = load_listed(row_ptr, list_ptr, listed + 1, count, first_block, lane, end, BLOCK_V)
    if UNROLL > 2:
        z2, in2 = load_listed(row_ptr, list_ptr, listed + 2, count, first_block, lane, end, BLOCK_V)
        z3, in3 = load_listed(row_ptr, list_ptr, listed + 3, count, first_block, lane, end, BLOCK_V)
    return z0, in0, z1, in1, z2, in2, z3, in3


@triton.jit
def add_block(z, inside, max_logit, temperature, kth, z1, counts, from_lo, above_hi, totals,
              lane_count, candidate, lo32, hi32, keys_ptr, kept_rows, keep, MODE: tl.constexpr,
              BLOCK_V: tl.constexpr, COUNTS: tl.constexpr, MULTIPLY: tl.constexpr = False):
    """A block's keys and weights added into the per-lane partials (the 16 candidates' only
    with COUNTS), and, when ``keep``, the keys of [lo, hi] appended to their lanes' columns.
    Top-k's keeping pass (not COUNTS) adds neither the keys >= lo nor the totals: its
    caller takes them from the lanes' kept counts and the split's length. MULTIPLY:
    ``temperature`` holds log2(e) / T (verify_math.exponent_scale)."""
    KEEPING_TOP_K: tl.constexpr = (MODE == TOP_K_MODE) and not COUNTS
    if MODE == TOP_K_MODE:
        key = order_key(z)
        weight = inside.to(tl.int32)
    else:
        p = tl.math.div_rn(processed_weights(z, max_logit, temperature, kth, z1, 0.0, MULTIPLY, False), z1)
        key = p.to(tl.int32, bitcast=True)
        weight = tl.where(inside, tl.floor(p * MASS_SCALE).to(tl.int64), 0)
    if COUNTS:
        counts += tl.where(key[None, :] > candidate[:, None], weight[None, :], 0)
    if not KEEPING_TOP_K:
        from_lo += tl.where(key >= lo32, weight, 0)
        totals += weight.to(tl.int64)
    above_hi += tl.where(key > hi32, weight, 0)
    if keep:
        if MODE == TOP_K_MODE:  # every entry inside weighs 1
            kept = inside & (key >= lo32) & (key <= hi32)
        else:
            kept = inside & (weight > 0) & (key >= lo32) & (key <= hi32)  # weight 0 adds to no A(c)
        tl.store(keys_ptr + lane_count.to(tl.int64) * BLOCK_V, key, mask=kept & (lane_count < kept_rows))
        lane_count += kept.to(tl.int32)
    return counts, from_lo, above_hi, totals, lane_count


@triton.jit
def add_blocks(step, weighting, sums, counting, MODE: tl.constexpr, UNROLL: tl.constexpr, BLOCK_V: tl.constexpr,
               COUNTS: tl.constexpr, MULTIPLY: tl.constexpr = False):
    """add_block over the UNROLL blocks of a step."""
    z0, in0, z1, in1, z2, in2, z3, in3 = step
    sums = add_block(z0, in0, *weighting, *sums, *counting, MODE, BLOCK_V, COUNTS, MULTIPLY)
    if UNROLL > 1:
        sums = add_block(z1, in1, *weighting, *sums, *counting, MODE, BLOCK_V, COUNTS, MULTIPLY)
    if UNROLL > 2:
        sums = add_block(z2, in2, *weighting, *sums, *counting, MODE, BLOCK_V, COUNTS, MULTIPLY)
        sums = add_block(z3, in3, *weighting, *sums, *counting, MODE, BLOCK_V, COUNTS, MULTIPLY)
    return sums


@triton.jit
def add_step(step, weighting, sums, counting, MODE: tl.constexpr, UNROLL: tl.constexpr, BLOCK_V: tl.constexpr,
             SKIPS: tl.constexpr, COUNTS: tl.constexpr, MULTIPLY: tl.constexpr = False):
    """The UNROLL blocks of a step (load_step's) added into the partials ``sums``. SKIPS
    (top-p after top-k): a step with no logit >= kth weighs 0 everywhere (key 0, mass 0),
    adds nothing and is skipped, the program's one test for the whole step (with top-k 50
    of 128k, most steps; -inf without top-k: none)."""
    if SKIPS:
        z0, _in0, z1, _in1, z2, _in2, z3, _in3 = step
        highest = tl.max(tl.maximum(tl.maximum(z0, z1), tl.maximum(z2, z3)), axis=0)
        if highest >= weighting[2]:
            sums = add_blocks(step, weighting, sums, counting, MODE, UNROLL, BLOCK_V, COUNTS, MULTIPLY)
    else:
        sums = add_blocks(step, weighting, sums, counting, MODE, UNROLL, BLOCK_V, COUNTS, MULTIPLY)
    return sums


@triton.jit
def row_pass(row_ptr, v_begin, end, weighting, sums, counting, live, MODE: tl.constexpr, UNROLL: tl.constexpr,
             BLOCK_V: tl.constexpr, SKIPS: tl.constexpr, COUNTS: tl.constexpr, LIVE_BLOCKS: tl.constexpr = 0,
             marks=None, MARKS: tl.constexpr = False, MULTIPLY: tl.constexpr = False):
    """A split's entries [v_begin, end) added into ``sums``, UNROLL blocks a step, their
    loads issued first (more bytes in flight a thread), and the next step's loads before
    this step's counts. LIVE_BLOCKS (with SKIPS, top-p after top-k): ``live`` = (the first
    normaliser's block sums of the row, a sum a BLOCK_V entries; a scratch list of
    LIVE_BLOCKS): only the blocks whose sum is not 0 are read (live_list), UNROLL at a time.
    A block summed to 0 weighs 0 here too: each entry's floor(p 2^32) <= floor(w 2^40) = 0.
    MARKS (top-k's round 0): ``marks`` = (the row's block marks, the float of lo), mark_step's.
    MULTIPLY: ``weighting``'s temperature is log2(e) / T (add_block's)."""
    lane = tl.arange(0, BLOCK_V)
    if LIVE_BLOCKS > 0:
        sums_ptr, list_ptr = live
        first_block = v_begin // BLOCK_V
        count = live_list(sums_ptr + first_block, tl.cdiv(end - v_begin, BLOCK_V), list_ptr, LIVE_BLOCKS)
        listed = 0
        step = load_listed_step(row_ptr, list_ptr, listed, count, first_block, lane, end, UNROLL, BLOCK_V)
        while listed < count:
            this_step = step
            listed += UNROLL
            step = load_listed_step(row_ptr, list_ptr, listed, count, first_block, lane, end, UNROLL, BLOCK_V)
            sums = add_blocks(this_step, weighting, sums, counting, MODE, UNROLL, BLOCK_V, COUNTS, MULTIPLY)
    else:
        offset = v_begin
        step = load_step(row_ptr, offset + lane, end, UNROLL, BLOCK_V)
        while offset < end:
            this_step = step
            step = load_step(row_ptr, offset + UNROLL * BLOCK_V + lane, end, UNROLL, BLOCK_V)
            if MARKS:
                mark_step(this_step, marks[0] + offset // BLOCK_V, marks[1], UNROLL, BLOCK_V)
            sums = add_step(this_step, weighting, sums, counting, MODE, UNROLL, BLOCK_V, SKIPS, COUNTS, MULTIPLY)
            offset += UNROLL * BLOCK_V
    return sums


@triton.jit
def count_kept(keys_ptr, rows, lane_count, counts, candidate, MODE: tl.constexpr, BLOCK_V: tl.constexpr):
    """The 16 candidates' counts over the first ``rows`` rows of a split's kept keys (each
    lane's first lane_count), 4 rows loaded at a time: a lane reads back its own column."""
    row = 0
    while row < rows:
        for u in tl.static_range(4):
            present = row + u < lane_count
            key = tl.load(keys_ptr + (row + u) * BLOCK_V, mask=present, other=0)
            weight = kept_weight(key, present, MODE)
            counts += tl.where(key[None, :] > candidate[:, None], weight[None, :], 0)
        row += 4
    return counts
