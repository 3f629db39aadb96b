"""Scorers: the target forward pass that gives logits at every draft position and the bonus
position of every request in one step.

- paged multi-query verify (default): each request is one attention sequence whose query
  is its whole window (uncached tokens + drafts, q_len = k + 1 in decode); its cached
  keys are read once per step.
- batch expansion (the baseline engines used before multi-query kernels): each new token
  becomes its own q_len-1 sequence sharing the request's block table, so the same keys
  are read k + 1 times.

Both write the same K/V and return the same logits; only the attention metadata differs.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence

import torch

from specops.engine.kv_cache import SequenceChunk, build_attention_batch
from specops.engine.runner import ModelRunner


class ScorerKind(enum.Enum):
    PAGED_VERIFY = "paged-verify"
    BATCH_EXPANSION = "batch-expansion"


class Scorer:
    """Target logits for the windows of a step.

    Parameters
    ----------
    runner : the target model with its cache.
    kind : how the windows are laid out for attention.
    max_blocks : width of the block tables (the longest sequence's blocks).
    """

    def __init__(self, runner: ModelRunner, kind: ScorerKind, max_blocks: int):
        self.runner = runner
        self.kind = ScorerKind(kind)
        self.max_blocks = max_blocks

    def score(self, chunks: Sequence[SequenceChunk], use_graph: bool = False) -> torch.Tensor:
        """Logits of the last ``chunk.num_logits`` tokens of every chunk, in order
        (``use_graph``: the windows have a recurring shape, replay a CUDA graph when on).

        Shape: ``[sum(num_logits), vocab]``.
        """
        batch = build_attention_batch(
            chunks, self.runner.cache.block_size, self.max_blocks, self.runner.cache.key.device,
            expand=self.kind is ScorerKind.BATCH_EXPANSION,
        )
        return self.runner(batch, use_graph)
