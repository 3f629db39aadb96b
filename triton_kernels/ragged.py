"""Ragged-batch helpers shared by the Triton sampling kernels (device functions only).

The row range of a request is clamped exactly as ``draft_range()`` in csrc/token_ids.h
does, so that an inconsistent ``cu_num_draft_tokens`` (value checks turned off) can never
make a kernel read or write out of bounds, and every backend treats it the same way.

Loops bounded by a runtime value are ``while`` loops in these kernels, not ``range()``:
under the Triton interpreter a runtime scalar is a 1-element array, which numpy >= 2.4
refuses to turn into a range bound.
"""

import triton
import triton.language as tl


@triton.jit
def clamp_range(start, end, num_tokens):
    """Clamp a request's raw ``[start, end)`` into ``[0, num_tokens]`` with ``end >= start``
    (elementwise, so it serves scalars and vectors of requests alike)."""
    start = tl.minimum(tl.maximum(start, 0), num_tokens)
    end = tl.minimum(tl.maximum(end, start), num_tokens)
    return start, end


@triton.jit
def draft_range(
    cu_num_draft_tokens_ptr,  # [batch] int32, inclusive cumulative draft counts
    b,  # request index, 0 <= b < batch
    num_tokens,
    max_spec_len,
):
    """(start, count) of the rows request ``b`` owns, as int64 scalars: clamped into
    ``[0, num_tokens]`` and to at most ``max_spec_len`` drafts."""
    end = tl.load(cu_num_draft_tokens_ptr + b).to(tl.int64)
    start = tl.load(cu_num_draft_tokens_ptr + tl.maximum(b - 1, 0)).to(tl.int64)
    start = tl.where(b > 0, start, 0)
    start, end = clamp_range(start, end, num_tokens)
    return start, tl.minimum(end - start, max_spec_len)
