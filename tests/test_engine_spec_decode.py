"""End to end speculative decoding: lossless against target-only decoding (greedy, token
for token, both proposers, both scorers), seeded reproducibility, per-request proposal
lengths, stop conditions across several tokens per step, and metrics."""

from __future__ import annotations

import pytest
from conftest import HAS_CUDA
from engine_models import repetitive_prompt, save_tiny_llama

from specops.engine.checkpoint import load_model
from specops.engine.rejection_sampler import SamplingParams
from specops.engine.request import Request, TokenSource
from specops.engine.spec_decode import EngineConfig, SpecDecodeEngine

DEVICES = ["cpu"] + ([pytest.param("cuda", marks=pytest.mark.gpu)] if HAS_CUDA else [])
CACHE = {"block_size": 4, "num_blocks": 120, "max_model_len": 128}


@pytest.fixture(scope="module")
def pair_dirs(tmp_path_factory):
    target = save_tiny_llama(tmp_path_factory.mktemp("target"), seed=0, num_layers=2)
    draft = save_tiny_llama(tmp_path_factory.mktemp("draft"), seed=0, num_layers=1, hidden=32, num_heads=2,
                            num_kv_heads=1)
    return target, draft


def models(pair_dirs, device="cpu"):
    return (load_model(d, device=device).model for d in pair_dirs)


def prompts():
    return [repetitive_prompt(seed, n) for seed, n in ((0, 21), (1, 9), (2, 33), (3, 4), (4, 15))]


def run(target, requests, draft=None, **config):
    engine = SpecDecodeEngine(target, EngineConfig(**{**CACHE, **config}), draft=draft)
    states = engine.generate(requests)
    return [s.output_token_ids for s in states], engine, states


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("proposer, k, scorer", [
    ("draft", 3, "paged-verify"), ("draft", 1, "batch-expansion"),
    ("ngram", 4, "paged-verify"), ("ngram", 2, "batch-expansion"),
])
def test_greedy_spec_decoding_equals_target_alone(pair_dirs, device, proposer, k, scorer):
    target, draft = models(pair_dirs, device)
    requests = [Request(tuple(p), max_tokens=20) for p in prompts()]
    expected, _, _ = run(target, requests, max_num_seqs=3)
    got, engine, states = run(target, requests, draft=draft, proposer=proposer, k=k, scorer=scorer, max_num_seqs=3)
    assert got == expected
    m = engine.metrics
    assert m.num_draft_tokens > 0 and m.num_accepted_tokens > 0  # drafts were proposed and some accepted
    assert sum(s.sources.count(TokenSource.DRAFT) for s in states) == m.num_accepted_tokens


def test_draft_equal_to_target_accepts_everything(pair_dirs):
    target, _ = models(pair_dirs)
    requests = [Request(tuple(p), max_tokens=13, sampling=SamplingParams(temperature=t, seed=i))
                for i, (p, t) in enumerate(zip(prompts(), (0.0, 1.0, 0.7, 0.0, 1.0)))]
    _, engine, states = run(target, requests, draft=target, proposer="draft", k=4)
    m = engine.metrics
    assert m.acceptance_rate == 1.0 and m.per_position_acceptance == [1.0] * 4
    # 13 tokens in steps of 5: 5, 5, then 3 (two drafts allowed by max_tokens, both accepted).
    assert all(len(s.output_token_ids) == 13 for s in states)
    assert m.num_steps == 3 and m.num_emitted_tokens == 5 * 13
    assert m.system_efficiency == pytest.approx(65 / (15 * 5))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("proposer", ["draft", "ngram"])
def test_seeded_sampling_is_reproducible_and_batch_independent(pair_dirs, proposer, device):
    target, draft = models(pair_dirs, device)
    sampling = [SamplingParams(temperature=0.9, seed=100 + i) for i in range(5)]
    requests = [Request(tuple(p), max_tokens=16, sampling=s) for p, s in zip(prompts(), sampling)]
    first, _, _ = run(target, requests, draft=draft, proposer=proposer, k=3)
    again, _, _ = run(target, requests, draft=draft, proposer=proposer, k=3, seed=7)
    alone, _, _ = run(target, requests[2:3], draft=draft, proposer=proposer, k=3)
    assert first == again and alone == first[2:3]
    other = [Request(r.prompt_token_ids, 16, SamplingParams(temperature=0.9, seed=200 + i))
             for i, r in enumerate(requests)]
    assert run(target, other, draft=draft, proposer=proposer, k=3)[0] != first


def test_max_tokens_cuts_a_multi_token_step(pair_dirs):
    target, _ = models(pair_dirs)
    requests = [Request(tuple(p), max_tokens=7) for p in prompts()]
    expected, _, _ = run(target, requests)
    got, _, _ = run(target, requests, draft=target, proposer="draft", k=4)
    assert got == expected and all(len(g) == 7 for g in got)


class LetterTokenizer:
    """Token id -> one letter: enough to test stop strings without a tokenizer file."""

    def decode(self, ids, skip_special_tokens=True):
        return "".join(chr(ord("a") + i % 26) for i in ids)


def test_eos_and_stop_strings_end_inside_a_step(pair_dirs, tmp_path):
    base, _ = models(pair_dirs)
    prompt = tuple(prompts()[0])
    free, _, _ = run(base, [Request(prompt, max_tokens=20)])
    eos = free[0][9]
    first = free[0].index(eos)
    # The same weights with an EOS id: generation ends at its first occurrence, EOS kept.
    eos_dir = save_tiny_llama(tmp_path, seed=0, num_layers=2, eos_token_id=eos)
    target = load_model(eos_dir).model
    for config in ({}, {"proposer": "draft", "k": 4}):
        got, _, states = run(target, [Request(prompt, max_tokens=20)], draft=target, **config)
        assert got[0] == free[0][: first + 1] and states[0].finish_reason.value == "stop"
    text = LetterTokenizer().decode(free[0])
    stop = text[5:8]
    cut = text.index(stop)
    for config in ({}, {"proposer": "draft", "k": 4}):
        engine = SpecDecodeEngine(base, EngineConfig(**CACHE, **config), draft=base, tokenizer=LetterTokenizer())
        [state] = engine.generate([Request(prompt, max_tokens=20, stop_strings=(stop,))])
        assert state.text == text[:cut] and state.output_token_ids == free[0][: cut + len(stop)]


def test_zero_drafts_and_bad_requests(pair_dirs):
    target, draft = models(pair_dirs)
    # One token left: no drafts may be proposed for it (allowance 0), the step still emits one.
    got, engine, _ = run(target, [Request((1, 2, 3), max_tokens=1)], draft=draft, proposer="draft", k=3)
    assert len(got[0]) == 1 and engine.metrics.num_draft_tokens == 0
    engine = SpecDecodeEngine(target, EngineConfig(**CACHE))
    with pytest.raises(ValueError, match="max_model_len"):
        engine.add_request(Request((1,) * 100, max_tokens=40))
    with pytest.raises(ValueError, match="vocab_size"):
        engine.add_request(Request((1, 500)))
    with pytest.raises(ValueError, match="stop_strings need a tokenizer"):
        engine.add_request(Request((1,), stop_strings=("x",)))
    with pytest.raises(ValueError, match="needs a draft model"):
        SpecDecodeEngine(target, EngineConfig(**CACHE, proposer="draft", k=2))
    with pytest.raises(ValueError, match="k must be 0 with no proposer"):
        EngineConfig(k=2)


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA GPU")
@pytest.mark.parametrize("proposer, k, scorer", [
    ("none", 0, "paged-verify"), ("draft", 3, "paged-verify"), ("draft", 4, "batch-expansion"),
    ("ngram", 4, "paged-verify"),
])
def test_cuda_graph_replay_keeps_greedy_lossless(pair_dirs, proposer, k, scorer):
    """Decode/verify steps replayed from CUDA graphs (windows padded to k + 1, the draft's
    catch-up fixed at 2 tokens) emit exactly the eager target-only tokens (float32)."""
    target, draft = models(pair_dirs, "cuda")
    requests = [Request(tuple(p), max_tokens=24) for p in prompts()]
    expected, _, _ = run(target, requests, max_num_seqs=3)
    got, engine, _ = run(target, requests, draft=draft, proposer=proposer, k=k, scorer=scorer, max_num_seqs=3,
                         use_cuda_graphs=True)
    assert got == expected
    assert engine.scorer.runner.num_graphs >= 1
    if proposer == "draft":
        assert engine.proposer.runner.num_graphs >= 1


@pytest.mark.parametrize("proposer, k", [("draft", 3), ("ngram", 4)])
def test_graph_shaped_steps_stay_lossless_on_cpu(pair_dirs, proposer, k):
    """The step layout CUDA graphs use (verify windows padded to k + 1 with dummy drafts,
    the draft catching up on exactly 2 tokens), run eagerly: still target-alone tokens."""
    target, draft = models(pair_dirs)
    requests = [Request(tuple(p), max_tokens=20) for p in prompts()]
    expected, _, _ = run(target, requests, max_num_seqs=3)
    engine = SpecDecodeEngine(target, EngineConfig(**CACHE, proposer=proposer, k=k, max_num_seqs=3), draft=draft)
    runners = [engine.scorer.runner] + ([engine.proposer.runner] if proposer == "draft" else [])
    for runner in runners:
        runner.use_cuda_graphs, runner.max_graph_tokens = True, 0  # graph layout, eager execution
    states = engine.generate(requests)
    assert [s.output_token_ids for s in states] == expected
    assert engine.metrics.num_accepted_tokens > 0
