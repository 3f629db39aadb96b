"""Loads specops._C, which registers the torch.ops.specops schemas and kernels."""

from __future__ import annotations

import functools


@functools.cache
def build_info() -> dict:
    """What specops._C was built with: backends, CUDA arch list, torch and CUDA versions."""
    from specops import _C

    return dict(_C.build_info())


def has_cuda_kernels() -> bool:
    return bool(build_info()["with_cuda"])
