"""specops.engine.RejectionSampler: the engine-facing module around verify, its metrics,
seeding, and the losslessness of its step (C++ CPU kernel, many copies)."""

from __future__ import annotations

import pytest
import torch
from distribution_harness import assert_follows

from specops.engine.rejection_sampler import RejectionSampler, SamplingParams
from specops.reference.verify import processed_probs


def _step_inputs(num_draft_tokens, vocab, seed):
    g = torch.Generator().manual_seed(seed)
    t = sum(num_draft_tokens)
    target = torch.randn(t, vocab, generator=g) * 2
    q = torch.softmax(target + torch.randn(t, vocab, generator=g), -1)
    drafts = torch.multinomial(q, 1, generator=g).squeeze(-1).int() if t else torch.zeros(0, dtype=torch.int32)
    return target, torch.randn(len(num_draft_tokens), vocab, generator=g), drafts, q


def test_metrics_count_drafts_and_acceptances():
    counts = [3, 0, 2, 4]
    target, bonus, drafts, q = _step_inputs(counts, 50, seed=0)
    sampler = RejectionSampler(max_spec_len=4)
    params = [SamplingParams(temperature=0.8, seed=i) for i in range(4)]
    out = sampler(target, bonus, drafts, counts, params, positions=[5, 9, 0, 100], draft_probs=q)
    accepted = out.num_accepted
    assert (accepted <= torch.tensor(counts, dtype=torch.int32)).all()
    emitted = (out.token_ids != -1).sum(1)
    assert emitted.tolist() == (accepted + 1).tolist()
    m = out.metrics
    assert int(m.num_draft_tokens) == 9 and int(m.num_accepted_tokens) == int(accepted.sum())
    assert int(m.num_emitted_tokens) == int(emitted.sum())
    assert m.drafts_per_position.tolist() == [3, 3, 2, 1]
    expected = [sum(int(a) > j for a in accepted) for j in range(4)]
    assert m.accepted_per_position.tolist() == expected
    assert 0 <= m.acceptance_rate <= 1


def test_greedy_requests_emit_the_argmax():
    counts = [2, 3]
    target, bonus, drafts, _ = _step_inputs(counts, 30, seed=1)
    drafts[:] = target.argmax(-1).int()
    drafts[3] = (drafts[3] + 1) % 30  # request 1 mismatches at its second draft
    out = RejectionSampler(max_spec_len=3)(target, bonus, drafts, counts, [SamplingParams(temperature=0)] * 2,
                                           positions=[0, 0])
    argmax = target.argmax(-1).tolist()
    assert out.token_ids.tolist() == [argmax[:2] + [int(bonus[0].argmax()), -1], argmax[2:4] + [-1, -1]]
    assert out.num_accepted.tolist() == [2, 1]


def test_seeded_requests_repeat_and_unseeded_requests_use_the_sampler_seed():
    counts = [3, 3]
    target, bonus, drafts, q = _step_inputs(counts, 200, seed=2)
    seeded = [SamplingParams(temperature=1.0, seed=7)] * 2
    a = RejectionSampler(3)(target, bonus, drafts, counts, seeded, [4, 4], q)
    b = RejectionSampler(3)(target, bonus, drafts, counts, seeded, [4, 4], q)
    assert torch.equal(a.token_ids, b.token_ids)
    unseeded = [SamplingParams(temperature=1.0)] * 2
    c = RejectionSampler(3, seed=1)(target, bonus, drafts, counts, unseeded, [4, 4], q)
    d = RejectionSampler(3, seed=1)(target, bonus, drafts, counts, unseeded, [4, 4], q)
    assert torch.equal(c.token_ids, d.token_ids)


def test_bad_parameters_raise():
    with pytest.raises(ValueError, match="temperature"):
        SamplingParams(temperature=-1)
    with pytest.raises(ValueError, match="top_p"):
        SamplingParams(top_p=0)
    with pytest.raises(ValueError, match="top_k"):
        SamplingParams(top_k=-3)
    target, bonus, drafts, _ = _step_inputs([1], 10, seed=3)
    with pytest.raises(ValueError, match="same requests"):
        RejectionSampler(2)(target, bonus, drafts, [1], [SamplingParams()] * 2, [0])


@pytest.mark.parametrize("ngram", [False, True], ids=["draft", "ngram"])
def test_step_is_lossless_with_temperature_top_k_top_p(ngram):
    """60000 copies of one request, V = 8, k = 2, through the C++ CPU kernel: the first
    token follows the processed p_1, the count accepted its exact law."""
    vocab, k, copies = 8, 2, 60_000
    g = torch.Generator().manual_seed(10)
    target = torch.randn(k, vocab, generator=g) * 1.5
    q = torch.softmax(torch.randn(k, vocab, generator=g), -1)
    params = SamplingParams(temperature=0.7, top_k=6, top_p=0.85)
    p = torch.stack([processed_probs(r, params.temperature, params.top_k, params.top_p) for r in target]).double()
    if ngram:
        drafts = torch.tensor([int(p[0].argmax()), int(q[1].argmax())], dtype=torch.int32).repeat(copies)
        q_law = torch.nn.functional.one_hot(drafts[:k].long(), vocab).double()
    else:
        drafts = torch.multinomial(q, copies, replacement=True, generator=g).t().reshape(-1).int()
        q_law = q.double()
    out = RejectionSampler(k, seed=0)(
        target.repeat(copies, 1), torch.randn(1, vocab, generator=g).repeat(copies, 1), drafts, [k] * copies,
        [params] * copies, list(range(copies)), None if ngram else q.repeat(copies, 1),
    )
    assert_follows(out.token_ids[:, 0], p[0], "first token")
    alpha = torch.minimum(p, q_law).sum(-1)
    law = torch.stack([1 - alpha[0], alpha[0] * (1 - alpha[1]), alpha[0] * alpha[1]])
    assert_follows(out.num_accepted, law, "number accepted")
