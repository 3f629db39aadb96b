"""Argument checks of the ops on the Python side.

``check_*`` mirror csrc/*_checks.cpp (shapes, dtypes, devices; no device sync): the
Triton launchers and the fake kernels run them, so every backend rejects the same calls
with the same messages. The checks of values live in specops/_value_checks.py.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

ID_DTYPES = (torch.int32, torch.int64)


@dataclass(frozen=True)
class RaggedSizes:
    batch: int  # B
    num_tokens: int  # T
    vocab: int = 0  # V
    width: int = 0  # max_spec_len + 1


def _shape(t: torch.Tensor) -> str:
    return str(list(t.shape))


def _device(t: torch.Tensor, name: str, ref: torch.Tensor, ref_name: str) -> None:
    if t.device != ref.device:
        raise ValueError(f"{name} must be on the same device as {ref_name} ({ref.device}), got {t.device}")


def _dtype(t: torch.Tensor, name: str, dtype: torch.dtype) -> None:
    if t.dtype != dtype:
        raise TypeError(f"{name} must be {dtype}, got {t.dtype}")


def _ids(t: torch.Tensor, name: str) -> None:
    if t.dtype not in ID_DTYPES:
        raise TypeError(f"{name} must be int32 or int64, got {t.dtype}")


def _one_d(t: torch.Tensor, name: str, size: int, size_name: str) -> None:
    if t.dim() != 1 or t.shape[0] != size:
        raise ValueError(f"{name} must have shape [{size_name}] = [{size}], got {_shape(t)}")
    if not t.is_contiguous():
        raise ValueError(f"{name} must be contiguous")


def _rows(t: torch.Tensor, name: str, rows: int, rows_name: str, vocab: int) -> None:
    if t.dim() != 2 or t.shape[0] != rows or t.shape[1] != vocab:
        raise ValueError(f"{name} must have shape [{rows_name}, vocab] = [{rows}, {vocab}], got {_shape(t)}")
    if not t.is_contiguous():
        raise ValueError(f"{name} must be contiguous")


def _cu(cu: torch.Tensor) -> int:
    if cu.dim() != 1:
        raise ValueError(f"cu_num_draft_tokens must have shape [batch], got {_shape(cu)}")
    _dtype(cu, "cu_num_draft_tokens", torch.int32)
    if not cu.is_contiguous():
        raise ValueError("cu_num_draft_tokens must be contiguous")
    return cu.shape[0]


def _ids_1d(t: torch.Tensor, name: str, cu: torch.Tensor, size: int, size_name: str) -> None:
    _device(t, name, cu, "cu_num_draft_tokens")
    _ids(t, name)
    _one_d(t, name, size, size_name)


def _num_tokens(draft_token_ids: torch.Tensor) -> int:
    if draft_token_ids.dim() != 1:
        raise ValueError(f"draft_token_ids must have shape [num_tokens], got {_shape(draft_token_ids)}")
    return draft_token_ids.shape[0]


def _output(out: torch.Tensor, cu: torch.Tensor, batch: int) -> None:
    _device(out, "output_token_ids", cu, "cu_num_draft_tokens")
    _dtype(out, "output_token_ids", torch.int32)
    if out.dim() != 2 or out.shape[0] != batch or out.shape[1] < 1:
        raise ValueError(
            f"output_token_ids must have shape [batch, max_spec_len + 1] with batch = {batch}, got {_shape(out)}"
        )
    if not out.is_contiguous():
        raise ValueError("output_token_ids must be contiguous")


def _is_greedy(is_greedy: torch.Tensor | None, cu: torch.Tensor, batch: int) -> None:
    if is_greedy is None:
        return
    _device(is_greedy, "is_greedy", cu, "cu_num_draft_tokens")
    _dtype(is_greedy, "is_greedy", torch.bool)
    _one_d(is_greedy, "is_greedy", batch, "batch")


def _probs(target_probs, draft_probs, cu, num_tokens) -> int:
    _device(target_probs, "target_probs", cu, "cu_num_draft_tokens")
    _dtype(target_probs, "target_probs", torch.float32)
    if target_probs.dim() != 2:
        raise ValueError(f"target_probs must have shape [num_tokens, vocab], got {_shape(target_probs)}")
    vocab = target_probs.shape[1]
    if vocab < 1:
        raise ValueError(f"target_probs must have a vocab of at least 1, got {_shape(target_probs)}")
    if vocab > 1 << 30:
        raise ValueError(f"target_probs vocab must be at most 2^30, got {vocab}")
    _rows(target_probs, "target_probs", num_tokens, "num_tokens", vocab)
    if draft_probs is not None:
        _device(draft_probs, "draft_probs", cu, "cu_num_draft_tokens")
        _dtype(draft_probs, "draft_probs", torch.float32)
        _rows(draft_probs, "draft_probs", num_tokens, "num_tokens", vocab)
    return vocab


def check_expand_to_tokens(values, cu_num_draft_tokens, num_tokens, replace_from) -> RaggedSizes:
    batch = _cu(cu_num_draft_tokens)
    _device(values, "values", cu_num_draft_tokens, "cu_num_draft_tokens")
    if values.dtype not in (torch.float32, torch.int32, torch.int64):
        raise TypeError(f"values must be float32, int32 or int64, got {values.dtype}")
    _one_d(values, "values", batch, "batch")
    if num_tokens < 0:
        raise ValueError(f"num_tokens must be >= 0, got {num_tokens}")
    if replace_from is not None and values.dtype != torch.float32:
        raise TypeError(f"replace_from is only supported for float32 values, got {values.dtype}")
    return RaggedSizes(batch, num_tokens)


def check_rejection_greedy_sample(
    output_token_ids, cu_num_draft_tokens, draft_token_ids, target_argmax, bonus_token_ids, is_greedy
) -> RaggedSizes:
    cu = cu_num_draft_tokens
    batch = _cu(cu)
    _output(output_token_ids, cu, batch)
    num_tokens = _num_tokens(draft_token_ids)
    _ids_1d(draft_token_ids, "draft_token_ids", cu, num_tokens, "num_tokens")
    _ids_1d(target_argmax, "target_argmax", cu, num_tokens, "num_tokens")
    _ids_1d(bonus_token_ids, "bonus_token_ids", cu, batch, "batch")
    _is_greedy(is_greedy, cu, batch)
    return RaggedSizes(batch, num_tokens, 0, output_token_ids.shape[1])


def check_rejection_random_sample(
    output_token_ids,
    cu_num_draft_tokens,
    draft_token_ids,
    draft_probs,
    target_probs,
    bonus_token_ids,
    recovered_token_ids,
    uniform_probs,
    is_greedy,
) -> RaggedSizes:
    cu = cu_num_draft_tokens
    batch = _cu(cu)
    _output(output_token_ids, cu, batch)
    num_tokens = _num_tokens(draft_token_ids)
    _ids_1d(draft_token_ids, "draft_token_ids", cu, num_tokens, "num_tokens")
    vocab = _probs(target_probs, draft_probs, cu, num_tokens)
    _ids_1d(bonus_token_ids, "bonus_token_ids", cu, batch, "batch")
    _ids_1d(recovered_token_ids, "recovered_token_ids", cu, num_tokens, "num_tokens")
    _device(uniform_probs, "uniform_probs", cu, "cu_num_draft_tokens")
    _dtype(uniform_probs, "uniform_probs", torch.float32)
    _one_d(uniform_probs, "uniform_probs", num_tokens, "num_tokens")
    _is_greedy(is_greedy, cu, batch)
    return RaggedSizes(batch, num_tokens, vocab, output_token_ids.shape[1])


def check_sample_recovered_tokens(
    cu_num_draft_tokens, draft_token_ids, draft_probs, target_probs, exponentials
) -> RaggedSizes:
    cu = cu_num_draft_tokens
    batch = _cu(cu)
    num_tokens = _num_tokens(draft_token_ids)
    _ids_1d(draft_token_ids, "draft_token_ids", cu, num_tokens, "num_tokens")
    vocab = _probs(target_probs, draft_probs, cu, num_tokens)
    _device(exponentials, "exponentials", cu, "cu_num_draft_tokens")
    _dtype(exponentials, "exponentials", torch.float32)
    _rows(exponentials, "exponentials", batch, "batch", vocab)
    return RaggedSizes(batch, num_tokens, vocab)


def check_verify(
    target_logits, bonus_logits, draft_token_ids, draft_probs, cu_num_draft_tokens, temperature, top_k, top_p,
    seeds, positions, max_spec_len,
) -> RaggedSizes:
    """Mirror of csrc/verify_checks.cpp."""
    if target_logits.dtype not in (torch.float32, torch.bfloat16, torch.float16):
        raise TypeError(f"target_logits must be float32, bfloat16 or float16, got {target_logits.dtype}")
    if target_logits.dim() != 2 or target_logits.shape[1] < 1:
        raise ValueError(f"target_logits must have shape [num_tokens, vocab], got {_shape(target_logits)}")
    if not target_logits.is_contiguous():
        raise ValueError("target_logits must be contiguous")
    num_tokens, vocab = target_logits.shape
    ref = target_logits
    batch = _cu(cu_num_draft_tokens)
    _device(cu_num_draft_tokens, "cu_num_draft_tokens", ref, "target_logits")
    if bonus_logits.dtype != target_logits.dtype:
        raise TypeError(f"bonus_logits must be {target_logits.dtype} like target_logits, got {bonus_logits.dtype}")
    _device(bonus_logits, "bonus_logits", ref, "target_logits")
    _rows(bonus_logits, "bonus_logits", batch, "batch", vocab)
    _device(draft_token_ids, "draft_token_ids", ref, "target_logits")
    _ids(draft_token_ids, "draft_token_ids")
    _one_d(draft_token_ids, "draft_token_ids", num_tokens, "num_tokens")
    if draft_probs is not None:
        _device(draft_probs, "draft_probs", ref, "target_logits")
        _dtype(draft_probs, "draft_probs", torch.float32)
        _rows(draft_probs, "draft_probs", num_tokens, "num_tokens", vocab)
    for name, t, dtype in (
        ("temperature", temperature, torch.float32),
        ("top_k", top_k, torch.int32),
        ("top_p", top_p, torch.float32),
        ("seeds", seeds, torch.int64),
        ("positions", positions, torch.int64),
    ):
        if t is None:
            continue
        _device(t, name, ref, "target_logits")
        _dtype(t, name, dtype)
        _one_d(t, name, batch, "batch")
    if max_spec_len < 0:
        raise ValueError(f"max_spec_len must be >= 0, got {max_spec_len}")
    return RaggedSizes(batch, num_tokens, vocab, max_spec_len + 1)


# ---- paged attention (mirror of csrc/attention_checks.cpp) ----

FLOAT_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


@dataclass(frozen=True)
class CacheSizes:
    num_tokens: int  # N
    num_blocks: int
    block_size: int
    num_kv_heads: int  # Hkv
    head_dim: int  # D


@dataclass(frozen=True)
class AttentionSizes:
    num_query_tokens: int  # Q
    num_heads: int  # Hq
    num_kv_heads: int  # Hkv
    head_dim: int  # D
    num_blocks: int
    block_size: int
    batch: int  # B
    max_blocks: int


def _floating(t: torch.Tensor, name: str) -> None:
    if t.dtype not in FLOAT_DTYPES:
        raise TypeError(f"{name} must be float32, bfloat16 or float16, got {t.dtype}")


def _contiguous(t: torch.Tensor, name: str) -> None:
    if not t.is_contiguous():
        raise ValueError(f"{name} must be contiguous")


def _caches(key_cache: torch.Tensor, value_cache: torch.Tensor) -> None:
    _floating(key_cache, "key_cache")
    if key_cache.dim() != 4 or key_cache.shape[1] < 1 or key_cache.shape[2] < 1:
        raise ValueError(
            f"key_cache must have shape [num_blocks, block_size, num_kv_heads, head_dim], got {_shape(key_cache)}"
        )
    _contiguous(key_cache, "key_cache")
    _device(value_cache, "value_cache", key_cache, "key_cache")
    if value_cache.dtype != key_cache.dtype:
        raise TypeError(f"value_cache must be {key_cache.dtype} like key_cache, got {value_cache.dtype}")
    if value_cache.shape != key_cache.shape:
        raise ValueError(f"value_cache must have the shape of key_cache {_shape(key_cache)}, got {_shape(value_cache)}")
    _contiguous(value_cache, "value_cache")


def _new_rows(t: torch.Tensor, name: str, key_cache: torch.Tensor) -> None:
    _device(t, name, key_cache, "key_cache")
    if t.dtype != key_cache.dtype:
        raise TypeError(f"{name} must be {key_cache.dtype} like key_cache, got {t.dtype}")
    num_kv_heads, head_dim = key_cache.shape[2], key_cache.shape[3]
    if t.dim() != 3 or t.shape[1] != num_kv_heads or t.shape[2] != head_dim:
        raise ValueError(
            f"{name} must have shape [num_tokens, num_kv_heads, head_dim] with num_kv_heads = {num_kv_heads} "
            f"and head_dim = {head_dim} as in key_cache, got {_shape(t)}"
        )
    _contiguous(t, name)


def _int32_vector(t: torch.Tensor, name: str, size: int, size_name: str, ref: torch.Tensor) -> None:
    _device(t, name, ref, "query")
    if t.dtype != torch.int32:
        raise TypeError(f"{name} must be int32, got {t.dtype}")
    if t.dim() != 1 or t.shape[0] != size:
        raise ValueError(f"{name} must have shape [{size_name}] = [{size}], got {_shape(t)}")
    _contiguous(t, name)


def check_reshape_and_cache(key, value, key_cache, value_cache, slot_mapping) -> CacheSizes:
    _caches(key_cache, value_cache)
    _new_rows(key, "key", key_cache)
    _new_rows(value, "value", key_cache)
    num_tokens = key.shape[0]
    if value.shape[0] != num_tokens:
        raise ValueError(f"value must have as many rows as key ({num_tokens}), got {_shape(value)}")
    _device(slot_mapping, "slot_mapping", key_cache, "key_cache")
    if slot_mapping.dtype != torch.int64:
        raise TypeError(f"slot_mapping must be int64, got {slot_mapping.dtype}")
    _one_d(slot_mapping, "slot_mapping", num_tokens, "num_tokens")
    num_blocks, block_size, num_kv_heads, head_dim = key_cache.shape
    return CacheSizes(num_tokens, num_blocks, block_size, num_kv_heads, head_dim)


def check_paged_attention(
    query, key_cache, value_cache, block_table, seq_lens, cu_query_lens, sliding_window, soft_cap, max_query_len
) -> AttentionSizes:
    _floating(query, "query")
    if query.dim() != 3 or query.shape[1] < 1 or query.shape[2] < 1:
        raise ValueError(f"query must have shape [num_query_tokens, num_heads, head_dim], got {_shape(query)}")
    _contiguous(query, "query")
    _device(key_cache, "key_cache", query, "query")
    _caches(key_cache, value_cache)
    if key_cache.dtype != query.dtype:
        raise TypeError(f"key_cache must be {query.dtype} like query, got {key_cache.dtype}")
    num_query_tokens, num_heads, head_dim = query.shape
    num_blocks, block_size, num_kv_heads, _ = key_cache.shape
    if key_cache.shape[3] != head_dim:
        raise ValueError(f"key_cache head_dim must equal query's ({head_dim}), got {_shape(key_cache)}")
    if num_heads % num_kv_heads != 0:
        raise ValueError(
            f"query num_heads ({num_heads}) must be divisible by key_cache num_kv_heads ({num_kv_heads})"
        )
    _device(block_table, "block_table", query, "query")
    if block_table.dtype != torch.int32:
        raise TypeError(f"block_table must be int32, got {block_table.dtype}")
    if block_table.dim() != 2:
        raise ValueError(f"block_table must have shape [batch, max_blocks], got {_shape(block_table)}")
    _contiguous(block_table, "block_table")
    batch, max_blocks = block_table.shape
    _int32_vector(seq_lens, "seq_lens", batch, "batch", query)
    _int32_vector(cu_query_lens, "cu_query_lens", batch + 1, "batch + 1", query)
    if sliding_window < 0:
        raise ValueError(f"sliding_window must be >= 0 (0 = off), got {sliding_window}")
    if soft_cap < 0:
        raise ValueError(f"soft_cap must be >= 0 (0 = off), got {soft_cap}")
    if max_query_len < 0:
        raise ValueError(f"max_query_len must be >= 0 (0 = unknown), got {max_query_len}")
    return AttentionSizes(
        num_query_tokens, num_heads, num_kv_heads, head_dim, num_blocks, block_size, batch, max_blocks
    )
