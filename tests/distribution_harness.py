"""Harness of the distribution tests: the sample-count tolerance, the fixed target and
draft distributions, their exact laws, and one speculative step run from the ops
(tests/test_sampling_distribution.py holds the tests and says what they check)."""

from __future__ import annotations

import enum
import fcntl
import functools
import itertools
import math
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from conftest import backend_params

import specops
from specops.backend import Backend

DELTA = 1e-6  # chance that one correct-sampler check fails (before the seeds fix it)


def tv_bound(num_categories: int, num_samples: int, delta: float = DELTA) -> float:
    """Total-variation distance that the empirical law of ``num_samples`` i.i.d. draws
    from a law on ``num_categories`` categories stays under with probability ``1 - delta``:

        TV <= 0.5 * sqrt((K - 1) / N) + sqrt(ln(1 / delta) / (2 N)).

    Derivation, for a law ``p`` on ``K`` categories and the empirical law ``p_hat`` of
    ``N`` draws, ``TV = 0.5 * sum_v |p_hat_v - p_v|``:

    1. Mean. ``N p_hat_v ~ Binomial(N, p_v)``, so by Jensen
       ``E|p_hat_v - p_v| <= sqrt(Var p_hat_v) = sqrt(p_v (1 - p_v) / N)``. By
       Cauchy-Schwarz ``sum_v sqrt(p_v (1 - p_v)) <= sqrt(K sum_v p_v (1 - p_v))
       = sqrt(K (1 - sum_v p_v^2)) <= sqrt(K - 1)``, as ``sum_v p_v^2 >= 1 / K``.
       Hence ``E TV <= 0.5 * sqrt((K - 1) / N)``.
    2. Concentration. TV is a function of ``N`` independent draws, and changing one draw
       moves mass ``1 / N`` between two categories, so TV changes by at most ``1 / N``.
       McDiarmid: ``P(TV - E TV >= t) <= exp(-2 t^2 / (N (1 / N)^2)) = exp(-2 N t^2)``,
       which is ``delta`` at ``t = sqrt(ln(1 / delta) / (2 N))``.

    ``K`` counts the categories of positive probability: a correct sampler never draws the
    others (the tests check that separately, exactly), so they add nothing to the mean.
    For a conditional law (say, the token at the first rejection), ``N`` is the number of
    copies in the conditioning event: given which copies fall in it, their tokens are
    i.i.d. draws from the conditional law, so the bound holds given ``N``.
    """
    if num_samples == 0:
        return 1.0
    mean = 0.5 * math.sqrt(max(num_categories - 1, 0) / num_samples)
    return mean + math.sqrt(math.log(1.0 / delta) / (2 * num_samples))


def tv_distance(samples: torch.Tensor, law: torch.Tensor) -> tuple[float, float]:
    """``(TV(empirical law of samples, law), tv_bound)``; samples are category indices."""
    samples = samples.long()  # [N]
    assert samples.numel() == 0 or (samples.min() >= 0 and samples.max() < law.numel()), "category out of range"
    counts = torch.bincount(samples, minlength=law.numel()).double()
    empirical = counts / max(samples.numel(), 1)
    tv = 0.5 * float((empirical - law).abs().sum()) if samples.numel() else 0.0
    return tv, tv_bound(int((law > 0).sum()), samples.numel())


def assert_follows(samples: torch.Tensor, law: torch.Tensor, what: str) -> None:
    """Samples never land on a category of probability 0 (exactly), and their empirical
    law is within :func:`tv_bound` of ``law`` in total variation."""
    samples = samples.long()
    law = law.double().flatten()
    impossible = samples[law[samples.clamp(0, law.numel() - 1)] == 0]
    assert impossible.numel() == 0, f"{what}: drew categories of probability 0: {impossible.unique().tolist()}"
    tv, bound = tv_distance(samples, law)
    assert tv <= bound, f"{what}: TV {tv:.4f} > bound {bound:.4f} over {samples.numel()} samples"


# ---- the fixed distributions --------------------------------------------------------


@dataclass(frozen=True)
class Scenario:
    """Fixed ``p_1..p_{k+1}`` and ``q_1..q_k``, float32 as the kernels take them."""

    target_probs: torch.Tensor  # [k + 1, V] float32: p_1..p_k, then p_{k+1} for the bonus
    draft_probs: torch.Tensor  # [k, V] float32: q_1..q_k

    @property
    def k(self) -> int:
        return self.draft_probs.shape[0]

    @property
    def vocab(self) -> int:
        return self.draft_probs.shape[1]


def _random_probs(rows: int, vocab: int, generator: torch.Generator) -> torch.Tensor:
    """``[rows, V]`` Dirichlet(1, ..., 1) draws (normalised Exp(1) draws), float64."""
    weights = torch.empty(rows, vocab, dtype=torch.float64).exponential_(generator=generator)
    return weights / weights.sum(dim=-1, keepdim=True)


def _zero_out(probs: torch.Tensor, zeros: torch.Tensor) -> torch.Tensor:
    """``probs`` ([rows, V]) set to exactly 0 at ``zeros`` ([rows, z] ids), renormalised."""
    probs = probs.scatter(1, zeros, 0.0)
    return probs / probs.sum(dim=-1, keepdim=True)


def make_scenario(vocab: int, k: int, seed: int) -> Scenario:
    """``q_i`` is half ``p_i``, half an unrelated law, then zeroed on a few tokens. At every
    position the draft proposes tokens the target forbids (``p = 0 < q``), the residual
    covers tokens the draft never proposes (``q = 0 < p``), and ``alpha_i`` is moderate."""
    generator = torch.Generator().manual_seed(seed)
    num_zeros = vocab // 4
    order = torch.rand(k + 1, vocab, generator=generator).argsort(dim=-1)  # two disjoint zero sets per row
    target = _zero_out(_random_probs(k + 1, vocab, generator), order[:, :num_zeros])
    mixed = 0.5 * target[:k] + 0.5 * _random_probs(k, vocab, generator)
    draft = _zero_out(mixed, order[:k, num_zeros : 2 * num_zeros])
    scenario = Scenario(target.float(), draft.float())

    p, q = as_law(scenario.target_probs)[:k], as_law(scenario.draft_probs)
    alpha = torch.minimum(p, q).sum(dim=-1)
    assert ((p == 0) & (q > 0)).any(dim=-1).all(), "every position should draft a token the target forbids"
    assert ((q == 0) & (p > 0)).any(dim=-1).all(), "every position should have residual the draft never proposes"
    assert ((alpha > 0.3) & (alpha < 0.85)).all(), f"acceptance rates {alpha.tolist()} should be moderate"
    return scenario


def as_law(probs: torch.Tensor) -> torch.Tensor:
    probs = probs.double()
    return probs / probs.sum(dim=-1, keepdim=True)


# Vocab sizes a power of two (8) and not (13), so a kernel's vocab block is full or masked.
SCENARIOS = {
    "V8-k2": functools.partial(make_scenario, vocab=8, k=2, seed=1234),
    "V13-k3": functools.partial(make_scenario, vocab=13, k=3, seed=4321),
}


@functools.cache
def scenario(name: str) -> Scenario:
    return SCENARIOS[name]()


# ---- exact laws ----------------------------------------------------------------------


@dataclass(frozen=True)
class Laws:
    """Exact laws of one speculative step, float64, from the probabilities the ops see.

    ``draft`` is ``q`` as the accept rule reads it: the draft probs, or one-hot on the
    drafted token for n-gram drafts (``u * 1 < p(x)`` accepts with probability ``p(x)``,
    and ``max(p - one_hot(x), 0)`` is ``p`` with ``x`` removed: the n-gram residual).
    """

    target: torch.Tensor  # [k + 1, V]
    draft: torch.Tensor  # [k, V]

    @property
    def k(self) -> int:
        return self.draft.shape[0]

    @functools.cached_property
    def overlap(self) -> torch.Tensor:  # [k, V]: min(p_i, q_i), accepted mass per token
        return torch.minimum(self.target[: self.k], self.draft)

    @functools.cached_property
    def alpha(self) -> torch.Tensor:  # [k]: acceptance probability per position
        return self.overlap.sum(dim=-1)

    @functools.cached_property
    def leftover(self) -> torch.Tensor:  # [k, V]: max(p_i - q_i, 0), sums to 1 - alpha_i
        return (self.target[: self.k] - self.draft).clamp_min(0)

    def accepted_count(self) -> torch.Tensor:  # [k + 1]: P(A = i)
        reach = torch.cat([self.alpha.new_ones(1), torch.cumprod(self.alpha, dim=0)])  # P(A >= i)
        return reach - torch.cat([reach[1:], reach.new_zeros(1)])

    def emitted_at_stop(self, i: int) -> torch.Tensor:  # [V]: the last token, given A = i
        if i == self.k:
            return self.target[self.k]
        return self.leftover[i] / self.leftover[i].sum()

    def accepted_token(self, j: int) -> torch.Tensor:  # [V]: the token at j, given A > j
        return self.overlap[j] / self.alpha[j]

    def output_row(self) -> torch.Tensor:
        """``[(V + 1) ** (k + 1)]``: the law of the whole output row, coded by
        :func:`encode_rows`. A row ``(x_1..x_i, y, -1, ...)`` has probability
        ``prod_{j <= i} min(p_j, q_j)(x_j)`` times ``max(p_{i+1} - q_{i+1}, 0)(y)``
        (``i < k``) or ``p_{k+1}(y)`` (``i = k``)."""
        vocab = self.draft.shape[1]
        law = torch.zeros((vocab + 1) ** (self.k + 1), dtype=torch.float64)
        for accepted in range(self.k + 1):
            last = self.target[self.k] if accepted == self.k else self.leftover[accepted]
            for prefix in itertools.product(range(vocab), repeat=accepted):
                prob = math.prod(float(self.overlap[j, x]) for j, x in enumerate(prefix))
                if prob == 0:
                    continue
                for y in range(vocab):
                    row = list(prefix) + [y] + [-1] * (self.k - accepted)
                    law[encode_rows(torch.tensor([row]), vocab)] += prob * float(last[y])
        return law


def encode_rows(rows: torch.Tensor, vocab: int) -> torch.Tensor:
    """``[N, W]`` token rows (``-1`` padded) to one category index each, base ``V + 1``."""
    digits = torch.where(rows < 0, vocab, rows).long()
    weights = (vocab + 1) ** torch.arange(rows.shape[1], dtype=torch.long)
    return (digits * weights).sum(dim=-1)


# ---- one speculative step from the ops -----------------------------------------------


def interpreted(device: str, backend: Backend) -> bool:
    """Triton on CPU tensors: the interpreter, which runs one program at a time in Python."""
    return device == "cpu" and backend is Backend.TRITON


# The interpreter costs about 15 ms per copy and step on a 2-core machine, so it runs one
# case with few copies; the C++ CPU backend and GPUs run every case, and the exact-equality
# tests cover the rest of Triton. A kernel's work per program may grow with the batch (the
# Triton race finds each token's request by scanning cu_num_draft_tokens), so the
# interpreter and GPUs launch the copies in batches of a bounded size: the law is the same.
INTERPRETER_COPIES = 1_500
INTERPRETER_CASES = {("V8-k2", "draft-model")}
LAUNCH_COPIES = {"interpreter": 250, "cuda": 16_384}


def num_copies(device: str, backend: Backend) -> int:
    """Samples per step: the C++ CPU kernels take 10^5 copies in a fraction of a second,
    a GPU takes 10^6."""
    if device == "cuda":
        return 1_000_000
    return INTERPRETER_COPIES if interpreted(device, backend) else 100_000


def copies_per_launch(device: str, backend: Backend) -> int | None:
    if interpreted(device, backend):
        return LAUNCH_COPIES["interpreter"]
    return LAUNCH_COPIES.get(device)


def speculative_step(
    target_probs: torch.Tensor,  # [k + 1, V] float32
    draft_probs: torch.Tensor | None,  # [k, V] float32; None: n-gram drafts
    draft_token_ids: torch.Tensor,  # [N, k] int64, one row of drafts per copy
    generator: torch.Generator,
    device: str,
    backend: Backend,
    *,
    recovery_probs: torch.Tensor | None = None,  # [k, V]: replaces draft_probs in the race
    accept_target_probs: torch.Tensor | None = None,  # [k, V]: replaces p in the accept rule
) -> torch.Tensor:  # [N, k + 1] int64: emitted tokens, -1 padded
    """One verification step for ``N`` copies of one request (batch ``N``, ``k`` drafts
    each), every draw from ``generator`` on the CPU so every device sees the same draws.
    The two replacements exist only to build wrong samplers for the negative control."""
    copies, k = draft_token_ids.shape
    vocab = target_probs.shape[1]
    uniforms = torch.rand(copies, k, generator=generator)  # U[0, 1)
    exponentials = torch.empty(copies, vocab).exponential_(generator=generator)  # Exp(1)
    bonus = torch.multinomial(target_probs[k].double(), copies, replacement=True, generator=generator)
    rows = (
        target_probs[:k],
        draft_probs,
        recovery_probs if recovery_probs is not None else draft_probs,
        accept_target_probs if accept_target_probs is not None else target_probs[:k],
    )

    launch = copies_per_launch(device, backend) or copies
    out = torch.cat([
        _launch(*rows, *(t[begin : begin + launch] for t in (draft_token_ids, uniforms, exponentials, bonus)),
                device=device, backend=backend)
        for begin in range(0, copies, launch)
    ])
    emitted = out >= 0
    assert emitted[:, 0].all(), "every row emits at least one token"
    assert torch.equal(emitted, emitted.int().cummin(dim=1).values.bool()), "-1 padding only after the last token"
    assert out.min() >= -1 and out.max() < vocab, "token ids outside the vocab"
    return out


def _launch(
    target_rows: torch.Tensor,  # [k, V] p_1..p_k
    draft_rows: torch.Tensor | None,  # [k, V] q_1..q_k, None for n-gram drafts
    race_draft_rows: torch.Tensor | None,  # [k, V] q as sample_recovered_tokens sees it
    accept_target_rows: torch.Tensor,  # [k, V] p as rejection_random_sample sees it
    draft_token_ids: torch.Tensor,  # [n, k]
    uniforms: torch.Tensor,  # [n, k]
    exponentials: torch.Tensor,  # [n, V]
    bonus_token_ids: torch.Tensor,  # [n]
    *,
    device: str,
    backend: Backend,
) -> torch.Tensor:  # [n, k + 1] int64
    """The two ops on ``n`` copies, laid out as ``n`` requests of ``k`` drafts."""
    copies, k = draft_token_ids.shape

    def per_token(rows: torch.Tensor | None) -> torch.Tensor | None:  # [k, V] -> [n * k, V]
        return None if rows is None else rows.repeat(copies, 1).to(device)

    cu_num_draft_tokens = torch.arange(1, copies + 1, dtype=torch.int32, device=device) * k  # [n]
    drafts = draft_token_ids.contiguous().view(-1).to(device)  # [n * k]
    recovered = specops.sample_recovered_tokens(
        cu_num_draft_tokens, drafts, per_token(race_draft_rows), per_token(target_rows),
        exponentials.to(device), backend=backend,
    )
    out = torch.full((copies, k + 1), -7, dtype=torch.int32, device=device)  # the op writes every cell
    specops.rejection_random_sample(
        out, cu_num_draft_tokens, drafts, per_token(draft_rows), per_token(accept_target_rows),
        bonus_token_ids.to(device), recovered, uniforms.contiguous().view(-1).to(device), backend=backend,
    )
    return out.cpu().long()


def accepted_counts(out: torch.Tensor) -> torch.Tensor:  # [N]: A, drafts accepted per row
    return (out >= 0).sum(dim=1) - 1


def sample_drafts(draft_probs: torch.Tensor, copies: int, generator: torch.Generator) -> torch.Tensor:
    """``[N, k]``: each copy's drafts, ``x_i ~ q_i`` independently (the ``q_i`` do not
    depend on earlier tokens, so this is the law of a sequential draft chain)."""
    return torch.multinomial(draft_probs.double(), copies, replacement=True, generator=generator).T.contiguous()


def ngram_drafts(s: Scenario) -> torch.Tensor:
    """``[k]``: the target's argmax at every position but the last, and there a token the
    target forbids (always rejected, so ``A = k`` never happens)."""
    p = s.target_probs[: s.k]
    drafts = p.argmax(dim=-1)
    drafts[-1] = int((p[-1] == 0).nonzero()[0])
    return drafts


class Mode(enum.Enum):
    DRAFT_MODEL = "draft-model"  # draft probs given, x_i ~ q_i
    NGRAM_FIXED = "ngram-fixed"  # no draft probs, one fixed draft sequence for every copy
    NGRAM_SAMPLED = "ngram-sampled"  # no draft probs, x_i ~ q_i unseen by the ops


@dataclass(frozen=True)
class Run:
    laws: Laws | None  # None for NGRAM_SAMPLED: the ops see a different one-hot q per copy
    drafts: torch.Tensor  # [N, k]
    out: torch.Tensor  # [N, k + 1]


def _mode_inputs(s: Scenario, mode: Mode, copies: int, generator: torch.Generator, position: int):
    """Drafts ``[N, k - position]`` and the draft probs the ops get, from ``position``."""
    if mode is Mode.NGRAM_FIXED:
        return ngram_drafts(s)[position:].expand(copies, -1), None
    drafts = sample_drafts(s.draft_probs[position:], copies, generator)
    return drafts, s.draft_probs[position:] if mode is Mode.DRAFT_MODEL else None


def shared_by_workers(name: str, compute) -> torch.Tensor:
    """``compute()``, computed once per test run by whichever pytest-xdist worker asks first
    and read back by the others (the run's files, keyed by its id: never a stale result of
    an earlier run); without xdist, simply ``compute()``. A failing ``compute`` stores nothing,
    so every worker that asks fails the same way."""
    run_id = os.environ.get("PYTEST_XDIST_TESTRUNUID")
    if run_id is None:
        return compute()
    path = Path(tempfile.gettempdir()) / f"specops-tests-{run_id}" / f"{name}.pt"
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.with_suffix(".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another worker computing it: wait for its result
        if path.exists():
            return torch.load(path)
        value = compute()
        torch.save(value, path.with_suffix(".tmp"))
        os.replace(path.with_suffix(".tmp"), path)
        return value


@functools.cache
def run(scenario_name: str, mode: Mode, device: str, backend: Backend) -> Run:
    """One step from position 1, shared by the tests of one (scenario, mode, backend): the
    interpreter's (tens of seconds) by the xdist workers too, not computed once by each
    worker that runs one of them."""
    s = scenario(scenario_name)
    copies = num_copies(device, backend)
    generator = torch.Generator().manual_seed(1000 * list(Mode).index(mode) + s.vocab)
    drafts, draft_probs = _mode_inputs(s, mode, copies, generator, 0)

    def step() -> torch.Tensor:
        return speculative_step(s.target_probs, draft_probs, drafts, generator, device, backend)

    name = f"step-{scenario_name}-{mode.value}-{device}-{backend.value}"  # the cache key of run() whole
    out = shared_by_workers(name, step) if interpreted(device, backend) else step()
    if mode is Mode.NGRAM_SAMPLED:
        return Run(None, drafts, out)
    if mode is Mode.NGRAM_FIXED:
        law_draft = torch.nn.functional.one_hot(ngram_drafts(s), s.vocab).double()
    else:
        law_draft = as_law(s.draft_probs)
    return Run(Laws(as_law(s.target_probs), law_draft), drafts, out)


@functools.cache
def following_step(scenario_name: str, mode: Mode, device: str, backend: Backend) -> torch.Tensor:
    """``[N, k]``: an independent step from position 2 (``k - 1`` drafts, bonus from
    ``p_{k+1}``): what the engine runs next for copies whose first step emitted one token."""
    s = scenario(scenario_name)
    generator = torch.Generator().manual_seed(1000 * list(Mode).index(mode) + s.vocab + 500)
    drafts, draft_probs = _mode_inputs(s, mode, num_copies(device, backend), generator, 1)
    return speculative_step(s.target_probs[1:], draft_probs, drafts, generator, device, backend)


def cases(scenario_names, modes, *, on_interpreter: bool = True) -> list:
    """(device, backend, scenario, mode) params; the interpreter gets INTERPRETER_CASES
    only, or none with ``on_interpreter=False``."""
    params = []
    for backend_param in backend_params():
        device, backend = backend_param.values
        for name, mode in itertools.product(scenario_names, modes):
            if interpreted(device, backend) and (not on_interpreter or (name, mode.value) not in INTERPRETER_CASES):
                continue
            params.append(
                pytest.param(device, backend, name, mode, id=f"{backend_param.id}-{name}-{mode.value}",
                             marks=backend_param.marks)
            )
    return params
