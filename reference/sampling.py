"""Pure-PyTorch reference of the verification-sampling ops.

Written to be read: one request at a time, the way the papers state the algorithm
(Leviathan et al. 2023, Chen et al. 2023). Every backend must return exactly what these
functions return when given the same random draws. Float64 inputs are accepted here so
the distribution tests can compute exact laws; the kernels take float32.

Ragged layout: the drafts of all ``B`` requests are flattened to ``num_tokens`` rows;
request ``b`` owns rows ``[cu_num_draft_tokens[b-1], cu_num_draft_tokens[b])`` (with
``cu_num_draft_tokens[-1] = 0``), so a request may have zero drafts.

Output rows are ``[max_spec_len + 1]`` int32: the accepted drafts, then either the token
recovered at the first rejection or the bonus token, then ``-1`` padding. An op writes
every column of each row it processes and leaves the other rows untouched, so a greedy
and a random op can fill one output between them (``is_greedy`` says who owns a row).
"""

from __future__ import annotations

import torch

PLACEHOLDER_TOKEN_ID = -1


def _request_range(cu_num_draft_tokens: torch.Tensor, b: int) -> tuple[int, int]:
    start = 0 if b == 0 else int(cu_num_draft_tokens[b - 1])
    return start, int(cu_num_draft_tokens[b])


def _owns_row(is_greedy: torch.Tensor | None, b: int, greedy_op: bool) -> bool:
    if is_greedy is None:
        return True
    return bool(is_greedy[b]) == greedy_op


def expand_to_tokens(
    values: torch.Tensor,  # [B] float32 | int32 | int64
    cu_num_draft_tokens: torch.Tensor,  # [B] int32, inclusive cumulative draft counts
    num_tokens: int,
    replace_from: float | None = None,
    replace_to: float = 0.0,
) -> torch.Tensor:  # [num_tokens], dtype of values
    """Repeat each request's value once per draft token of that request.

    With ``replace_from`` set (floating values only), values equal to it become
    ``replace_to``: e.g. a greedy request's temperature 0 becomes 1 so a later division
    by the temperature stays finite.
    """
    counts = torch.diff(cu_num_draft_tokens.long(), prepend=cu_num_draft_tokens.new_zeros(1).long())
    out = torch.repeat_interleave(values, counts.cpu(), output_size=num_tokens)
    if replace_from is not None:
        out = torch.where(out == replace_from, torch.full_like(out, replace_to), out)
    return out


def rejection_greedy_sample(
    output_token_ids: torch.Tensor,  # [B, max_spec_len + 1] int32, written in place
    cu_num_draft_tokens: torch.Tensor,  # [B] int32
    draft_token_ids: torch.Tensor,  # [num_tokens] int32 | int64
    target_argmax: torch.Tensor,  # [num_tokens] int32 | int64
    bonus_token_ids: torch.Tensor,  # [B] int32 | int64
    is_greedy: torch.Tensor | None = None,  # [B] bool; None: every request is greedy
) -> None:
    """Accept drafts while they equal the target's argmax; emit the argmax at the first
    mismatch, or the bonus token when every draft matched."""
    batch, width = output_token_ids.shape
    for b in range(batch):
        if not _owns_row(is_greedy, b, greedy_op=True):
            continue
        start, end = _request_range(cu_num_draft_tokens, b)
        row = [PLACEHOLDER_TOKEN_ID] * width
        for i in range(end - start):
            target = int(target_argmax[start + i])
            row[i] = target
            if int(draft_token_ids[start + i]) != target:
                break
        else:
            row[end - start] = int(bonus_token_ids[b])
        output_token_ids[b] = torch.tensor(row, dtype=output_token_ids.dtype)


def accepts(uniform: torch.Tensor, draft_prob: torch.Tensor, target_prob: torch.Tensor) -> bool:
    """The acceptance test ``u * q < p`` with ``q > 0``, in the inputs' precision.

    Strict ``<`` with ``u`` in [0, 1) accepts with probability exactly ``min(1, p / q)``
    and never accepts a token the target gives probability 0 (even when ``u`` is 0).
    A draft probability of 0 rejects: a proposer cannot have sampled that token.
    """
    return bool(draft_prob > 0) and bool(uniform * draft_prob < target_prob)


def rejection_random_sample(
    output_token_ids: torch.Tensor,  # [B, max_spec_len + 1] int32, written in place
    cu_num_draft_tokens: torch.Tensor,  # [B] int32
    draft_token_ids: torch.Tensor,  # [num_tokens] int32 | int64
    draft_probs: torch.Tensor | None,  # [num_tokens, V] float; None: n-gram drafts (q one-hot)
    target_probs: torch.Tensor,  # [num_tokens, V] float
    bonus_token_ids: torch.Tensor,  # [B] int32 | int64
    recovered_token_ids: torch.Tensor,  # [num_tokens] int32 | int64
    uniform_probs: torch.Tensor,  # [num_tokens] float, U[0, 1)
    is_greedy: torch.Tensor | None = None,  # [B] bool; None: no request is greedy
) -> None:
    """Accept draft ``x_i`` when ``u_i * q_i(x_i) < p_i(x_i)``; at the first rejection
    emit the recovered token of that position and stop; if every draft is accepted emit
    the bonus token."""
    batch, width = output_token_ids.shape
    for b in range(batch):
        if not _owns_row(is_greedy, b, greedy_op=False):
            continue
        start, end = _request_range(cu_num_draft_tokens, b)
        row = [PLACEHOLDER_TOKEN_ID] * width
        for i in range(end - start):
            t = start + i
            token = int(draft_token_ids[t])
            q = draft_probs[t, token] if draft_probs is not None else target_probs.new_ones(())
            if accepts(uniform_probs[t], q, target_probs[t, token]):
                row[i] = token
            else:
                row[i] = int(recovered_token_ids[t])
                break
        else:
            row[end - start] = int(bonus_token_ids[b])
        output_token_ids[b] = torch.tensor(row, dtype=output_token_ids.dtype)


def residual(
    target_probs_row: torch.Tensor,  # [V]
    draft_probs_row: torch.Tensor | None,  # [V]; None: q is one-hot on draft_token_id
    draft_token_id: int,
) -> torch.Tensor:  # [V], unnormalised max(p - q, 0)
    if draft_probs_row is None:
        out = target_probs_row.clone()
        out[draft_token_id] = 0
        return out
    return torch.clamp(target_probs_row - draft_probs_row, min=0)


def race_scores(residual_row: torch.Tensor, exponentials_row: torch.Tensor) -> torch.Tensor:
    """Exponential-race scores ``r_v / E_v``; entries with ``r_v <= 0`` (or NaN) score -1
    so they can never beat a positive residual, even one whose score underflows to 0."""
    positive = residual_row > 0
    return torch.where(positive, residual_row / exponentials_row, torch.full_like(residual_row, -1))


def sample_recovered_tokens(
    cu_num_draft_tokens: torch.Tensor,  # [B] int32
    draft_token_ids: torch.Tensor,  # [num_tokens] int32 | int64
    draft_probs: torch.Tensor | None,  # [num_tokens, V] float; None: n-gram drafts
    target_probs: torch.Tensor,  # [num_tokens, V] float
    exponentials: torch.Tensor,  # [B, V] float, Exp(1) draws, one row per request
) -> torch.Tensor:  # [num_tokens] int32
    """For every draft position, sample from ``norm(max(p - q, 0))`` by the exponential
    race ``argmax_v r_v / E_v`` (ties go to the lowest index).

    A request's positions share its row of exponentials: only the token recovered at
    its first rejection is ever emitted, so the shared draws never meet in one output.
    """
    num_tokens = draft_token_ids.shape[0]
    out = torch.empty(num_tokens, dtype=torch.int32, device=target_probs.device)
    for b in range(cu_num_draft_tokens.shape[0]):
        start, end = _request_range(cu_num_draft_tokens, b)
        for t in range(start, end):
            q = draft_probs[t] if draft_probs is not None else None
            r = residual(target_probs[t], q, int(draft_token_ids[t]))
            out[t] = int(torch.argmax(race_scores(r, exponentials[b])))
    return out
