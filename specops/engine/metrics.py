"""Speculative-decoding metrics accumulated over the steps of a run."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class SpecDecodeMetrics:
    """Counts over decode steps (steps that verified at least one running request).

    - acceptance rate: accepted drafts / proposed drafts;
    - mean accepted length: tokens emitted per request-step (accepted drafts + 1);
    - system efficiency: emitted / (request-steps * (k + 1)), 1 when every step emits k + 1;
    - per-position acceptance: of the request-steps with a draft at position j, the share
      whose draft j was accepted (None where none had one).
    """

    k: int
    num_steps: int = 0
    num_request_steps: int = 0  # sum over steps of the batch size
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    num_emitted_tokens: int = 0  # before stop conditions cut the output
    drafts_per_position: list[int] = field(default_factory=list)
    accepted_per_position: list[int] = field(default_factory=list)

    def __post_init__(self):
        if self.k < 0:
            raise ValueError(f"k must be >= 0, got {self.k}")
        self.drafts_per_position = self.drafts_per_position or [0] * self.k
        self.accepted_per_position = self.accepted_per_position or [0] * self.k

    def record(self, num_drafts: list[int], num_accepted: list[int]) -> None:
        """One verification step: per request, drafts proposed and drafts accepted."""
        if len(num_drafts) != len(num_accepted):
            raise ValueError("num_drafts and num_accepted must have one entry per request")
        self.num_steps += 1
        self.num_request_steps += len(num_drafts)
        self.num_draft_tokens += sum(num_drafts)
        self.num_accepted_tokens += sum(num_accepted)
        self.num_emitted_tokens += sum(num_accepted) + len(num_accepted)
        for n, a in zip(num_drafts, num_accepted):
            for j in range(n):
                self.drafts_per_position[j] += 1
                self.accepted_per_position[j] += j < a

    @property
    def acceptance_rate(self) -> float:
        return self.num_accepted_tokens / max(self.num_draft_tokens, 1)

    @property
    def mean_accepted_length(self) -> float:
        return self.num_emitted_tokens / max(self.num_request_steps, 1)

    @property
    def system_efficiency(self) -> float:
        return self.num_emitted_tokens / max(self.num_request_steps * (self.k + 1), 1)

    @property
    def per_position_acceptance(self) -> list[float | None]:
        """Per draft position; None where no request-step had a draft there."""
        return [a / d if d else None for a, d in zip(self.accepted_per_position, self.drafts_per_position)]

    def summary(self) -> dict[str, float | list[float]]:
        return {
            "acceptance_rate": round(self.acceptance_rate, 4),
            "mean_accepted_length": round(self.mean_accepted_length, 4),
            "system_efficiency": round(self.system_efficiency, 4),
            "per_position_acceptance": [None if x is None else round(x, 4) for x in self.per_position_acceptance],
            "num_steps": self.num_steps,
            "num_draft_tokens": self.num_draft_tokens,
            "num_accepted_tokens": self.num_accepted_tokens,
        }
