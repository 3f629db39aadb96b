"""Pure-PyTorch reference of the paged-attention ops.

Written to be read: one sequence at a time, its keys and values gathered through its
block table, then plain softmax attention. Every kernel must match these functions up to
its accumulation precision; tests call them with ``accumulate_dtype=torch.float64``.

Paged KV cache: ``[num_blocks, block_size, num_kv_heads, head_dim]``; token slot ``s``
lives in block ``s // block_size`` at offset ``s % block_size``. Sequence ``b``'s
``j``-th key lives in block ``block_table[b, j // block_size]`` at offset
``j % block_size``.

Ragged queries: the query rows of all ``B`` sequences are flattened; sequence ``b`` owns
rows ``[cu_query_lens[b], cu_query_lens[b + 1])``, which are its LAST ``q_len`` positions
(bottom-right causal): row ``j`` sits at position ``seq_len - q_len + j`` and attends to
keys ``0..position`` (the last ``sliding_window`` of them when the window is on).
"""

from __future__ import annotations

import torch

PADDING_SLOT_ID = -1


def reshape_and_cache(
    key: torch.Tensor,  # [N, Hkv, D]
    value: torch.Tensor,  # [N, Hkv, D]
    key_cache: torch.Tensor,  # [num_blocks, block_size, Hkv, D], written in place
    value_cache: torch.Tensor,  # [num_blocks, block_size, Hkv, D], written in place
    slot_mapping: torch.Tensor,  # [N] int64, -1 = padding (skipped)
) -> None:
    """Write ``key[i]`` and ``value[i]`` into slot ``slot_mapping[i]`` of the caches."""
    block_size = key_cache.shape[1]
    for i, slot in enumerate(slot_mapping.tolist()):
        if slot == PADDING_SLOT_ID:
            continue
        block, offset = divmod(slot, block_size)
        key_cache[block, offset] = key[i]
        value_cache[block, offset] = value[i]


def _gather(cache: torch.Tensor, block_row: torch.Tensor, seq_len: int) -> torch.Tensor:
    """The first ``seq_len`` tokens of one sequence: [seq_len, Hkv, D]."""
    block_size = cache.shape[1]
    num_blocks_used = -(-seq_len // block_size)
    blocks = cache[block_row[:num_blocks_used].long()]  # [n, block_size, Hkv, D]
    return blocks.reshape(-1, *cache.shape[2:])[:seq_len]


def paged_attention(
    query: torch.Tensor,  # [num_query_tokens, Hq, D]
    key_cache: torch.Tensor,  # [num_blocks, block_size, Hkv, D]
    value_cache: torch.Tensor,  # [num_blocks, block_size, Hkv, D]
    block_table: torch.Tensor,  # [B, max_blocks] int32
    seq_lens: torch.Tensor,  # [B] int32, keys in the cache per sequence (new tokens included)
    cu_query_lens: torch.Tensor,  # [B + 1] int32, exclusive prefix of query lengths
    scale: float,
    sliding_window: int = 0,
    soft_cap: float = 0.0,
    return_lse: bool = False,
    max_query_len: int = 0,
    *,
    accumulate_dtype: torch.dtype = torch.float32,
) -> tuple[torch.Tensor, torch.Tensor]:  # out [num_query_tokens, Hq, D] dtype of query; lse [num_query_tokens, Hq] float32
    """Attention of each query row over its sequence's cached keys, causal from the bottom right.

    ``lse`` is the natural-log log-sum-exp of the scaled (and soft-capped) logits, or an
    empty ``[0, 0]`` tensor unless ``return_lse``. ``max_query_len`` is the kernels' tiling
    hint (the longest query length, 0 = unknown); it never changes the result, and is
    ignored here.
    """
    num_query_tokens, num_heads, head_dim = query.shape
    group = num_heads // key_cache.shape[2]
    out = torch.zeros(num_query_tokens, num_heads, head_dim, dtype=accumulate_dtype, device=query.device)
    lse = torch.zeros(num_query_tokens, num_heads, dtype=accumulate_dtype, device=query.device)
    cu = cu_query_lens.tolist()
    for b, seq_len in enumerate(seq_lens.tolist()):
        start, end = cu[b], cu[b + 1]
        q_len = end - start
        if q_len == 0:
            continue
        keys = _gather(key_cache, block_table[b], seq_len).to(accumulate_dtype)  # [S, Hkv, D]
        values = _gather(value_cache, block_table[b], seq_len).to(accumulate_dtype)
        keys = keys.repeat_interleave(group, dim=1).transpose(0, 1)  # [Hq, S, D]
        values = values.repeat_interleave(group, dim=1).transpose(0, 1)
        q = query[start:end].to(accumulate_dtype).transpose(0, 1)  # [Hq, q_len, D]
        logits = (q @ keys.transpose(1, 2)) * scale  # [Hq, q_len, S]
        if soft_cap > 0:
            logits = soft_cap * torch.tanh(logits / soft_cap)
        positions = torch.arange(seq_len - q_len, seq_len, device=query.device)[:, None]  # [q_len, 1]
        key_positions = torch.arange(seq_len, device=query.device)[None, :]  # [1, S]
        visible = key_positions <= positions
        if sliding_window > 0:
            visible &= key_positions > positions - sliding_window
        logits = logits.masked_fill(~visible, float("-inf"))
        row_lse = torch.logsumexp(logits, dim=-1)  # [Hq, q_len]
        probs = torch.exp(logits - row_lse[..., None])
        out[start:end] = (probs @ values).transpose(0, 1)
        lse[start:end] = row_lse.transpose(0, 1)
    lse_out = lse.float() if return_lse else torch.empty(0, 0, dtype=torch.float32, device=query.device)
    return out.to(query.dtype), lse_out
