"""The paged KV cache manager: block allocator, block tables, slot mapping, the two
attention layouts, and the split of a memory budget between target and draft caches."""

from __future__ import annotations

import pytest
import torch

from specops.engine.config import LlamaConfig
from specops.engine.kv_cache import (
    BlockAllocator,
    SequenceChunk,
    build_attention_batch,
    cache_block_bytes,
    split_num_cache_blocks_evenly,
)


def test_allocator_reserves_grows_and_frees():
    alloc = BlockAllocator(num_blocks=6, block_size=4)
    table = alloc.reserve(7, 9)  # 9 tokens -> 3 blocks
    assert len(table) == 3 and len(set(table)) == 3 and alloc.num_free_blocks == 3
    assert alloc.reserve(7, 12) == table  # still 3 blocks
    other = alloc.reserve(8, 5)
    assert not set(other) & set(table) and alloc.num_free_blocks == 1
    assert not alloc.can_hold(9, 5) and alloc.can_hold(9, 4)
    with pytest.raises(MemoryError, match="request 9 needs 2 more cache blocks"):
        alloc.reserve(9, 8)
    alloc.free(7)
    assert alloc.num_free_blocks == 4 and alloc.can_hold(9, 16)
    assert sorted(alloc.reserve(9, 16) + other) == list(range(6))


def test_slot_mapping_and_paged_layout():
    chunks = [SequenceChunk([11, 12, 13], 5, [4, 2], 2), SequenceChunk([21], 0, [0], 1)]
    batch = build_attention_batch(chunks, block_size=4, max_blocks=3, device="cpu")
    assert batch.input_ids.tolist() == [11, 12, 13, 21]
    assert batch.positions.tolist() == [5, 6, 7, 0]
    # position 5 -> block 1 of the table (2), offset 1 -> slot 2*4+1; 6, 7 likewise.
    assert batch.slot_mapping.tolist() == [9, 10, 11, 0]
    assert batch.block_table.tolist() == [[4, 2, 0], [0, 0, 0]]
    assert batch.seq_lens.tolist() == [8, 1] and batch.cu_query_lens.tolist() == [0, 3, 4]
    assert batch.max_query_len == 3  # the longest window, from host lists: no device sync
    assert batch.logits_indices.tolist() == [1, 2, 3]
    assert batch.block_table.dtype == torch.int32 and batch.slot_mapping.dtype == torch.int64


def test_batch_expansion_layout():
    chunks = [SequenceChunk([11, 12, 13], 5, [4, 2], 3)]
    batch = build_attention_batch(chunks, block_size=4, max_blocks=2, device="cpu", expand=True)
    assert batch.slot_mapping.tolist() == [9, 10, 11]
    assert batch.block_table.tolist() == [[4, 2]] * 3
    assert batch.seq_lens.tolist() == [6, 7, 8] and batch.cu_query_lens.tolist() == [0, 1, 2, 3]
    assert batch.max_query_len == 1


def test_chunk_and_table_errors():
    with pytest.raises(ValueError, match="cannot hold 9 positions"):
        build_attention_batch([SequenceChunk([1, 2], 7, [0, 1], 1)], 4, 4, "cpu")
    with pytest.raises(ValueError, match="num_logits"):
        SequenceChunk([1], 0, [0], 2)


def test_split_num_cache_blocks_evenly():
    target = LlamaConfig(vocab_size=10, hidden_size=64, intermediate_size=128, num_hidden_layers=4,
                         num_attention_heads=4, num_key_value_heads=2, head_dim=16)
    draft = LlamaConfig(vocab_size=10, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                        num_attention_heads=2, num_key_value_heads=1, head_dim=16)
    t, d = cache_block_bytes(target, 16, torch.bfloat16), cache_block_bytes(draft, 16, torch.bfloat16)
    assert t == 2 * 4 * 16 * 2 * 16 * 2 and d == 2 * 1 * 16 * 1 * 16 * 2
    n = split_num_cache_blocks_evenly(t, d, 10**6)
    assert n * (t + d) <= 10**6 < (n + 1) * (t + d)
    with pytest.raises(ValueError, match="target_block_bytes"):
        split_num_cache_blocks_evenly(0, d, 10)
