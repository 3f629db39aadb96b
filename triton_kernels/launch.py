"""What the GPU offers the Triton launchers, read once per device."""

from __future__ import annotations

import functools

import torch


@functools.cache
def _properties(index: int):
    return torch.cuda.get_device_properties(index)


def _index(device: torch.device) -> int:
    return device.index if device.index is not None else torch.cuda.current_device()


def _cuda_properties(device: torch.device):
    return _properties(_index(device))


def multiprocessor_count(device: torch.device, off_gpu: int) -> int:
    """Streaming multiprocessors of ``device``; ``off_gpu`` off a GPU (the interpreter),
    which the caller picks: a GPU's count to plan as on it, or a few to exercise splits."""
    if device.type != "cuda":
        return off_gpu
    return _cuda_properties(device).multi_processor_count


@functools.cache
def _dram_gbs(index: int) -> float:
    from triton.runtime import driver  # Triton's driver reads the memory clock and bus width from CUDA

    properties = driver.active.utils.get_device_properties(index)
    return properties["mem_clock_rate"] * properties["mem_bus_width"] * 2 / 8 / 1e6  # kHz x bits, DDR


def dram_gbs_per_multiprocessor(device: torch.device) -> int:
    """Peak memory bandwidth of ``device`` shared by each multiprocessor, GB/s, from its memory
    clock and bus width (an H100 SXM by its datasheet: 3352 / 132 = 25; an H200 read 36);
    0 off a GPU."""
    if device.type != "cuda":
        return 0
    return int(_dram_gbs(_index(device)) / _cuda_properties(device).multi_processor_count)


def has_pdl(device: torch.device) -> bool:
    """Whether ``device`` has programmatic dependent launch (griddepcontrol: sm_90+); never
    off a GPU (the interpreter runs no inline PTX)."""
    return device.type == "cuda" and _cuda_properties(device).major >= 9
