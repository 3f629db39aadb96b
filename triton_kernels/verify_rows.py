"""Row passes of the Triton ``verify``: statistics of every target and bonus row a request
may reach (a *slot*, verify_slots.py), each row split across ``num_splits`` programs whose
partials combine exactly.

Partials and why they combine bit-exactly (reference/verify.py fixes the contract):
- max and first argmax: max of split maxima, lowest index among the splits reaching it;
- the fixed-point normaliser ``sum floor(w * 2^40)``: int64 partials, summed (integer
  addition is associative). ``w`` needs the row max first (w = exp((z - max) / T), and
  exp(a) * exp(b) is not exp(a + b) bit for bit), so the sum is a second pass (in the
  same launch for unscreened calls, after a wait for the row's max:
  verify_unscreened.py);
- top-k / top-p thresholds: integer counts of a search (verify_search.py).
"""

from __future__ import annotations

import triton
import triton.language as tl

from .launch import direct_launch
from .ragged import draft_range
from .verify_math import (FIXED_SCALE, INDEX_MAX, LOG2E, chain_launch, exponent_scale, fixed_weights, load_logits,
                          processed_weights)
from .verify_search import marks_blocks, row_kth, row_p_min, top_k_initial
from .verify_search_counts import live_list
from .verify_slots import (PACKED_MAX_SPLITS, PACKED_ONE, PACKED_SHIFT, PACKED_SUM, draft_step, request_params,
                           row_fixed_sum, row_max_argmax, slot_row)


@triton.jit
def _load_block(block_ptr, lane, limit, MASKED: tl.constexpr):
    """One block of a row as float32 (MASKED: the lanes below ``limit``, -inf past them)."""
    if MASKED:
        raw = tl.load(block_ptr + lane, mask=lane < limit, other=float("-inf"))
    else:
        raw = tl.load(block_ptr + lane)
    return raw.to(tl.float32)


@triton.jit
def _finite(raw, best):
    """A loaded block's logits, +-inf and NaN as -inf (probability 0, as load_logits), and
    where each beats its lane's running max ``best``."""
    z = tl.where(tl.abs(raw) < float("inf"), raw, float("-inf"))  # NaN compares false
    return z, z > best


@triton.jit
def _lane_max(z, better, offset, best, best_offset):
    """Each lane's running max over its blocks and the offset of the block that holds it
    (strict >: the first of equal maxima)."""
    return tl.maximum(best, z), tl.where(better, offset, best_offset)


@triton.jit
def _scan_block(block_ptr, lane, offset, limit, best, best_offset, approx, neg_scale, MASKED: tl.constexpr,
                WITH_SUM: tl.constexpr):
    """_scan's step over one block of BLOCK_V entries at ``block_ptr`` (MASKED: the lanes
    below ``limit`` only, the row's last block)."""
    raw = _load_block(block_ptr, lane, limit, MASKED)
    z, better = _finite(raw, best)
    if WITH_SUM:
        # One exp2 per entry: 2^(-|z - best| s) is the rescale of the old sum when z is
        # the new lane max, else the entry's own term (0 for z = -inf, also when the
        # lane has seen only -inf, whose difference is NaN).
        e = tl.where(tl.abs(raw) < float("inf"), tl.exp2(tl.abs(z - best) * neg_scale), 0.0)
        approx = tl.where(better, approx * e + 1.0, approx + e)
    best, best_offset = _lane_max(z, better, offset, best, best_offset)
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


# The max pass's acceptance tests (row_max_kernel, TESTS): a verdict per draft step.
PASSES = tl.constexpr(1)  # the step's exact test passes (greedy: the draft is the first argmax)
FAILS = tl.constexpr(0)  # it fails
UNSETTLED = tl.constexpr(2)  # the approximate sum cannot tell: the exact normaliser decides
# A random step's packed partial (verify_slots.py): u q(x) sum_v 2^((z_v - z_x) log2(e) / T)
# over the split in 2^-40 units, capped at 4 (past 1 + margin the step fails whatever the
# rest adds), in bits 0-47 (63 programs * 4 * 2^40 < 2^48), and in bits 48-53 one count
# for a split whose max lies over TRUSTED_RATIO binades above z_x.
TEST_SCALE = tl.constexpr(1099511627776.0)  # 2^40
TEST_CAP = tl.constexpr(4.0)
TEST_SUM = tl.constexpr((1 << 48) - 1)
FAR_SHIFT = tl.constexpr(48)
TRUSTED_RATIO = tl.constexpr(100.0)  # binades: p(x) >= 2^-100 / vocab, a normal float
# The screen's band (verify_screen.py: MARGIN, 2^-9) around 1 in 2^-40 units.
TEST_LOW = tl.constexpr((1 << 40) - (1 << 31))
TEST_HIGH = tl.constexpr((1 << 40) + (1 << 31))


@triton.jit
def _test_block(raw, lane, offset, best, best_offset, acc, z_x, scale, x_rel, MODE: tl.constexpr):
    """_scan_tests' step over one loaded block (as _scan_block): the lane max and offset;
    MODE 1 (greedy) counts the entries that come before the draft in the first-argmax order
    (a larger logit, or the draft's own at a lower index), MODE 2 (random) adds
    2^((z - z_x) scale), MODE 0 (bonus row) neither."""
    z, better = _finite(raw, best)
    if MODE == 1:
        acc += ((z > z_x) | ((z == z_x) & (offset + lane < x_rel))).to(tl.int32)
    elif MODE == 2:
        acc += tl.exp2((z - z_x) * scale)  # -inf: 0
    best, best_offset = _lane_max(z, better, offset, best, best_offset)
    return best, best_offset, acc


@triton.jit
def _scan_tests(row_ptr, v_begin, end, first, z_x, scale, x_rel, MODE: tl.constexpr, BLOCK_V: tl.constexpr):
    """As _scan over the split's ``end`` entries, with its part of a draft step's test
    (_test_block's MODE) instead of the approximate normaliser: (per-lane max, its first
    index, the split's count or sum). ``first``: the split's first block, loaded (masked to
    ``end``) before the program's loads of the draft, so their latencies overlap."""
    lane = tl.arange(0, BLOCK_V)
    best = tl.full([BLOCK_V], float("-inf"), tl.float32)
    best_offset = tl.zeros([BLOCK_V], tl.int32)
    if MODE == 1:
        acc = tl.zeros([BLOCK_V], tl.int32)
    else:
        acc = tl.zeros([BLOCK_V], tl.float32)
    best, best_offset, acc = _test_block(first, lane, 0, best, best_offset, acc, z_x, scale, x_rel, MODE)
    whole = end - end % BLOCK_V
    offset = BLOCK_V
    while offset < whole:
        raw = _load_block(row_ptr + v_begin + offset, lane, BLOCK_V, False)
        best, best_offset, acc = _test_block(raw, lane, offset, best, best_offset, acc, z_x, scale, x_rel, MODE)
        offset += BLOCK_V
    if offset < end:
        raw = _load_block(row_ptr + v_begin + offset, lane, end - offset, True)
        best, best_offset, acc = _test_block(raw, lane, offset, best, best_offset, acc, z_x, scale, x_rel, MODE)
    return best, v_begin + best_offset + lane, tl.sum(acc, axis=0)


@triton.jit
def step_trusted(z_x, scale):
    """Whether a random step's test may be settled from its packed sum (else UNSETTLED, and
    no NaN summed): z_x finite above -inf and 1 / T a positive float (NaN, negative or 0
    only with value checks off)."""
    return (z_x > float("-inf")) & (scale > 0.0) & (scale < float("inf"))


@triton.jit
def step_addend(row_ptr, v_begin, end, first, i, count, z_x, x, q_x, u, scale, greedy, trusted,
                BLOCK_V: tl.constexpr):
    """(lane maxima, their first indices, the split's max, packed addend) of one split of
    step i's row: a TESTS program's work (row_max_kernel's, verify_walk.py's). At the bonus
    row (i == count) the max alone, addend 0; greedy, the count of entries ahead of the
    draft; random, u q(x) sum_v 2^((z_v - z_x) log2(e) / T) in fixed point, plus FAR_SHIFT's
    bit where the split's max lies more than TRUSTED_RATIO binades above z_x."""
    if i == count:
        best, best_index, _none = _scan_tests(row_ptr, v_begin, end, first, z_x, 0.0, 0, 0, BLOCK_V)
        split_best = tl.max(best, axis=0)
        addend = tl.zeros([], tl.int64)
    elif greedy:
        best, best_index, ahead = _scan_tests(row_ptr, v_begin, end, first, z_x, 0.0, (x - v_begin).to(tl.int32), 1,
                                              BLOCK_V)
        split_best = tl.max(best, axis=0)
        addend = ahead.to(tl.int64)
    else:
        best, best_index, total = _scan_tests(row_ptr, v_begin, end, first, tl.where(trusted, z_x, 0.0),
                                              tl.where(trusted, scale, 1.0), 0, 2, BLOCK_V)
        split_best = tl.max(best, axis=0)
        scaled = total * (u * q_x)
        # NaN (inf * 0: a far split, so UNSETTLED) to the cap; below 0 (q(x) < 0, which
        # FAILS) to 0: an addend outside [0, cap] would carry into the count.
        scaled = tl.maximum(tl.where(scaled < TEST_CAP, scaled, TEST_CAP), 0.0)
        far = (split_best - z_x) * scale > TRUSTED_RATIO
        addend = (scaled * TEST_SCALE).to(tl.int64) + (far.to(tl.int64) << FAR_SHIFT)
    return best, best_index, split_best, addend


# Grid (batch * width, num_splits). Program (slot, s) reads entries
# [s * split_len, (s + 1) * split_len) of the slot's row once: its max, first argmax, and
# an approximate normaliser sum_v 2^((z_v - m_s) log2(e) / T) relative to the split's max
# m_s (hardware exp2, online rescaling; unused in greedy rows). The approximate sums let
# the screen settle most acceptance tests without the exact normaliser (verify_screen.py),
# so the second, exact pass reads only the rows that need it. ALL_GREEDY: the caller
# promised every request is greedy (temperature not read, no sums: 0 stored).
# TESTS: the max pass settles the tests itself, and no screen runs. A draft step's programs
# load the draft, its logit z_x, draft prob and uniform at their start and, instead of the
# normaliser, add u q(x) sum_v 2^((z_v - z_x) log2(e) / T) over their split (that sum is
# u q(x) / p(x) up to the approximations the screen's band covers; verify_screen.py says
# why) or, greedy, count the entries that precede the draft in the first-argmax order;
# they leave by one packed atomic (verify_slots.py), and the row's last to leave stores
# the step's verdict: PASSES below 1 - 2^-9, FAILS from 1 + 2^-9 (or a draft outside the
# vocab, or q(x) = 0), UNSETTLED between, or where a split's max lies more than
# TRUSTED_RATIO binades above z_x, z_x is -inf or 1 / T is not a positive float; greedy,
# PASSES when none precedes the draft (exact). Bonus rows store their max and argmax only.
# BINS (top-k calls): a program also stores the maxima of BINS groups of its lanes, each a
# logit of its split or -inf, then those of COARSE_BINS groups, from which the top-k search
# seeds its interval (verify_search.top_k_seed).
# Bytes: the row once over all splits (TESTS: and the draft's logit and draft prob).
@direct_launch
@triton.jit(do_not_specialize=["num_tokens", "width"])  # vocab % 16 == 0: vector loads
def row_max_kernel(
    part_max_ptr,  # [batch * width, num_splits] float32
    part_arg_ptr,  # [batch * width, num_splits] int32
    part_approx_ptr,  # [batch * width, num_splits] float32 (not TESTS)
    part_bins_ptr,  # [batch * width, num_splits, BINS + COARSE_BINS] float32 (BINS > 0): lane-group maxima
    target_ptr,  # [num_tokens, vocab] float32 | bfloat16 | float16
    bonus_ptr,  # [batch, vocab]
    cu_ptr,  # [batch] int32
    temperature_ptr,  # [batch] float32 (not read when ALL_GREEDY)
    packed_ptr,  # [batch * width] int64, 0 on entry and on exit (TESTS; verify_unscreened.packed_departures)
    verdict_ptr,  # [batch * width] int32, written at draft steps (TESTS)
    draft_ptr,  # [num_tokens] int32 | int64 (TESTS)
    draft_probs_ptr,  # [num_tokens, vocab] float32 (TESTS and HAS_DRAFT_PROBS)
    seeds_ptr,  # [batch] int64 (TESTS)
    positions_ptr,  # [batch] int64 (TESTS)
    num_tokens,
    vocab,
    width,
    split_len,  # a multiple of BLOCK_V
    ALL_GREEDY: tl.constexpr,
    BLOCK_V: tl.constexpr,
    TESTS: tl.constexpr = False,
    HAS_DRAFT_PROBS: tl.constexpr = False,
    BINS: tl.constexpr = 0,  # (not TESTS) lane-group maxima stored for the top-k search's seed
    COARSE_BINS: tl.constexpr = 0,  # and coarser ones after them (BINS > 0)
    PDL: tl.constexpr = False,
):
    chain_launch(PDL, WAITS=False)  # the chain's first launch: a plain one
    slot = tl.program_id(0)
    split = tl.program_id(1)
    num_splits = tl.num_programs(1)
    b = slot // width
    i = slot % width
    row_ptr, start, count = slot_row(cu_ptr, target_ptr, bonus_ptr, b, i, num_tokens, vocab, width)
    if i <= count:
        v_begin = split * split_len
        out = slot.to(tl.int64) * num_splits + split
        if ALL_GREEDY:
            temperature = 0.0
            scale = 0.0
        else:
            temperature = tl.load(temperature_ptr + b)
            scale = tl.where(temperature == 0.0, 0.0, LOG2E / temperature)  # greedy: unused
        if TESTS:
            end = tl.minimum(split_len, vocab - v_begin)
            first = _load_block(row_ptr + v_begin, tl.arange(0, BLOCK_V), end, True)
            draft, in_vocab, x, z_x, q_x, u = draft_step(draft_ptr, draft_probs_ptr, seeds_ptr, positions_ptr, row_ptr,
                                                         start, b, i, count, vocab, HAS_DRAFT_PROBS)
            greedy = temperature == 0.0
            trusted = step_trusted(z_x, scale)
            best, best_index, split_best, addend = step_addend(row_ptr, v_begin, end, first, i, count, z_x, x, q_x, u,
                                                               scale, greedy, trusted, BLOCK_V)
        else:
            best, best_index, approx = _scan(row_ptr, v_begin, split_len, vocab, -scale, not ALL_GREEDY, BLOCK_V)
            split_best = tl.max(best, axis=0)
            split_sum = tl.zeros([], tl.float32)
            if not ALL_GREEDY:
                lane_weight = tl.where(best == float("-inf"), 0.0, tl.exp2((best - split_best) * scale))
                split_sum = tl.sum(approx * lane_weight, axis=0)
            tl.store(part_approx_ptr + out, split_sum)
            if BINS > 0:  # each the max of BLOCK_V / BINS lanes: a logit of the split, or -inf
                bins_ptr = part_bins_ptr + out * (BINS + COARSE_BINS)
                tl.store(bins_ptr + tl.arange(0, BINS), tl.max(tl.reshape(best, [BINS, BLOCK_V // BINS]), axis=1))
                if COARSE_BINS > 0:
                    coarse = tl.max(tl.reshape(best, [COARSE_BINS, BLOCK_V // COARSE_BINS]), axis=1)
                    tl.store(bins_ptr + BINS + tl.arange(0, COARSE_BINS), coarse)
        tl.store(part_max_ptr + out, split_best)
        tl.store(part_arg_ptr + out, tl.min(tl.where(best == split_best, best_index, INDEX_MAX), axis=0))
        if TESTS:
            if i < count:
                old = tl.atomic_add(packed_ptr + slot, addend + PACKED_ONE, sem="relaxed", scope="gpu")
                if ((old >> PACKED_SHIFT) & PACKED_MAX_SPLITS) == num_splits - 1:  # the row's last to leave
                    tl.atomic_xchg(packed_ptr + slot, 0, sem="relaxed", scope="gpu")
                    verdict = packed_verdict(old + addend, in_vocab, q_x, trusted, greedy)
                    tl.store(verdict_ptr + slot, verdict.to(tl.int32))


@triton.jit
def packed_verdict(row, in_vocab, q_x, trusted, greedy):
    """A draft step's verdict from its row's packed sum (the count bits are dropped): greedy,
    PASSES when no entry precedes the draft; random, PASSES below the band, FAILS above it
    (or outside the vocab, or q(x) = 0), UNSETTLED in it or where a split lay far (or not
    ``trusted``: z_x -inf, 1 / T not a positive float)."""
    row = row & PACKED_SUM
    if greedy:
        verdict = tl.where(in_vocab & (row == 0), PASSES, FAILS)
    else:
        sure = trusted & ((row >> FAR_SHIFT) == 0)
        test = row & TEST_SUM
        verdict = tl.where(test < TEST_LOW, PASSES, tl.where(test >= TEST_HIGH, FAILS, UNSETTLED))
        verdict = tl.where(in_vocab & (q_x > 0.0), tl.where(sure, verdict, UNSETTLED), FAILS)
    return verdict


# Grid (step_programs * batch * sum_splits,), split fastest, then request, then j: program
# (j, b, s) takes the j-th, (j + step_programs)-th, ... of the steps the screen marked in
# request b (marked[b] = (first step, number of steps); VERDICTS: those the max pass's
# verdicts leave the decisions, not always a range; else every reachable step, no screen
# having run) and adds floor(w_v 2^40) over split s of its row (int64,
# exact), w = exp((z - max) / T) after top-k (SECOND: also top-p, p = w / z1 >= p_min).
# Greedy slots sum at T = 1 (log-probabilities). The launcher gives step_programs = 1 when
# usually one step a request is marked (no idle programs), the width when every step is.
# Bytes: the marked rows once per launch (usually the one row per request that samples).
@direct_launch
@triton.jit(do_not_specialize=["num_tokens", "width", "row_splits", "batch"])
def fixed_sum_kernel(
    part_sum_ptr,  # [batch * width, sum_splits] int64, written
    block_sum_ptr,  # [batch * width, cdiv(vocab, MASS_BLOCK)] int64, written: the sums per block
    marked_ptr,  # [batch, 2] int32: the steps whose exact normaliser the decisions need (MARKED)
    verdict_ptr,  # [batch * width] int32 (VERDICTS): the max pass's verdicts of the draft steps
    part_max_ptr,  # [batch * width, num_splits] float32
    part_arg_ptr,  # [batch * width, num_splits] int32
    top_k_state_ptr,  # [TOP_K_ROUNDS, batch * width, 2] int64 (verify_search.py)
    top_k_agg_ptr,  # [TOP_K_ROUNDS, batch * width, num_splits, AGG_COLUMNS] int64
    top_p_state_ptr,  # (SECOND) as top_k_state_ptr
    top_p_agg_ptr,  # (SECOND) as top_k_agg_ptr
    first_sum_ptr,  # (SECOND) [batch * width, sum_splits] int64: z1 partials
    live_list_ptr,  # (SECOND, LIVE_BLOCKS) [batch * width, sum_splits, LIVE_BLOCKS] int32: scratch
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
    MARKED: tl.constexpr = True,  # False: no screen ran, every reachable step is summed (or VERDICTS)
    VERDICTS: tl.constexpr = False,  # (not MARKED) the steps the max pass's verdicts leave (row_max_kernel, TESTS)
    BLOCK_W: tl.constexpr = 8,  # (VERDICTS) a power of two >= width
    LIVE_BLOCKS: tl.constexpr = 0,  # (with top-k) a power of two >= a split's mass blocks: only the live ones read
    MARK_MAX_K: tl.constexpr = 0,  # (LIVE_BLOCKS, not SECOND) as top-k's round 0 (verify_search.marks_blocks)
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
    greedy = temperature == 0.0
    temperature = tl.where(greedy, 1.0, temperature)
    scale = exponent_scale(temperature)
    _start, num_drafts = draft_range(cu_ptr, b, num_tokens, width - 1)  # unused (dropped) when MARKED
    chain_launch(PDL)
    if MARKED:
        first = tl.load(marked_ptr + b * 2)
        count = tl.load(marked_ptr + b * 2 + 1)
    elif VERDICTS:
        # The first step that does not surely pass (the bonus step when all do), and after an
        # unsettled one the later steps the loop below does not skip; greedy requests none.
        steps = tl.arange(0, BLOCK_W)
        verdicts = tl.load(verdict_ptr + b * width + steps, mask=steps < num_drafts, other=PASSES)
        first = tl.min(tl.where((steps < num_drafts) & (verdicts != PASSES), steps, num_drafts), axis=0).to(tl.int32)
        unsettled = tl.sum(((steps == first) & (verdicts == UNSETTLED)).to(tl.int32), axis=0) > 0
        count = tl.where(greedy, 0, tl.where(unsettled, num_drafts + 1 - first, 1)).to(tl.int32)
    else:
        first = tl.zeros([], tl.int32)
        count = (num_drafts + 1).to(tl.int32)
    if SECOND:
        count = tl.where(uses_top_p, count, 0)
    while j < count:
        i = tl.minimum(first + j, width - 1)  # j < the number marked: a reachable step
        slot = b * width + i
        # VERDICTS, after an unsettled first step: the decisions (verify_decide.py) read the
        # normalisers of the unsettled steps and of the one that samples, the first sure
        # failure (or the bonus step): a step that surely passes is skipped, a sure failure
        # is the last. Marking every later step held the request's programs a row each
        # (H200, B=256 random 215 -> 258 µs on 2 draws of 8; bench/NOTES.md).
        verdict = tl.full([], UNSETTLED, tl.int32)
        if VERDICTS:
            verdict = tl.load(verdict_ptr + slot, mask=(j > 0) & (i < num_drafts), other=UNSETTLED)
        if verdict != PASSES:
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
            list_ptr = live_list_ptr + (slot.to(tl.int64) * num_splits + split) * LIVE_BLOCKS
            # The live blocks: z1's, those top-k's round 0 marked (block_sum holds the marks,
            # where it marked: verify_search.marks_blocks); z2's, those z1 left nonzero.
            live = tl.full([], SECOND, tl.int1)
            if HAS_TOP_K and (LIVE_BLOCKS > 0) and not SECOND:
                lo = tl.load(top_k_state_ptr + slot.to(tl.int64) * 2)  # round 0's interval
                hi = tl.load(top_k_state_ptr + slot.to(tl.int64) * 2 + 1)
                unseeded, _max_key = top_k_initial(max_logit)
                live = uses_top_k & marks_blocks(lo, hi, lo > unseeded, top_k, MARK_MAX_K)
            split_range = (row_ptr, blocks, list_ptr, split * split_len, split_len, vocab)
            if scale > 0.0:  # T = 2^n: exp's first step by one multiply (exponent_scale)
                total = _split_fixed_sum(*split_range, max_logit, scale, kth, z1, p_min, live, True, SECOND, HAS_TOP_K,
                                         BLOCK_V, MASS_BLOCK, LIVE_BLOCKS)
            else:
                total = _split_fixed_sum(*split_range, max_logit, temperature, kth, z1, p_min, live, False, SECOND,
                                         HAS_TOP_K, BLOCK_V, MASS_BLOCK, LIVE_BLOCKS)
            tl.store(part_sum_ptr + slot.to(tl.int64) * num_splits + split, total)
        j = tl.where(verdict == FAILS, count, j + step_programs)


@triton.jit
def block_masses(z, max_logit, temperature, kth, z1, p_min, MULTIPLY: tl.constexpr, SECOND: tl.constexpr,
                 HAS_TOP_K: tl.constexpr):
    """The fixed-point masses of a tile of logits summed per mass block (_split_fixed_sum's)."""
    if SECOND:
        w = processed_weights(z, max_logit, temperature, kth, z1, p_min, MULTIPLY, True)
        mass = tl.floor(w * FIXED_SCALE).to(tl.int64)
    else:
        mass = fixed_weights(z, max_logit, temperature, kth, MULTIPLY, HAS_TOP_K)
    return tl.sum(tl.sum(mass, axis=2), axis=2)  # REPS (a thread's own entries) first, then SPAN


@triton.jit
def mass_tile(BLOCK_V: tl.constexpr, MASS_BLOCK: tl.constexpr):
    """(block, entry): the mass block index [LANE_GROUPS, WARP_GROUPS] and the entry offset
    [LANE_GROUPS, WARP_GROUPS, REPS, SPAN] of the tile _split_fixed_sum describes."""
    REPS: tl.constexpr = (MASS_BLOCK + 31) // 32
    SPAN: tl.constexpr = MASS_BLOCK // REPS
    GROUPS: tl.constexpr = BLOCK_V // MASS_BLOCK
    LANE_GROUPS: tl.constexpr = GROUPS // ((GROUPS + 3) // 4)
    WARP_GROUPS: tl.constexpr = GROUPS // LANE_GROUPS
    block = tl.arange(0, LANE_GROUPS)[:, None] + tl.arange(0, WARP_GROUPS)[None, :] * LANE_GROUPS
    entry = ((block * MASS_BLOCK)[:, :, None, None] + tl.arange(0, REPS)[None, None, :, None] * SPAN
             + tl.arange(0, SPAN)[None, None, None, :])
    return block, entry


@triton.jit
def _split_fixed_sum(row_ptr, blocks_ptr, list_ptr, v_begin, split_len, vocab, max_logit, temperature, kth, z1,
                     p_min, live, MULTIPLY: tl.constexpr, SECOND: tl.constexpr, HAS_TOP_K: tl.constexpr,
                     BLOCK_V: tl.constexpr, MASS_BLOCK: tl.constexpr, LIVE_BLOCKS: tl.constexpr):
    """sum floor(w_v 2^40) over [v_begin, v_begin + split_len) (int64, exact); the sum of
    each MASS_BLOCK entries to ``blocks_ptr`` (the masses verify_sample.py draws from).
    MULTIPLY: ``temperature`` holds log2(e) / T (exponent_scale). With top-k and
    LIVE_BLOCKS: _live_blocks_sum (where ``live``, only the blocks ``blocks_ptr`` holds nonzero).
    The tile [LANE_GROUPS, WARP_GROUPS, REPS, SPAN] holds BLOCK_V entries so that each mass
    block lies in the registers of a few lanes of one warp (4 warps, 2048 entries, 128-entry
    blocks: 8 lanes of 16 entries; a warp's load covers 4 blocks, 128 contiguous bytes of
    each): a block sum is mostly a thread's own additions, then 3 shuffle steps, not 5.
    (Triton lays the contiguous SPAN fastest, then the dims in order: lanes go to SPAN and
    LANE_GROUPS, warps to WARP_GROUPS, registers to REPS.)"""
    block, entry = mass_tile(BLOCK_V, MASS_BLOCK)
    totals = tl.zeros(block.shape, tl.int64)
    if HAS_TOP_K and LIVE_BLOCKS > 0:
        totals = _live_blocks_sum(row_ptr, blocks_ptr, list_ptr, v_begin, split_len, vocab, max_logit, temperature,
                                  kth, z1, p_min, live, MULTIPLY, SECOND, BLOCK_V, MASS_BLOCK, LIVE_BLOCKS)
    else:
        offset = 0
        while offset < split_len:
            v = v_begin + offset + entry
            z = load_logits(row_ptr, v, v < vocab)  # -inf past the vocab: mass 0
            blocks = block_masses(z, max_logit, temperature, kth, z1, p_min, MULTIPLY, SECOND, HAS_TOP_K)
            first = v_begin + offset + block * MASS_BLOCK
            tl.store(blocks_ptr + first // MASS_BLOCK, blocks, mask=first < vocab)
            totals += blocks
            offset += BLOCK_V
    return tl.sum(tl.sum(totals, axis=1), axis=0)


@triton.jit
def _live_blocks_sum(row_ptr, blocks_ptr, list_ptr, v_begin, split_len, vocab, max_logit, temperature, kth, z1,
                     p_min, live, MULTIPLY: tl.constexpr, SECOND: tl.constexpr, BLOCK_V: tl.constexpr,
                     MASS_BLOCK: tl.constexpr, LIVE_BLOCKS: tl.constexpr):
    """_split_fixed_sum with top-k, per mass block [LANE_GROUPS, WARP_GROUPS]: over every
    block of the split in order where not ``live`` (one loop for both: a second, streaming
    loop beside it measured no faster; what such rows lost was the registers the gather
    took, which the launcher caps: bench/NOTES.md), else over its live blocks only; a block
    not live holds 0 already, and is neither read nor written. The first pass: ``blocks_ptr`` holds top-k's round 0 marks (1: a logit >= its
    lo, which every logit >= kth is; 0: every mass is 0). The second (top-p): the first
    pass's block sums; an entry's second mass is its first one or 0 (floor(w 2^40), kept by
    top-p or not), so a block the first pass summed to 0 stays 0. The live ones (about top_k
    a row, of cdiv(vocab, MASS_BLOCK)), listed by live_list in the program's scratch
    ``list_ptr``, are gathered BLOCK_V / MASS_BLOCK at a time."""
    block, entry = mass_tile(BLOCK_V, MASS_BLOCK)
    within = entry - (block * MASS_BLOCK)[:, :, None, None]
    GROUPS: tl.constexpr = BLOCK_V // MASS_BLOCK
    first_block = v_begin // MASS_BLOCK
    num_blocks = tl.cdiv(tl.minimum(split_len, vocab - v_begin), MASS_BLOCK)
    count = num_blocks
    if live:
        count = live_list(blocks_ptr + first_block, num_blocks, list_ptr, LIVE_BLOCKS)
    totals = tl.zeros(block.shape, tl.int64)
    taken = 0
    while taken < count:
        listed = taken + block  # the tile's mass block b takes live block taken + b
        valid = listed < count
        picked = first_block + tl.where(live, tl.load(list_ptr + listed, mask=valid & (live != 0), other=0), listed)
        v = picked[:, :, None, None] * MASS_BLOCK + within
        z = load_logits(row_ptr, v, valid[:, :, None, None] & (v < vocab))
        blocks = block_masses(z, max_logit, temperature, kth, z1, p_min, MULTIPLY, SECOND, True)
        tl.store(blocks_ptr + picked, blocks, mask=valid)
        totals += tl.where(valid, blocks, 0)
        taken += GROUPS
    return totals
