"""Top-p after top-k finished from the keys its round 0 kept (verify_search.py): after
top-k, about top_k keys of a row weigh more than 0, and round 0 keeps every one of them
when its splits do not overflow. Then the threshold is found in one program a slot instead
of seven more rounds of launches.

The search's result is the least c in [0, bits(1.0)] with ``A(c) 2^24 < bound * total``
(A(c) = the summed weight floor(p 2^32) of the keys > c; verify_search._narrow). A(c) only
changes at a key, so that least c is a key, or bits(1.0) where none holds: the least kept
key kappa with A(kappa) 2^24 < bound * total, counted over the kept keys alone (weight-0
keys add to no A). Stored as round 0's interval (c, c), every later round narrows nothing
and exits at once (verify_search.threshold_search_kernel), and row_p_min reads c.
"""

from __future__ import annotations

import triton
import triton.language as tl

from .launch import direct_launch
from .ragged import draft_range
from .verify_math import chain_launch
from .verify_search import AGG_COLUMNS, META_COLUMNS, TOTAL_COLUMN, top_p_threshold
from .verify_search_counts import TOP_P_MODE, kept_weight
from .verify_slots import request_params

FINISH_CHUNK = tl.constexpr(64)  # candidates (and keys) counted at a time: a [64, 64] tile


@triton.jit
def _gather_kept(kept_ptr, kept_lanes_ptr, kept_meta_ptr, keys_ptr, slot, num_splits, kept_rows,
                 FINISH_KEYS: tl.constexpr, BLOCK_V: tl.constexpr):
    """Every key the slot's splits kept, packed at ``keys_ptr`` (the first FINISH_KEYS of
    them); returns how many there are."""
    lane = tl.arange(0, BLOCK_V)
    count = tl.zeros([], tl.int32)
    split = 0
    while split < num_splits:
        this = slot.to(tl.int64) * num_splits + split
        rows = tl.load(kept_meta_ptr + this * META_COLUMNS)
        lane_count = tl.load(kept_lanes_ptr + this * BLOCK_V + lane)
        row = 0
        while row < rows:
            present = row < lane_count
            key = tl.load(kept_ptr + (this * kept_rows + row) * BLOCK_V + lane, mask=present, other=0)
            rank = count + tl.cumsum(present.to(tl.int32), axis=0) - 1
            tl.store(keys_ptr + rank, key, mask=present & (rank < FINISH_KEYS))
            count += tl.sum(present.to(tl.int32), axis=0)
            row += 1
        split += 1
    return count


@triton.jit
def _least_holding_key(keys_ptr, count, bound):
    """The least of the ``count`` keys at ``keys_ptr`` whose A(key) 2^24 is below ``bound``,
    or bits(1.0) where none is (no p exceeds 1.0), as int64."""
    best = tl.zeros([], tl.int64) + 0x3F800000
    c = 0
    while c < count:
        candidate_at = c + tl.arange(0, FINISH_CHUNK)
        is_candidate = candidate_at < count
        candidate = tl.load(keys_ptr + candidate_at, mask=is_candidate, other=0)
        above = tl.zeros([FINISH_CHUNK], tl.int64)  # A(candidate)
        k = 0
        while k < count:
            key_at = k + tl.arange(0, FINISH_CHUNK)
            is_key = key_at < count
            key = tl.load(keys_ptr + key_at, mask=is_key, other=0)
            weight = kept_weight(key, is_key, TOP_P_MODE)
            above += tl.sum(tl.where(key[None, :] > candidate[:, None], weight[None, :], 0), axis=1)
            k += FINISH_CHUNK
        holds = is_candidate & (above * 16777216 < bound)
        best = tl.minimum(best, tl.min(tl.where(holds, candidate.to(tl.int64), best), axis=0))
        c += FINISH_CHUNK
    return best


# Grid (batch * width,), launched after top-p's round 0 when top-k came before it. Program
# slot finishes its search where top_k <= FINISH_KEYS and every split of the slot kept its
# keys (at most FINISH_KEYS in all); elsewhere it leaves round 0's interval, and the rounds after it search as
# before. Bytes: the slot's kept keys (about top_k int32) and round 0's totals.
@direct_launch
@triton.jit(do_not_specialize=["num_tokens", "width", "num_splits", "kept_rows", "keep_limit"])
def top_p_finish_kernel(
    state_ptr,  # [TOP_P_ROUNDS, batch * width, 2] int64: round 0's interval rewritten when finished
    agg_ptr,  # [TOP_P_ROUNDS, batch * width, num_splits, AGG_COLUMNS] int64: round 0's totals read
    kept_ptr,  # [batch * width, num_splits, kept_rows, BLOCK_V] int32 (verify_search.py)
    kept_lanes_ptr,  # [batch * width, num_splits, BLOCK_V] int32
    kept_meta_ptr,  # [batch * width, num_splits, META_COLUMNS] int64
    keys_ptr,  # [batch * width, FINISH_KEYS] int32: scratch, the slot's kept keys packed
    cu_ptr,  # [batch] int32
    temperature_ptr,  # [batch] float32
    top_k_ptr,  # [batch] int32
    top_p_ptr,  # [batch] float32
    num_tokens,
    vocab,
    width,
    num_splits,
    kept_rows,
    keep_limit,
    BLOCK_V: tl.constexpr,  # the search's
    BLOCK_S: tl.constexpr,  # a power of two >= num_splits
    FINISH_KEYS: tl.constexpr,
    PDL: tl.constexpr = False,
):
    chain_launch(PDL)
    slot = tl.program_id(0)
    b = slot // width
    i = slot % width
    _start, count = draft_range(cu_ptr, b, num_tokens, width - 1)
    _temperature, uses_top_k, top_k, uses_top_p, top_p = request_params(
        b, vocab, temperature_ptr, top_k_ptr, top_p_ptr, True, True)
    # Round 0 kept at once only here (threshold_search_kernel: top-p after top-k, SKIPS); the
    # counting is quadratic in the keys, so only for top_k up to FINISH_KEYS (at B = 64 it
    # lost to the rounds from k = 200: bench/NOTES.md).
    if ((i <= count) & uses_top_p & uses_top_k & (top_k <= keep_limit) & (keep_limit >= 0)
            & (top_k <= FINISH_KEYS)):
        s = tl.arange(0, BLOCK_S)
        this = slot.to(tl.int64) * num_splits + s
        rows = tl.load(kept_meta_ptr + this * META_COLUMNS, mask=s < num_splits, other=0)
        if tl.min(rows, axis=0) >= 0:  # every split kept (-1: one read its row, or overflowed)
            keys_row = keys_ptr + slot.to(tl.int64) * FINISH_KEYS
            kept = _gather_kept(kept_ptr, kept_lanes_ptr, kept_meta_ptr, keys_row, slot, num_splits, kept_rows,
                                FINISH_KEYS, BLOCK_V)
            if kept <= FINISH_KEYS:
                tl.debug_barrier()  # the packed keys visible to the whole program
                totals = tl.load(agg_ptr + this * AGG_COLUMNS + TOTAL_COLUMN, mask=s < num_splits, other=0)
                least = _least_holding_key(keys_row, kept, top_p_threshold(top_p) * tl.sum(totals, axis=0))
                tl.store(state_ptr + slot.to(tl.int64) * 2, least)
                tl.store(state_ptr + slot.to(tl.int64) * 2 + 1, least)
