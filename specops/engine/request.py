"""A generation request and its running state in the engine."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from specops.engine.outputs import FinishReason, OutputProcessor
from specops.engine.rejection_sampler import SamplingParams


@dataclass(frozen=True)
class Request:
    """What a caller asks for: continue ``prompt_token_ids`` by at most ``max_tokens`` tokens.

    ``ignore_eos`` keeps generating past the model's EOS id (benchmarks); ``stop_strings``
    end the output text before their first occurrence (they need a tokenizer in the engine).
    """

    prompt_token_ids: tuple[int, ...]
    max_tokens: int = 64
    sampling: SamplingParams = field(default_factory=lambda: SamplingParams(temperature=0.0))
    stop_strings: tuple[str, ...] = ()
    ignore_eos: bool = False

    def __post_init__(self):
        if len(self.prompt_token_ids) < 1:
            raise ValueError("prompt_token_ids must hold at least one token")
        if self.max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1, got {self.max_tokens}")
        if any(not s for s in self.stop_strings):
            raise ValueError("stop_strings must not contain the empty string")


class TokenSource(enum.Enum):
    """Where an emitted token came from (the CLI colours them)."""

    DRAFT = "draft"  # a proposed token the verifier accepted
    TARGET = "target"  # sampled from the target: recovered, bonus, or plain decoding


@dataclass
class SequenceState:
    """A request inside the engine.

    ``token_ids`` is the prompt followed by the output; the target cache holds valid K/V
    for positions ``< num_cached`` and the draft cache for ``< num_draft_cached``.
    """

    request_id: int
    request: Request
    token_ids: list[int]
    num_cached: int = 0
    num_draft_cached: int = 0
    block_table: list[int] = field(default_factory=list)  # shared by the target and draft caches
    output: OutputProcessor | None = None  # stop conditions and detokenised text
    sources: list[TokenSource] = field(default_factory=list)  # one per output token

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.request.prompt_token_ids)

    @property
    def output_token_ids(self) -> list[int]:
        return self.token_ids[self.num_prompt_tokens:]

    @property
    def num_output_tokens(self) -> int:
        return len(self.token_ids) - self.num_prompt_tokens

    @property
    def finish_reason(self) -> FinishReason | None:
        return self.output.output.finish_reason if self.output is not None else None

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None

    @property
    def text(self) -> str:
        return self.output.output.text if self.output is not None else ""
