"""What the GPU offers the Triton launchers, read once per device."""

from __future__ import annotations

import functools

import torch


@functools.cache
def _capability(index: int) -> tuple[int, int]:
    return torch.cuda.get_device_capability(index)


def has_pdl(device: torch.device) -> bool:
    """Whether ``device`` has programmatic dependent launch (griddepcontrol: sm_90+); never
    off a GPU (the interpreter runs no inline PTX)."""
    if device.type != "cuda":
        return False
    return _capability(device.index if device.index is not None else torch.cuda.current_device())[0] >= 9
