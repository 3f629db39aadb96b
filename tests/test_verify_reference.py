"""The reference of the fused ``verify`` op and its building blocks: the Philox generator
against its published known answers, the reproducible exp/log/exponential against float64,
top-k/top-p against their sort-based definitions, seeded determinism across batch
compositions, and losslessness of the step against exact laws (processed target
distribution with temperature, top-k and top-p)."""

from __future__ import annotations

import pytest
import torch
from distribution_harness import assert_follows
from fma_cases import fma_cases, fma_exact
from verify_inputs import make_inputs, select_requests

from specops.reference import philox
from specops.reference.repro_math import fma, repro_exp, repro_log
from specops.reference.verify import processed_probs, verify

# Random123's kat_vectors: counter[4], key[2] -> output[4].
PHILOX_KNOWN_ANSWERS = [
    ((0, 0, 0, 0), (0, 0), (0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8)),
    ((0xFFFFFFFF,) * 4, (0xFFFFFFFF,) * 2, (0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD)),
    (
        (0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344),
        (0xA4093822, 0x299F31D0),
        (0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1),
    ),
]


def test_philox_known_answers():
    counter = torch.tensor([c for c, _, _ in PHILOX_KNOWN_ANSWERS], dtype=torch.int64)
    key = torch.tensor([k for _, k, _ in PHILOX_KNOWN_ANSWERS], dtype=torch.int64)
    got = philox.philox4x32_10(counter, key).tolist()
    assert got == [list(out) for _, _, out in PHILOX_KNOWN_ANSWERS]


def test_philox_counters_separate_positions_and_purposes():
    seed = torch.tensor(-12345, dtype=torch.int64)  # negative seeds use their two's complement
    words = {
        (pos, purpose): tuple(
            philox.philox4x32_10(philox.counters(torch.tensor(pos), purpose, torch.tensor(0)), philox.keys(seed)).tolist()
        )
        for pos in (0, 1, 2**32, -1)
        for purpose in (philox.PURPOSE_ACCEPT, philox.PURPOSE_SAMPLE)
    }
    assert len(set(words.values())) == len(words)


def test_fma_rounds_once():
    """The reference's fma equals a * b + c rounded once (exact rationals) on random triples
    and on triples where rounding twice (float64, then float32) gives the other neighbour."""
    a, b, c, hard = fma_cases()
    expected = fma_exact(a, b, c)
    assert torch.equal(fma(a, b, c).view(torch.int32), expected.view(torch.int32))
    twice = (a.double() * b.double() + c.double()).float()
    assert not torch.equal(twice[-hard:], expected[-hard:])
    assert (twice[-hard:] != expected[-hard:]).all()  # each hard triple tells the two apart


def test_repro_exp_and_log_against_float64():
    x = -torch.rand(200_000, generator=torch.Generator().manual_seed(0)) * 40
    rel = (repro_exp(x).double() - torch.exp(x.double())).abs() / torch.exp(x.double())
    assert float(rel.max()) < 3e-6  # grows as |x| 2^-24 from the rounding of x log2(e)
    assert repro_exp(torch.tensor([0.0])).item() == 1.0
    assert repro_exp(torch.tensor([-200.0])).item() == 0.0
    u = torch.rand(200_000, generator=torch.Generator().manual_seed(1)).clamp(min=2**-24)
    assert float((repro_log(u).double() - torch.log(u.double())).abs().max()) < 2e-6


def _sorted_top_p_keep(p: torch.Tensor, top_p: float) -> torch.Tensor:
    """Tie-inclusive top-p by sorting, in float64: keep v when the mass strictly above p_v
    is below top_p."""
    p64 = p.double()
    return torch.tensor([float(p64[p64 > value].sum()) < top_p for value in p64])


@pytest.mark.parametrize("seed", range(5))
def test_processed_probs_top_k_top_p_keep_the_sorted_sets(seed):
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(300, generator=g) * 2
    logits[:40] = logits[40:80]  # ties
    top_k, top_p, temperature = 50, 0.7, 0.8
    p = processed_probs(logits, temperature, top_k, top_p)
    kth = torch.sort(logits, descending=True).values[top_k - 1]
    after_k = processed_probs(logits, temperature, top_k, 1.0)
    assert torch.equal(after_k > 0, logits >= kth)
    expected_keep = _sorted_top_p_keep(after_k, top_p) & (after_k > 0)
    assert torch.equal(p > 0, expected_keep)
    assert abs(float(p.double().sum()) - 1) < 1e-5
    kept = p > 0
    ratio = p[kept].double() / after_k[kept].double()
    assert float(ratio.max() - ratio.min()) < 1e-5  # renormalised, shape unchanged


def test_seeded_requests_do_not_depend_on_their_batch():
    inputs = make_inputs([3, 0, 4, 2, 1], 64, seed=3, greedy_fraction=0.2)
    full = verify(**inputs, max_spec_len=4, return_logprobs=True)
    for order in ([2], [4, 2, 0], [1, 3, 2, 4, 0]):
        part = verify(**select_requests(inputs, order), max_spec_len=4, return_logprobs=True)
        for got, expected in zip(part, full):
            torch.testing.assert_close(got, expected[order], rtol=0, atol=0)


def test_greedy_rows_take_the_argmax():
    inputs = make_inputs([3, 2], 40, seed=4, greedy_fraction=1.0)
    out, accepted, _ = verify(**inputs, max_spec_len=3)
    argmax = inputs["target_logits"].argmax(-1)
    inputs["draft_token_ids"][:] = argmax.int()  # every draft matches: bonus argmax follows
    out, accepted, _ = verify(**inputs, max_spec_len=3)
    assert accepted.tolist() == [3, 2]
    assert out[0].tolist() == argmax[:3].tolist() + [int(inputs["bonus_logits"][0].argmax())]


def test_non_finite_logits_get_probability_zero():
    logits = torch.tensor([1.0, float("nan"), 2.0, float("inf"), float("-inf"), 0.5])
    p = processed_probs(logits, 1.0, 0, 1.0)
    assert p[[1, 3, 4]].tolist() == [0.0, 0.0, 0.0] and abs(float(p.sum()) - 1) < 1e-6
    none_finite = processed_probs(torch.tensor([float("nan"), float("inf")]), 0.7, 0, 0.9)
    assert none_finite.tolist() == [1.0, 0.0]


def test_one_step_is_lossless_with_temperature_top_k_top_p():
    """N copies of one request (seeds 0..N-1), k = 2, V = 8: the first emitted token follows
    the processed p_1, the number accepted its exact law, and the token at a first-position
    rejection the normalised residual."""
    vocab, k, copies = 8, 2, 3000
    g = torch.Generator().manual_seed(6)
    target = torch.randn(k, vocab, generator=g) * 1.5
    bonus = torch.randn(1, vocab, generator=g)
    q = torch.softmax(torch.randn(k, vocab, generator=g), -1)
    temperature, top_k, top_p = 0.8, 6, 0.9
    p = torch.stack([processed_probs(row, temperature, top_k, top_p) for row in target]).double()
    drafts = torch.multinomial(q, copies, replacement=True, generator=g).t().int()  # [copies, k]
    batch = dict(
        target_logits=target.repeat(copies, 1),
        bonus_logits=bonus.repeat(copies, 1),
        draft_token_ids=drafts.reshape(-1),
        draft_probs=q.repeat(copies, 1),
        cu_num_draft_tokens=torch.arange(1, copies + 1, dtype=torch.int32) * k,
        temperature=torch.full((copies,), temperature),
        top_k=torch.full((copies,), top_k, dtype=torch.int32),
        top_p=torch.full((copies,), top_p),
        seeds=torch.arange(copies, dtype=torch.int64),
        positions=torch.full((copies,), 5, dtype=torch.int64),
    )
    out, accepted, _ = verify(**batch, max_spec_len=k)
    assert_follows(out[:, 0], p[0], "first token")
    alpha = torch.minimum(p, q.double()).sum(-1)
    law = torch.tensor([1 - alpha[0], alpha[0] * (1 - alpha[1]), alpha[0] * alpha[1]])
    assert_follows(accepted, law, "number accepted")
    residual = torch.clamp(p[0] - q[0].double(), min=0)
    rejected_first = accepted == 0
    assert_follows(out[rejected_first, 0], residual / residual.sum(), "token at a first-position rejection")
