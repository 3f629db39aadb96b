"""Rounding of float32 values to a narrower float dtype, the same on the GPU and under the
Triton interpreter (whose float32 -> bfloat16 cast truncates where the GPU's rounds to
nearest even)."""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def round_to(x, DTYPE: tl.constexpr):
    """float32 ``x`` rounded to nearest (ties to even) in DTYPE, returned as float32 (finite x)."""
    if DTYPE == tl.bfloat16:
        bits = x.to(tl.uint32, bitcast=True)
        bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
        return bits.to(tl.float32, bitcast=True)
    else:
        return x.to(DTYPE).to(tl.float32)
