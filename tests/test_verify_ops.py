"""The fused verify op's kernels against its reference: exact equality (tokens, accepted
counts, log-probabilities) under hypothesis, logits dtypes, n-gram and greedy mixes; opcheck
and torch.compile; named errors. Kernels: C++ CPU and Triton here; on a GPU the same tests
run the CUDA and Triton kernels on CUDA tensors, plus full-size shapes, every cluster size
of the CUDA kernel, CUDA-graph replay and the step's laws on a million copies. The top-k /
top-p threshold searches: test_verify_search.py."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import backend_params, capture, requires_gpu
from distribution_harness import assert_follows
from verify_inputs import (assert_matches_reference, assert_tokens_match_reference, make_inputs, on,
                           rejecting_first_drafts, select_requests)

import specops
from specops.backend import Backend
from specops.reference.verify import accept_uniform, processed_probs
from specops.reference.verify import verify as reference_verify

# Every verify kernel present here.
KERNEL_BACKENDS = backend_params()


@pytest.mark.parametrize("device,backend", KERNEL_BACKENDS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("ngram", [False, True], ids=["draft", "ngram"])
@pytest.mark.parametrize("vocab", [5, 111, 1000])
def test_grid_matches_reference(device, backend, dtype, ngram, vocab):
    inputs = make_inputs([3, 0, 5, 1, 2], vocab, seed=vocab, ngram=ngram, dtype=dtype)
    assert_matches_reference(inputs, 5, device, backend)


# With top-k/top-p the screen fixture's three forms run the same launches: the Triton
# launcher takes exact normalisers of every row whatever its screen flags (exact_everywhere,
# triton_kernels/verify.py) and the CUDA kernel's screened path takes unfiltered calls only
# (screened_call, csrc/verify_cuda.cu). Filtered calls take one form.
SCREEN_FORMS = ("screened", "screen-launch", "unscreened")
SCREEN_AND_TOP = [pytest.param(form, False, id=f"{form}-plain") for form in SCREEN_FORMS]
SCREEN_AND_TOP.append(pytest.param("screened", True, id="screened-top"))


@pytest.mark.parametrize("device,backend", KERNEL_BACKENDS)
@pytest.mark.parametrize("path", ["proposal", "direct"])
@pytest.mark.parametrize("screen,with_top", SCREEN_AND_TOP, indirect=["screen"])
def test_residual_token_through_each_path_matches_reference(device, backend, path, with_top, screen, monkeypatch):
    """Random requests reject their first draft; their residual token comes from a kept
    proposal, or (q close to p) from the pass over the residual masses when all 16 fail:
    both paths equal the reference, which is checked to take the intended one."""
    import specops.reference.verify as reference_module

    vocab = 3000 if device == "cuda" else 700
    inputs = make_inputs([2, 1, 3, 0, 2], vocab, seed=23, greedy_fraction=0.0, with_top=with_top)
    inputs["temperature"][1] = 0.0
    inputs = rejecting_first_drafts(inputs, path)
    proposals = []
    propose = reference_module.propose_residual
    monkeypatch.setattr(reference_module, "propose_residual", lambda *a: proposals.append(propose(*a)) or proposals[-1])
    assert_matches_reference(inputs, 3, device, backend)
    assert len(proposals) == 3 and all((token is not None) == (path == "proposal") for token in proposals)
    assert_tokens_match_reference(inputs, 3, device, backend)  # without log-probabilities: screened or not


@pytest.mark.parametrize("device,backend", KERNEL_BACKENDS)
def test_hypothesis_matches_reference(device, backend):
    """Drawn batches equal the reference. The Triton kernel under the interpreter takes 2/5
    of the profile's examples (10 of CI's 25: they cost ~7.6 s each there, the suite's longest
    test; bench/NOTES.md, 2026-12-03); on a GPU every backend takes them all."""
    examples = settings.default.max_examples
    if device == "cpu" and backend is Backend.TRITON:
        examples = max(10, examples * 2 // 5)

    @settings(max_examples=examples)
    @given(
        counts=st.lists(st.integers(0, 5), min_size=1, max_size=6),
        vocab=st.sampled_from([2, 9, 64, 257]),
        seed=st.integers(0, 2**31 - 1),
        ngram=st.booleans(),
        greedy_fraction=st.sampled_from([0.0, 0.5, 1.0]),
        id_dtype=st.sampled_from([torch.int32, torch.int64]),
        with_top=st.booleans(),
    )
    def check(counts, vocab, seed, ngram, greedy_fraction, id_dtype, with_top):
        inputs = make_inputs(counts, vocab, seed, greedy_fraction=greedy_fraction, ngram=ngram, id_dtype=id_dtype,
                             with_top=with_top)
        assert_matches_reference(inputs, max(counts) + 1, device, backend)
        assert_tokens_match_reference(inputs, max(counts) + 1, device, backend)  # the Triton kernel unscreened

    check()


@pytest.mark.parametrize("device,backend", KERNEL_BACKENDS)
def test_seeded_request_same_in_any_batch(device, backend):
    inputs = make_inputs([4, 2, 3], 300, seed=9, greedy_fraction=0.0)
    full = specops.verify(*on(inputs, device).values(), 4, True, backend=backend)
    alone = select_requests(inputs, [1])
    single = specops.verify(*on(alone, device).values(), 4, True, backend=backend)
    for s, f in zip(single, full):
        assert torch.equal(s[0], f[1])


@pytest.mark.parametrize("device,backend", KERNEL_BACKENDS)
def test_opcheck_and_compile(device, backend):
    inputs = on(make_inputs([2, 0, 3], 40, seed=1), device)
    namespace = torch.ops.specops_triton if backend is Backend.TRITON else torch.ops.specops
    torch.library.opcheck(namespace.verify.default, (*inputs.values(), 3, True))
    torch.library.opcheck(namespace.verify.default, (*inputs.values(), 3, False))

    def step(*args):
        return specops.verify(*args, 3, True, backend=backend)

    torch._dynamo.reset()
    compiled = torch.compile(step, fullgraph=True, backend="aot_eager" if device == "cpu" else "inductor")
    for g, e in zip(compiled(*inputs.values()), step(*inputs.values())):
        assert torch.equal(g, e)


VALIDATING_DEVICES = ["cpu", pytest.param("cuda", marks=[pytest.mark.gpu, requires_gpu])]


@pytest.mark.parametrize("device", VALIDATING_DEVICES)
def test_bad_arguments_raise_named_errors(device):
    inputs = on(make_inputs([2, 3], 30, seed=2), device)
    nan, inf = float("nan"), float("inf")
    cu = inputs["cu_num_draft_tokens"]
    cases = [
        (dict(target_logits=inputs["target_logits"].double()), TypeError, "target_logits"),
        (dict(bonus_logits=inputs["bonus_logits"].half()), TypeError, "bonus_logits"),
        (dict(bonus_logits=inputs["bonus_logits"][:, :-1].contiguous()), ValueError, "bonus_logits"),
        (dict(draft_probs=inputs["draft_probs"][:-1]), ValueError, "draft_probs"),
        (dict(temperature=inputs["temperature"].double()), TypeError, "temperature"),
        (dict(seeds=inputs["seeds"].int()), TypeError, "seeds"),
        (dict(positions=inputs["positions"][:1]), ValueError, "positions"),
        (dict(top_k=inputs["top_k"].long()), TypeError, "top_k"),
    ]
    # Values (validate=True: read in one device sync), each message with its numbers.
    value_cases = [
        (dict(cu_num_draft_tokens=cu + 1), ValueError, "its last entry is 6, num_tokens is 5"),
        (dict(cu_num_draft_tokens=cu * torch.tensor([-1, 1], dtype=torch.int32, device=device)), ValueError,
         "negative draft count"),
        (dict(draft_token_ids=inputs["draft_token_ids"] + 30), ValueError,
         r"draft_token_ids holds an id outside the vocab \[0, 30\): min 3\d, max \d\d"),
        (dict(draft_token_ids=inputs["draft_token_ids"] - 30), ValueError, "draft_token_ids holds an id"),
        (dict(temperature=-inputs["temperature"] - 1), ValueError, "temperature must be >= 0"),
        (dict(temperature=inputs["temperature"].index_fill(0, torch.tensor([1], device=device), nan)), ValueError,
         "temperature must be >= 0"),
        (dict(top_p=inputs["top_p"] * 0), ValueError, "top_p must be > 0"),
        (dict(top_p=inputs["top_p"].index_fill(0, torch.tensor([0], device=device), nan)), ValueError,
         "top_p must be > 0"),
        (dict(target_logits=inputs["target_logits"].index_fill(1, torch.tensor([3], device=device), nan)),
         ValueError, "target_logits holds NaN"),
        (dict(target_logits=inputs["target_logits"].index_fill(1, torch.tensor([29], device=device), -inf)),
         ValueError, "target_logits holds NaN or inf"),
        (dict(bonus_logits=inputs["bonus_logits"].index_fill(1, torch.tensor([0], device=device), inf)),
         ValueError, "bonus_logits holds NaN or inf"),
        (dict(bonus_logits=inputs["bonus_logits"].bfloat16(), target_logits=inputs["target_logits"].bfloat16()
              .index_fill(1, torch.tensor([7], device=device), nan)), ValueError, "target_logits holds NaN"),
        # Two bad values: the checks' order decides which is named.
        (dict(cu_num_draft_tokens=cu + 1, target_logits=inputs["target_logits"] * nan), ValueError,
         "cu_num_draft_tokens"),
        (dict(draft_token_ids=inputs["draft_token_ids"] + 30, top_p=inputs["top_p"] * 0), ValueError,
         "draft_token_ids"),
    ]
    if device == "cuda":  # a value check's argument on another device: the op's check names it
        cases += [(dict(temperature=inputs["temperature"].cpu()), ValueError, "temperature must be on the same device"),
                  (dict(cu_num_draft_tokens=cu.cpu()), ValueError, "cu_num_draft_tokens must be on the same device")]
    for override, error, words in cases + value_cases:
        args = {**inputs, **override}
        with pytest.raises(error, match=words):
            specops.verify(*args.values(), 3)
    for override, _, _ in value_cases:  # unvalidated, the kernels take them (and stay in bounds)
        specops.verify(*{**inputs, **override}.values(), 3, validate=False)
    with pytest.raises(ValueError, match="max_spec_len is too small: a request has 3 drafts"):
        specops.verify(*inputs.values(), 2)
    # One request (cu_num_draft_tokens of one entry) and one with no drafts.
    one = on(make_inputs([3], 30, seed=4), device)
    specops.verify(*one.values(), 3)
    with pytest.raises(ValueError, match="max_spec_len is too small: a request has 3 drafts"):
        specops.verify(*one.values(), 2)
    with pytest.raises(ValueError, match="its last entry is 4, num_tokens is 3"):
        specops.verify(*{**one, "cu_num_draft_tokens": one["cu_num_draft_tokens"] + 1}.values(), 3)
    specops.verify(*on(make_inputs([0], 30, seed=5), device).values(), 3)
    # Shape and dtype errors come from the kernel's launcher too, without the Python layer.
    with pytest.raises((TypeError, RuntimeError), match="temperature must be Float"):
        torch.ops.specops.verify(*{**inputs, "temperature": inputs["temperature"].double()}.values(), 3)


@requires_gpu
@pytest.mark.gpu
def test_validation_syncs_the_device_once():
    """validate=True reads every value check's statistics in one device sync."""
    inputs = on(make_inputs([2, 3], 30, seed=2), "cuda")
    specops.verify(*inputs.values(), 3)  # compiled and allocated
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("warn")
    try:
        with pytest.warns(UserWarning, match="synchroniz") as warned:
            specops.verify(*inputs.values(), 3)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert len([w for w in warned if "synchroniz" in str(w.message)]) == 1


@pytest.mark.parametrize("device,backend", KERNEL_BACKENDS)
@pytest.mark.parametrize("ngram", [False, True], ids=["draft", "ngram"])
@pytest.mark.parametrize("screen,with_top", SCREEN_AND_TOP, indirect=["screen"])
def test_unvalidated_non_finite_logits_follow_the_documented_rule(device, backend, ngram, with_top, screen):
    """validate=False: NaN/inf logits count as -inf (probability 0), a row with none finite
    emits token 0; the kernel agrees with the reference and never crashes (tokens only
    without top-k/top-p: the screened paths and the screen's own launch too)."""
    inputs = make_inputs([3, 2, 0], 16, seed=12, ngram=ngram, greedy_fraction=0.3, with_top=with_top)
    inputs["target_logits"][0, :5] = float("nan")
    inputs["target_logits"][1, :] = float("inf")
    inputs["target_logits"][3, 2] = float("-inf")
    inputs["bonus_logits"][2, :] = float("nan")
    assert_matches_reference(inputs, 3, device, backend, validate=False)
    assert_tokens_match_reference(inputs, 3, device, backend, validate=False)


@pytest.fixture(params=["screened", "screen-launch", "unscreened"])
def screen(request, monkeypatch):
    """The Triton launcher with and without its screen on tokens-only calls (one request
    with few bytes of rows skips it by default: every test exact), the screen settled in
    the max pass (the default) or by its own launch (MAX_PASS_TESTS off: calls the max pass
    cannot serve), and the CUDA kernel with and without its screened path
    (SPECOPS_VERIFY_SCREEN; the CPU kernel ignores all three)."""
    from specops.triton_kernels import verify as triton_verify

    backend = request.node.callspec.params.get("backend")
    if request.param == "screen-launch" and backend != Backend.TRITON:
        pytest.skip("the Triton launcher's form only")
    unscreened = request.param == "unscreened"
    monkeypatch.setenv("SPECOPS_VERIFY_SCREEN", "0" if unscreened else "1")
    monkeypatch.setattr(triton_verify, "UNSCREENED_MAX_BATCH", 1 << 30 if unscreened else 0)
    monkeypatch.setattr(triton_verify, "UNSCREENED_BYTES", 1 << 62 if unscreened else 0)
    monkeypatch.setattr(triton_verify, "MAX_PASS_TESTS", request.param != "screen-launch")
    return request.param


@pytest.mark.parametrize("device,backend", KERNEL_BACKENDS)
@pytest.mark.parametrize("screen,ngram,with_top",
                         [pytest.param(form, ngram, False, id=f"{form}-{'ngram' if ngram else 'draft'}")
                          for form in SCREEN_FORMS for ngram in (False, True)]
                         + [pytest.param("screened", False, True, id="screened-draft-top")],  # one form (SCREEN_AND_TOP)
                         indirect=["screen"])
def test_without_logprobs_matches_reference(device, backend, ngram, with_top, screen):
    inputs = make_inputs([3, 0, 5, 1, 2, 4], 120, seed=31, ngram=ngram, greedy_fraction=0.3, with_top=with_top)
    assert_tokens_match_reference(inputs, 5, device, backend)


@pytest.mark.parametrize("device,backend", KERNEL_BACKENDS)
def test_acceptance_tests_at_the_boundary_match_reference(device, backend, screen):
    """Draft probs placed so that u q(x) lies within 4e-6 (relative) of p(x): just below at
    step 0 (accept), just above at step 1 (reject). No approximate normaliser settles these
    tests; the kernels must still agree with the reference."""
    inputs = make_inputs([3, 3, 2], 64, seed=5, greedy_fraction=0.0, with_top=False)
    cu = inputs["cu_num_draft_tokens"].tolist()
    for b in range(len(cu)):
        temperature = float(inputs["temperature"][b])
        for i, factor in enumerate((1 - 4e-6, 1 + 4e-6)):
            t = (cu[b - 1] if b > 0 else 0) + i
            x = int(inputs["draft_token_ids"][t])
            p_x = processed_probs(inputs["target_logits"][t], temperature, 0, 1.0)[x]
            u = accept_uniform(int(inputs["seeds"][b]), int(inputs["positions"][b]) + i)
            inputs["draft_probs"][t, x] = p_x / u * factor
    assert reference_verify(**inputs, max_spec_len=3)[1].tolist() == [1, 1, 1]  # the construction held
    assert_tokens_match_reference(inputs, 3, device, backend)
    assert_matches_reference(inputs, 3, device, backend)


@pytest.mark.parametrize("device,backend", KERNEL_BACKENDS)
@pytest.mark.parametrize("ngram", [False, True], ids=["draft", "ngram"])
@pytest.mark.parametrize("return_logprobs", [False, True], ids=["tokens", "logprobs"])
def test_no_temperature_means_every_request_greedy(device, backend, ngram, return_logprobs):
    """temperature=None (the caller's all-greedy promise, on which the Triton kernel runs
    only its max pass and screen) returns what temperature zeros return, top-k and top-p
    ignored as for any greedy request. Drafts match the argmax up to a mismatch, so every
    acceptance length and the bonus row occur."""
    inputs = make_inputs([3, 0, 5, 1, 2, 4], 300, seed=44, ngram=ngram, greedy_fraction=1.0)
    argmax = inputs["target_logits"].argmax(-1).to(inputs["draft_token_ids"].dtype)
    keep = torch.rand(argmax.shape, generator=torch.Generator().manual_seed(3)) < 0.8
    inputs["draft_token_ids"] = torch.where(keep, argmax, inputs["draft_token_ids"])
    assert not inputs["temperature"].any()
    expected = reference_verify(**inputs, max_spec_len=5, return_logprobs=return_logprobs)
    assert expected[1].tolist() != [0] * 6 and expected[1].tolist() != [3, 0, 5, 1, 2, 4]
    no_temperature = {**inputs, "temperature": None}
    assert all(torch.equal(r, e) for r, e in
               zip(reference_verify(**no_temperature, max_spec_len=5, return_logprobs=return_logprobs), expected))
    got = specops.verify(*on(no_temperature, device).values(), 5, return_logprobs, backend=backend)
    for name, g, e in zip(("output_token_ids", "num_accepted", "logprobs"), got, expected):
        assert g.dtype == e.dtype and g.shape == e.shape, name
        assert torch.equal(g.cpu(), e), f"{name} differs:\n{g}\n{e}"


@pytest.mark.parametrize("device,backend", KERNEL_BACKENDS)
def test_opcheck_without_temperature(device, backend):
    inputs = on(make_inputs([2, 1], 40, seed=6, greedy_fraction=1.0), device)
    namespace = torch.ops.specops_triton if backend is Backend.TRITON else torch.ops.specops
    torch.library.opcheck(namespace.verify.default, (*{**inputs, "temperature": None}.values(), 3, False))


TRITON_BACKENDS = [p for p in KERNEL_BACKENDS if p.values[1] is Backend.TRITON]


@pytest.mark.parametrize("device,backend", TRITON_BACKENDS)
@pytest.mark.parametrize("with_top", [False, True], ids=["plain", "top"])
def test_triton_rows_split_across_programs(device, backend, with_top, monkeypatch):
    """Tiny blocks: every row is cut into 5 programs (max/argmax, threshold counts; exact
    sums too with top-k/top-p) or 19 (exact sums without, the race), with ties across split
    boundaries (integer logits)."""
    from specops.triton_kernels import verify as triton_verify

    for name, value in (("BLOCK_V", 16), ("MIN_SPLIT_LEN", 16), ("PROGRAMS_PER_SM", 16)):
        monkeypatch.setattr(triton_verify, name, value)
    inputs = make_inputs([2, 0, 3], 300, seed=8, greedy_fraction=0.0, with_top=with_top)
    inputs["temperature"][0] = 0.0  # one greedy request: first argmax across splits
    inputs["target_logits"] = (inputs["target_logits"] / 3).round()  # the max tied in several splits
    inputs["bonus_logits"] = (inputs["bonus_logits"] * 2).round()
    if with_top:  # the threshold searches; the screen is off with top-k/top-p
        assert_matches_reference(inputs, 3, device, backend)
    else:
        assert_tokens_match_reference(inputs, 3, device, backend)




@pytest.mark.parametrize("device,backend", TRITON_BACKENDS)
def test_triton_all_greedy_rows_split_across_programs(device, backend, monkeypatch):
    """temperature=None with every row cut into 5 programs and the max tied across split
    boundaries: the screen combines the first argmax of the splits."""
    from specops.triton_kernels import verify as triton_verify

    for name, value in (("BLOCK_V", 16), ("MIN_SPLIT_LEN", 16), ("PROGRAMS_PER_SM", 16)):
        monkeypatch.setattr(triton_verify, name, value)
    inputs = make_inputs([2, 0, 3], 300, seed=8, greedy_fraction=1.0, with_top=False)
    inputs["target_logits"] = (inputs["target_logits"] / 3).round()
    inputs["bonus_logits"] = (inputs["bonus_logits"] * 2).round()
    inputs["draft_token_ids"][:2] = inputs["target_logits"][:2].argmax(-1).int()  # request 0 reaches its bonus
    expected = reference_verify(**inputs, max_spec_len=3)
    assert expected[1][0] == 2
    got = specops.verify(*on({**inputs, "temperature": None}, device).values(), 3, backend=backend)
    for g, e in zip(got[:2], expected[:2]):
        assert torch.equal(g.cpu(), e)


GPU_BACKENDS = [p for p in KERNEL_BACKENDS if p.values[0] == "cuda"]


@pytest.mark.gpu
@pytest.mark.parametrize("device,backend", GPU_BACKENDS)
@pytest.mark.parametrize("vocab,batch_size,with_top", [(32000, 99, False), (128256, 1, True), (151936, 16, False)])
def test_gpu_full_size_matches_reference(device, backend, vocab, batch_size, with_top):
    g = torch.Generator().manual_seed(vocab + batch_size)
    counts = torch.randint(0, 6, (batch_size,), generator=g).tolist()
    inputs = make_inputs(counts, vocab, seed=batch_size, with_top=with_top, dtype=torch.bfloat16)
    assert_matches_reference(inputs, 5, device, backend)
    assert_tokens_match_reference(inputs, 5, device, backend)  # the CUDA kernel's screened path without top-k/top-p


@pytest.mark.gpu
@pytest.mark.parametrize("device,backend", GPU_BACKENDS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_gpu_full_size_all_greedy_matches_reference(device, backend, dtype):
    """temperature=None at the benchmark's shape (B = 64, V = 128256), drafts agreeing with
    the argmax 80% of the time."""
    g = torch.Generator().manual_seed(64)
    counts = torch.randint(0, 6, (64,), generator=g).tolist()
    inputs = make_inputs(counts, 128256, seed=64, greedy_fraction=1.0, with_top=False, dtype=dtype)
    argmax = inputs["target_logits"].argmax(-1).int()
    inputs["draft_token_ids"] = torch.where(torch.rand(argmax.shape, generator=g) < 0.8, argmax,
                                            inputs["draft_token_ids"])
    expected = reference_verify(**inputs, max_spec_len=5)
    got = specops.verify(*on({**inputs, "temperature": None}, device).values(), 5, backend=backend)
    for g_, e in zip(got[:2], expected[:2]):
        assert torch.equal(g_.cpu(), e)


@pytest.mark.gpu
@pytest.mark.parametrize("device,backend", GPU_BACKENDS)
@pytest.mark.parametrize("return_logprobs", [True, False], ids=["logprobs", "tokens"])
def test_gpu_cuda_graph_replays_draw_fresh_numbers(device, backend, return_logprobs):
    """Seeds and positions are device tensors: advancing positions between replays gives
    new draws, and each replay equals an eager call at those positions (tokens only: the
    CUDA kernel's screened path, a programmatic dependent launch)."""
    inputs = on(make_inputs([3, 2, 4], 4096, seed=21, greedy_fraction=0.0, with_top=False), device)
    positions = inputs["positions"]

    def step():
        return specops.verify(*inputs.values(), 4, return_logprobs, backend=backend)

    graph, static = capture(step)
    seen = set()
    for _ in range(3):
        positions.add_(7)
        graph.replay()
        torch.cuda.synchronize()
        for s, e in zip(static, step()):
            assert torch.equal(s, e)
        seen.add(tuple(static[0].flatten().tolist()))
    assert len(seen) > 1, "replays at new positions must draw new numbers"


@pytest.mark.gpu
@pytest.mark.parametrize("device,backend", GPU_BACKENDS)
@pytest.mark.parametrize(
    "vocab,counts,dtype",
    [
        (12, [3, 0, 5, 1], torch.float32),  # CUDA kernel: clusters of 1 CTA
        (5000, [2, 4], torch.float16),  # 2
        (9000, [1, 3, 0], torch.bfloat16),  # 4
        (20000, [4, 4, 2], torch.float32),  # 8
        (70001, [4], torch.float32),  # 16 (one request fills too few SMs); odd row length
        (200000, [2, 1], torch.bfloat16),  # 16 (a slice of 8 would not fit in shared memory)
    ],
)
def test_gpu_every_cluster_size_matches_reference(device, backend, vocab, counts, dtype, monkeypatch):
    """The cluster sizes of the two full passes (in the comments), then tokens-only calls
    forced onto the screened path, whose one-wave rule picks 1, 2, 4, 8, 16, 16 here."""
    for ngram in (False, True):
        inputs = make_inputs(counts, vocab, seed=vocab, ngram=ngram, dtype=dtype, greedy_fraction=0.25)
        assert_matches_reference(inputs, max(counts) + 1, device, backend)
        inputs = make_inputs(counts, vocab, seed=vocab, ngram=ngram, dtype=dtype, greedy_fraction=0.25, with_top=False)
        with monkeypatch.context() as patch:
            patch.setenv("SPECOPS_VERIFY_SCREEN", "1")
            assert_tokens_match_reference(inputs, max(counts) + 1, device, backend)


@pytest.mark.gpu
@requires_gpu
def test_gpu_default_backend_is_triton_inside_graph_capture(chosen_backends):
    """Eager calls run the CUDA kernel, captured calls the Triton kernel (faster replayed);
    the replay equals the eager result (both backends follow the reference exactly)."""
    # A vocabulary no other test uses: the Triton kernels compile inside the capture, as they
    # would for an engine whose eager warm-up ran the CUDA kernel.
    inputs = on(make_inputs([4, 1, 3], 30011, seed=5, greedy_fraction=0.3), "cuda")
    eager = specops.verify(*inputs.values(), 4, True)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static = specops.verify(*inputs.values(), 4, True)
    graph.replay()
    torch.cuda.synchronize()
    assert chosen_backends[0] is Backend.CUDA and chosen_backends[-1] is Backend.TRITON
    for s, e in zip(static, eager):
        assert torch.equal(s, e)


def test_eager_default_steers_to_triton_by_logits():
    """The eager default's crossover (specops.ops.TRITON_EAGER_MIN_LOGITS): the bench's
    shapes on either side of it, as measured (specops/ops.py)."""
    rows = lambda batch, k: batch * (k + 1)  # noqa: E731 (target and bonus rows)
    assert not specops.ops.triton_faster_eagerly(rows(1, 4) * 128256, filtered=False)  # 0.6 Mi: 63 / 68 µs
    assert specops.ops.triton_faster_eagerly(rows(2, 4) * 128256, filtered=False)  # 1.2 Mi: 62 / 60
    assert specops.ops.triton_faster_eagerly(rows(64, 8) * 151936, filtered=False)
    assert not specops.ops.triton_faster_eagerly(rows(8, 4) * 128256, False, return_logprobs=True)  # 4.9 Mi: 39 / 44
    assert specops.ops.triton_faster_eagerly(rows(16, 4) * 128256, False, return_logprobs=True)  # 9.8 Mi: 65 / 46
    assert not specops.ops.triton_faster_eagerly(rows(2, 4) * 128256, filtered=True)  # 1.2 Mi: 134 / 148
    assert specops.ops.triton_faster_eagerly(rows(4, 4) * 128256, filtered=True)  # 2.4 Mi: 189 / 144
    # all-greedy (temperature=None) without log-probabilities: Triton at every size, top-k/top-p ignored
    assert specops.ops.triton_faster_eagerly(rows(1, 4) * 32000, filtered=True, all_greedy=True)  # 41 / 32
    assert not specops.ops.triton_faster_eagerly(rows(1, 4) * 128256, False, return_logprobs=True, all_greedy=True)
    assert not specops.ops.triton_faster_eagerly(rows(1, 4) * 128256, filtered=True, all_greedy=False)


@pytest.mark.gpu
@requires_gpu
def test_gpu_eager_default_runs_triton_on_many_logits(chosen_backends):
    """An eager call past the crossover (B=96, k=4, V=128256 with top-k and top-p: 62M
    logits) runs the Triton kernel by default, a small one the CUDA kernel; the default's
    result equals the CUDA kernel's."""
    inputs = on(make_inputs([4] * 96, 128256, seed=8, greedy_fraction=0.25, with_top=True), "cuda")
    default = specops.verify(*inputs.values(), 4, False)
    cuda = specops.verify(*inputs.values(), 4, False, backend="cuda")
    small = on(make_inputs([4], 128256, seed=8, greedy_fraction=0.25, with_top=True), "cuda")
    specops.verify(*small.values(), 4, False)
    assert chosen_backends == [Backend.TRITON, Backend.CUDA, Backend.CUDA]
    for d, c in zip(default, cuda):
        assert torch.equal(d, c)


@pytest.mark.gpu
@requires_gpu
def test_gpu_eager_default_runs_triton_on_all_greedy_calls(chosen_backends):
    """An all-greedy call (temperature=None) without log-probabilities runs the Triton kernel
    eagerly however small (V=32000, 2 requests: 8 rows, 0.24 Mi logits); with log-probabilities, below
    their threshold, the CUDA kernel. The default's tokens and log-probabilities equal the CUDA
    kernel's."""
    inputs = on(make_inputs([4, 2], 32000, seed=9, greedy_fraction=1.0, with_top=True), "cuda")
    inputs["temperature"] = None
    default = specops.verify(*inputs.values(), 4, False)
    with_logprobs = specops.verify(*inputs.values(), 4, True)
    cuda = specops.verify(*inputs.values(), 4, True, backend="cuda")
    assert chosen_backends == [Backend.TRITON, Backend.CUDA, Backend.CUDA]
    for got in default[:2], with_logprobs[:2]:
        for d, c in zip(got, cuda[:2]):
            assert torch.equal(d, c)
    assert torch.equal(with_logprobs[2], cuda[2])


@pytest.mark.gpu
@requires_gpu
def test_gpu_vocab_past_the_cuda_kernel_runs_triton_by_default():
    vocab = specops.ops.CUDA_VERIFY_MAX_VOCAB + 8
    inputs = make_inputs([1, 0], vocab, seed=4, with_top=False)
    with pytest.raises(ValueError, match="vocab"):
        specops.verify(*on(inputs, "cuda").values(), 1, backend="cuda")
    assert_matches_reference(inputs, 1, "cuda", None)


@pytest.mark.gpu
@pytest.mark.parametrize("device,backend", GPU_BACKENDS)
@pytest.mark.parametrize("ngram", [False, True])
def test_gpu_step_laws_on_a_million_copies(device, backend, ngram):
    """One request copied 2^20 times (seeds 0..N-1) with temperature, top-k and top-p: the
    first token follows the processed p_1, the number accepted its exact law, and the
    token at a first-position rejection the normalised residual (n-gram: p_1 without the
    draft)."""
    vocab, k, copies = 40, 3, 1 << 20
    g = torch.Generator().manual_seed(17)
    target = torch.randn(k, vocab, generator=g) * 1.5
    q = torch.softmax(torch.randn(k, vocab, generator=g), -1)
    temperature, top_k, top_p = 0.8, 30, 0.9
    p = torch.stack([processed_probs(row, temperature, top_k, top_p) for row in target]).double()
    drafts = torch.multinomial(q, copies, replacement=True, generator=g).t().int()  # [copies, k]
    batch = dict(
        target_logits=target.repeat(copies, 1),
        bonus_logits=torch.randn(1, vocab, generator=g).repeat(copies, 1),
        draft_token_ids=drafts.reshape(-1),
        draft_probs=None if ngram else q.repeat(copies, 1),
        cu_num_draft_tokens=torch.arange(1, copies + 1, dtype=torch.int32) * k,
        temperature=torch.full((copies,), temperature),
        top_k=torch.full((copies,), top_k, dtype=torch.int32),
        top_p=torch.full((copies,), top_p),
        seeds=torch.arange(copies, dtype=torch.int64),
        positions=torch.full((copies,), 5, dtype=torch.int64),
    )
    out, accepted, _ = specops.verify(*on(batch, device).values(), k, backend=backend)
    out, accepted, drafts = out.cpu(), accepted.cpu(), drafts.long()
    assert_follows(out[:, 0], p[0], "first token")
    rejected_first = accepted == 0
    if ngram:
        accept_first = p[0][drafts[:, 0]]  # P(accept | x) = p(x) with q one-hot on x
        assert abs(float(rejected_first.double().mean()) - float(1 - accept_first.mean())) < 5e-3
        for x in range(vocab):
            rows = rejected_first & (drafts[:, 0] == x)
            if int(rows.sum()) > 2000:
                residual = p[0].clone()
                residual[x] = 0
                assert_follows(out[rows, 0], residual / residual.sum(), f"token after rejecting {x}")
    else:
        alpha = torch.minimum(p[:k], q.double()).sum(-1)
        law = torch.tensor([1 - alpha[0], alpha[0] * (1 - alpha[1]), alpha[0] * alpha[1] * (1 - alpha[2]),
                            alpha[0] * alpha[1] * alpha[2]])
        assert_follows(accepted, law, "number accepted")
        residual = torch.clamp(p[0] - q[0].double(), min=0)
        assert_follows(out[rejected_first, 0], residual / residual.sum(), "token at a first-position rejection")
