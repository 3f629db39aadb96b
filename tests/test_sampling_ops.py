"""Every backend of the sampling ops equals the reference exactly, given the same draws.

Layers: a grid of awkward sizes; hypothesis properties (ragged lengths with zeros, mixed
greedy, odd vocab, int32/int64 ids); targeted edge cases; full-size GPU shapes.
Outputs are poisoned before each run, so an entry a kernel forgot to write fails.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import specops
from conftest import backend_params, requires_gpu
from sampling_inputs import POISON, SamplingBatch, make_batch
from specops.reference import sampling as ref

BACKENDS = backend_params()


def _recovered(batch: SamplingBatch, backend) -> torch.Tensor:
    return specops.sample_recovered_tokens(
        batch.cu_num_draft_tokens,
        batch.draft_token_ids,
        batch.draft_probs,
        batch.target_probs,
        batch.exponentials,
        backend=backend,
    )


def _random_rows(batch: SamplingBatch, backend, recovered: torch.Tensor, max_spec_len=None) -> torch.Tensor:
    out = batch.poisoned_output(max_spec_len)
    specops.rejection_random_sample(
        out,
        batch.cu_num_draft_tokens,
        batch.draft_token_ids,
        batch.draft_probs,
        batch.target_probs,
        batch.bonus_token_ids,
        recovered,
        batch.uniform_probs,
        batch.is_greedy,
        backend=backend,
    )
    return out


def _greedy_rows(batch: SamplingBatch, backend, max_spec_len=None) -> torch.Tensor:
    out = batch.poisoned_output(max_spec_len)
    specops.rejection_greedy_sample(
        out,
        batch.cu_num_draft_tokens,
        batch.draft_token_ids,
        batch.target_argmax,
        batch.bonus_token_ids,
        batch.is_greedy,
        backend=backend,
    )
    return out


def _on_cpu(batch: SamplingBatch) -> SamplingBatch:
    moved = {k: (v.cpu() if isinstance(v, torch.Tensor) else v) for k, v in vars(batch).items()}
    return SamplingBatch(**moved)


def assert_all_ops_match_reference(batch: SamplingBatch, backend, max_spec_len=None) -> None:
    """Recovered tokens, random rows and greedy rows of ``backend`` equal the reference's
    (computed on the CPU from the same tensors), and no owned row keeps poison."""
    cpu = _on_cpu(batch)
    expected_recovered = ref.sample_recovered_tokens(
        cpu.cu_num_draft_tokens, cpu.draft_token_ids, cpu.draft_probs, cpu.target_probs, cpu.exponentials
    )
    recovered = _recovered(batch, backend)
    assert recovered.dtype == torch.int32
    torch.testing.assert_close(recovered.cpu(), expected_recovered, rtol=0, atol=0)

    expected = cpu.poisoned_output(max_spec_len)
    ref.rejection_random_sample(
        expected,
        cpu.cu_num_draft_tokens,
        cpu.draft_token_ids,
        cpu.draft_probs,
        cpu.target_probs,
        cpu.bonus_token_ids,
        expected_recovered,
        cpu.uniform_probs,
        cpu.is_greedy,
    )
    got = _random_rows(batch, backend, recovered, max_spec_len)
    torch.testing.assert_close(got.cpu(), expected, rtol=0, atol=0)

    expected_greedy = cpu.poisoned_output(max_spec_len)
    ref.rejection_greedy_sample(
        expected_greedy,
        cpu.cu_num_draft_tokens,
        cpu.draft_token_ids,
        cpu.target_argmax,
        cpu.bonus_token_ids,
        cpu.is_greedy,
    )
    got_greedy = _greedy_rows(batch, backend, max_spec_len)
    torch.testing.assert_close(got_greedy.cpu(), expected_greedy, rtol=0, atol=0)

    # Between them the two ops own every row: nothing may keep poison.
    if batch.is_greedy is not None:
        merged = torch.where(cpu.is_greedy[:, None], got_greedy.cpu(), got.cpu())
        assert not (merged == POISON).any()
    else:
        assert not (got.cpu() == POISON).any() and not (got_greedy.cpu() == POISON).any()


# ---- 1. a grid of awkward sizes (CPU-sized) ----


@pytest.mark.parametrize("device,backend", BACKENDS)
@pytest.mark.parametrize("vocab", [7, 111, 1000])
@pytest.mark.parametrize("num_draft_tokens", [[3], [0], [2, 0, 5, 1], [4] * 9, [0, 0, 0]])
@pytest.mark.parametrize("with_draft_probs", [True, False], ids=["draft", "ngram"])
def test_grid_matches_reference(device, backend, vocab, num_draft_tokens, with_draft_probs):
    batch = make_batch(
        num_draft_tokens, vocab, seed=vocab * 31 + len(num_draft_tokens), device=device,
        with_draft_probs=with_draft_probs, greedy_fraction=0.4,
    )
    assert_all_ops_match_reference(batch, backend)


@pytest.mark.parametrize("device,backend", BACKENDS)
def test_long_speculation_and_int64_ids(device, backend):
    """max_spec_len 32 (and a wider output than needed), int64 ids, every request random."""
    batch = make_batch([32, 7, 0, 32], 97, seed=5, device=device, id_dtype=torch.int64, accept_bias=0.95)
    assert_all_ops_match_reference(batch, backend, max_spec_len=40)


# ---- 2. hypothesis properties ----


@st.composite
def batches(draw, device: str):
    num_draft_tokens = draw(st.lists(st.integers(0, 6), min_size=1, max_size=12))
    return make_batch(
        num_draft_tokens,
        draw(st.sampled_from([2, 5, 16, 33, 130, 257])),
        seed=draw(st.integers(0, 2**31 - 1)),
        device=device,
        with_draft_probs=draw(st.booleans()),
        id_dtype=draw(st.sampled_from([torch.int32, torch.int64])),
        greedy_fraction=draw(st.sampled_from([0.0, 0.3, 1.0])),
        sparsity=draw(st.sampled_from([0.0, 0.3, 0.9])),
        accept_bias=draw(st.sampled_from([0.0, 0.5, 1.0])),
    )


@pytest.mark.parametrize("device,backend", BACKENDS)
def test_hypothesis_matches_reference(device, backend):
    @given(batches(device))
    def check(batch):
        assert_all_ops_match_reference(batch, backend)

    check()


@pytest.mark.parametrize("device,backend", BACKENDS)
@given(values=st.lists(st.floats(0, 2, width=32), min_size=1, max_size=10), data=st.data())
def test_expand_to_tokens_matches_reference(device, backend, values, data):
    counts = data.draw(st.lists(st.integers(0, 5), min_size=len(values), max_size=len(values)))
    cu = torch.tensor(counts, dtype=torch.int64).cumsum(0).to(torch.int32)
    num_tokens = sum(counts)
    for dtype in (torch.float32, torch.int32, torch.int64):
        vals = (torch.tensor(values) * 1000).to(dtype) if dtype != torch.float32 else torch.tensor(values)
        vals[0] = 0  # something for replace_from to hit
        replace = {"replace_from": 0.0, "replace_to": 1.0} if dtype == torch.float32 else {}
        expected = ref.expand_to_tokens(vals, cu, num_tokens, **replace)
        got = specops.expand_to_tokens(vals.to(device), cu.to(device), num_tokens, **replace, backend=backend)
        assert got.dtype == dtype
        torch.testing.assert_close(got.cpu(), expected, rtol=0, atol=0)


# ---- 3. targeted edge cases ----


@pytest.mark.parametrize("device,backend", BACKENDS)
def test_zero_draft_probability_rejects_and_zero_target_never_accepted(device, backend):
    vocab = 8
    target = torch.full((3, vocab), 1.0 / vocab)
    draft = torch.full((3, vocab), 1.0 / vocab)
    draft[0, 2] = 0.0  # row 0: draft prob of the drafted token is 0 -> reject
    target[1, 4] = 0.0  # row 1: target prob 0 with u = 0 -> still reject
    target[1] /= target[1].sum()
    ids = torch.tensor([2, 4, 1], dtype=torch.int32)
    uniform = torch.tensor([0.0, 0.0, 0.0])
    recovered = torch.tensor([6, 5, 3], dtype=torch.int32)
    args = dict(device=device)
    for cu, expect in (
        (torch.tensor([1, 2, 3]), [[6, -1], [5, -1], [1, 9]]),
        (torch.tensor([3, 3, 3]), [[6, -1, -1, -1], [9, -1, -1, -1], [9, -1, -1, -1]]),
    ):
        width = len(expect[0])
        out = torch.full((3, width), POISON, dtype=torch.int32, **args)
        specops.rejection_random_sample(
            out, cu.to(torch.int32).to(**args), ids.to(**args), draft.to(**args), target.to(**args),
            torch.tensor([9, 9, 9], **args), recovered.to(**args), uniform.to(**args), backend=backend,
        )
        assert out.cpu().tolist() == expect


@pytest.mark.parametrize("device,backend", BACKENDS)
def test_recovered_ties_take_lowest_index_and_all_zero_residual(device, backend):
    vocab = 6
    target = torch.tensor([[0.0, 0.5, 0.0, 0.5, 0.0, 0.0], [0.25] * 4 + [0.0, 0.0]])
    draft = target.clone()  # residual all zero in both rows -> index 0
    exponentials = torch.ones(2, vocab)
    cu = torch.tensor([1, 2], dtype=torch.int32)
    ids = torch.tensor([1, 2], dtype=torch.int32)
    dev = dict(device=device)
    got = specops.sample_recovered_tokens(cu.to(**dev), ids.to(**dev), draft.to(**dev), target.to(**dev),
                                          exponentials.to(**dev), backend=backend)
    assert got.cpu().tolist() == [0, 0]
    # n-gram: residual = p without the draft; the two equal leftovers tie -> lowest index.
    got = specops.sample_recovered_tokens(cu.to(**dev), ids.to(**dev), None, target.to(**dev),
                                          exponentials.to(**dev), backend=backend)
    assert got.cpu().tolist() == [3, 0]


@pytest.mark.parametrize("device,backend", BACKENDS)
@pytest.mark.parametrize("with_draft_probs", [True, False], ids=["draft", "ngram"])
def test_recovered_near_ties_are_exact(device, backend, with_draft_probs):
    """Scores a few ulps apart (and exact ties): a kernel that rules elements out with an
    approximate quotient must still return the exact race winner."""
    g = torch.Generator().manual_seed(17)
    num_tokens, vocab = 6, 4099
    base = torch.tensor(0.37, dtype=torch.float32)
    ulps = torch.randint(-3, 4, (num_tokens, vocab), generator=g)
    target = base + ulps * torch.finfo(torch.float32).eps * base
    e_base = torch.tensor(1.3, dtype=torch.float32)
    exponentials = (e_base + torch.randint(-3, 4, (2, vocab), generator=g) * 1.2e-7).float()
    exponentials[1, 100:] = 1e-30  # an exponential far outside the fast path's range
    draft = target * torch.rand(num_tokens, vocab, generator=g).lt(0.5) * 0.5
    cu = torch.tensor([3, 6], dtype=torch.int32)
    ids = torch.randint(0, vocab, (num_tokens,), generator=g, dtype=torch.int32)
    q = draft if with_draft_probs else None
    expected = ref.sample_recovered_tokens(cu, ids, q, target, exponentials)
    got = specops.sample_recovered_tokens(cu.to(device), ids.to(device), q.to(device) if q is not None else None,
                                          target.to(device), exponentials.to(device), backend=backend)
    assert got.cpu().tolist() == expected.tolist()


@pytest.mark.parametrize("device,backend", BACKENDS)
def test_ops_leave_other_requests_rows_untouched(device, backend):
    batch = make_batch([2, 3, 1, 0], 50, seed=11, device=device, greedy_fraction=0.5)
    batch.is_greedy = torch.tensor([True, False, True, False], device=device)
    rec = _recovered(batch, backend)
    random_rows = _random_rows(batch, backend, rec).cpu()
    greedy_rows = _greedy_rows(batch, backend).cpu()
    assert (random_rows[[0, 2]] == POISON).all() and not (random_rows[[1, 3]] == POISON).any()
    assert (greedy_rows[[1, 3]] == POISON).all() and not (greedy_rows[[0, 2]] == POISON).any()


@pytest.mark.parametrize("device,backend", BACKENDS)
def test_empty_batch_and_no_drafts(device, backend):
    batch = make_batch([0, 0], 10, seed=3, device=device)
    rows = _random_rows(batch, backend, _recovered(batch, backend)).cpu()
    assert rows[:, 0].tolist() == batch.bonus_token_ids.cpu().tolist()
    empty = make_batch([], 10, seed=3, device=device)
    assert _recovered(empty, backend).shape == (0,)
    assert _greedy_rows(empty, backend, max_spec_len=2).shape == (0, 3)


# ---- 4. full-size GPU shapes ----


# One worker runs these in turn under `--dist loadgroup` (scripts/gpu_check.sh): on an H200
# host the eight B=256 cases took 72 s one after another, and side by side over eight
# workers two of ten cases had not finished after 300 s (bench/NOTES.md, 2026-12-03).
@requires_gpu
@pytest.mark.gpu
@pytest.mark.xdist_group("full-size")
@pytest.mark.parametrize("backend", [b for d, b in ((p.values[0], p.values[1]) for p in BACKENDS) if d == "cuda"])
@pytest.mark.parametrize("vocab", [32000, 128256, 151936])
@pytest.mark.parametrize("batch_size", [1, 99, 256])
@pytest.mark.parametrize("with_draft_probs", [True, False], ids=["draft", "ngram"])
def test_gpu_full_size_matches_reference(backend, vocab, batch_size, with_draft_probs):
    g = torch.Generator().manual_seed(vocab + batch_size)
    counts = torch.randint(0, 9, (batch_size,), generator=g).tolist()
    batch = make_batch(counts, vocab, seed=batch_size, device="cuda", with_draft_probs=with_draft_probs,
                       greedy_fraction=0.3, sparsity=0.0)
    assert_all_ops_match_reference(batch, backend)


@requires_gpu
@pytest.mark.gpu
@pytest.mark.parametrize("backend", [b for d, b in ((p.values[0], p.values[1]) for p in BACKENDS) if d == "cuda"])
def test_gpu_offsets_past_int32(backend):
    """num_tokens * vocab > 2^31: the last rows must be read where they are."""
    vocab, num_tokens = 262144, 8200  # 2.15e9 elements, 8.6 GB of float32
    target = torch.empty(num_tokens, vocab, device="cuda").uniform_()
    target /= target.sum(-1, keepdim=True)
    tail = make_batch([4], vocab, seed=1, device="cuda", with_draft_probs=False, sparsity=0.0)
    target[-4:] = tail.target_probs
    cu = torch.tensor([num_tokens - 4, num_tokens], dtype=torch.int32, device="cuda")
    ids = torch.cat([torch.zeros(num_tokens - 4, dtype=torch.int32, device="cuda"), tail.draft_token_ids])
    exponentials = torch.cat([tail.exponentials, tail.exponentials])
    got = specops.sample_recovered_tokens(cu, ids, None, target, exponentials, backend=backend)
    expected = ref.sample_recovered_tokens(
        torch.tensor([4], dtype=torch.int32), tail.draft_token_ids.cpu(), None, tail.target_probs.cpu(),
        tail.exponentials.cpu(),
    )
    assert got[-4:].cpu().tolist() == expected.tolist()
    del target
    torch.cuda.empty_cache()
