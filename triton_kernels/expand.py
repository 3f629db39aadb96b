"""Triton kernel of ``expand_to_tokens``: per-request values repeated once per draft token."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .launch import direct_launch
from .ragged import draft_range


# Grid (batch,). Program b writes request b's value (after the optional replace) into its
# clamped row range [start, start + count) of the output, BLOCK_TOKENS rows at a time.
# Bytes moved: 8 (cu) + 4|8 (value) per request, 4|8 per token written.
@direct_launch
@triton.jit(do_not_specialize=["num_tokens"])
def _expand_to_tokens_kernel(
    out_ptr,  # [num_tokens] dtype of values, zero-filled
    values_ptr,  # [batch] float32 | int32 | int64
    cu_num_draft_tokens_ptr,  # [batch] int32
    num_tokens,
    replace_from,  # float32 (read only when HAS_REPLACE)
    replace_to,  # float32 (read only when HAS_REPLACE)
    HAS_REPLACE: tl.constexpr,
    BLOCK_TOKENS: tl.constexpr,
):
    b = tl.program_id(0)
    start, count = draft_range(cu_num_draft_tokens_ptr, b, num_tokens, num_tokens)
    value = tl.load(values_ptr + b)
    if HAS_REPLACE:
        value = tl.where(value == replace_from, replace_to, value)
    # while, not range(): see ragged.py.
    offset = 0
    while offset < count:
        i = offset + tl.arange(0, BLOCK_TOKENS)
        tl.store(out_ptr + start + i, tl.zeros([BLOCK_TOKENS], value.dtype) + value, mask=i < count)
        offset += BLOCK_TOKENS


def _expand_to_tokens(
    out: torch.Tensor,  # [num_tokens] dtype of values, zero-filled
    values: torch.Tensor,  # [batch] float32 | int32 | int64
    cu_num_draft_tokens: torch.Tensor,  # [batch] int32
    replace_from: float | None,
    replace_to: float,
) -> None:
    batch = values.shape[0]
    if batch == 0 or out.shape[0] == 0:
        return
    # Round on the host to the float32 the comparison happens in (as the C++ kernel's
    # static_cast<float> does), so the launch passes an exactly representable value.
    has_replace = replace_from is not None
    replace_from_f32 = float(torch.tensor(replace_from if has_replace else 0.0, dtype=torch.float32))
    replace_to_f32 = float(torch.tensor(replace_to, dtype=torch.float32))
    _expand_to_tokens_kernel[(batch,)](
        out,
        values,
        cu_num_draft_tokens,
        out.shape[0],
        replace_from_f32,
        replace_to_f32,
        HAS_REPLACE=has_replace,
        BLOCK_TOKENS=32,
        num_warps=1,
    )


def expand_to_tokens(
    values: torch.Tensor,
    cu_num_draft_tokens: torch.Tensor,
    num_tokens: int,
    replace_from: float | None = None,
    replace_to: float = 0.0,
) -> torch.Tensor:
    """Repeat each request's value once per draft token of that request; values equal to
    ``replace_from`` (float32 only) become ``replace_to``. Rows no request covers stay 0.

    Shape:
        values: [batch] float32 | int32 | int64
        cu_num_draft_tokens: [batch] int32, inclusive cumulative draft counts
        returns: [num_tokens], dtype of values
    """
    out = torch.zeros(num_tokens, dtype=values.dtype, device=values.device)
    _expand_to_tokens(out, values, cu_num_draft_tokens, replace_from, replace_to)
    return out
