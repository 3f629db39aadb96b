"""The paged KV cache: block allocator, per-request block tables, slot mapping, and the
attention metadata of one forward pass.

Draft and target caches share one allocator and one block table per request: both hold
the same positions of the same sequences, so a block id means the same tokens in both,
and :func:`split_num_cache_blocks_evenly` gives them the same number of blocks.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from specops.engine.config import LlamaConfig


def cache_block_bytes(config: LlamaConfig, block_size: int, dtype: torch.dtype) -> int:
    """Bytes of one block of K and V over all layers of a model."""
    element = torch.empty((), dtype=dtype).element_size()
    return 2 * config.num_hidden_layers * block_size * config.num_key_value_heads * config.head_dim * element


def split_num_cache_blocks_evenly(target_block_bytes: int, draft_block_bytes: int, budget_bytes: int) -> int:
    """Blocks each of the target and draft caches gets from ``budget_bytes``: the same number,
    since every request holds the same positions in both."""
    if target_block_bytes < 1 or draft_block_bytes < 0 or budget_bytes < 0:
        raise ValueError(
            f"block sizes must be positive and the budget >= 0, got target_block_bytes={target_block_bytes}, "
            f"draft_block_bytes={draft_block_bytes}, budget_bytes={budget_bytes}"
        )
    return budget_bytes // (target_block_bytes + draft_block_bytes)


class BlockAllocator:
    """Free list of cache block ids with a block table per request."""

    def __init__(self, num_blocks: int, block_size: int):
        if num_blocks < 1 or block_size < 1:
            raise ValueError(f"num_blocks and block_size must be >= 1, got {num_blocks}, {block_size}")
        self.num_blocks = num_blocks
        self.block_size = block_size
        # Popped from the end: low ids first, so small runs touch few pages.
        self._free = list(range(num_blocks - 1, -1, -1))
        self._tables: dict[int, list[int]] = {}

    @property
    def num_free_blocks(self) -> int:
        return len(self._free)

    def blocks_needed(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    def can_hold(self, request_id: int, num_tokens: int) -> bool:
        """Whether :meth:`reserve` of ``num_tokens`` for the request would succeed."""
        have = len(self._tables.get(request_id, ()))
        return self.blocks_needed(num_tokens) - have <= len(self._free)

    def reserve(self, request_id: int, num_tokens: int) -> list[int]:
        """Grow the request's table to hold ``num_tokens`` positions; returns the table."""
        table = self._tables.setdefault(request_id, [])
        missing = self.blocks_needed(num_tokens) - len(table)
        if missing > len(self._free):
            raise MemoryError(
                f"request {request_id} needs {missing} more cache blocks for {num_tokens} tokens, "
                f"{len(self._free)} free"
            )
        for _ in range(max(missing, 0)):
            table.append(self._free.pop())
        return table

    def table(self, request_id: int) -> list[int]:
        return self._tables[request_id]

    def free(self, request_id: int) -> None:
        self._free.extend(reversed(self._tables.pop(request_id, [])))


class KVCache:
    """K and V of every layer of one model. Shape: ``[num_layers, num_blocks, block_size, Hkv, D]``
    each; ``layer(i)`` gives the contiguous per-layer views the ops take."""

    def __init__(self, config: LlamaConfig, num_blocks: int, block_size: int, dtype: torch.dtype,
                 device: torch.device | str):
        shape = (config.num_hidden_layers, num_blocks, block_size, config.num_key_value_heads, config.head_dim)
        self.key = torch.zeros(shape, dtype=dtype, device=device)
        self.value = torch.zeros(shape, dtype=dtype, device=device)
        self.block_size = block_size

    def layer(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.key[index], self.value[index]


@dataclass(frozen=True)
class SequenceChunk:
    """New tokens of one sequence in a forward pass: ``token_ids`` sit at positions
    ``start, start + 1, ...``; positions before ``start`` are already cached."""

    token_ids: Sequence[int]
    start: int
    block_table: Sequence[int]
    num_logits: int  # logits wanted for the last num_logits new tokens

    def __post_init__(self):
        if not 1 <= len(self.token_ids):
            raise ValueError("a sequence chunk needs at least one new token")
        if not 0 <= self.num_logits <= len(self.token_ids):
            raise ValueError(f"num_logits must be in [0, {len(self.token_ids)}], got {self.num_logits}")
        if self.start < 0:
            raise ValueError(f"start must be >= 0, got {self.start}")


@dataclass
class AttentionBatch:
    """Everything one forward pass over a ragged batch of new tokens reads, built once per step."""

    input_ids: torch.Tensor  # [N] int64
    positions: torch.Tensor  # [N] int64
    slot_mapping: torch.Tensor  # [N] int64: where each new token's K/V goes
    block_table: torch.Tensor  # [S, max_blocks] int32, one row per attention sequence
    seq_lens: torch.Tensor  # [S] int32: keys per attention sequence, new tokens included
    cu_query_lens: torch.Tensor  # [S + 1] int32
    logits_indices: torch.Tensor  # [M] int64: rows of the N whose logits are wanted
    # The longest q_len, known on the host (0 = unknown): paged_attention's tiling hint.
    max_query_len: int = 0

    @property
    def num_tokens(self) -> int:
        return self.input_ids.shape[0]


def build_attention_batch(chunks: Sequence[SequenceChunk], block_size: int, max_blocks: int,
                          device: torch.device | str, *, expand: bool = False) -> AttentionBatch:
    """Flatten the chunks into one batch.

    ``expand=False``: one attention sequence per chunk (q_len = its new tokens; the paged
    multi-query path). ``expand=True``: one q_len-1 sequence per new token, sharing the
    chunk's block table (batch expansion): the same keys are read once per new token.
    """
    ids, positions, slots, tables, seq_lens, q_lens, logits = [], [], [], [], [], [], []
    for chunk in chunks:
        n = len(chunk.token_ids)
        end = chunk.start + n
        if -(-end // block_size) > len(chunk.block_table):
            raise ValueError(f"block table of {len(chunk.block_table)} blocks cannot hold {end} positions")
        if len(chunk.block_table) > max_blocks:
            raise ValueError(f"block table of {len(chunk.block_table)} blocks exceeds max_blocks={max_blocks}")
        row = list(chunk.block_table) + [0] * (max_blocks - len(chunk.block_table))
        first = len(ids)
        for p in range(chunk.start, end):
            slots.append(chunk.block_table[p // block_size] * block_size + p % block_size)
        ids.extend(chunk.token_ids)
        positions.extend(range(chunk.start, end))
        logits.extend(range(first + n - chunk.num_logits, first + n))
        if expand:
            tables.extend([row] * n)
            seq_lens.extend(range(chunk.start + 1, end + 1))
            q_lens.extend([1] * n)
        else:
            tables.append(row)
            seq_lens.append(end)
            q_lens.append(n)
    cu = [0]
    for q in q_lens:
        cu.append(cu[-1] + q)

    def tensor(values, dtype):
        return torch.tensor(values, dtype=dtype).to(device, non_blocking=True)

    return AttentionBatch(
        input_ids=tensor(ids, torch.int64),
        positions=tensor(positions, torch.int64),
        slot_mapping=tensor(slots, torch.int64),
        block_table=tensor(tables, torch.int32).reshape(len(tables), max_blocks),
        seq_lens=tensor(seq_lens, torch.int32),
        cu_query_lens=tensor(cu, torch.int32),
        logits_indices=tensor(logits, torch.int64),
        max_query_len=max(q_lens, default=0),
    )
