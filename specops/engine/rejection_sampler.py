"""The verification step as an ``nn.Module`` an engine can drop in.

It takes what an engine has at hand after the target forward pass (logits of the draft
positions and of the bonus position, the drafts, per-request sampling parameters and
seeds) and returns the emitted tokens with the step's metrics. Built on specops.verify
alone.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from specops import ops


@dataclass(frozen=True)
class SamplingParams:
    """One request's sampling parameters. temperature 0 is greedy; top_k 0 and top_p 1 turn
    those filters off; seed None asks the sampler for a fresh seed each step."""

    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int | None = None

    def __post_init__(self):
        if not self.temperature >= 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0, got {self.top_k}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")


@dataclass
class StepMetrics:
    """Counts of one verification step (tensors on the logits' device: reading them syncs)."""

    num_draft_tokens: torch.Tensor  # [] drafts proposed
    num_accepted_tokens: torch.Tensor  # [] drafts accepted
    num_emitted_tokens: torch.Tensor  # [] tokens emitted (accepted + one per request)
    drafts_per_position: torch.Tensor  # [max_spec_len]: requests with a draft at position j
    accepted_per_position: torch.Tensor  # [max_spec_len]: requests whose draft j was accepted

    @property
    def acceptance_rate(self) -> float:
        return float(self.num_accepted_tokens) / max(int(self.num_draft_tokens), 1)


@dataclass
class SamplerOutput:
    token_ids: torch.Tensor  # [B, max_spec_len + 1] int32, -1 padded
    num_accepted: torch.Tensor  # [B] int32
    logprobs: torch.Tensor  # [B, max_spec_len + 1] float32, or [0, 0]
    metrics: StepMetrics


class RejectionSampler(torch.nn.Module):
    """Lossless verification of draft tokens from target logits (specops.verify).

    Example
    -------
    >>> sampler = RejectionSampler(max_spec_len=4)
    >>> out = sampler(target_logits, bonus_logits, draft_token_ids, [2, 0, 4],
    ...               [SamplingParams(temperature=0.7, seed=1)] * 3, positions=[10, 3, 7])
    >>> out.token_ids, out.metrics.acceptance_rate
    """

    def __init__(self, max_spec_len: int, *, return_logprobs: bool = False, backend=None, seed: int | None = None):
        super().__init__()
        if max_spec_len < 0:
            raise ValueError(f"max_spec_len must be >= 0, got {max_spec_len}")
        self.max_spec_len = max_spec_len
        self.return_logprobs = return_logprobs
        self.backend = backend
        self._seeds = torch.Generator()
        if seed is not None:
            self._seeds.manual_seed(seed)
        else:
            self._seeds.seed()

    def _params(self, params: Sequence[SamplingParams], device: torch.device) -> dict[str, torch.Tensor | None]:
        """Per-request tensors; a parameter no request uses is None (all greedy: no
        temperature; no top-k or top-p anywhere: none), which spares the kernels the
        launches and passes that only those parameters need."""
        fresh = torch.randint(0, 2**63 - 1, (len(params),), generator=self._seeds, dtype=torch.int64).tolist()

        def per_request(values, dtype, used):
            return torch.tensor(values, dtype=dtype, device=device) if used else None

        random = [p.temperature != 0 for p in params]
        return dict(
            temperature=per_request([p.temperature for p in params], torch.float32, any(random)),
            top_k=per_request([p.top_k for p in params], torch.int32,
                              any(r and p.top_k > 0 for r, p in zip(random, params))),
            top_p=per_request([p.top_p for p in params], torch.float32,
                              any(r and p.top_p < 1 for r, p in zip(random, params))),
            seeds=torch.tensor([p.seed if p.seed is not None else s for p, s in zip(params, fresh)],
                               dtype=torch.int64, device=device),
        )

    def forward(
        self,
        target_logits: torch.Tensor,  # [num_tokens, V]
        bonus_logits: torch.Tensor,  # [B, V]
        draft_token_ids: torch.Tensor,  # [num_tokens]
        num_draft_tokens: Sequence[int],  # B counts, 0 allowed
        params: Sequence[SamplingParams],  # B
        positions: Sequence[int],  # B: absolute position of each request's first draft
        draft_probs: torch.Tensor | None = None,  # [num_tokens, V] float32; None: n-gram drafts
    ) -> SamplerOutput:
        device = target_logits.device
        if not len(num_draft_tokens) == len(params) == len(positions) == bonus_logits.shape[0]:
            raise ValueError(
                "num_draft_tokens, params, positions and bonus_logits must describe the same requests: got "
                f"{len(num_draft_tokens)}, {len(params)}, {len(positions)}, {bonus_logits.shape[0]}"
            )
        counts = torch.tensor(list(num_draft_tokens), dtype=torch.int64)
        cu = counts.cumsum(0).to(torch.int32).to(device)
        sampling = self._params(params, device)
        token_ids, num_accepted, logprobs = ops.verify(
            target_logits, bonus_logits, draft_token_ids, draft_probs, cu, sampling["temperature"],
            sampling["top_k"], sampling["top_p"], sampling["seeds"],
            torch.tensor(list(positions), dtype=torch.int64, device=device), self.max_spec_len,
            self.return_logprobs, backend=self.backend,
        )
        return SamplerOutput(token_ids, num_accepted, logprobs, self._metrics(counts.to(device), num_accepted))

    def _metrics(self, counts: torch.Tensor, num_accepted: torch.Tensor) -> StepMetrics:
        j = torch.arange(self.max_spec_len, device=counts.device)
        return StepMetrics(
            num_draft_tokens=counts.sum(),
            num_accepted_tokens=num_accepted.sum(),
            num_emitted_tokens=num_accepted.sum() + counts.numel(),
            drafts_per_position=(counts[:, None] > j).sum(0),
            accepted_per_position=(num_accepted[:, None].long() > j).sum(0),
        )
