"""Top-k and top-p thresholds of the Triton ``verify``: an exact 16-ary search over int32
keys, one launch per round, each row split across programs whose partials add exactly.

Round r narrows the slot's interval [lo, hi] from the previous round's partials, then each
program adds ``A(c) = sum weight_v [key_v > c]`` over its split for 16 candidates c
(int, exact): top-k: key = order key of the logit, weight 1 (the result is the key of the
k-th largest logit); top-p: key = bits of p = w / z1, weight floor(p 2^32) (the result is
the least p kept). 8 rounds of evenly spaced candidates cover 32 bits; top-k's searches
start with a round near the row max (_candidates), so they take 9.

Most of a row lies outside the interval after one or two rounds, and every later
interval lies inside the current one. So a program whose split holds at most
``keep_limit`` entries of the current interval (known from the previous round's
partials: exactly for top-k, bounded by mass / least weight for top-p) keeps their keys
while it counts: each of the BLOCK_V lanes appends the keys it meets to its own column
of a [kept_rows, BLOCK_V] buffer (no atomics, no cross-lane scan), and stores the mass
above hi it counted. Its later rounds read those keys, not the row: A(c) is the stored
mass above hi plus the kept keys' weights above c, the same integers. A lane that meets
more than kept_rows keys voids the buffer and the split reads its row again next round.
Each kept round moves its own interval's keys down their columns and drops the rest (the
stored mass becomes its A(hi)), so a column shrinks about 16x a round.
Bytes: the row once per round until its split keeps (2 reads a search on 128k random
logits, bench/search_rounds.py), then the kept keys (at most kept_rows * BLOCK_V int32).
Top-p after top-k: only the logits >= kth weigh more than 0, and weight-0 keys add to no
A(c). Its row passes read only the blocks whose first normaliser's block sum is not 0 (a
list a program, verify_search_counts.live_list; about top_k blocks a row), and its round 0
keeps at once when top_k <= keep_limit (ties past k overflow a lane: read again), so it
reads those blocks once (bench/NOTES.md).
"""

from __future__ import annotations

import triton
import triton.language as tl

from .launch import direct_launch
from .verify_math import MASS_SCALE, TOP_P_SCALE, chain_launch, exponent_scale, from_order_key, order_key
from .verify_search_counts import TOP_K_MODE, TOP_P_MODE, add_kept, clear_marks, count_kept, row_pass
from .verify_slots import request_params, row_fixed_sum, row_max_argmax, slot_row

NUM_CANDIDATES = tl.constexpr(16)  # thresholds tested per search round
EVEN_ROUNDS = tl.constexpr(8)  # 16-ary search: 16^8 = 2^32 covers any float key interval
TOP_K_ROUNDS = tl.constexpr(EVEN_ROUNDS.value + 1)  # one round near the max, then EVEN_ROUNDS from there
TOP_P_ROUNDS = EVEN_ROUNDS
# Partials per (round, slot, split): A(c_j) for the 16 candidates, the total weight, and
# A(lo - 1), A(hi) of the round's own interval (the next round's population).
AGG_COLUMNS = tl.constexpr(19)
TOTAL_COLUMN = tl.constexpr(16)
FROM_LO_COLUMN = tl.constexpr(17)
ABOVE_HI_COLUMN = tl.constexpr(18)
KEPT_UNROLL = tl.constexpr(4)  # kept rows loaded at a time (the kept loop's four loads)
META_COLUMNS = tl.constexpr(3)  # per (slot, split): rows kept (-1: none), A(hi) then, total


@triton.jit
def _candidates(lo, hi, j, search_round, MODE: tl.constexpr):
    """The round's candidates (int64, non-decreasing in j; j < 16 meaningful): evenly spaced,
    lo + j * ceil((hi - lo) / 16), but for top-k's first round, unseeded, the keys of max - d_j, where
    hi = key(max) and d_j falls from 64 to about 2^-5.2 in steps of 3/4 of a binade (its bits
    linear in j: the same integers on every device). The even spacing of order keys puts
    2^23 keys in each binade, so the logits near a row's top share one interval for two
    rounds; distances from the max put the k-th largest of 128k logits in an interval of a
    few thousand after one round (bench/NOTES.md)."""
    step = tl.maximum((hi - lo + NUM_CANDIDATES - 1) // NUM_CANDIDATES, 1)
    candidate = lo + j.to(tl.int64) * step
    if MODE == TOP_K_MODE:  # a seeded first interval (lo above key(-inf)) is spaced evenly
        distance = ((133 << 23) - j * (3 << 21)).to(tl.int32).to(tl.float32, bitcast=True)
        near_max = order_key(from_order_key(hi) - distance).to(tl.int64)
        unseeded = lo == order_key(tl.full([], float("-inf"), tl.float32)).to(tl.int64)
        candidate = tl.where((search_round == 0) & unseeded, near_max, candidate)
    return candidate


@triton.jit
def _narrow(agg_ptr, lo, hi, num_splits, bound, candidate_round, MODE: tl.constexpr, BLOCK_S: tl.constexpr):
    """One search step: the smallest c in [lo, hi] with ``A(c) * SCALE < bound`` (true at
    hi), A(c) the summed partials of round ``candidate_round``'s candidates below hi. Top-p:
    SCALE 2^24 and the bound times the summed total (column 16); top-k: SCALE 1."""
    s = tl.arange(0, BLOCK_S)
    j = tl.arange(0, 2 * NUM_CANDIDATES)  # columns 0..16 used (arange needs a power of 2)
    tile = tl.load(agg_ptr + s[:, None] * AGG_COLUMNS + j[None, :],
                   mask=(s < num_splits)[:, None] & (j <= TOTAL_COLUMN)[None, :], other=0)
    agg = tl.sum(tile, axis=0)  # A(c_j) for j < 16, then the total
    if MODE == TOP_P_MODE:
        bound = bound * tl.sum(tl.where(j == TOTAL_COLUMN, agg, 0), axis=0)
        agg = agg * 16777216
    candidate = _candidates(lo, hi, j, candidate_round, MODE)
    valid = (j < NUM_CANDIDATES) & (candidate < hi)
    holds = agg < bound
    new_hi = tl.min(tl.where(valid & holds, candidate, hi), axis=0)
    new_lo = tl.max(tl.where(valid & ~holds, candidate + 1, lo), axis=0)
    return new_lo, new_hi


@triton.jit
def search_interval(state_ptr, agg_ptr, search_round, slot, num_slots, num_splits, lo, hi, bound,
                    MODE: tl.constexpr, BLOCK_S: tl.constexpr):
    """The search interval of a slot before round ``search_round`` (TOP_K_ROUNDS or
    TOP_P_ROUNDS: the result, lo == hi). (lo, hi): the initial interval, used in round 0."""
    if search_round > 0:
        previous = slot.to(tl.int64) + (search_round - 1) * num_slots
        lo = tl.load(state_ptr + previous * 2)
        hi = tl.load(state_ptr + previous * 2 + 1)
        agg = agg_ptr + previous * num_splits * AGG_COLUMNS
        lo, hi = _narrow(agg, lo, hi, num_splits, bound, search_round - 1, MODE, BLOCK_S)
    return lo, hi


@triton.jit
def split_population(state_ptr, agg_ptr, search_round, slot, num_slots, num_splits, split, lo, hi,
                     MODE: tl.constexpr):
    """Entries of one split with a key in [lo, hi], the interval of round ``search_round``
    (> 0), from that split's partials of the round before: A(lo - 1) - A(hi), both among
    its candidates or its own interval's ends. Top-k: exact (weight 1). Top-p: that mass
    over the least weight a key >= lo has, an upper bound (huge where that weight is 0)."""
    previous = slot.to(tl.int64) + (search_round - 1) * num_slots
    previous_lo = tl.load(state_ptr + previous * 2)
    previous_hi = tl.load(state_ptr + previous * 2 + 1)
    column = tl.arange(0, 2 * NUM_CANDIDATES)
    partial = tl.load(agg_ptr + (previous * num_splits + split) * AGG_COLUMNS + column,
                      mask=column < AGG_COLUMNS, other=0)
    candidate = _candidates(previous_lo, previous_hi, column, search_round - 1, MODE)
    candidate = tl.minimum(tl.maximum(candidate, -2147483648), 2147483647)
    key = tl.where(column < NUM_CANDIDATES, candidate,
                   tl.where(column == FROM_LO_COLUMN, previous_lo - 1,
                            tl.where(column == ABOVE_HI_COLUMN, previous_hi, -(2 ** 40))))
    from_lo = tl.max(tl.where(key == lo - 1, partial, -1), axis=0)
    above_hi = tl.max(tl.where(key == hi, partial, -1), axis=0)
    huge = tl.full([], 2 ** 62, tl.int64)
    population = from_lo - above_hi
    if MODE == TOP_P_MODE:
        least = tl.floor(lo.to(tl.int32).to(tl.float32, bitcast=True) * MASS_SCALE).to(tl.int64)
        population = tl.where(least > 0, population // tl.maximum(least, 1), huge)
    return tl.where((from_lo >= 0) & (above_hi >= 0), population, huge)


@triton.jit
def top_k_initial(max_logit):
    """Top-k search interval over order keys: [key(-inf), key(max)], as int64."""
    low = order_key(tl.full([], float("-inf"), tl.float32)).to(tl.int64)
    return low, order_key(max_logit + tl.zeros([], tl.float32)).to(tl.int64)


@triton.jit
def _seed_over(maxima_ptr, stride, num_splits, top_k, max_logit, ROUNDS: tl.constexpr, COUNT: tl.constexpr,
               BLOCK_S: tl.constexpr):
    """The low end of an interval holding the k-th largest of a row's COUNT maxima a split
    (``stride`` apart), after ROUNDS 16-ary steps over their order keys counted in registers
    (the first near the max, as the search's round 0): key(-inf) where fewer than k are
    finite."""
    s = tl.arange(0, BLOCK_S)[:, None]
    maxima = tl.load(maxima_ptr + s * stride + tl.arange(0, COUNT)[None, :], mask=s < num_splits,
                     other=float("-inf"))
    keys = tl.reshape(order_key(maxima), [BLOCK_S * COUNT])
    lo, hi = top_k_initial(max_logit)
    j = tl.arange(0, NUM_CANDIDATES)
    for seed_round in tl.static_range(ROUNDS):
        candidate = tl.minimum(tl.maximum(_candidates(lo, hi, j, seed_round, TOP_K_MODE), -2147483648), 2147483647)
        at_least = tl.sum((keys[None, :] >= candidate.to(tl.int32)[:, None]).to(tl.int32), axis=1) >= top_k
        valid = (candidate >= lo) & (candidate <= hi)
        new_lo = tl.max(tl.where(valid & at_least, candidate, lo), axis=0)
        hi = tl.min(tl.where(valid & ~at_least, candidate - 1, hi), axis=0)
        lo = new_lo
    return lo


@triton.jit
def top_k_seed(part_bins_ptr, slot, num_splits, top_k, max_logit, ROUNDS: tl.constexpr, BINS: tl.constexpr,
               COARSE: tl.constexpr, DENSITY: tl.constexpr, BLOCK_S: tl.constexpr):
    """A lower bound on a slot's k-th largest logit, as an int64 order key, from the max
    pass's lane-group maxima (verify_rows.py: BINS a program, then COARSE coarser ones):
    these are logits of the row (or -inf), so the k-th largest of them is at most the row's
    own. The coarse set where it holds DENSITY maxima a kept key (fewer compares), else the
    fine one (_seed_over)."""
    row = part_bins_ptr + slot.to(tl.int64) * num_splits * (BINS + COARSE)
    if COARSE > 0:
        if top_k * DENSITY <= num_splits * COARSE:
            lo = _seed_over(row + BINS, BINS + COARSE, num_splits, top_k, max_logit, ROUNDS, COARSE, BLOCK_S)
        else:
            lo = _seed_over(row, BINS + COARSE, num_splits, top_k, max_logit, ROUNDS, BINS, BLOCK_S)
    else:
        lo = _seed_over(row, BINS, num_splits, top_k, max_logit, ROUNDS, BINS, BLOCK_S)
    return lo


@triton.jit
def marks_blocks(lo, hi, seeded, top_k, MARK_MAX_K: tl.constexpr):
    """Whether top-k's round 0, its interval [lo, hi], marks the blocks holding a logit >= lo
    for z1 (which then reads those alone): where seeded (about top_k keys a row lie in it,
    so few blocks are marked), top_k <= MARK_MAX_K, and something is left to count (its
    row pass runs). Else z1 reads every block, unmarked."""
    return (lo < hi) & seeded & (top_k <= MARK_MAX_K)


@triton.jit
def top_p_threshold(top_p):
    """Top-p's bound factor max(1, floor(top_p 2^24)): a key c holds where A(c) 2^24 is below
    it times the total (its first interval: top_p_bounds)."""
    return tl.maximum(tl.floor(top_p * TOP_P_SCALE).to(tl.int64), 1)


@triton.jit
def top_p_bounds(threshold, z1, vocab):
    """Round 0's top-p interval: bits [lo, hi] that hold the threshold c* (the least key c
    with A(c) 2^24 < threshold * total), about ten binades where [0, bits(1.0)] spans 127.
    hi: every p = w / z1 with w = exp(<= 0) < 2 is at most rn(2 / z1), so A(hi) = 0 and c* <=
    hi (bits(1.0) if z1 gives no such bound). lo: the keys below it weigh m = floor(p 2^32)
    <= m_lo = floor((2^24 - threshold) 2^6 / vocab) each, at most vocab * m_lo together, so
    A(lo - 1) 2^24 >= (total - vocab * m_lo) 2^24 >= threshold * total wherever total >= 2^30
    (total >= 2^32 sum(p) - vocab, sum(p) >= 1 - 2^-23): no key below lo holds, c* >= lo.
    bits(m_lo 2^-32) rounded to nearest, less 1: a float no greater than m_lo 2^-32."""
    q = tl.math.div_rn(2.0, z1)
    hi = tl.where((q > 0.0) & (q < 1.0), q.to(tl.int32, bitcast=True).to(tl.int64), 0x3F800000)
    low_mass = ((16777216 - threshold) * 64) // vocab
    lo = (low_mass.to(tl.float32) * 2.3283064365386963e-10).to(tl.int32, bitcast=True).to(tl.int64) - 1
    return tl.minimum(tl.maximum(lo, 0), hi), hi


@triton.jit
def row_kth(state_ptr, agg_ptr, slot, num_slots, num_splits, uses_top_k, top_k, max_logit, BLOCK_S: tl.constexpr):
    """The top-k threshold of a slot once its search is done (-inf without top-k)."""
    kth = tl.full([], float("-inf"), tl.float32)
    if uses_top_k:
        lo, hi = top_k_initial(max_logit)
        lo, hi = search_interval(state_ptr, agg_ptr, TOP_K_ROUNDS, slot, num_slots, num_splits, lo, hi,
                                 top_k.to(tl.int64), TOP_K_MODE, BLOCK_S)
        kth = from_order_key(hi)
    return kth


@triton.jit
def row_p_min(state_ptr, agg_ptr, slot, num_slots, num_splits, uses_top_p, top_p, BLOCK_S: tl.constexpr):
    """The top-p threshold of a slot once its search is done: keep p >= p_min (0 without)."""
    p_min = tl.zeros([], tl.float32)
    if uses_top_p:
        unused = tl.zeros([], tl.int64)  # the first interval: read in round 0 only
        lo, hi = search_interval(state_ptr, agg_ptr, TOP_P_ROUNDS, slot, num_slots, num_splits, unused, unused,
                                 top_p_threshold(top_p), TOP_P_MODE, BLOCK_S)
        p_min = hi.to(tl.int32).to(tl.float32, bitcast=True)
    return p_min


@triton.jit
def _kept_keys(keys_ptr, row, lane_count, BLOCK_V: tl.constexpr):
    """KEPT_UNROLL rows of a split's kept keys from ``row`` (0 past each lane's count)."""
    key0 = tl.load(keys_ptr + row * BLOCK_V, mask=row < lane_count, other=0)
    key1 = tl.load(keys_ptr + (row + 1) * BLOCK_V, mask=row + 1 < lane_count, other=0)
    key2 = tl.load(keys_ptr + (row + 2) * BLOCK_V, mask=row + 2 < lane_count, other=0)
    key3 = tl.load(keys_ptr + (row + 3) * BLOCK_V, mask=row + 3 < lane_count, other=0)
    return key0, key1, key2, key3


@triton.jit
def _store_kept_record(lanes_ptr, meta_ptr, lane_count, most, above_hi, total):
    """A split's kept record once its lanes hold its interval's keys: their counts, then
    A(hi) (the mass above them), the total and, last, the rows kept."""
    tl.store(lanes_ptr, lane_count)
    tl.store(meta_ptr + 1, tl.sum(above_hi.to(tl.int64), axis=0))
    tl.store(meta_ptr + 2, total)
    tl.store(meta_ptr, most.to(tl.int64))


# Grid (batch * width, num_splits), one launch per round. Program (slot, s) narrows the
# slot's interval from the previous round's partials (split 0 records it), then adds A(c)
# for the round's 16 candidates, the total weight and A(lo - 1), A(hi) over its split: from
# its row, keeping the interval's keys when few enough, or from the keys it kept in an
# earlier round. Each thread adds into its own entries' counts (int32 for top-k's 0/1
# weights), reduced once after the loop. Bytes: the row once per round until the split
# keeps, for the slots that use the threshold only.
@direct_launch
@triton.jit(do_not_specialize=["num_tokens", "width", "search_round", "kept_rows", "keep_limit"])
def threshold_search_kernel(
    state_ptr,  # [rounds, batch * width, 2] int64: (lo, hi) before each round (TOP_K_ROUNDS / TOP_P_ROUNDS)
    agg_ptr,  # [rounds, batch * width, num_splits, AGG_COLUMNS] int64
    kept_ptr,  # [batch * width, num_splits, kept_rows, BLOCK_V] int32: kept keys, a column a lane
    kept_lanes_ptr,  # [batch * width, num_splits, BLOCK_V] int32: keys kept by each lane
    kept_meta_ptr,  # [batch * width, num_splits, META_COLUMNS] int64
    part_max_ptr,  # [batch * width, num_splits] float32
    part_arg_ptr,  # [batch * width, num_splits] int32
    part_bins_ptr,  # [batch * width, num_splits, SEED_BINS + SEED_COARSE] float32: the max pass's lane-group maxima
    top_k_state_ptr,  # top-k search of the same shapes (read in TOP_P_MODE)
    top_k_agg_ptr,
    part_sum_ptr,  # [batch * width, num_splits] int64: z1 partials (read in TOP_P_MODE)
    block_sum_ptr,  # [batch * width, cdiv(vocab, BLOCK_V)] int64: z1's block sums (read with LIVE_BLOCKS)
    live_list_ptr,  # [batch * width, num_splits, LIVE_BLOCKS] int32: scratch, a list a program (LIVE_BLOCKS)
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
    kept_rows,  # rows of the kept-key buffer
    keep_limit,  # keep a split's interval keys when at most this many (-1: never)
    MODE: tl.constexpr,
    HAS_TOP_K: tl.constexpr,
    HAS_TOP_P: tl.constexpr,
    BLOCK_V: tl.constexpr,
    BLOCK_S: tl.constexpr,
    UNROLL: tl.constexpr = 4,  # blocks loaded a step: 1, 2 or 4 (masked past the split's end)
    SEED_BINS: tl.constexpr = 0,  # top-k's round 0: its interval starts at top_k_seed's bound
    SEED_COARSE: tl.constexpr = 0,  # the max pass's coarse maxima after the SEED_BINS (0: none)
    SEED_DENSITY: tl.constexpr = 1,  # the coarse ones seed k up to their count over this
    SEED_ROUNDS: tl.constexpr = 3,  # top_k_seed's steps (9: the k-th largest maximum itself)
    LIVE_BLOCKS: tl.constexpr = 0,  # top-p after top-k: a power of two >= a split's blocks; only those z1 left nonzero
    MARK_BLOCKS: tl.constexpr = 0,  # top-k's round 0: a power of two >= a split's blocks; marks them for z1
    MARK_MAX_K: tl.constexpr = 0,  # (MARK_BLOCKS) marked where top_k is at most this (marks_blocks)
    KEEP_FIRST: tl.constexpr = False,  # top-p alone: round 0 keeps its interval's keys (top_p_bounds)
    KEPT_PREFETCH: tl.constexpr = False,  # kept rounds load their next KEPT_UNROLL rows before counting these
    PDL: tl.constexpr = False,
):
    slot = tl.program_id(0)
    split = tl.program_id(1)
    num_slots = tl.num_programs(0)
    num_splits = tl.num_programs(1)
    b = slot // width
    i = slot % width
    # Before the wait (PDL): the op's own inputs only (verify_math.chain_launch).
    row_ptr, _start, count = slot_row(cu_ptr, target_ptr, bonus_ptr, b, i, num_tokens, vocab, width)
    temperature, uses_top_k, top_k, uses_top_p, top_p = request_params(
        b, vocab, temperature_ptr, top_k_ptr, top_p_ptr, HAS_TOP_K, HAS_TOP_P)
    uses = (i <= count) & (uses_top_k if MODE == TOP_K_MODE else uses_top_p)
    chain_launch(PDL)
    MARKS: tl.constexpr = MARK_BLOCKS > 0 and SEED_BINS > 0  # top-k's round 0 marks blocks for z1
    # A search already at one key (lo == hi before this round: its last round narrowed to
    # it, or top-p's finish stored it) stays there, and nothing is counted: split 0 copies
    # the interval on, after one load (not the row statistics and partials the narrowing reads).
    done = slot < 0
    if search_round > 0:
        previous = slot.to(tl.int64) + (search_round - 1) * num_slots
        done_lo = tl.load(state_ptr + previous * 2)
        done_hi = tl.load(state_ptr + previous * 2 + 1)
        done = done_lo == done_hi
        if uses & done & (split == 0):
            here = slot.to(tl.int64) + search_round * num_slots
            tl.store(state_ptr + here * 2, done_lo)
            tl.store(state_ptr + here * 2 + 1, done_hi)
    if uses & (done == 0):
        max_logit, _argmax = row_max_argmax(part_max_ptr, part_arg_ptr, slot, num_splits, BLOCK_S)
        kth = tl.full([], float("-inf"), tl.float32)
        z1 = tl.full([], 1.0, tl.float32)
        seeded = False
        if MODE == TOP_K_MODE:
            lo, hi = top_k_initial(max_logit)
            bound = top_k.to(tl.int64)
            if SEED_BINS > 0:
                seed = top_k_seed(part_bins_ptr, slot, num_splits, top_k, max_logit, SEED_ROUNDS, SEED_BINS,
                                  SEED_COARSE, SEED_DENSITY, BLOCK_S)
                seeded = seed > lo
                lo = seed
        else:
            if HAS_TOP_K:
                kth = row_kth(top_k_state_ptr, top_k_agg_ptr, slot, num_slots, num_splits, uses_top_k, top_k,
                              max_logit, BLOCK_S)
            z1 = row_fixed_sum(part_sum_ptr, slot, num_splits, BLOCK_S)
            bound = top_p_threshold(top_p)
            lo, hi = top_p_bounds(bound, z1, vocab)
        lo, hi = search_interval(state_ptr, agg_ptr, search_round, slot, num_slots, num_splits, lo, hi, bound,
                                 MODE, BLOCK_S)
        here = slot.to(tl.int64) + search_round * num_slots
        if split == 0:
            tl.store(state_ptr + here * 2, lo)
            tl.store(state_ptr + here * 2 + 1, hi)
        marks_ptr = block_sum_ptr + slot.to(tl.int64) * tl.cdiv(vocab, BLOCK_V)
        marks = (marks_ptr, tl.full([], float("inf"), tl.float32))  # nothing marked: no logit >= +inf
        if MARKS:  # the split's blocks holding a logit >= lo
            if marks_blocks(lo, hi, seeded, top_k, MARK_MAX_K):
                clear_marks(marks_ptr, split * split_len, tl.minimum(split * split_len + split_len, vocab), BLOCK_V,
                            MARK_BLOCKS)
                marks = (marks_ptr, from_order_key(lo))
        # An interval of one key is the threshold: nothing left to count (its partials are
        # never read: no candidate lies below hi).
        if lo < hi:
            j = tl.arange(0, NUM_CANDIDATES)
            # The keys are int32 (order keys; the bits of p in [0, 1]), and so are lo and hi:
            # int32 compares (the candidates clamped to int32 all the same).
            candidate = tl.minimum(tl.maximum(_candidates(lo, hi, j, search_round, MODE), -2147483648),
                                   2147483647).to(tl.int32)
            lo32 = lo.to(tl.int32)
            hi32 = hi.to(tl.int32)
            this = slot.to(tl.int64) * num_splits + split
            meta_ptr = kept_meta_ptr + this * META_COLUMNS
            lane = tl.arange(0, BLOCK_V)
            lanes_ptr = kept_lanes_ptr + this * BLOCK_V + lane
            keys_ptr = kept_ptr + this * kept_rows * BLOCK_V + lane
            rows_kept = tl.full([], -1, tl.int64)
            if (search_round > 0) & (keep_limit >= 0):  # keep_limit -1: no kept-key buffers at all
                rows_kept = tl.load(meta_ptr)
            if MODE == TOP_K_MODE:
                counts = tl.zeros([NUM_CANDIDATES, BLOCK_V], tl.int32)
                from_lo = tl.zeros([BLOCK_V], tl.int32)
                above_hi = tl.zeros([BLOCK_V], tl.int32)
            else:
                counts = tl.zeros([NUM_CANDIDATES, BLOCK_V], tl.int64)
                from_lo = tl.zeros([BLOCK_V], tl.int64)
                above_hi = tl.zeros([BLOCK_V], tl.int64)
            if rows_kept >= 0:  # this split kept its keys in an earlier round
                base = tl.load(meta_ptr + 1)  # A(hi) of the round that last wrote them: the mass above them
                total = tl.load(meta_ptr + 2)
                lane_count = tl.load(lanes_ptr)
                # Counted as in a row pass, KEPT_UNROLL rows loaded at a time; those of [lo, hi]
                # are moved down their column (never past a row already read), the rest dropped:
                # the keys of the later rounds' intervals stay, and the stored mass above them
                # becomes this round's A(hi). A column so shrinks about 16x a round.
                # KEPT_PREFETCH: the next rows' loads issued before these rows' counts (the moves
                # store only below the row being read, never into a row loaded ahead).
                stays = tl.zeros([BLOCK_V], tl.int32)
                row = 0
                if KEPT_PREFETCH:
                    ahead = _kept_keys(keys_ptr, row, lane_count, BLOCK_V)
                while row < rows_kept:
                    if KEPT_PREFETCH:
                        key0, key1, key2, key3 = ahead
                        ahead = _kept_keys(keys_ptr, row + KEPT_UNROLL, lane_count, BLOCK_V)
                    else:
                        key0, key1, key2, key3 = _kept_keys(keys_ptr, row, lane_count, BLOCK_V)
                    kept = (counts, from_lo, above_hi, stays)
                    kept = add_kept(key0, row, lane_count, *kept, candidate, lo32, hi32, keys_ptr, MODE, BLOCK_V)
                    kept = add_kept(key1, row + 1, lane_count, *kept, candidate, lo32, hi32, keys_ptr, MODE, BLOCK_V)
                    kept = add_kept(key2, row + 2, lane_count, *kept, candidate, lo32, hi32, keys_ptr, MODE, BLOCK_V)
                    kept = add_kept(key3, row + 3, lane_count, *kept, candidate, lo32, hi32, keys_ptr, MODE, BLOCK_V)
                    counts, from_lo, above_hi, stays = kept
                    row += KEPT_UNROLL
                tl.store(lanes_ptr, stays)
                tl.store(meta_ptr + 1, tl.sum(above_hi.to(tl.int64), axis=0) + base)
                tl.store(meta_ptr, tl.max(stays, axis=0).to(tl.int64))
            else:
                SKIPS: tl.constexpr = (MODE == TOP_P_MODE) and HAS_TOP_K
                LIVE: tl.constexpr = LIVE_BLOCKS if SKIPS else 0
                live_ptr = (block_sum_ptr + slot.to(tl.int64) * tl.cdiv(vocab, BLOCK_V),
                            live_list_ptr + (slot.to(tl.int64) * num_splits + split) * LIVE_BLOCKS)
                keep = False
                if search_round > 0:
                    keep = split_population(state_ptr, agg_ptr, search_round, slot, num_slots, num_splits, split, lo,
                                            hi, MODE) <= keep_limit
                elif SKIPS:  # top-p after top-k: about top_k keys weigh more than 0; ties past it overflow
                    keep = uses_top_k & (top_k <= keep_limit) & (keep_limit >= 0)
                elif SEED_BINS > 0:  # a seeded interval holds about k keys (more with ties: lanes overflow)
                    keep = seeded & (keep_limit >= 0)
                elif KEEP_FIRST:  # top-p alone: top_p_bounds' interval, kept where the lanes hold it
                    keep = keep_limit >= 0
                fresh = (counts, from_lo, above_hi, tl.zeros([BLOCK_V], tl.int64), tl.zeros([BLOCK_V], tl.int32))
                split_range = (row_ptr, split * split_len, tl.minimum(split * split_len + split_len, vocab))
                weighting = (max_logit, temperature, kth, z1)
                base = tl.zeros([], tl.int64)
                total = tl.zeros([], tl.int64)
                if (search_round == 0) & (keep_limit >= 0):
                    tl.store(meta_ptr, -1)
                # Top-k and top-p after top-k: a keeping pass adds no counts; its 16 candidates'
                # counts come from the keys it kept, read back after it (the same integers: every
                # key of [lo, hi] is kept, the others add to every candidate or to none), and a lane
                # that overflowed voids them: the row is read again, counting. Top-p alone counts
                # while keeping, in one pass (its bound on a split's keys is loose, so lanes
                # overflow and recounts cost more than the counts: bench/NOTES.md; counting after
                # keeping in its round 0 too was measured slower, B=64 top-p 0.9 856 -> 1025 µs).
                DEFERS: tl.constexpr = (MODE == TOP_K_MODE) or SKIPS
                if DEFERS:
                    counting_pass = keep == 0
                    if keep:
                        keeping = (candidate, lo32, hi32, keys_ptr, kept_rows, keep)
                        sums = row_pass(*split_range, weighting, fresh, keeping, live_ptr, MODE, UNROLL, BLOCK_V,
                                        SKIPS, False, LIVE, marks, MARKS)
                        counts, from_lo, above_hi, totals, lane_count = sums
                        if MODE == TOP_K_MODE:  # keys >= lo: those kept (every one counted) and those above hi
                            from_lo = lane_count + above_hi
                            total = (split_range[2] - split_range[1]).to(tl.int64)  # every entry weighs 1
                        else:
                            total = tl.sum(totals, axis=0)
                        most = tl.max(lane_count, axis=0)
                        if most <= kept_rows:
                            _store_kept_record(lanes_ptr, meta_ptr, lane_count, most, above_hi, total)
                            tl.debug_barrier()  # the kept keys visible to the whole program
                            counts = count_kept(keys_ptr, most, lane_count, counts, candidate, MODE, BLOCK_V)
                            counts += above_hi[None, :]  # keys above hi: above every candidate <= hi
                        else:
                            counting_pass = True
                    if counting_pass:
                        sums = row_pass(*split_range, weighting, fresh,
                                        (candidate, lo32, hi32, keys_ptr, kept_rows, False), live_ptr,
                                        MODE, UNROLL, BLOCK_V, SKIPS, True, LIVE, marks, MARKS)
                        counts, from_lo, above_hi, totals, lane_count = sums
                        total = tl.sum(totals, axis=0)
                else:
                    counting = (candidate, lo32, hi32, keys_ptr, kept_rows, keep)
                    scale = exponent_scale(temperature)
                    if scale > 0.0:  # T = 2^n (1 among them): exp's first step by one multiply (exponent_scale)
                        sums = row_pass(*split_range, (max_logit, scale, kth, z1), fresh, counting, live_ptr, MODE,
                                        UNROLL, BLOCK_V, SKIPS, True, LIVE, MULTIPLY=True)
                    else:
                        sums = row_pass(*split_range, weighting, fresh, counting, live_ptr, MODE, UNROLL, BLOCK_V, SKIPS,
                                        True, LIVE)
                    counts, from_lo, above_hi, totals, lane_count = sums
                    total = tl.sum(totals, axis=0)
                    if keep:
                        most = tl.max(lane_count, axis=0)
                        if most <= kept_rows:  # else a lane overflowed: read the row again next round
                            _store_kept_record(lanes_ptr, meta_ptr, lane_count, most, above_hi, total)
            out = agg_ptr + (here * num_splits + split) * AGG_COLUMNS
            tl.store(out + j, tl.sum(counts.to(tl.int64), axis=1) + base)
            tl.store(out + TOTAL_COLUMN, total)
            tl.store(out + FROM_LO_COLUMN, tl.sum(from_lo.to(tl.int64), axis=0) + base)
            tl.store(out + ABOVE_HI_COLUMN, tl.sum(above_hi.to(tl.int64), axis=0) + base)
