"""Zeroed counters for kernels whose programs meet at atomics: one int32 buffer a (device,
stream), which every kernel that uses it leaves at 0 (the last program to leave resets what
it counted), so it is zeroed once, never by a fill launch inside a CUDA graph.

Layout as the verify kernels read it (verify_unscreened.py): two int32 a slot (arrivals,
departures), then an int64 a slot (packed departures). Kernels on one stream run in turn (a
programmatic dependent reads the counts only after its wait on the launch before it), so
they share it; another stream has its own. A stream first seen while it captures a graph takes a spare zeroed at an
earlier eager call (none left: None, and the caller takes launches that count nothing).
"""

from __future__ import annotations

import torch
import triton.language as tl

from . import launch_plan

COUNTER_SLOTS = tl.constexpr(4096)  # slots a buffer serves (64 KiB); calls with more take the counter-free launches
SPARE_BUFFERS = 4
_COUNTERS: dict[tuple[int, int], torch.Tensor] = {}  # (device index, stream) -> counters
_SPARES: dict[int, list[torch.Tensor]] = {}  # device index -> zeroed buffers not yet taken


def row_counters(device: torch.device, num_slots: int) -> torch.Tensor | None:
    """The zeroed counters of the current stream (4 * COUNTER_SLOTS int32) for a call of
    ``num_slots`` slots, or None where none can serve (too many slots, or a new stream
    capturing with no spare left)."""
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
            fresh = launch_plan.persistent(torch.zeros(1 + SPARE_BUFFERS - len(spares), 4 * COUNTER_SLOTS.value,
                                                       dtype=torch.int32, device=device))
            if device.type == "cuda":
                stream.synchronize()  # once a buffer: zero before any stream, or a later graph, uses it
            counters, *more = fresh.unbind(0)
            spares.extend(more)
        _COUNTERS[key] = counters
    return counters
