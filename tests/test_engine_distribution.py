"""The law of the first sampled token of speculative decoding is the target's: thousands of
seeded requests of one prompt through the engine (draft model proposing from its own,
different law), their first output tokens against ``softmax(target logits)``."""

from __future__ import annotations

import pytest
import torch
from distribution_harness import tv_bound
from engine_models import VOCAB, save_tiny_llama

from specops.engine.checkpoint import load_model
from specops.engine.kv_cache import KVCache, SequenceChunk, build_attention_batch
from specops.engine.rejection_sampler import SamplingParams
from specops.engine.request import Request
from specops.engine.spec_decode import EngineConfig, SpecDecodeEngine

NUM_SAMPLES = 4000
PROMPT = (3, 14, 15, 92, 65, 35)


def next_token_law(model, temperature: float, top_k: int = 0) -> torch.Tensor:
    cache = KVCache(model.config, 4, 8, torch.float32, "cpu")
    batch = build_attention_batch([SequenceChunk(PROMPT, 0, [0], 1)], 8, 1, "cpu")
    logits = model(batch, cache)[0].double() / temperature
    if top_k:
        logits[logits < logits.topk(top_k).values[-1]] = float("-inf")
    return torch.softmax(logits, dim=-1)


@pytest.mark.parametrize("scorer", ["paged-verify", "batch-expansion"])
def test_first_sampled_token_follows_the_target(tmp_path, scorer):
    target = load_model(save_tiny_llama(tmp_path / "t", seed=0)).model
    draft = load_model(save_tiny_llama(tmp_path / "d", seed=5, num_layers=1, hidden=32, num_heads=2,
                                       num_kv_heads=1)).model
    # The target keeps its top 8 tokens (few categories: a tight bound); the draft proposes
    # from its whole law, so drafts outside them are always rejected and recovered.
    temperature, top_k = 1.0, 8
    p, q = next_token_law(target, temperature, top_k), next_token_law(draft, temperature)
    # k = 2 drafts may be proposed (max_tokens 3): the first token is an accepted draft or a recovered one.
    requests = [Request(PROMPT, max_tokens=3, sampling=SamplingParams(temperature=temperature, top_k=top_k, seed=i))
                for i in range(NUM_SAMPLES)]
    engine = SpecDecodeEngine(target, EngineConfig(proposer="draft", k=2, scorer=scorer, block_size=8,
                                                   num_blocks=1100, max_num_seqs=1000, max_model_len=16),
                              draft=draft)
    states = engine.generate(requests)
    first = torch.tensor([s.output_token_ids[0] for s in states])
    empirical = torch.bincount(first, minlength=VOCAB).double() / NUM_SAMPLES
    bound = tv_bound(int((p > 1e-9).sum()), NUM_SAMPLES)
    assert 0 < engine.metrics.acceptance_rate < 1  # both branches (accept, recover) were taken
    assert 0.5 * (empirical - p).abs().sum() <= bound
    # The test has power: the draft's own law is far outside the bound.
    assert 0.5 * (empirical - q).abs().sum() > 2 * bound
