"""Both row passes of an unscreened Triton ``verify`` call in one launch (verify.py: one
request, every reachable step's exact normaliser summed, no screen).

The exact normaliser needs its row's max first (verify_rows.py), which took a launch of
its own: the max pass, then fixed_sum_kernel reading the rows again. Here each program
holds one BLOCK_V block of a row in registers, stores the block's max and first argmax,
waits for the other programs of its row at a counter, combines the row's max partials and
sums the block's exact fixed-point masses from the same registers: the same partials, block
sums and normaliser partials as the two launches, bit for bit (the same splits, the same
operations), one launch and one read of the rows fewer. The last program of a row to
leave also holds the row's normaliser total (the programs leave by one packed atomic that
adds their partials) and tests the row's draft exactly, so the decisions (verify_decide.py)
start at the first step that failed instead of walking the passed ones.

The wait needs every program of a row to run: the grid puts a row's programs next to each
other (split fastest), the GPU dispatches blocks in grid order (as decoupled look-back
scans rely on), and a row has no more programs than the GPU has SMs, so the rows resident
first finish and free their slots for the next. The interpreter runs programs one after
another: there the launcher takes this launch only when a row is one program (a vocab of
at most one block), else the two launches.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .launch import direct_launch
from .stream_counters import COUNTER_SLOTS
from .verify_math import FIXED_SCALE, INDEX_MAX, chain_launch, exponent_scale, exact_test, load_logits
from .verify_rows import block_masses, mass_tile
from .verify_slots import PACKED_MAX_SPLITS, PACKED_ONE, PACKED_SHIFT, PACKED_SUM, draft_step, slot_row


def packed_departures(counters: torch.Tensor) -> torch.Tensor:
    """The int64 packed departures of a counters buffer (row_max_sum_kernel)."""
    return counters.view(torch.int64)[COUNTER_SLOTS.value:]


@triton.jit
def step_passes(draft, in_vocab, x, z_x, q_x, u, part_arg_ptr, split_max, row_max, total, temperature, greedy, slot,
                num_splits, BLOCK_S: tl.constexpr):
    """Whether a draft step passes, as decide_kernel tests it: greedy, the draft is the
    row's first argmax (row_max_argmax, from ``split_max`` and the argmax partials); random,
    the exact test u q(x) < p(x) (exact_test) with the row's ``total`` as its normaliser."""
    if greedy:
        s = tl.arange(0, BLOCK_S)
        split_arg = tl.load(part_arg_ptr + slot.to(tl.int64) * num_splits + s, mask=s < num_splits,
                            other=INDEX_MAX, cache_modifier=".cg")
        passed = draft == tl.min(tl.where(split_max == row_max, split_arg, INDEX_MAX), axis=0)
    else:
        z1 = total.to(tl.float32) * (1.0 / FIXED_SCALE)
        kth, p_min = tl.full([], float("-inf"), tl.float32), tl.zeros([], tl.float32)  # as decide_kernel's
        passed, _p_x = exact_test(z_x, q_x, u, x, in_vocab, row_max, temperature, kth, z1, p_min, z2=z1)
    return passed


# Grid (num_splits, batch * width), split fastest: program (s, slot) takes entries
# [s * BLOCK_V, (s + 1) * BLOCK_V) of the slot's row (unreachable slots exit at once). It
# stores the block's max and first argmax (row_max_kernel's partials, whose splits here are
# single blocks), arrives at the slot's counter and waits for num_splits arrivals, then
# loads the row's max partials past L1, sums floor(w 2^40) of its block at the request's
# temperature (1 for a greedy request, as fixed_sum_kernel) into the block sums and the
# normaliser partial (stored only without TEST_STEPS: with it the partial rides the packed
# departure). The last program of a row to leave resets the row's counters, stores
# the slot's max and normaliser total, and at a draft step its exact acceptance test, as
# decide_kernel would run it (greedy: the draft is the row's first argmax), so the
# decisions start at the first failed step instead of walking the passed ones.
# Bytes: each reachable row once, the row's max partials, the draft's logit and draft prob
# once a program; a greedy step's argmax partials once a row.
@direct_launch
@triton.jit(do_not_specialize=["num_tokens", "width"])
def row_max_sum_kernel(
    part_max_ptr,  # [batch * width, num_splits] float32
    part_arg_ptr,  # [batch * width, num_splits] int32
    part_sum_ptr,  # [batch * width, num_splits] int64 (without TEST_STEPS)
    block_sum_ptr,  # [batch * width, cdiv(vocab, MASS_BLOCK)] int64
    counters_ptr,  # [4 * COUNTER_SLOTS] int32, 0 on entry and on exit (stream_counters.row_counters)
    packed_ptr,  # [COUNTER_SLOTS] int64, 0 on entry and on exit: packed_departures(counters)
    verdict_ptr,  # [batch * width] int32: 1 where a draft step's exact test passed (draft steps only)
    slot_max_ptr,  # [batch * width] float32: the slot's max logit
    slot_total_ptr,  # [batch * width] int64: the slot's normaliser total sum floor(w 2^40)
    target_ptr,  # [num_tokens, vocab]
    bonus_ptr,  # [batch, vocab]
    draft_ptr,  # [num_tokens] int32 | int64
    draft_probs_ptr,  # [num_tokens, vocab] float32 (HAS_DRAFT_PROBS)
    cu_ptr,  # [batch] int32
    temperature_ptr,  # [batch] float32
    seeds_ptr,  # [batch] int64
    positions_ptr,  # [batch] int64
    num_tokens,
    vocab,
    width,
    HAS_DRAFT_PROBS: tl.constexpr,
    BLOCK_V: tl.constexpr,
    MASS_BLOCK: tl.constexpr,
    BLOCK_S: tl.constexpr,  # a power of two >= num_splits
    TEST_STEPS: tl.constexpr = True,  # num_splits <= PACKED_MAX_SPLITS; False: no slot statistics or verdicts
    PDL: tl.constexpr = False,
):
    chain_launch(PDL, WAITS=False)  # the chain's first launch: a plain one
    split = tl.program_id(0)
    num_splits = tl.num_programs(0)
    slot = tl.program_id(1)
    b = slot // width
    i = slot % width
    row_ptr, row_start, count = slot_row(cu_ptr, target_ptr, bonus_ptr, b, i, num_tokens, vocab, width)
    if i <= count:
        request_temperature = tl.load(temperature_ptr + b)
        greedy = request_temperature == 0.0
        temperature = tl.where(greedy, 1.0, request_temperature)  # greedy: summed at T = 1
        scale = exponent_scale(temperature)
        # (unused, so not loaded, without TEST_STEPS)
        draft, in_vocab, x, z_x, q_x, u = draft_step(draft_ptr, draft_probs_ptr, seeds_ptr, positions_ptr, row_ptr,
                                                     row_start, b, i, count, vocab, HAS_DRAFT_PROBS)
        block, entry = mass_tile(BLOCK_V, MASS_BLOCK)
        v = split * BLOCK_V + entry
        z = load_logits(row_ptr, v, v < vocab)
        best = tl.max(tl.max(tl.max(tl.max(z, axis=3), axis=2), axis=1), axis=0)
        # The first index of the max; the split's first entry when no logit is finite (as
        # row_max_kernel, whose lanes start at offset 0).
        first = tl.min(tl.min(tl.min(tl.min(tl.where(z == best, v, INDEX_MAX), axis=3), axis=2), axis=1), axis=0)
        out = slot.to(tl.int64) * num_splits + split
        tl.store(part_max_ptr + out, best)
        tl.store(part_arg_ptr + out, first)
        # Every thread's stores before the arrival (one thread's atomic), whose release
        # publishes them at GPU scope; the acquire of the count that reaches num_splits makes
        # the row's partials visible here.
        tl.debug_barrier()
        arrivals = counters_ptr + slot
        tl.atomic_add(arrivals, 1, sem="release", scope="gpu")
        while tl.atomic_add(arrivals, 0, sem="acquire", scope="gpu") < num_splits:
            pass
        s = tl.arange(0, BLOCK_S)
        split_max = tl.load(part_max_ptr + slot.to(tl.int64) * num_splits + s, mask=s < num_splits,
                            other=float("-inf"), cache_modifier=".cg")
        row_max = tl.max(split_max, axis=0)
        kth = tl.full([], float("-inf"), tl.float32)
        one = tl.full([], 1.0, tl.float32)
        if scale > 0.0:  # T = 2^n: exp's first step by one multiply (exponent_scale)
            masses = block_masses(z, row_max, scale, kth, one, 0.0, True, False, False)
        else:
            masses = block_masses(z, row_max, temperature, kth, one, 0.0, False, False, False)
        start = split * BLOCK_V + block * MASS_BLOCK
        tl.store(block_sum_ptr + slot.to(tl.int64) * tl.cdiv(vocab, MASS_BLOCK) + start // MASS_BLOCK, masses,
                 mask=start < vocab)
        partial = tl.sum(tl.sum(masses, axis=1), axis=0)
        if not TEST_STEPS:  # else the decisions read the slot's total, never the partials
            tl.store(part_sum_ptr + out, partial)
        # Leaving: the last of the row to leave has seen every program past the wait, so
        # it may reset the counters for the next call. TEST_STEPS: each program leaves with
        # one atomic that adds its partial and counts it (packed), so the last to leave
        # holds the row's normaliser total without a read of the partials; it stores the
        # slot's statistics and the draft step's verdict. (The argmax partials it reads for a
        # greedy step were published by the arrivals.) A partial is at most BLOCK_V masses of
        # at most 2^40 each, so a row's sum stays below 63 * 2^51 < 2^57 (verify_slots.py).
        if TEST_STEPS:
            old = tl.atomic_add(packed_ptr + slot, partial + PACKED_ONE, sem="relaxed", scope="gpu")
            if ((old >> PACKED_SHIFT) & PACKED_MAX_SPLITS) == num_splits - 1:
                tl.atomic_xchg(arrivals, 0, sem="relaxed", scope="gpu")
                tl.atomic_xchg(packed_ptr + slot, 0, sem="relaxed", scope="gpu")
                total = (old + partial) & PACKED_SUM
                tl.store(slot_max_ptr + slot, row_max)
                tl.store(slot_total_ptr + slot, total)
                if i < count:
                    passed = step_passes(draft, in_vocab, x, z_x, q_x, u, part_arg_ptr, split_max, row_max, total,
                                         request_temperature, greedy, slot, num_splits, BLOCK_S)
                    tl.store(verdict_ptr + slot, passed.to(tl.int32))
        else:
            departures = counters_ptr + COUNTER_SLOTS + slot
            if tl.atomic_add(departures, 1, sem="relaxed", scope="gpu") == num_splits - 1:
                tl.atomic_xchg(arrivals, 0, sem="relaxed", scope="gpu")
                tl.atomic_xchg(departures, 0, sem="relaxed", scope="gpu")
