"""Both row passes of an unscreened Triton ``verify`` call in one launch (verify.py: one
request, every reachable step's exact normaliser summed, no screen).

The exact normaliser needs its row's max first (verify_rows.py), which took a launch of
its own: the max pass, then fixed_sum_kernel reading the rows again. Here each program
holds one BLOCK_V block of a row in registers, stores the block's max and first argmax,
waits for the other programs of its row at a counter, combines the row's max partials and
sums the block's exact fixed-point masses from the same registers: the same partials, block
sums and normaliser partials as the two launches, bit for bit (the same splits, the same
operations), one launch and one read of the rows fewer.

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

from .verify_math import INDEX_MAX, chain_launch, load_logits
from .verify_rows import block_masses, exact_inverse, mass_tile
from .verify_slots import slot_row

# Row counters: one zeroed buffer a (device, stream), two int32 a slot (arrivals,
# departures). The kernel leaves them at 0 (the last program of a row to leave resets
# them), so they are zeroed once, never by a fill launch inside a graph. A stream first seen
# while it captures a graph takes a spare zeroed at an earlier eager call (none left: the
# caller takes the two launches). Calls on one stream run in turn; another stream has its own.
COUNTER_SLOTS = tl.constexpr(256)  # slots a buffer serves; calls with more take the two launches
SPARE_BUFFERS = 4
_COUNTERS: dict[tuple[int, int], torch.Tensor] = {}  # (device index, stream) -> counters
_SPARES: dict[int, list[torch.Tensor]] = {}  # device index -> zeroed buffers not yet taken


def row_counters(device: torch.device, num_slots: int) -> torch.Tensor | None:
    """The zeroed counters of the current stream for ``num_slots`` slots, or None where
    none can serve (too many slots, or a new stream capturing with no spare left)."""
    if num_slots > COUNTER_SLOTS.value:
        return None
    if device.type != "cuda":  # the interpreter: no streams, no capture
        key, capturing = (-1, 0), False
    else:
        index = device.index if device.index is not None else torch.cuda.current_device()
        stream = torch.cuda.current_stream(device)
        key, capturing = (index, stream.cuda_stream), torch.cuda.is_current_stream_capturing()
    counters = _COUNTERS.get(key)
    if counters is None:
        spares = _SPARES.setdefault(key[0], [])
        if capturing:
            if not spares:
                return None
            counters = spares.pop()
        else:
            fresh = torch.zeros(1 + SPARE_BUFFERS - len(spares), 2 * COUNTER_SLOTS.value, dtype=torch.int32,
                                device=device)
            if device.type == "cuda":
                stream.synchronize()  # once a buffer: zero before any stream, or a later graph, uses it
            counters, *more = fresh.unbind(0)
            spares.extend(more)
        _COUNTERS[key] = counters
    return counters


# Grid (num_splits, batch * width), split fastest: program (s, slot) takes entries
# [s * BLOCK_V, (s + 1) * BLOCK_V) of the slot's row (unreachable slots exit at once). It
# stores the block's max and first argmax (row_max_kernel's partials, whose splits here are
# single blocks), arrives at the slot's counter and waits for num_splits arrivals, then
# loads the row's max partials past L1, sums floor(w 2^40) of its block at the request's
# temperature (1 for a greedy request, as fixed_sum_kernel) into the block sums and the
# normaliser partial. The last program of a row to leave resets the row's counters.
# Bytes: each reachable row once, the row's max partials once a program.
@triton.jit(do_not_specialize=["num_tokens", "width"])
def row_max_sum_kernel(
    part_max_ptr,  # [batch * width, num_splits] float32
    part_arg_ptr,  # [batch * width, num_splits] int32
    part_sum_ptr,  # [batch * width, num_splits] int64
    block_sum_ptr,  # [batch * width, cdiv(vocab, MASS_BLOCK)] int64
    counters_ptr,  # [2 * COUNTER_SLOTS] int32, 0 on entry and on exit (row_counters)
    target_ptr,  # [num_tokens, vocab]
    bonus_ptr,  # [batch, vocab]
    cu_ptr,  # [batch] int32
    temperature_ptr,  # [batch] float32
    num_tokens,
    vocab,
    width,
    BLOCK_V: tl.constexpr,
    MASS_BLOCK: tl.constexpr,
    BLOCK_S: tl.constexpr,  # a power of two >= num_splits
    PDL: tl.constexpr = False,
):
    chain_launch(PDL, WAITS=False)  # the chain's first launch: a plain one
    split = tl.program_id(0)
    num_splits = tl.num_programs(0)
    slot = tl.program_id(1)
    b = slot // width
    i = slot % width
    row_ptr, _start, count = slot_row(cu_ptr, target_ptr, bonus_ptr, b, i, num_tokens, vocab, width)
    if i <= count:
        temperature = tl.load(temperature_ptr + b)
        temperature = tl.where(temperature == 0.0, 1.0, temperature)  # greedy: summed at T = 1
        inverse = exact_inverse(temperature)
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
        row_max = tl.max(tl.load(part_max_ptr + slot.to(tl.int64) * num_splits + s, mask=s < num_splits,
                                 other=float("-inf"), cache_modifier=".cg"), axis=0)
        kth = tl.full([], float("-inf"), tl.float32)
        one = tl.full([], 1.0, tl.float32)
        if inverse > 0.0:  # T = 2^n: (z - max) / T is (z - max) * 2^-n, bit for bit
            masses = block_masses(z, row_max, inverse, kth, one, 0.0, True, False, False)
        else:
            masses = block_masses(z, row_max, temperature, kth, one, 0.0, False, False, False)
        start = split * BLOCK_V + block * MASS_BLOCK
        tl.store(block_sum_ptr + slot.to(tl.int64) * tl.cdiv(vocab, MASS_BLOCK) + start // MASS_BLOCK, masses,
                 mask=start < vocab)
        tl.store(part_sum_ptr + out, tl.sum(tl.sum(masses, axis=1), axis=0))
        # Leaving: the last of the row to leave has seen every program past the wait, so
        # it may reset both counters for the next call.
        departures = counters_ptr + COUNTER_SLOTS + slot
        if tl.atomic_add(departures, 1, sem="relaxed", scope="gpu") == num_splits - 1:
            tl.atomic_xchg(arrivals, 0, sem="relaxed", scope="gpu")
            tl.atomic_xchg(departures, 0, sem="relaxed", scope="gpu")
