"""Triton kernel of the engine's MLP activation: silu(gate) * up from the fused gate_up
projection, in one pass (the eager formula is two kernels and a copy of gate).

Numerics: silu in float32 from the input dtype, rounded to it, then the product with up
rounded, as the eager ops do; the exponential is Triton's (within a few float32 ulps of
the eager one, so bf16/fp16 results match the eager path but for rare rounding ties).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .rounding import round_to

BLOCK_I = 1024
NUM_WARPS = 4


# Grid (N, cdiv(I, BLOCK_I)). Program (i, j) writes entries [j BLOCK_I, (j + 1) BLOCK_I) of
# row i. Bytes: gate and up read once, the product written once.
@triton.jit
def silu_mul_kernel(
    out_ptr,  # [N, I], rows contiguous
    gate_up_ptr,  # [N, 2 I]: gate, then up
    gate_up_stride,  # elements between gate_up rows
    INTERMEDIATE: tl.constexpr,
    BLOCK_I: tl.constexpr,
):
    i = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK_I + tl.arange(0, BLOCK_I)
    mask = cols < INTERMEDIATE
    DTYPE: tl.constexpr = out_ptr.dtype.element_ty
    row = gate_up_ptr + i * gate_up_stride
    gate = tl.load(row + cols, mask=mask).to(tl.float32)
    up = tl.load(row + INTERMEDIATE + cols, mask=mask).to(tl.float32)
    silu = round_to(gate / (1.0 + tl.exp(-gate)), DTYPE)
    tl.store(out_ptr + i * INTERMEDIATE + cols, round_to(silu * up, DTYPE).to(DTYPE), mask=mask)


def silu_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """``silu(gate) * up`` of ``gate_up`` ``[N, 2 I]`` (gate, then up; rows contiguous); returns ``[N, I]``."""
    if gate_up.dim() != 2 or gate_up.shape[1] % 2 or gate_up.stride(1) != 1:
        raise ValueError(f"silu_mul: gate_up must be [N, 2 I] with contiguous rows, got {tuple(gate_up.shape)} "
                         f"strides {gate_up.stride()}")
    n, intermediate = gate_up.shape[0], gate_up.shape[1] // 2
    out = torch.empty((n, intermediate), dtype=gate_up.dtype, device=gate_up.device)
    if n and intermediate:
        silu_mul_kernel[(n, triton.cdiv(intermediate, BLOCK_I))](
            out, gate_up, gate_up.stride(0), INTERMEDIATE=intermediate, BLOCK_I=BLOCK_I, num_warps=NUM_WARPS,
            enable_fp_fusion=False,
        )
    return out
