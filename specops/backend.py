"""Which implementation runs an op: the typed choice and the default for a device."""

from __future__ import annotations

import enum
import functools
import importlib.util
import os

import torch

from specops._native import has_cuda_kernels


class Backend(enum.Enum):
    CUDA = "cuda"  # torch.ops.specops on CUDA tensors
    CPU = "cpu"  # torch.ops.specops on CPU tensors (C++ kernels)
    TRITON = "triton"  # torch.ops.specops_triton (GPU, or CPU under TRITON_INTERPRET=1)
    REFERENCE = "reference"  # specops.reference, pure PyTorch


# Read once at import: torch.compile then sees constants, not calls it must trace.
_TRITON_INSTALLED = importlib.util.find_spec("triton") is not None
_CUDA_KERNELS_BUILT = has_cuda_kernels()


def triton_available() -> bool:
    return _TRITON_INSTALLED


def triton_runs_on(device: torch.device) -> bool:
    """Triton kernels run on CUDA tensors, and on CPU tensors only under the interpreter."""
    return _triton_runs(device.type, os.environ.get("TRITON_INTERPRET"))


def _triton_runs(device_type: str, interpret: str | None) -> bool:
    return triton_available() and (device_type == "cuda" or (device_type == "cpu" and interpret == "1"))


def available_backends(device: torch.device) -> list[Backend]:
    """Every backend that can run on tensors of ``device``, fastest first."""
    device = torch.device(device)
    return list(_available(device.type, os.environ.get("TRITON_INTERPRET")))


@functools.cache  # every op call asks (the interpreter's variable read each time)
def _available(device_type: str, interpret: str | None) -> tuple[Backend, ...]:
    backends = []
    if device_type == "cuda" and _CUDA_KERNELS_BUILT:
        backends.append(Backend.CUDA)
    if device_type == "cpu":
        backends.append(Backend.CPU)
    if _triton_runs(device_type, interpret):
        backends.append(Backend.TRITON)
    backends.append(Backend.REFERENCE)
    return tuple(backends)


@functools.cache  # device.type builds its string through a C++ stream on each read: ~3k instructions
def _device_type(device: torch.device) -> str:
    return device.type


def resolve(
    backend: Backend | str | None, device: torch.device, *, op: str = "", missing: tuple[Backend, ...] = ()
) -> Backend:
    """The backend to use: the one asked for (checked to run on ``device``), else the
    fastest available. ``missing`` names the backends ``op`` has no kernel for yet: they are
    skipped by the default choice and raise NotImplementedError when asked for."""
    # (the interpreter's variable matters on CPU tensors alone: not read for CUDA ones)
    device_type = _device_type(device)
    available = _available(device_type, os.environ.get("TRITON_INTERPRET") if device_type == "cpu" else None)
    if missing:
        available = tuple(b for b in available if b not in missing)
    if backend is None:
        return available[0]
    chosen = backend if isinstance(backend, Backend) else Backend(backend)
    if chosen in available:
        return chosen
    names = ", ".join(b.value for b in available)
    if chosen in missing:
        raise NotImplementedError(f"{op} has no {chosen.value} kernel yet; available on {device}: {names}")
    raise ValueError(f"backend {chosen.value!r} cannot run on {device} tensors here; available: {names}")
