"""Per-slot views of the Triton ``verify``'s row statistics, shared by its launches.

A *slot* is (request b, step i), ``slot = b * width + i``: step i < count is the request's
target row ``start + i``, step count its bonus row, later steps are empty (their programs
exit at once). Slots, not physical rows, carry the statistics, so a row two requests share
(inconsistent ``cu_num_draft_tokens`` with value checks off) is processed per request.
Each row pass stores one partial per (slot, split); the helpers here combine a slot's
partials, exactly (verify_rows.py says why they combine bit for bit).
"""

from __future__ import annotations

import triton
import triton.language as tl

from .ragged import draft_range
from .verify_math import FIXED_SCALE, INDEX_MAX, acceptance_uniform, load_logits


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


# A packed departure: a row's programs leave by one relaxed 64-bit atomic add each of their
# partial plus one count in bits 58-63 (6 bits: at most PACKED_MAX_SPLITS programs a row),
# so the program that reads back a count of num_splits - 1 is the row's last and holds the
# exact sum of every partial, with no fence and no read of the others' stores. The partials
# must sum below 2^58 (verify_unscreened.py: normaliser partials; verify_rows.py: the
# acceptance tests' sums); the count may wrap the sign bit (63 * 2^58), which the shift and
# mask ignore. The last program resets the word to 0 for the next call.
PACKED_SHIFT = tl.constexpr(58)
PACKED_ONE = tl.constexpr(1 << 58)
PACKED_SUM = tl.constexpr((1 << 58) - 1)
PACKED_MAX_SPLITS = tl.constexpr(63)


@triton.jit
def draft_step(draft_ptr, draft_probs_ptr, seeds_ptr, positions_ptr, row_ptr, start, b, i, count, vocab,
               HAS_DRAFT_PROBS: tl.constexpr):
    """What the acceptance test of step i of request b reads of the op's inputs, loaded at
    a row program's start so the test waits on none of them: (draft id, whether it lies in
    the vocab, the entry tested (0 outside), its logit z_x, its draft prob q_x (1 for
    n-gram), the test's uniform u); a stand-in past the drafts (i = count, the bonus step)."""
    is_draft = i < count
    draft = tl.load(draft_ptr + start + i, mask=is_draft, other=-1).to(tl.int64)
    in_vocab = (draft >= 0) & (draft < vocab)
    x = tl.where(in_vocab, draft, 0)
    z_x = tl.sum(load_logits(row_ptr, x + tl.arange(0, 1), in_vocab), axis=0)
    q_x = tl.full([], 1.0, tl.float32)
    if HAS_DRAFT_PROBS:
        q_x = tl.load(draft_probs_ptr + (start + i) * vocab + x, mask=in_vocab, other=0.0)
    u = tl.sum(acceptance_uniform(tl.load(seeds_ptr + b), tl.load(positions_ptr + b) + i, tl.zeros([1], tl.int32)),
               axis=0)
    return draft, in_vocab, x, z_x, q_x, u
