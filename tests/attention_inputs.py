"""Inputs of the paged-attention ops from fresh random data, and the float64 answer,
shared by their tests."""

from __future__ import annotations

import torch
from specops.reference import attention as reference

# (dtype, max relative error ||out - ref|| / ||ref||, LSE absolute tolerance)
TOLERANCES = [
    (torch.float32, 1e-5, 1e-4),
    (torch.float16, 2e-3, 1e-3),
    (torch.bfloat16, 1e-2, 1e-3),
]


def make_batch(seq_lens, q_lens, num_heads, num_kv_heads, head_dim, block_size, dtype, seed, spare_blocks=3):
    """A paged cache holding random keys/values for each sequence in shuffled blocks; every
    other slot is NaN, and block-table columns past a sequence's blocks hold invalid ids."""
    g = torch.Generator().manual_seed(seed)
    blocks_needed = [-(-n // block_size) for n in seq_lens]
    num_blocks = sum(blocks_needed) + spare_blocks
    max_blocks = max(blocks_needed) + 1
    perm = torch.randperm(num_blocks, generator=g).to(torch.int32)
    block_table = torch.full((len(seq_lens), max_blocks), num_blocks + 7, dtype=torch.int32)
    key_cache = torch.full((num_blocks, block_size, num_kv_heads, head_dim), float("nan"), dtype=dtype)
    value_cache = key_cache.clone()
    used = 0
    for b, (n, nb) in enumerate(zip(seq_lens, blocks_needed)):
        block_table[b, :nb] = perm[used : used + nb]
        used += nb
        positions = torch.arange(n)
        slots = block_table[b, positions // block_size].long() * block_size + positions % block_size
        key_cache.view(-1, num_kv_heads, head_dim)[slots] = torch.randn(n, num_kv_heads, head_dim, generator=g).to(dtype)
        value_cache.view(-1, num_kv_heads, head_dim)[slots] = torch.randn(n, num_kv_heads, head_dim, generator=g).to(
            dtype
        )
    query = torch.randn(sum(q_lens), num_heads, head_dim, generator=g).to(dtype)
    cu_query_lens = torch.tensor([0, *q_lens], dtype=torch.int64).cumsum(0).to(torch.int32)
    return {
        "query": query,
        "key_cache": key_cache,
        "value_cache": value_cache,
        "block_table": block_table,
        "seq_lens": torch.tensor(seq_lens, dtype=torch.int32),
        "cu_query_lens": cu_query_lens,
    }


def reference_float64(inputs, scale, sliding_window, soft_cap):
    """The reference on float64 copies of the inputs: the exact answer for these inputs."""
    upcast = {k: (v.double() if v.is_floating_point() else v) for k, v in inputs.items()}
    return reference.paged_attention(
        *upcast.values(), scale, sliding_window, soft_cap, True, accumulate_dtype=torch.float64
    )


def relative_error(out, ref):
    return ((out.double() - ref).norm() / ref.norm()).item()

