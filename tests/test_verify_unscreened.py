"""The Triton verify's unscreened calls with both row passes in one launch
(triton_kernels/verify_unscreened.py): the same tokens as the reference and as the two
launches, the row counters left at zero for the next call, the steps the launch tests
(walks of every depth), on a GPU rows of many programs (more than run at once, and more
than the launch tests) and graph replays. Under the interpreter a row is one program (a
vocab of at most one block); on a GPU a row takes up to one program an SM."""

from __future__ import annotations

import pytest
import torch

from conftest import HAS_CUDA, capture, launch_grids
from verify_inputs import make_inputs, triton_tokens

import specops
from specops.backend import Backend
from specops.reference.verify import verify as reference_verify
from specops.triton_kernels.verify_rows import fixed_sum_kernel as FIXED_SUM_KERNEL

DEVICES = ["cpu"] + ([pytest.param("cuda", marks=pytest.mark.gpu)] if HAS_CUDA else [])


@pytest.fixture
def no_fixed_sum(triton_verify, monkeypatch):
    """The separate normaliser launch fails if it is taken."""

    class Refused:
        def __getitem__(self, grid):
            raise AssertionError("fixed_sum_kernel launched: the one-launch path was not taken")

    monkeypatch.setattr(triton_verify, "fixed_sum_kernel", Refused())


def assert_counters_zero(device):
    from specops.triton_kernels.stream_counters import row_counters

    assert not row_counters(torch.device(device), 1).any().item()


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("ngram", [False, True], ids=["draft", "ngram"])
def test_one_launch_matches_reference_and_leaves_counters_zero(device, ngram, no_fixed_sum):
    """One request (the default unscreened call), mixed steps, a greedy one among others
    through the seeds; twice in a row: the counters the first call left serve the second."""
    vocab = 2000 if device == "cpu" else 9000  # one block under the interpreter; 5 a row on a GPU
    for seed in (3, 4):
        inputs = make_inputs([4], vocab, seed=seed, greedy_fraction=0.0, ngram=ngram, with_top=False)
        if seed == 4:
            inputs["temperature"][0] = 0.0
        expected = reference_verify(**inputs, max_spec_len=4)
        for _ in range(2):
            got = triton_tokens(inputs, device, 4)
            assert torch.equal(got[0], expected[0]) and torch.equal(got[1], expected[1])
            assert_counters_zero(device)


@pytest.mark.parametrize("device", DEVICES)
def test_one_launch_equals_two_launches(device, triton_verify, no_fixed_sum, monkeypatch):
    """Temperatures that are and are not powers of two, ties for the max across blocks (on a
    GPU), logits NaN and -inf: the one launch's tokens are the two launches'."""
    vocab = 2048 if device == "cpu" else 4100
    inputs = make_inputs([3], vocab, seed=17, greedy_fraction=0.0, with_top=False)
    inputs["target_logits"] = (inputs["target_logits"] * 2).round()  # ties, in several blocks
    inputs["target_logits"][1, :7] = float("nan")
    inputs["bonus_logits"][0, 100] = float("-inf")
    for temperature in (1.0, 0.7, 0.25):
        inputs["temperature"][0] = temperature
        one = triton_tokens(inputs, device, 3, validate=False)
        with monkeypatch.context() as two_launches:
            two_launches.setattr(triton_verify, "ONE_LAUNCH_UNSCREENED", False)
            two_launches.setattr(triton_verify, "fixed_sum_kernel", FIXED_SUM_KERNEL)
            two = triton_tokens(inputs, device, 3, validate=False)
        expected = reference_verify(**inputs, max_spec_len=3)
        for got in (one, two):
            assert torch.equal(got[0], expected[0]) and torch.equal(got[1], expected[1])


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA GPU")
@pytest.mark.parametrize("counts,vocab", [([8], 128256), ([4], 140000), ([4] * 40, 20000)],
                         ids=["B1-k8-V128256", "B1-V140000", "B40-V20000"])
def test_gpu_one_launch_rows_of_many_programs(counts, vocab, triton_verify, no_fixed_sum, monkeypatch):
    """63 programs a row over 9 rows (the most whose steps the launch tests); 69 a row (the
    decisions then walk every step); 10 a row over 200 rows (2000 programs, more than the
    GPU runs at once: the rows resident first must finish for the rest to start)."""
    monkeypatch.setattr(triton_verify, "UNSCREENED_MAX_BATCH", 1 << 30)
    monkeypatch.setattr(triton_verify, "UNSCREENED_BYTES", 1 << 62)
    inputs = make_inputs(counts, vocab, seed=len(counts), greedy_fraction=0.25, with_top=False)
    expected = reference_verify(**inputs, max_spec_len=max(counts))
    got = triton_tokens(inputs, "cuda", max(counts))
    assert torch.equal(got[0], expected[0]) and torch.equal(got[1], expected[1])
    assert_counters_zero("cuda")


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA GPU")
@pytest.mark.parametrize("spares", [True, False], ids=["spare", "none-left"])
def test_gpu_one_launch_graph_replays(spares, triton_verify, monkeypatch):
    """A captured one-request call replayed at advancing positions equals eager calls there.
    The capture stream, new, takes a spare zeroed buffer (no fill in the graph), each replay
    finding it at zero; with no spare left the graph holds the two launches."""
    from specops.triton_kernels import stream_counters

    inputs = make_inputs([4], 50000, seed=2, with_top=False)
    inputs = {k: (v.cuda() if v is not None else None) for k, v in inputs.items()}
    launched = launch_grids(monkeypatch, triton_verify, "fixed_sum_kernel")
    # Counters of this test alone: earlier tests of the process may have taken the spares,
    # or left a buffer under the stream handle the capture stream reuses.
    monkeypatch.setattr(stream_counters, "_COUNTERS", {})
    monkeypatch.setattr(stream_counters, "_SPARES", {})
    specops.verify(*inputs.values(), 4, False, backend=Backend.TRITON)  # an eager call: buffers and spares
    if not spares:  # new buffers come without spares, and none is left
        monkeypatch.setattr(stream_counters, "SPARE_BUFFERS", 0)
        monkeypatch.setattr(stream_counters, "_SPARES", {})
    spare_list = stream_counters._SPARES.setdefault(torch.cuda.current_device(), [])
    before, launched[:] = len(spare_list), []
    graph, static = capture(lambda: specops.verify(*inputs.values(), 4, False, backend=Backend.TRITON),
                            stream=torch.cuda.Stream())  # a capture stream seen for the first time
    if spares:
        assert len(spare_list) == before - 1 and not launched  # the side stream's buffer: a fresh one
    else:
        assert len(launched) == 1  # the capture's call took the two launches
    for _ in range(4):
        inputs["positions"].add_(3)
        graph.replay()
        torch.cuda.synchronize()
        for s, e in zip(static, specops.verify(*inputs.values(), 4, False, backend=Backend.TRITON)):
            assert torch.equal(s, e)
    assert_counters_zero("cuda")


def deep_walk_inputs(vocab, depth, seed, *, ngram, failure):
    """One request of 4 drafts whose first ``depth`` pass (each target row dominated by the
    draft's token, its draft prob near 1) and whose step ``depth`` (if < 4) fails by
    ``failure``: "unlikely" (a token of little target mass, all draft mass on it) or
    "no-draft-mass" (the dominant token with draft prob 0)."""
    inputs = make_inputs([4], vocab, seed=seed, greedy_fraction=0.0, ngram=ngram, with_top=False)
    g = torch.Generator().manual_seed(seed)
    dominant = torch.randint(0, vocab, (4,), generator=g)
    inputs["target_logits"][torch.arange(4), dominant] += 15.0
    drafts = dominant.clone()
    if not ngram:
        inputs["draft_probs"] = torch.softmax(inputs["target_logits"] + 0.1 * torch.randn(4, vocab, generator=g), -1)
    if depth < 4:
        if failure == "no-draft-mass" and not ngram:
            inputs["draft_probs"][depth, dominant[depth]] = 0.0
        else:
            drafts[depth] = (dominant[depth] + 1 + seed) % vocab
            if not ngram:
                inputs["draft_probs"][depth] = 0.0
                inputs["draft_probs"][depth, drafts[depth]] = 1.0
    inputs["draft_token_ids"] = drafts.to(inputs["draft_token_ids"].dtype)
    return inputs


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("ngram", [False, True], ids=["draft", "ngram"])
def test_one_launch_walks_of_every_depth(device, ngram, no_fixed_sum):
    """The max pass tests every draft step and the decisions start at the first failed one:
    0 to 4 passed drafts (then a rejection's token, or the bonus draw), greedy requests
    among them, a temperature of 1/2 (the masses' multiply path), failures by an
    unlikely draft and by a draft prob of 0: the reference's tokens, at every depth."""
    vocab = 2000 if device == "cpu" else 9000
    depths = set()
    for depth in range(5):
        for temperature, failure in ((None, "unlikely"), (0.0, "unlikely"), (0.5, "unlikely"),
                                     (None, "no-draft-mass")):
            inputs = deep_walk_inputs(vocab, depth, seed=10 * depth + len(failure), ngram=ngram, failure=failure)
            if temperature is not None:
                inputs["temperature"][0] = temperature
            expected = reference_verify(**inputs, max_spec_len=4)
            got = triton_tokens(inputs, device, 4)
            assert torch.equal(got[0], expected[0]) and torch.equal(got[1], expected[1]), (depth, temperature, failure)
            depths.add(int(expected[1][0]))
    assert depths == set(range(5)), depths  # the inputs reach every depth
    assert_counters_zero(device)
