"""Proposers: where draft tokens come from.

A proposer gets the running sequences and how many drafts each may have (0 allowed) and
returns the drafts, flattened request by request, with the probabilities they were drawn
from (``None`` for proposers without a distribution, like n-gram lookup: the verifier then
treats each draft as one-hot).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import torch

from specops import ops
from specops.engine.kv_cache import SequenceChunk, build_attention_batch
from specops.engine.request import SequenceState
from specops.engine.runner import ModelRunner

# Added to a request's seed for its draft draws, so they are independent of the
# verifier's draws at the same positions (sharing them would bias acceptance).
DRAFT_SEED_OFFSET = 0x5EED_D4AF_7000_0001


@dataclass
class Proposal:
    draft_token_ids: list[list[int]]  # per request, len <= its allowance
    draft_probs: torch.Tensor | None  # [sum of lengths, vocab] float32, rows in the same order


class Proposer(Protocol):
    def propose(self, states: Sequence[SequenceState], num_drafts: Sequence[int]) -> Proposal: ...

    def on_verified(self, state: SequenceState, num_accepted: int) -> None:
        """Called once the state's accepted drafts (and one more token) were appended."""


class NgramProposer:
    """Prompt lookup: drafts copied from where the sequence's last n-gram occurred before.

    Wraps :class:`specops.engine.ngram.NgramProposer` (pure, over token-id lists).
    """

    def __init__(self, k: int, min_n: int = 1, max_n: int = 3):
        from specops.engine import ngram

        self.k = k
        self._lookup = ngram.NgramProposer(min_n=min_n, max_n=max_n, k=k)

    def propose(self, states: Sequence[SequenceState], num_drafts: Sequence[int]) -> Proposal:
        drafts = self._lookup.propose_batch([s.token_ids for s in states], list(num_drafts))
        return Proposal(drafts, None)

    def on_verified(self, state: SequenceState, num_accepted: int) -> None:
        return None


class DraftModelProposer:
    """A small model run k times per step (multi-step), with its own paged cache sharing the
    target's block tables.

    Each step it first catches up on the sequence's tokens its cache lacks (1 in decode,
    2 after a step whose drafts were all accepted, the prompt at first), sampling draft 1
    from the last row; then it feeds draft j to get draft j + 1. Greedy requests take the
    argmax; random ones sample ``softmax(logits / temperature)`` with specops.verify (no
    drafts, the logits as bonus row), keyed by the request's seed and the position, so a
    seeded request drafts the same tokens in any batch.
    """

    def __init__(self, runner: ModelRunner, max_blocks: int, *, seed: int | None = None):
        self.runner = runner
        self.max_blocks = max_blocks
        self._seeds = torch.Generator()
        if seed is None:
            self._seeds.seed()
        else:
            self._seeds.manual_seed(seed)

    def _forward(self, chunks: list[SequenceChunk]) -> torch.Tensor:
        cache = self.runner.cache
        batch = build_attention_batch(chunks, cache.block_size, self.max_blocks, cache.key.device)
        # Windows of one length <= 2 recur every step (decode, catch-up): worth a graph.
        recurring = len({len(c.token_ids) for c in chunks}) == 1 and len(chunks[0].token_ids) <= 2
        return self.runner(batch, use_graph=recurring)

    def _sample(self, logits: torch.Tensor, states: Sequence[SequenceState], positions: list[int],
                seeds: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        """Draft ids ``[R]`` int64 and the laws they were drawn from ``[R, vocab]`` float32."""
        device = logits.device
        temperature = torch.tensor([s.request.sampling.temperature for s in states], dtype=torch.float32,
                                   device=device)
        empty = torch.empty((0,), dtype=torch.int64, device=device)
        tokens, _, _ = ops.verify(
            logits[:0], logits, empty, None, torch.zeros(len(states), dtype=torch.int32, device=device),
            temperature, None, None, torch.tensor(seeds, dtype=torch.int64, device=device),
            torch.tensor(positions, dtype=torch.int64, device=device), 0, validate=False,
        )
        safe_t = torch.where(temperature > 0, temperature, 1.0)
        probs = torch.softmax(logits.float() / safe_t[:, None], dim=-1)
        return tokens[:, 0].long(), probs

    def propose(self, states: Sequence[SequenceState], num_drafts: Sequence[int]) -> Proposal:
        active = [i for i, n in enumerate(num_drafts) if n > 0]
        drafts: list[list[int]] = [[] for _ in states]
        rows: list[list[torch.Tensor]] = [[] for _ in states]
        fresh = torch.randint(0, 2**62, (len(states),), generator=self._seeds).tolist()
        seeds = [
            (s.request.sampling.seed + DRAFT_SEED_OFFSET) % 2**63 if s.request.sampling.seed is not None else f
            for s, f in zip(states, fresh)
        ]
        step = 0
        while active:
            chunks = []
            for i in active:
                s = states[i]
                if step == 0:
                    start = s.num_draft_cached
                    if self.runner.use_cuda_graphs and 0 <= len(s.token_ids) - 2 <= start:
                        # Catch up on exactly 2 tokens (recomputing one cached K/V, same values)
                        # so every decode step has one shape and replays one graph.
                        start = len(s.token_ids) - 2
                    chunks.append(SequenceChunk(s.token_ids[start:], start, s.block_table, 1))
                else:
                    chunks.append(SequenceChunk([drafts[i][-1]], len(s.token_ids) + step - 1, s.block_table, 1))
            logits = self._forward(chunks)
            tokens, probs = self._sample(
                logits, [states[i] for i in active], [len(states[i].token_ids) + step for i in active],
                [seeds[i] for i in active],
            )
            for row, (i, token) in enumerate(zip(active, tokens.tolist())):
                drafts[i].append(token)
                rows[i].append(probs[row])
            for i in active:
                # Cached now: everything fed so far (the last draft is never fed).
                states[i].num_draft_cached = len(states[i].token_ids) + step
            step += 1
            active = [i for i in active if len(drafts[i]) < num_drafts[i]]
        flat = [row for per_request in rows for row in per_request]
        probs = torch.stack(flat) if flat else None
        return Proposal(drafts, probs)

    def on_verified(self, state: SequenceState, num_accepted: int) -> None:
        # Positions past the last accepted draft hold rejected drafts' K/V: forget them.
        state.num_draft_cached = min(state.num_draft_cached, state.num_cached)
