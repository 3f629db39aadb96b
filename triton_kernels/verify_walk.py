"""The max pass of a screened tokens-only Triton ``verify`` walked step by step: a request's
rows are read in order, and none after its first failed step.

row_max_kernel (verify_rows.py, TESTS) reads every row a request may reach at once and
tests each draft step in the row's last program to leave. Most requests fail early (the
bench's default drafts pass ~0.35 of their steps), and nothing downstream reads a row
after the first failed step: the decisions (verify_decide.py) and the exact normaliser
(fixed_sum_kernel, VERDICTS) start at the first step that did not pass and end at the
first that failed. Here a request's programs (one a split) walk its steps together: each
reads its split of step i's row exactly as row_max_kernel's program would (the same
partials, the same packed addend), arrives with one packed atomic, waits until every split
of the row has arrived, and computes the step's verdict from the row's packed sum (every
program the same integers, so the same verdict); the walk goes on past a step that passes
or is unsettled, and stops after one that fails (or after the bonus row, read when no
draft failed). The partials and verdicts of every row up to the first failure are those
of row_max_kernel, bit for bit; later rows are neither read nor written.

The wait needs every program of a request to run: the grid puts a request's programs next
to each other (split fastest), the GPU dispatches blocks in grid order (verify_unscreened.py
relies on the same), and a request has no more programs than the GPU has SMs. The
interpreter runs programs one after another: there the launcher gives a request one split.
"""

from __future__ import annotations

import triton
import triton.language as tl

from .launch import direct_launch
from .ragged import draft_range
from .verify_math import INDEX_MAX, LOG2E, chain_launch, exponent_scale
from .verify_rows import FAILS, PASSES, _load_block, _split_fixed_sum, packed_verdict, step_addend, step_trusted
from .verify_slots import PACKED_MAX_SPLITS, PACKED_ONE, PACKED_SHIFT, draft_step, slot_row


@triton.jit
def _sum_split(part_max_ptr, part_sum_ptr, block_sum_ptr, row_ptr, slot, split, num_splits, v_begin, split_len, vocab,
               temperature, BLOCK_V: tl.constexpr, BLOCK_S: tl.constexpr, MASS_BLOCK: tl.constexpr):
    """fixed_sum_kernel's work for one split of a slot's row (no top-k): the row's max from
    its split maxima (published to this program by the wait), then sum floor(w 2^40) of the
    split into the block sums and the slot's normaliser partial."""
    s = tl.arange(0, BLOCK_S)
    split_max = tl.load(part_max_ptr + slot * num_splits + s, mask=s < num_splits, other=float("-inf"),
                        cache_modifier=".cg")
    max_logit = tl.max(split_max, axis=0)
    blocks = block_sum_ptr + slot * tl.cdiv(vocab, MASS_BLOCK)
    kth, z1, p_min = tl.full([], float("-inf"), tl.float32), tl.full([], 1.0, tl.float32), tl.zeros([], tl.float32)
    live = tl.zeros([], tl.int1)
    scale = exponent_scale(temperature)
    if scale > 0.0:  # T = 2^n: exp's first step by one multiply (exponent_scale)
        total = _split_fixed_sum(row_ptr, blocks, blocks, v_begin, split_len, vocab, max_logit, scale, kth, z1, p_min,
                                 live, True, False, False, BLOCK_V, MASS_BLOCK, 0)
    else:
        total = _split_fixed_sum(row_ptr, blocks, blocks, v_begin, split_len, vocab, max_logit, temperature, kth, z1,
                                 p_min, live, False, False, False, BLOCK_V, MASS_BLOCK, 0)
    tl.store(part_sum_ptr + slot * num_splits + split, total)


# Grid (num_splits, batch), split fastest: program (s, b) walks request b's steps over
# entries [s * split_len, (s + 1) * split_len) of each row. Per step it stores the split's
# max and first argmax (row_max_kernel's partials), adds its packed addend to the slot's
# packed sum, waits until the count in it reaches num_splits, and (split 0) stores the
# verdict. LOOKAHEAD: the next step's first block and draft are loaded before the wait
# (read for nothing after the request's last step). The last program of a request to leave
# resets the packed sums it walked and its exit count (the stream's zeroed counters:
# stream_counters.py). Bytes: the rows up to the first failure once, a block a program
# beyond with LOOKAHEAD.
@direct_launch
@triton.jit(do_not_specialize=["num_tokens", "width"])
def row_walk_kernel(
    part_max_ptr,  # [batch * width, num_splits] float32
    part_arg_ptr,  # [batch * width, num_splits] int32
    part_sum_ptr,  # [batch * width, num_splits] int64 (SUMS): the exact normaliser's partials
    block_sum_ptr,  # [batch * width, cdiv(vocab, MASS_BLOCK)] int64 (SUMS): its block sums
    target_ptr,  # [num_tokens, vocab] float32 | bfloat16 | float16
    bonus_ptr,  # [batch, vocab]
    cu_ptr,  # [batch] int32
    temperature_ptr,  # [batch] float32
    exits_ptr,  # [batch] int32, 0 on entry and on exit (the counters' arrivals)
    packed_ptr,  # [batch * width] int64, 0 on entry and on exit (verify_unscreened.packed_departures)
    verdict_ptr,  # [batch * width] int32, written at the draft steps walked
    draft_ptr,  # [num_tokens] int32 | int64
    draft_probs_ptr,  # [num_tokens, vocab] float32 (HAS_DRAFT_PROBS)
    seeds_ptr,  # [batch] int64
    positions_ptr,  # [batch] int64
    num_tokens,
    vocab,
    width,
    split_len,  # a multiple of BLOCK_V
    HAS_DRAFT_PROBS: tl.constexpr,
    BLOCK_V: tl.constexpr,
    BLOCK_W: tl.constexpr,  # a power of two >= width
    BLOCK_S: tl.constexpr = 1,  # (SUMS) a power of two >= num_splits
    MASS_BLOCK: tl.constexpr = 128,  # divides BLOCK_V: entries per stored block sum
    LOOKAHEAD: tl.constexpr = True,
    SUMS: tl.constexpr = False,
    PDL: tl.constexpr = False,
):
    chain_launch(PDL, WAITS=False)  # the chain's first launch: a plain one
    split = tl.program_id(0)
    num_splits = tl.num_programs(0)
    b = tl.program_id(1)
    start, count = draft_range(cu_ptr, b, num_tokens, width - 1)
    temperature = tl.load(temperature_ptr + b)
    greedy = temperature == 0.0
    scale = tl.where(greedy, 0.0, LOG2E / temperature)
    v_begin = split * split_len
    end = tl.minimum(split_len, vocab - v_begin)
    lane = tl.arange(0, BLOCK_V)
    row_ptr, _start, _count = slot_row(cu_ptr, target_ptr, bonus_ptr, b, 0, num_tokens, vocab, width)
    first = _load_block(row_ptr + v_begin, lane, end, True)
    draft, in_vocab, x, z_x, q_x, u = draft_step(draft_ptr, draft_probs_ptr, seeds_ptr, positions_ptr, row_ptr, start,
                                                 b, 0, count, vocab, HAS_DRAFT_PROBS)
    i = tl.zeros([], tl.int64)
    last = count  # the walk's last step: the bonus step until a draft fails
    while i <= last:
        slot = b * width + i
        trusted = step_trusted(z_x, scale)
        best, best_index, split_best, addend = step_addend(row_ptr, v_begin, end, first, i, count, z_x, x, q_x, u,
                                                           scale, greedy, trusted, BLOCK_V)
        out = slot * num_splits + split
        tl.store(part_max_ptr + out, split_best)
        tl.store(part_arg_ptr + out, tl.min(tl.where(best == split_best, best_index, INDEX_MAX), axis=0))
        this_ptr = row_ptr
        if i < count:
            tested_in_vocab, tested_q, tested_trusted = in_vocab, q_x, trusted
            if SUMS:  # every thread's partials stored before the arrival, whose release publishes them
                tl.debug_barrier()
                row = tl.atomic_add(packed_ptr + slot, addend + PACKED_ONE, sem="acq_rel", scope="gpu") + addend
            else:
                row = tl.atomic_add(packed_ptr + slot, addend + PACKED_ONE, sem="relaxed", scope="gpu") + addend
            row += PACKED_ONE
            next_ptr, _start, _count = slot_row(cu_ptr, target_ptr, bonus_ptr, b, i + 1, num_tokens, vocab, width)
            if LOOKAHEAD:  # the next step's loads in flight through the wait
                first = _load_block(next_ptr + v_begin, lane, end, True)
                draft, in_vocab, x, z_x, q_x, u = draft_step(draft_ptr, draft_probs_ptr, seeds_ptr, positions_ptr,
                                                             next_ptr, start, b, i + 1, count, vocab, HAS_DRAFT_PROBS)
            while ((row >> PACKED_SHIFT) & PACKED_MAX_SPLITS) < num_splits:
                if SUMS:  # the acquire that sees every arrival makes the row's max partials visible
                    row = tl.atomic_add(packed_ptr + slot, 0, sem="acquire", scope="gpu")
                else:
                    row = tl.atomic_add(packed_ptr + slot, 0, sem="relaxed", scope="gpu")
            verdict = packed_verdict(row, tested_in_vocab, tested_q, tested_trusted, greedy)
            if split == 0:
                tl.store(verdict_ptr + slot, verdict.to(tl.int32))
            last = tl.where(verdict == FAILS, i, count)
            if SUMS:
                if (verdict != PASSES) & (not greedy):
                    _sum_split(part_max_ptr, part_sum_ptr, block_sum_ptr, this_ptr, slot, split, num_splits, v_begin,
                               split_len, vocab, temperature, BLOCK_V, BLOCK_S, MASS_BLOCK)
            if not LOOKAHEAD:
                first = _load_block(next_ptr + v_begin, lane, end, True)
                draft, in_vocab, x, z_x, q_x, u = draft_step(draft_ptr, draft_probs_ptr, seeds_ptr, positions_ptr,
                                                             next_ptr, start, b, i + 1, count, vocab, HAS_DRAFT_PROBS)
            row_ptr = next_ptr
        elif SUMS:  # the bonus row (no failure before it): the request's programs meet for its max
            if not greedy:
                tl.debug_barrier()
                tl.atomic_add(packed_ptr + slot, PACKED_ONE, sem="release", scope="gpu")
                while ((tl.atomic_add(packed_ptr + slot, 0, sem="acquire", scope="gpu") >> PACKED_SHIFT)
                       & PACKED_MAX_SPLITS) < num_splits:
                    pass
                _sum_split(part_max_ptr, part_sum_ptr, block_sum_ptr, this_ptr, slot, split, num_splits, v_begin,
                           split_len, vocab, temperature, BLOCK_V, BLOCK_S, MASS_BLOCK)
        i += 1
    # Leaving: every program has read the packed sums it waited on (before its release), so
    # the last to leave may reset them for the next call on the stream.
    if tl.atomic_add(exits_ptr + b, 1, sem="acq_rel", scope="gpu") == num_splits - 1:
        steps = tl.arange(0, BLOCK_W)
        tl.store(packed_ptr + b * width + steps, tl.zeros([BLOCK_W], tl.int64), mask=steps <= last)
        tl.atomic_xchg(exits_ptr + b, 0, sem="relaxed", scope="gpu")
