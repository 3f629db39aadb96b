"""What the GPU offers the Triton launchers, read once per device."""

from __future__ import annotations

import functools

import torch


@functools.cache
def _properties(index: int):
    return torch.cuda.get_device_properties(index)


def _cuda_properties(device: torch.device):
    return _properties(device.index if device.index is not None else torch.cuda.current_device())


def multiprocessor_count(device: torch.device, off_gpu: int) -> int:
    """Streaming multiprocessors of ``device``; ``off_gpu`` off a GPU (the interpreter),
    which the caller picks: a GPU's count to plan as on it, or a few to exercise splits."""
    if device.type != "cuda":
        return off_gpu
    return _cuda_properties(device).multi_processor_count


def has_pdl(device: torch.device) -> bool:
    """Whether ``device`` has programmatic dependent launch (griddepcontrol: sm_90+); never
    off a GPU (the interpreter runs no inline PTX)."""
    return device.type == "cuda" and _cuda_properties(device).major >= 9
