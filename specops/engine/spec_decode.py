"""The speculative-decoding loop with continuous batching.

One :meth:`SpecDecodeEngine.step`:

1. admit waiting requests while the batch has room and the cache has blocks for their
   whole length (prompt + max_tokens + k: a request never waits for blocks mid-run);
2. propose up to k drafts per running request (0 allowed: no n-gram match, or the
   request is one token from its limit);
3. score: one target forward over each request's window (tokens the target cache lacks
   -- the prompt at first, then the last emitted token -- followed by its drafts), giving
   logits at every draft position and at the bonus position;
4. verify with :class:`RejectionSampler` (specops.verify): accepted drafts + one target token;
5. append the tokens through each request's stop conditions, roll the cache lengths back
   past rejected drafts (their K/V is simply overwritten later), free finished requests.

Without a proposer (k = 0) the same loop is plain target decoding, verifying zero drafts.
"""

from __future__ import annotations

import enum
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from specops.engine.kv_cache import BlockAllocator, KVCache, SequenceChunk
from specops.engine.metrics import SpecDecodeMetrics
from specops.engine.model import LlamaForCausalLM
from specops.engine.outputs import OutputProcessor, StopParams
from specops.engine.proposers import DraftModelProposer, NgramProposer, Proposer
from specops.engine.rejection_sampler import RejectionSampler
from specops.engine.request import Request, SequenceState, TokenSource
from specops.engine.runner import ModelRunner
from specops.engine.scorer import Scorer, ScorerKind


class ProposerKind(enum.Enum):
    NONE = "none"  # target alone
    NGRAM = "ngram"
    DRAFT = "draft"


@dataclass(frozen=True)
class EngineConfig:
    """How the engine runs.

    Parameters
    ----------
    proposer : where drafts come from (DRAFT needs a draft model).
    k : drafts per request per step (0 with ProposerKind.NONE).
    scorer : paged multi-query verify or batch expansion.
    block_size, num_blocks : the paged caches (draft and target get num_blocks each).
    max_num_seqs : requests decoded together at most.
    max_model_len : prompt + output + k positions at most per request.
    use_cuda_graphs : replay decode/verify forward passes from CUDA graphs (CUDA only).
    seed : seeds the fresh per-step seeds of requests that give none.
    ngram_min_n, ngram_max_n : n-gram sizes the lookup tries (longest first).
    """

    proposer: ProposerKind = ProposerKind.NONE
    k: int = 0
    scorer: ScorerKind = ScorerKind.PAGED_VERIFY
    block_size: int = 16
    num_blocks: int = 256
    max_num_seqs: int = 32
    max_model_len: int = 2048
    use_cuda_graphs: bool = False
    seed: int | None = None
    ngram_min_n: int = 1
    ngram_max_n: int = 3

    def __post_init__(self):
        object.__setattr__(self, "proposer", ProposerKind(self.proposer))
        object.__setattr__(self, "scorer", ScorerKind(self.scorer))
        if self.k < 0 or (self.proposer is ProposerKind.NONE) != (self.k == 0):
            raise ValueError(f"k must be 0 with no proposer and >= 1 with one, got k={self.k} with {self.proposer}")
        for name in ("block_size", "num_blocks", "max_num_seqs", "max_model_len"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if not 1 <= self.ngram_min_n <= self.ngram_max_n:
            raise ValueError(f"need 1 <= ngram_min_n <= ngram_max_n, got {self.ngram_min_n}, {self.ngram_max_n}")


class SpecDecodeEngine:
    """Speculative decoding over a target model (and optionally a draft model).

    Example
    -------
    >>> engine = SpecDecodeEngine(target, EngineConfig(proposer="draft", k=4), draft=draft)
    >>> [state] = engine.generate([Request((1, 2, 3), max_tokens=16)])
    >>> state.output_token_ids, engine.metrics.acceptance_rate
    """

    def __init__(self, target: LlamaForCausalLM, config: EngineConfig, *, draft: LlamaForCausalLM | None = None,
                 tokenizer=None):
        self.config = config
        self.target = target
        self.tokenizer = tokenizer
        param = next(target.parameters())
        device, dtype = param.device, param.dtype
        limit = target.config.max_position_embeddings
        if config.max_model_len > limit:
            raise ValueError(f"max_model_len ({config.max_model_len}) exceeds the target's "
                             f"max_position_embeddings ({limit})")
        self.max_blocks = -(-config.max_model_len // config.block_size)
        self.allocator = BlockAllocator(config.num_blocks, config.block_size)
        cache = KVCache(target.config, config.num_blocks, config.block_size, dtype, device)
        self.scorer = Scorer(ModelRunner(target, cache, use_cuda_graphs=config.use_cuda_graphs), config.scorer,
                             self.max_blocks)
        self.proposer: Proposer | None = None
        if config.proposer is ProposerKind.DRAFT:
            if draft is None:
                raise ValueError("proposer 'draft' needs a draft model (draft=None)")
            if draft.config.vocab_size != target.config.vocab_size:
                raise ValueError(f"draft vocab_size ({draft.config.vocab_size}) must equal the target's "
                                 f"({target.config.vocab_size})")
            if config.max_model_len > draft.config.max_position_embeddings:
                raise ValueError("max_model_len exceeds the draft's max_position_embeddings")
            draft_cache = KVCache(draft.config, config.num_blocks, config.block_size, dtype, device)
            self.proposer = DraftModelProposer(ModelRunner(draft, draft_cache, use_cuda_graphs=config.use_cuda_graphs),
                                               self.max_blocks, seed=config.seed)
        elif config.proposer is ProposerKind.NGRAM:
            self.proposer = NgramProposer(config.k, config.ngram_min_n, config.ngram_max_n)
        self.sampler = RejectionSampler(config.k, seed=config.seed)
        eos = target.config.eos_token_ids
        self._eos = eos[0] if eos else None
        self.metrics = SpecDecodeMetrics(config.k)
        self.waiting: deque[SequenceState] = deque()
        self.running: list[SequenceState] = []
        self._next_id = 0

    # ----------------------------------------------------------------- requests
    def add_request(self, request: Request) -> SequenceState:
        need = len(request.prompt_token_ids) + request.max_tokens + self.config.k
        if need > self.config.max_model_len:
            raise ValueError(f"prompt ({len(request.prompt_token_ids)}) + max_tokens ({request.max_tokens}) + k "
                             f"({self.config.k}) exceeds max_model_len ({self.config.max_model_len})")
        if self.allocator.blocks_needed(need) > self.allocator.num_blocks:
            raise ValueError(f"the request needs {self.allocator.blocks_needed(need)} cache blocks, the cache has "
                             f"{self.allocator.num_blocks}")
        vocab = self.target.config.vocab_size
        if any(not 0 <= t < vocab for t in request.prompt_token_ids):
            raise ValueError(f"prompt_token_ids must lie in [0, vocab_size={vocab})")
        if request.stop_strings and self.tokenizer is None:
            raise ValueError("stop_strings need a tokenizer (the engine has none)")
        stop = StopParams(request.max_tokens, None if request.ignore_eos else self._eos, request.stop_strings)
        state = SequenceState(self._next_id, request, list(request.prompt_token_ids),
                              output=OutputProcessor(stop, self._decode, request.prompt_token_ids))
        self._next_id += 1
        self.waiting.append(state)
        return state

    def _decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True) if self.tokenizer is not None else ""

    def _admit(self) -> None:
        while self.waiting and len(self.running) < self.config.max_num_seqs:
            state = self.waiting[0]
            need = len(state.token_ids) + state.request.max_tokens + self.config.k
            if not self.allocator.can_hold(state.request_id, need):
                break
            state.block_table = self.allocator.reserve(state.request_id, need)
            self.running.append(self.waiting.popleft())

    @property
    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    # ----------------------------------------------------------------- one step
    def step(self) -> list[SequenceState]:
        """Run one step over the running requests; returns those that finished in it."""
        self._admit()
        states = self.running
        if not states:
            return []
        k = self.config.k
        allowance = [min(k, s.request.max_tokens - s.num_output_tokens - 1) for s in states]
        if self.proposer is not None and any(allowance):
            proposal = self.proposer.propose(states, allowance)
            drafts, draft_probs = proposal.draft_token_ids, proposal.draft_probs
        else:
            drafts, draft_probs = [[] for _ in states], None
        # With CUDA graphs, decode windows are padded to k + 1 so every step has one shape;
        # the padding rows' K/V lands past the sequence and is overwritten later.
        pad = self.scorer.runner.use_cuda_graphs and all(s.num_cached == len(s.token_ids) - 1 for s in states)
        chunks, draft_rows, bonus_rows, row = [], [], [], 0
        for s, d in zip(states, drafts):
            window = s.token_ids[s.num_cached:] + d + ([0] * (k - len(d)) if pad else [])
            num_logits = (k if pad else len(d)) + 1
            chunks.append(SequenceChunk(window, s.num_cached, s.block_table, num_logits))
            draft_rows.extend(range(row, row + len(d)))
            bonus_rows.append(row + len(d))
            row += num_logits
        logits = self.scorer.score(chunks, use_graph=pad)
        device = logits.device
        draft_ids = torch.tensor([t for d in drafts for t in d], dtype=torch.int64).to(device)
        out = self.sampler(
            logits[torch.tensor(draft_rows, dtype=torch.int64).to(device)],
            logits[torch.tensor(bonus_rows, dtype=torch.int64).to(device)],
            draft_ids, [len(d) for d in drafts], [s.request.sampling for s in states],
            [len(s.token_ids) for s in states], draft_probs,
        )
        token_rows, accepted = out.token_ids.tolist(), out.num_accepted.tolist()
        self.metrics.record([len(d) for d in drafts], accepted)
        finished = []
        for s, tokens, n in zip(states, token_rows, accepted):
            old_len = len(s.token_ids)
            s.num_cached = old_len + n  # through the last accepted draft; the final token is new
            emitted = tokens[: n + 1]
            s.output.append(emitted)
            kept = s.output.output.token_ids[s.num_output_tokens:]
            s.token_ids.extend(kept)
            s.sources.extend(([TokenSource.DRAFT] * n + [TokenSource.TARGET])[: len(kept)])
            if self.proposer is not None:
                self.proposer.on_verified(s, n)
            if s.finished:
                finished.append(s)
                self.allocator.free(s.request_id)
        self.running = [s for s in states if not s.finished]
        return finished

    def generate(self, requests: Sequence[Request],
                 on_step: Callable[[SpecDecodeEngine], None] | None = None) -> list[SequenceState]:
        """Run requests to completion; returns their states in the order given."""
        states = [self.add_request(r) for r in requests]
        while self.has_unfinished:
            self.step()
            if on_step is not None:
                on_step(self)
        return states
