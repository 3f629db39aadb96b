"""Ragged verification batches from fresh random data, for the sampling-op tests."""

from __future__ import annotations

from dataclasses import dataclass

import torch

POISON = -7777  # written into outputs before a run: any survivor is an unwritten entry


@dataclass
class SamplingBatch:
    num_draft_tokens: list[int]
    cu_num_draft_tokens: torch.Tensor  # [B] int32
    draft_token_ids: torch.Tensor  # [T]
    draft_probs: torch.Tensor | None  # [T, V] float32
    target_probs: torch.Tensor  # [T, V] float32
    target_argmax: torch.Tensor  # [T]
    bonus_token_ids: torch.Tensor  # [B]
    uniform_probs: torch.Tensor  # [T] float32
    exponentials: torch.Tensor  # [B, V] float32
    is_greedy: torch.Tensor | None  # [B] bool

    @property
    def batch(self) -> int:
        return len(self.num_draft_tokens)

    @property
    def num_tokens(self) -> int:
        return self.draft_token_ids.shape[0]

    @property
    def vocab(self) -> int:
        return self.target_probs.shape[1]

    def poisoned_output(self, max_spec_len: int | None = None) -> torch.Tensor:
        width = (max_spec_len if max_spec_len is not None else max(self.num_draft_tokens, default=0)) + 1
        return torch.full((self.batch, width), POISON, dtype=torch.int32, device=self.target_probs.device)


def _probs(rows: int, vocab: int, generator: torch.Generator, sparsity: float) -> torch.Tensor:
    """Peaked random distributions with some exact zeros (sparsity = fraction zeroed)."""
    logits = torch.randn(rows, vocab, generator=generator, dtype=torch.float32) * 3
    probs = torch.softmax(logits, dim=-1)
    if sparsity > 0:
        keep = torch.rand(rows, vocab, generator=generator) >= sparsity
        probs = probs * keep
        probs[:, 0] += (probs.sum(-1) == 0).float()  # never an all-zero row
        probs = probs / probs.sum(-1, keepdim=True)
    return probs


def make_batch(
    num_draft_tokens: list[int],
    vocab: int,
    *,
    seed: int,
    device: str = "cpu",
    with_draft_probs: bool = True,
    id_dtype: torch.dtype = torch.int32,
    greedy_fraction: float = 0.0,
    sparsity: float = 0.2,
    accept_bias: float = 0.5,
) -> SamplingBatch:
    """A batch whose drafts are drawn from the draft probs, and whose target argmax
    agrees with the draft about ``accept_bias`` of the time, so both acceptance and
    rejection paths run. Everything is built on the CPU from ``seed`` then moved."""
    g = torch.Generator().manual_seed(seed)
    batch = len(num_draft_tokens)
    num_tokens = sum(num_draft_tokens)
    cu = torch.tensor(num_draft_tokens, dtype=torch.int64).cumsum(0).to(torch.int32)
    draft_probs = _probs(num_tokens, vocab, g, sparsity)
    target_probs = _probs(num_tokens, vocab, g, sparsity)
    draft_ids = torch.multinomial(draft_probs, 1, generator=g).squeeze(-1) if num_tokens else torch.zeros(0, dtype=torch.int64)
    # Make the target like the draft at some positions so greedy/random acceptance happens.
    like = torch.rand(num_tokens, generator=g) < accept_bias
    target_probs[like] = 0.5 * target_probs[like] + 0.5 * draft_probs[like]
    target_argmax = target_probs.argmax(-1)
    target_argmax = torch.where(like, draft_ids, target_argmax)
    bonus = torch.randint(0, vocab, (batch,), generator=g)
    uniform = torch.rand(num_tokens, generator=g, dtype=torch.float32)
    exponentials = torch.empty(batch, vocab).exponential_(generator=g)
    is_greedy = (torch.rand(batch, generator=g) < greedy_fraction) if greedy_fraction > 0 else None
    to = dict(device=device)
    return SamplingBatch(
        num_draft_tokens=list(num_draft_tokens),
        cu_num_draft_tokens=cu.to(**to),
        draft_token_ids=draft_ids.to(id_dtype).to(**to),
        draft_probs=draft_probs.to(**to) if with_draft_probs else None,
        target_probs=target_probs.to(**to),
        target_argmax=target_argmax.to(id_dtype).to(**to),
        bonus_token_ids=bonus.to(id_dtype).to(**to),
        uniform_probs=uniform.to(**to),
        exponentials=exponentials.to(**to),
        is_greedy=is_greedy.to(**to) if is_greedy is not None else None,
    )
