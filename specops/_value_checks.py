"""Value checks of the ops (ids inside the vocab, consistent ``cu_num_draft_tokens``,
``max_spec_len`` large enough, finite logits; block ids, ``seq_lens`` and
``cu_query_lens`` of paged attention). Their statistics come from one op a family
(torch.ops.specops.sampling_value_stats, paged_attention_value_stats: csrc/value_stats_*)
and are read in one device sync, so the public API runs them unless asked not to or while
capturing a graph or compiling. The kernels never read or write out of bounds when they are
skipped.
"""

from __future__ import annotations

import torch

from specops._checks import FLOAT_DTYPES, ID_DTYPES, _shape
from specops._native import has_cuda_kernels
from specops.reference import checks as reference_checks

# ---- the sampling ops ----


def _value_stats_problem(cu, token_ids, target_logits, bonus_logits, temperature, top_p):
    """Why torch.ops.specops.sampling_value_stats would refuse these tensors, as (error
    type, message), or None (mirror of csrc/value_stats_checks.cpp)."""
    if cu.dtype not in ID_DTYPES:
        return TypeError, f"cu_num_draft_tokens must be int32 or int64, got {cu.dtype}"
    if not cu.is_contiguous():
        return ValueError, "cu_num_draft_tokens must be contiguous"
    for name, t, dtypes, dtype_names in (
        ("token_ids", token_ids, ID_DTYPES, "int32 or int64"),
        ("target_logits", target_logits, FLOAT_DTYPES, "float32, bfloat16 or float16"),
        ("bonus_logits", bonus_logits, FLOAT_DTYPES, "float32, bfloat16 or float16"),
        ("temperature", temperature, (torch.float32,), "float32"),
        ("top_p", top_p, (torch.float32,), "float32"),
    ):
        if t is None:
            continue
        if t.device != cu.device:
            return ValueError, f"{name} must be on the same device as cu_num_draft_tokens ({cu.device}), got {t.device}"
        if t.dtype not in dtypes:
            return TypeError, f"{name} must be {dtype_names}, got {t.dtype}"
        if not t.is_contiguous():
            return ValueError, f"{name} must be contiguous"
    return None


def _raise(problem) -> None:
    if problem is not None:
        error, message = problem
        raise error(message)


def check_sampling_value_stats(cu, token_ids, target_logits, bonus_logits, temperature, top_p) -> None:
    _raise(_value_stats_problem(cu, token_ids, target_logits, bonus_logits, temperature, top_p))


def _native_value_stats(device: torch.device) -> bool:
    """Whether torch.ops.specops.sampling_value_stats has a kernel for ``device``."""
    return device.type == "cpu" or (device.type == "cuda" and has_cuda_kernels())


def validate_sampling_values(
    cu_num_draft_tokens: torch.Tensor,
    num_tokens: int,
    max_spec_len: int | None,
    draft_token_ids: torch.Tensor | None = None,
    vocab: int = 0,
    target_logits: torch.Tensor | None = None,
    bonus_logits: torch.Tensor | None = None,
    temperature: torch.Tensor | None = None,
    top_p: torch.Tensor | None = None,
) -> None:
    """The sampling ops' value checks, in this order (the first failure is named):
    cu_num_draft_tokens non-decreasing from >= 0 and ending at num_tokens, no request with
    more than max_spec_len drafts (None: no bound); every id of ``draft_token_ids`` inside
    [0, vocab); finite target and bonus logits; temperature >= 0; top_p > 0.
    Their statistics come from torch.ops.specops.sampling_value_stats (one CPU or CUDA
    op: two launches on a GPU) and are read in one device sync; arguments that op does not
    take (on different devices, an unexpected dtype: the calling op's own checks name them)
    go through reference/checks.py instead, one read each."""
    if cu_num_draft_tokens.numel() == 0 and num_tokens != 0:
        raise ValueError(f"cu_num_draft_tokens is empty but num_tokens = {num_tokens}")
    args = (cu_num_draft_tokens, draft_token_ids, target_logits, bonus_logits, temperature, top_p)
    if _native_value_stats(cu_num_draft_tokens.device) and _value_stats_problem(*args) is None:
        stats = torch.ops.specops.sampling_value_stats(*args)
    else:
        stats = reference_checks.sampling_value_stats(*args)
    (min_count, max_count, last_cu, min_id, max_id, target_bad, bonus_bad, bad_temperature,
     bad_top_p) = stats.tolist()
    if cu_num_draft_tokens.numel():
        if min_count < 0:
            raise ValueError(
                "cu_num_draft_tokens must be non-decreasing and start at >= 0 (a request has a negative draft count)"
            )
        if last_cu != num_tokens:
            raise ValueError(
                f"cu_num_draft_tokens is inconsistent with num_tokens: its last entry is {int(last_cu)}, "
                f"num_tokens is {num_tokens}"
            )
        if max_spec_len is not None and max_count > max_spec_len:
            raise ValueError(
                f"max_spec_len is too small: a request has {int(max_count)} drafts but output_token_ids has room "
                f"for max_spec_len = {max_spec_len}"
            )
    if draft_token_ids is not None and draft_token_ids.numel() and (min_id < 0 or max_id >= vocab):
        raise ValueError(
            f"draft_token_ids holds an id outside the vocab [0, {vocab}): min {int(min_id)}, max {int(max_id)}"
        )
    if target_bad:
        raise ValueError("target_logits holds NaN or inf")
    if bonus_bad:
        raise ValueError("bonus_logits holds NaN or inf")
    if bad_temperature:
        raise ValueError("temperature must be >= 0 (0 means greedy)")
    if bad_top_p:
        raise ValueError("top_p must be > 0")


# ---- paged attention ----


def _attention_value_stats_problem(block_table, seq_lens, cu_query_lens, block_size: int):
    """Why torch.ops.specops.paged_attention_value_stats would refuse these arguments, as
    (error type, message), or None (mirror of csrc/value_stats_checks.cpp)."""
    for name, t in (("block_table", block_table), ("seq_lens", seq_lens), ("cu_query_lens", cu_query_lens)):
        if t.device != block_table.device:
            return ValueError, (f"{name} must be on the same device as block_table ({block_table.device}), "
                                f"got {t.device}")
        if t.dtype != torch.int32:
            return TypeError, f"{name} must be int32, got {t.dtype}"
        if not t.is_contiguous():
            return ValueError, f"{name} must be contiguous"
    if block_table.dim() != 2:
        return ValueError, f"block_table must have shape [batch, max_blocks], got {_shape(block_table)}"
    batch = block_table.shape[0]
    if seq_lens.shape != (batch,):
        return ValueError, f"seq_lens must have shape [batch] = [{batch}], got {_shape(seq_lens)}"
    if cu_query_lens.shape != (batch + 1,):
        return ValueError, f"cu_query_lens must have shape [batch + 1] = [{batch + 1}], got {_shape(cu_query_lens)}"
    if block_size < 1:
        return ValueError, f"block_size must be >= 1, got {block_size}"
    return None


def check_paged_attention_value_stats(block_table, seq_lens, cu_query_lens, block_size: int) -> None:
    _raise(_attention_value_stats_problem(block_table, seq_lens, cu_query_lens, block_size))


def validate_paged_attention_values(
    block_table, seq_lens, cu_query_lens, num_query_tokens: int, block_size: int, num_blocks: int
) -> None:
    """cu_query_lens non-decreasing from 0 to num_query_tokens; every seq_len >= its
    query length and addressable by the block table; every block id a sequence uses (the
    first ceil(seq_len / block_size) of its row) inside [0, num_blocks). One op
    (torch.ops.specops.paged_attention_value_stats) and one device sync on a GPU; skipped
    for tensors that op does not take (a dtype, a shape), which paged_attention's own
    checks reject in every backend, the reference's included."""
    batch, max_blocks = block_table.shape if block_table.dim() == 2 else (None, None)
    if batch == 0:
        if cu_query_lens.tolist() != [0] or num_query_tokens != 0:
            raise ValueError(
                f"cu_query_lens is inconsistent with num_query_tokens: batch is empty but query has "
                f"{num_query_tokens} rows"
            )
        return
    if _attention_value_stats_problem(block_table, seq_lens, cu_query_lens, block_size) is not None:
        return  # paged_attention's own checks name the argument (every backend runs them)
    args = (block_table, seq_lens, cu_query_lens, block_size, num_blocks)
    stats_of = (torch.ops.specops.paged_attention_value_stats if _native_value_stats(block_table.device)
                else reference_checks.paged_attention_value_stats)
    first, last, min_q_len, min_slack, most_blocks, any_bad = stats_of(*args).tolist()
    if first != 0 or min_q_len < 0:
        raise ValueError("cu_query_lens must start at 0 and be non-decreasing")
    if last != num_query_tokens:
        raise ValueError(
            f"cu_query_lens is inconsistent with num_query_tokens: its last entry is {int(last)}, "
            f"query has {num_query_tokens} rows"
        )
    if min_slack < 0:
        raise ValueError(
            "seq_lens must be >= each sequence's query length (cu_query_lens[b + 1] - cu_query_lens[b]): "
            f"a sequence has {int(-min_slack)} fewer keys than queries"
        )
    if most_blocks > max_blocks:
        raise ValueError(
            f"seq_lens is too long for block_table: a sequence needs {int(most_blocks)} blocks of {block_size} "
            f"tokens but block_table has {max_blocks} columns"
        )
    if any_bad:
        raise ValueError(f"block_table holds a block id outside [0, num_blocks) = [0, {num_blocks})")


def validate_slot_mapping(slot_mapping, num_slots: int) -> None:
    """Every slot is -1 (padding) or inside [0, num_blocks * block_size)."""
    if slot_mapping.numel() == 0:
        return
    bad = ((slot_mapping < -1) | (slot_mapping >= num_slots)).any().item()
    if bad:
        raise ValueError(f"slot_mapping holds a slot outside [0, num_blocks * block_size) = [0, {num_slots}) and not -1")
