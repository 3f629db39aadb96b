"""Triton kernels of ``rejection_greedy_sample`` and ``rejection_random_sample``.

Both write whole output rows ``[max_spec_len + 1]``: the accepted drafts, then the token
emitted at the first rejection (or the bonus token when every draft was accepted), then
``-1`` padding; rows of requests the op does not own (``is_greedy``) are left untouched.
One program per request walks its row BLOCK_COLUMNS columns at a time, carrying the first
rejected position found so far: a column's value depends only on the drafts before it, so
each chunk is written as soon as it is decided.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .launch import direct_launch, next_power_of_2
from .ragged import draft_range

PLACEHOLDER_TOKEN_ID = tl.constexpr(-1)


def _block_columns(width: int) -> int:
    return max(16, min(next_power_of_2(width), 128))


def _is_greedy_arg(is_greedy: torch.Tensor | None, dummy: torch.Tensor) -> tuple[torch.Tensor, bool]:
    # bool tensors are read as uint8 (same bytes, no copy); None becomes a dummy pointer
    # that the kernel never reads, so the launch signature does not depend on it.
    if is_greedy is None:
        return dummy, False
    return is_greedy.view(torch.uint8), True


# Grid (batch,). Program b, if it owns request b (is_greedy[b] or no is_greedy), compares
# the request's drafts with the target argmax and writes its output row.
# Bytes moved per request: 8 (cu) + 1 (is_greedy) + 4|8 (bonus) + 4 * width (row written),
# plus 2 * (4|8) per draft read.
@direct_launch
@triton.jit(do_not_specialize=["num_tokens"])
def _rejection_greedy_sample_kernel(
    output_token_ids_ptr,  # [batch, width] int32, width = max_spec_len + 1
    cu_num_draft_tokens_ptr,  # [batch] int32
    draft_token_ids_ptr,  # [num_tokens] int32 | int64
    target_argmax_ptr,  # [num_tokens] int32 | int64
    bonus_token_ids_ptr,  # [batch] int32 | int64
    is_greedy_ptr,  # [batch] uint8 (read only when HAS_IS_GREEDY)
    num_tokens,
    width,
    HAS_IS_GREEDY: tl.constexpr,
    BLOCK_COLUMNS: tl.constexpr,
):
    b = tl.program_id(0)
    if HAS_IS_GREEDY:
        owned = tl.load(is_greedy_ptr + b) != 0
    else:
        owned = b >= 0
    start, count = draft_range(cu_num_draft_tokens_ptr, b, num_tokens, width - 1)
    bonus = tl.load(bonus_token_ids_ptr + b, mask=owned, other=0).to(tl.int32)
    row_ptr = output_token_ids_ptr + b.to(tl.int64) * width
    first_mismatch = count  # running min; == count while every draft so far matched
    col_start = 0
    while col_start < width:  # while, not range(): see ragged.py
        col = col_start + tl.arange(0, BLOCK_COLUMNS)
        is_draft = owned & (col < count)
        draft = tl.load(draft_token_ids_ptr + start + col, mask=is_draft, other=0).to(tl.int64)
        target = tl.load(target_argmax_ptr + start + col, mask=is_draft, other=0).to(tl.int64)
        mismatch_col = tl.where(is_draft & (draft != target), col.to(tl.int64), count)
        first_mismatch = tl.minimum(first_mismatch, tl.min(mismatch_col, axis=0))
        # Drafts up to and including the first mismatch emit the target's argmax; the
        # column after the last draft gets the bonus only if nothing mismatched.
        token = tl.where(
            (col < count) & (col <= first_mismatch),
            target.to(tl.int32),
            tl.where(col == first_mismatch, bonus, PLACEHOLDER_TOKEN_ID),
        )
        tl.store(row_ptr + col, token, mask=owned & (col < width))
        col_start += BLOCK_COLUMNS


def _rejection_greedy_sample(
    output_token_ids: torch.Tensor,  # [batch, max_spec_len + 1] int32, written in place
    cu_num_draft_tokens: torch.Tensor,  # [batch] int32
    draft_token_ids: torch.Tensor,  # [num_tokens] int32 | int64
    target_argmax: torch.Tensor,  # [num_tokens] int32 | int64
    bonus_token_ids: torch.Tensor,  # [batch] int32 | int64
    is_greedy: torch.Tensor | None,  # [batch] bool
) -> None:
    batch, width = output_token_ids.shape
    if batch == 0:
        return
    is_greedy_arg, has_is_greedy = _is_greedy_arg(is_greedy, cu_num_draft_tokens)
    _rejection_greedy_sample_kernel[(batch,)](
        output_token_ids,
        cu_num_draft_tokens,
        draft_token_ids,
        target_argmax,
        bonus_token_ids,
        is_greedy_arg,
        draft_token_ids.shape[0],
        width,
        HAS_IS_GREEDY=has_is_greedy,
        BLOCK_COLUMNS=_block_columns(width),
        num_warps=1,
    )


def rejection_greedy_sample(
    output_token_ids: torch.Tensor,
    cu_num_draft_tokens: torch.Tensor,
    draft_token_ids: torch.Tensor,
    target_argmax: torch.Tensor,
    bonus_token_ids: torch.Tensor,
    is_greedy: torch.Tensor | None = None,
) -> None:
    """Accept drafts while they equal the target's argmax; emit the argmax at the first
    mismatch, or the bonus token when every draft matched. Writes the rows of greedy
    requests (every row when ``is_greedy`` is None) in place.

    Shape:
        output_token_ids: [batch, max_spec_len + 1] int32, written in place
        cu_num_draft_tokens: [batch] int32
        draft_token_ids: [num_tokens] int32 | int64
        target_argmax: [num_tokens] int32 | int64
        bonus_token_ids: [batch] int32 | int64
        is_greedy: [batch] bool, or None
    """
    _rejection_greedy_sample(
        output_token_ids, cu_num_draft_tokens, draft_token_ids, target_argmax, bonus_token_ids, is_greedy
    )


# Grid (batch,). Program b, if it owns request b (not is_greedy[b], or no is_greedy),
# accepts draft x_i iff 0 <= x_i < vocab, q_i(x_i) > 0 and u_i * q_i(x_i) < p_i(x_i) in
# float32 (q = 1 without draft probs), and writes its output row.
# Bytes moved per request: 8 (cu) + 1 (is_greedy) + 4|8 (bonus) + 4 * width (row written),
# plus per draft: 4|8 (id) + 4 (uniform) + 4|8 (recovered) + 4 (p gathered) + 4 (q gathered).
@direct_launch
@triton.jit(do_not_specialize=["num_tokens"])
def _rejection_random_sample_kernel(
    output_token_ids_ptr,  # [batch, width] int32, width = max_spec_len + 1
    cu_num_draft_tokens_ptr,  # [batch] int32
    draft_token_ids_ptr,  # [num_tokens] int32 | int64
    draft_probs_ptr,  # [num_tokens, vocab] float32 (read only when HAS_DRAFT_PROBS)
    target_probs_ptr,  # [num_tokens, vocab] float32
    bonus_token_ids_ptr,  # [batch] int32 | int64
    recovered_token_ids_ptr,  # [num_tokens] int32 | int64
    uniform_probs_ptr,  # [num_tokens] float32
    is_greedy_ptr,  # [batch] uint8 (read only when HAS_IS_GREEDY)
    num_tokens,
    vocab,
    width,
    HAS_DRAFT_PROBS: tl.constexpr,
    HAS_IS_GREEDY: tl.constexpr,
    BLOCK_COLUMNS: tl.constexpr,
):
    b = tl.program_id(0)
    if HAS_IS_GREEDY:
        owned = tl.load(is_greedy_ptr + b) == 0
    else:
        owned = b >= 0
    start, count = draft_range(cu_num_draft_tokens_ptr, b, num_tokens, width - 1)
    bonus = tl.load(bonus_token_ids_ptr + b, mask=owned, other=0).to(tl.int32)
    row_ptr = output_token_ids_ptr + b.to(tl.int64) * width
    first_reject = count  # running min; == count while every draft so far was accepted
    col_start = 0
    while col_start < width:
        col = col_start + tl.arange(0, BLOCK_COLUMNS)
        is_draft = owned & (col < count)
        t = start + col  # int64 row of each draft
        draft = tl.load(draft_token_ids_ptr + t, mask=is_draft, other=0).to(tl.int64)
        in_vocab = is_draft & (draft >= 0) & (draft < vocab)  # an id outside is never read
        prob_offset = t * vocab + draft
        target_prob = tl.load(target_probs_ptr + prob_offset, mask=in_vocab, other=0.0)
        if HAS_DRAFT_PROBS:
            draft_prob = tl.load(draft_probs_ptr + prob_offset, mask=in_vocab, other=0.0)
        else:
            draft_prob = tl.where(in_vocab, 1.0, 0.0)
        uniform = tl.load(uniform_probs_ptr + t, mask=is_draft, other=0.0)
        # u * q < p with q > 0 (token_ids.h accepts()); a lone multiply, so no FMA forms.
        accepted = in_vocab & (draft_prob > 0.0) & (uniform * draft_prob < target_prob)
        reject_col = tl.where(is_draft & ~accepted, col.to(tl.int64), count)
        first_reject = tl.minimum(first_reject, tl.min(reject_col, axis=0))
        recovered = tl.load(recovered_token_ids_ptr + t, mask=is_draft, other=0).to(tl.int32)
        # Accepted drafts, then the recovered token at the first rejection, or the bonus
        # token right after the last draft when none was rejected.
        token = tl.where(
            col < first_reject,
            draft.to(tl.int32),
            tl.where(
                col == first_reject,
                tl.where(first_reject < count, recovered, bonus),
                PLACEHOLDER_TOKEN_ID,
            ),
        )
        tl.store(row_ptr + col, token, mask=owned & (col < width))
        col_start += BLOCK_COLUMNS


def _rejection_random_sample(
    output_token_ids: torch.Tensor,  # [batch, max_spec_len + 1] int32, written in place
    cu_num_draft_tokens: torch.Tensor,  # [batch] int32
    draft_token_ids: torch.Tensor,  # [num_tokens] int32 | int64
    draft_probs: torch.Tensor | None,  # [num_tokens, vocab] float32
    target_probs: torch.Tensor,  # [num_tokens, vocab] float32
    bonus_token_ids: torch.Tensor,  # [batch] int32 | int64
    recovered_token_ids: torch.Tensor,  # [num_tokens] int32 | int64
    uniform_probs: torch.Tensor,  # [num_tokens] float32
    is_greedy: torch.Tensor | None,  # [batch] bool
) -> None:
    batch, width = output_token_ids.shape
    if batch == 0:
        return
    num_tokens, vocab = target_probs.shape
    is_greedy_arg, has_is_greedy = _is_greedy_arg(is_greedy, cu_num_draft_tokens)
    has_draft_probs = draft_probs is not None
    _rejection_random_sample_kernel[(batch,)](
        output_token_ids,
        cu_num_draft_tokens,
        draft_token_ids,
        draft_probs if has_draft_probs else target_probs,
        target_probs,
        bonus_token_ids,
        recovered_token_ids,
        uniform_probs,
        is_greedy_arg,
        num_tokens,
        vocab,
        width,
        HAS_DRAFT_PROBS=has_draft_probs,
        HAS_IS_GREEDY=has_is_greedy,
        BLOCK_COLUMNS=_block_columns(width),
        num_warps=1,
    )


def rejection_random_sample(
    output_token_ids: torch.Tensor,
    cu_num_draft_tokens: torch.Tensor,
    draft_token_ids: torch.Tensor,
    draft_probs: torch.Tensor | None,
    target_probs: torch.Tensor,
    bonus_token_ids: torch.Tensor,
    recovered_token_ids: torch.Tensor,
    uniform_probs: torch.Tensor,
    is_greedy: torch.Tensor | None = None,
) -> None:
    """Accept draft ``x_i`` when ``u_i * q_i(x_i) < p_i(x_i)`` (``q_i > 0``); at the first
    rejection emit the recovered token of that position and stop; if every draft is
    accepted emit the bonus token. Writes the rows of non-greedy requests (every row when
    ``is_greedy`` is None) in place.

    Shape:
        output_token_ids: [batch, max_spec_len + 1] int32, written in place
        cu_num_draft_tokens: [batch] int32
        draft_token_ids: [num_tokens] int32 | int64
        draft_probs: [num_tokens, vocab] float32, or None for n-gram drafts (q one-hot)
        target_probs: [num_tokens, vocab] float32
        bonus_token_ids: [batch] int32 | int64
        recovered_token_ids: [num_tokens] int32 | int64
        uniform_probs: [num_tokens] float32, U[0, 1)
        is_greedy: [batch] bool, or None
    """
    _rejection_random_sample(
        output_token_ids,
        cu_num_draft_tokens,
        draft_token_ids,
        draft_probs,
        target_probs,
        bonus_token_ids,
        recovered_token_ids,
        uniform_probs,
        is_greedy,
    )
