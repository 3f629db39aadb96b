"""Triton kernels of ``sample_recovered_tokens``: the exponential race
``argmax_v r_v / E_v`` over the residual ``r = max(p - q, 0)`` of every draft position.

Bandwidth-bound: every token reads its target row, its draft row and its request's row of
exponentials once. To keep the GPU busy at small batch, each row's vocab is split across
``num_splits`` programs (about PROGRAMS_PER_SM programs per SM in all); each writes its
partial (best score, lowest index) to a small workspace and a second kernel combines the
partials per token. Argmax with ties to the lowest index is associative, so the split
result is exactly the sequential one.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .launch import cdiv, direct_launch, multiprocessor_count, next_power_of_2
from .ragged import clamp_range

BLOCK_VOCAB = 2048  # vocab entries one program handles per loop iteration
MIN_SPLIT_LEN = 4096  # fewest vocab entries worth a program of their own
PROGRAMS_PER_SM = 4
CPU_NUM_SMS = 4  # the interpreter has no SMs; a small fixed count keeps splits rare
INDEX_MAX = tl.constexpr(2**31 - 1)


@triton.jit
def _owning_request(
    cu_num_draft_tokens_ptr,  # [batch] int32
    t,  # token row
    batch,
    num_tokens,
    BLOCK_BATCH: tl.constexpr,
):
    """The last request whose clamped range holds row t (the C++ kernels' order: later
    requests overwrite earlier ones), or -1 when none does."""
    owner = t * 0 - 1
    b_start = 0
    while b_start < batch:  # while, not range(): see ragged.py
        b = b_start + tl.arange(0, BLOCK_BATCH)
        valid = b < batch
        end = tl.load(cu_num_draft_tokens_ptr + b, mask=valid, other=0)
        start = tl.load(cu_num_draft_tokens_ptr + b - 1, mask=valid & (b > 0), other=0)
        start, end = clamp_range(start, end, num_tokens)
        holds = valid & (start <= t) & (t < end)
        owner = tl.maximum(owner, tl.max(tl.where(holds, b, -1), axis=0))
        b_start += BLOCK_BATCH
    return owner


# Grid (num_tokens, num_splits). Program (t, s) runs the race over vocab entries
# [s * split_len, (s + 1) * split_len) of row t against row b of the exponentials (b the
# request owning t) and writes its best score and the lowest index reaching it. Rows no
# request owns race over nothing: score -inf, index 0.
# Bytes moved per program: 4 * split_len from each of target_probs, draft_probs (when
# given) and exponentials, 8 * batch from cu_num_draft_tokens (cached), 8 written.
@direct_launch
@triton.jit(do_not_specialize=["batch", "num_tokens"])
def _recovered_partial_kernel(
    partial_scores_ptr,  # [num_tokens, num_splits] float32
    partial_index_ptr,  # [num_tokens, num_splits] int32
    cu_num_draft_tokens_ptr,  # [batch] int32
    draft_token_ids_ptr,  # [num_tokens] int32 | int64
    draft_probs_ptr,  # [num_tokens, vocab] float32 (read only when HAS_DRAFT_PROBS)
    target_probs_ptr,  # [num_tokens, vocab] float32
    exponentials_ptr,  # [batch, vocab] float32
    batch,
    num_tokens,
    vocab,
    split_len,  # vocab entries per program, a multiple of BLOCK_V
    HAS_DRAFT_PROBS: tl.constexpr,
    BLOCK_V: tl.constexpr,
    BLOCK_BATCH: tl.constexpr,
):
    t = tl.program_id(0)
    split = tl.program_id(1)
    num_splits = tl.num_programs(1)
    b = _owning_request(cu_num_draft_tokens_ptr, t, batch, num_tokens, BLOCK_BATCH)
    owned = b >= 0  # rows no request owns race over nothing: score -inf, index 0
    row = t.to(tl.int64) * vocab
    target_row_ptr = target_probs_ptr + row
    draft_row_ptr = draft_probs_ptr + row
    exponentials_row_ptr = exponentials_ptr + tl.maximum(b, 0).to(tl.int64) * vocab
    draft = tl.load(draft_token_ids_ptr + t).to(tl.int64)
    draft = tl.where((draft >= 0) & (draft < vocab), draft, -1).to(tl.int32)  # -1: no entry

    # Per-lane running best: each lane sees increasing indices and keeps its first best
    # (strict >), so one reduction at the end gives the lowest index of the maximum.
    # NaN scores never compare greater, -inf never beats the initial -inf (index 0).
    best_score = tl.full([BLOCK_V], float("-inf"), tl.float32)
    best_index = tl.zeros([BLOCK_V], tl.int32)
    v_begin = split * split_len
    v_offset = 0
    while v_offset < split_len:
        v = v_begin + v_offset + tl.arange(0, BLOCK_V)
        mask = owned & (v < vocab)
        target_prob = tl.load(target_row_ptr + v, mask=mask, other=0.0)
        if HAS_DRAFT_PROBS:
            residual = target_prob - tl.load(draft_row_ptr + v, mask=mask, other=0.0)
        else:
            residual = tl.where(v == draft, 0.0, target_prob)
        exponential = tl.load(exponentials_row_ptr + v, mask=mask, other=1.0)
        # race_score(): IEEE division (plain / is approximate on GPU); r <= 0 or NaN -> -1.
        score = tl.where(residual > 0.0, tl.math.div_rn(residual, exponential), -1.0)
        better = mask & (score > best_score)
        best_score = tl.where(better, score, best_score)
        best_index = tl.where(better, v, best_index)
        v_offset += BLOCK_V

    split_best = tl.max(best_score, axis=0)
    split_index = tl.min(tl.where(best_score == split_best, best_index, INDEX_MAX), axis=0)
    out = t.to(tl.int64) * num_splits + split
    tl.store(partial_scores_ptr + out, split_best)
    tl.store(partial_index_ptr + out, split_index)


# Grid (cdiv(num_tokens, BLOCK_TOKENS),). Program i reduces the num_splits partials of
# BLOCK_TOKENS tokens: the highest score, ties (and all -inf) to the lowest index.
# Bytes moved per token: 8 * num_splits read, 4 written.
@direct_launch
@triton.jit(do_not_specialize=["num_tokens"])
def _recovered_combine_kernel(
    recovered_token_ids_ptr,  # [num_tokens] int32
    partial_scores_ptr,  # [num_tokens, num_splits] float32
    partial_index_ptr,  # [num_tokens, num_splits] int32
    num_tokens,
    num_splits,
    BLOCK_TOKENS: tl.constexpr,
    BLOCK_SPLITS: tl.constexpr,
):
    t = tl.program_id(0) * BLOCK_TOKENS + tl.arange(0, BLOCK_TOKENS)
    s = tl.arange(0, BLOCK_SPLITS)
    mask = (t < num_tokens)[:, None] & (s < num_splits)[None, :]
    offset = t.to(tl.int64)[:, None] * num_splits + s[None, :]
    score = tl.load(partial_scores_ptr + offset, mask=mask, other=float("-inf"))
    index = tl.load(partial_index_ptr + offset, mask=mask, other=0)
    best = tl.max(score, axis=1)
    best_index = tl.min(tl.where(score == best[:, None], index, INDEX_MAX), axis=1)
    tl.store(recovered_token_ids_ptr + t, best_index, mask=t < num_tokens)


def _split_config(num_tokens: int, vocab: int, device: torch.device) -> tuple[int, int]:
    """(block_v, split_len): about PROGRAMS_PER_SM programs per SM in all, each split at
    least MIN_SPLIT_LEN entries (one split when the vocab is smaller) and a multiple of
    block_v."""
    block_v = min(BLOCK_VOCAB, max(16, next_power_of_2(vocab)))
    wanted = cdiv(PROGRAMS_PER_SM * multiprocessor_count(device, CPU_NUM_SMS), max(num_tokens, 1))
    num_splits = max(1, min(wanted, vocab // MIN_SPLIT_LEN))
    split_len = cdiv(cdiv(vocab, num_splits), block_v) * block_v
    return block_v, split_len


def _sample_recovered_tokens(
    cu_num_draft_tokens: torch.Tensor,  # [batch] int32
    draft_token_ids: torch.Tensor,  # [num_tokens] int32 | int64
    draft_probs: torch.Tensor | None,  # [num_tokens, vocab] float32
    target_probs: torch.Tensor,  # [num_tokens, vocab] float32
    exponentials: torch.Tensor,  # [batch, vocab] float32
    block_v: int,
    split_len: int,
    num_warps: int = 8,
) -> torch.Tensor:  # [num_tokens] int32
    num_tokens, vocab = target_probs.shape
    batch = cu_num_draft_tokens.shape[0]
    assert split_len % block_v == 0, "split_len must be a multiple of block_v"
    device = target_probs.device
    if num_tokens == 0:
        return torch.zeros(0, dtype=torch.int32, device=device)
    num_splits = cdiv(vocab, split_len)
    partial_scores = torch.empty(num_tokens, num_splits, dtype=torch.float32, device=device)
    # With one split the partial indices are the answer: no combine launch.
    partial_index = torch.empty(num_tokens, num_splits, dtype=torch.int32, device=device)
    _recovered_partial_kernel[(num_tokens, num_splits)](
        partial_scores,
        partial_index,
        cu_num_draft_tokens,
        draft_token_ids,
        draft_probs if draft_probs is not None else target_probs,
        target_probs,
        exponentials,
        batch,
        num_tokens,
        vocab,
        split_len,
        HAS_DRAFT_PROBS=draft_probs is not None,
        BLOCK_V=block_v,
        BLOCK_BATCH=256,
        num_warps=num_warps,
    )
    if num_splits == 1:
        return partial_index.view(num_tokens)
    recovered_token_ids = torch.empty(num_tokens, dtype=torch.int32, device=device)
    block_tokens = 64
    _recovered_combine_kernel[(cdiv(num_tokens, block_tokens),)](
        recovered_token_ids,
        partial_scores,
        partial_index,
        num_tokens,
        num_splits,
        BLOCK_TOKENS=block_tokens,
        BLOCK_SPLITS=next_power_of_2(num_splits),
        num_warps=4,
    )
    return recovered_token_ids


def sample_recovered_tokens(
    cu_num_draft_tokens: torch.Tensor,
    draft_token_ids: torch.Tensor,
    draft_probs: torch.Tensor | None,
    target_probs: torch.Tensor,
    exponentials: torch.Tensor,
) -> torch.Tensor:
    """For every draft position, sample from ``norm(max(p - q, 0))`` by the exponential
    race ``argmax_v r_v / E_v`` (ties to the lowest index); a request's positions share its
    row of exponentials. Rows no request covers get 0.

    Shape:
        cu_num_draft_tokens: [batch] int32
        draft_token_ids: [num_tokens] int32 | int64
        draft_probs: [num_tokens, vocab] float32, or None for n-gram drafts
        target_probs: [num_tokens, vocab] float32
        exponentials: [batch, vocab] float32, Exp(1) draws
        returns: [num_tokens] int32
    """
    num_tokens, vocab = target_probs.shape
    block_v, split_len = _split_config(num_tokens, vocab, target_probs.device)
    return _sample_recovered_tokens(
        cu_num_draft_tokens, draft_token_ids, draft_probs, target_probs, exponentials, block_v, split_len
    )
