"""The fused verify op's kernels against its reference: exact equality (tokens, accepted
counts, log-probabilities) under hypothesis, logits dtypes, n-gram and greedy mixes; opcheck
and torch.compile; named errors. Kernels: C++ CPU and Triton here; on a GPU the same tests
run the CUDA and Triton kernels on CUDA tensors, plus full-size shapes, every cluster size
of the CUDA kernel, CUDA-graph replay and the step's laws on a million copies."""

from __future__ import annotations

import math

import pytest
import torch
import triton
from hypothesis import given
from hypothesis import strategies as st

from conftest import backend_params, capture, requires_gpu
from distribution_harness import assert_follows
from verify_inputs import make_inputs, rejecting_first_drafts, select_requests

import specops
from specops.backend import Backend
from specops.reference.verify import accept_uniform, processed_probs
from specops.reference.verify import verify as reference_verify

# Every verify kernel present here.
KERNEL_BACKENDS = backend_params()


def on(inputs, device):
    return {k: (v.to(device) if v is not None else None) for k, v in inputs.items()}


def assert_matches_reference(inputs, max_spec_len, device, backend, validate=True):
    """The kernel on ``device`` returns exactly what the reference returns on the CPU."""
    expected = reference_verify(**inputs, max_spec_len=max_spec_len, return_logprobs=True)
    got = specops.verify(*on(inputs, device).values(), max_spec_len, True, backend=backend, validate=validate)
    names = ("output_token_ids", "num_accepted", "logprobs")
    for name, g, e in zip(names, got, expected):
        g = g.cpu()
        assert g.dtype == e.dtype and g.shape == e.shape, name
        assert torch.equal(g, e), f"{name} differs:\n{g}\n{e}"


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


def assert_tokens_match_reference(inputs, max_spec_len, device, backend, validate=True):
    """As assert_matches_reference, without log-probabilities: the path on which the Triton
    kernel settles acceptance tests from approximate normalisers (verify_screen.py)."""
    expected = reference_verify(**inputs, max_spec_len=max_spec_len)
    got = specops.verify(*on(inputs, device).values(), max_spec_len, False, backend=backend, validate=validate)
    for name, g, e in zip(("output_token_ids", "num_accepted"), got, expected):
        assert torch.equal(g.cpu(), e), f"{name} differs:\n{g}\n{e}"


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


# No kept-key buffers past SEARCH_KEPT_BYTES is the layout (0, -1) of a negative keep limit
# (kept_layout, test_triton_kept_keys_layout_is_bounded): "never-keeps" runs its launches.
@pytest.mark.parametrize("device,backend", TRITON_BACKENDS)
@pytest.mark.parametrize("keep_limit,kept_rows", [(-1, 16), (6, 16), (10**6, 1), (10**6, 16)],
                         ids=["never-keeps", "keeps-late", "lanes-overflow", "keeps-early"])
@pytest.mark.parametrize("tiny", [True, False], ids=["tiny-blocks", "default-blocks"])
def test_triton_threshold_search_keeps_interval_keys(device, backend, keep_limit, kept_rows, tiny, monkeypatch):
    """The top-k / top-p searches of splits that read their rows every round (no kept-key
    buffers at all, as past SEARCH_KEPT_BYTES), keep their interval's keys in a late or an
    early round, or overflow a lane's column and read the row again (verify_search.py):
    the same thresholds, so the reference's tokens, counts and log-probabilities. Target
    rows continuous (a threshold off by one key changes z1, so the log-probabilities), bonus
    rows tied; k of 1, 5 and half the vocab (a threshold far below the max among logits one
    key apart: the rounds that converge), every request random."""
    from specops.triton_kernels import verify as triton_verify

    monkeypatch.setattr(triton_verify, "SEARCH_KEEP_LIMIT", keep_limit)
    monkeypatch.setattr(triton_verify, "SEARCH_KEPT_ROWS", kept_rows)
    if tiny:  # rows of 300 in five programs of a 64-entry block each
        for name, value in (("BLOCK_V", 64), ("MIN_SPLIT_LEN", 64), ("PROGRAMS_PER_SM", 16)):
            monkeypatch.setattr(triton_verify, name, value)
    vocab = 300 if tiny else 2500 if device == "cpu" else 40000
    assert_matches_reference(threshold_inputs(vocab), 3, device, backend)


def top_p_extremes(vocab):
    """Rows whose top-p thresholds lie at the ends of the search's first interval
    (verify_search.top_p_bounds), top-p alone: a flat row (every token kept at p = 1 / V), a
    token of p 0.49 over a flat tail at top_p 0.5 (the whole tail kept: the threshold 1 / (2V),
    4x the interval's low end), the max alone kept where the next token is almost as likely
    (top_p 2^-24: the threshold the max's p, near the high end), top_p a step below 1 at
    temperature 10, and a sharp row at 0.05."""
    inputs = make_inputs([1, 1, 1, 1, 1], vocab, seed=vocab, greedy_fraction=0.0, with_top=False)
    g = torch.Generator().manual_seed(vocab + 1)
    rows = torch.randn(5, vocab, generator=g) * 3
    rows[0] = 0.0
    rows[1] = 0.0
    rows[1, 7] = math.log(0.49 * (vocab - 1) / 0.51)
    rows[2, 3] = 30.0
    rows[2, 4] = 30.0 - 2.0**-18  # p ~32 ulps below the max's: above any high bound 1% short
    rows[2, 5] = 29.0  # both p then mid-binade (about 0.42): one 1024-key bucket of p's bits
    inputs["target_logits"] = rows
    inputs["bonus_logits"] = rows.flip(1).clone()
    inputs["temperature"] = torch.tensor([1.0, 1.0, 1.0, 10.0, 0.05])
    inputs["top_p"] = torch.tensor([0.9, 0.5, 2.0**-24, 1.0 - 2.0**-24, 0.9])
    return inputs


@pytest.mark.parametrize("device,backend", TRITON_BACKENDS)
@pytest.mark.parametrize("tiny", [True, False], ids=["tiny-blocks", "default-blocks"])
def test_triton_top_p_thresholds_at_its_bounds(device, backend, tiny, monkeypatch):
    """Top-p's search starts from bounds on its threshold, not [0, bits(1.0)]: the rows of
    top_p_extremes, whose thresholds lie near those bounds, get the reference's tokens,
    counts and log-probabilities (a low bound 8x higher, or a high one 1% short, fails)."""
    from specops.triton_kernels import verify as triton_verify

    if tiny:  # rows of 300 in five programs of a 64-entry block each
        for name, value in (("BLOCK_V", 64), ("MIN_SPLIT_LEN", 64), ("PROGRAMS_PER_SM", 16)):
            monkeypatch.setattr(triton_verify, name, value)
    assert_matches_reference(top_p_extremes(300 if tiny else 2500 if device == "cpu" else 40000), 3, device,
                             backend)


@pytest.mark.parametrize("device,backend", TRITON_BACKENDS)
@pytest.mark.parametrize("keep_first,kept_rows", [(True, 256), (True, 1), (False, 256)],
                         ids=["keeps", "lanes-overflow", "counts-first"])
def test_triton_top_p_alone_keeps_in_round_0(device, backend, kept_rows, keep_first, monkeypatch):
    """TOP_P_KEEP_FIRST (on by default, bench/NOTES.md): top-p alone keeps the keys of its
    first interval (top_p_bounds) in round 0, in a buffer of TOP_P_KEPT_ROWS rows a lane,
    counting its candidates as it reads, or overflows a lane and reads the row again; or,
    with it off, only counts in round 0: the reference's tokens, counts and
    log-probabilities every way."""
    from specops.triton_kernels import verify as triton_verify

    for name, value in (("TOP_P_KEEP_FIRST", keep_first), ("TOP_P_KEPT_ROWS", kept_rows),
                        ("TOP_P_KEEP_LIMIT", 10**6)):
        monkeypatch.setattr(triton_verify, name, value)
    vocab = 2500 if device == "cpu" else 40000  # splits whose lanes meet more entries than one row
    assert_matches_reference(top_p_extremes(vocab), 3, device, backend)
    inputs = threshold_inputs(vocab)
    inputs["top_k"] = None
    assert_matches_reference(inputs, 3, device, backend)


@pytest.mark.parametrize("device,backend", TRITON_BACKENDS)
def test_triton_top_p_alone_at_power_of_two_temperatures(device, backend):
    """Top-p alone's row passes multiply by log2(e) / T where T is a power of two
    (verify_math.exponent_scale) and divide elsewhere: requests at T = 0.5, 2, 2^-10, 4 and 1
    beside T = 3 and the floats next to 2 and 0.5, the reference's tokens, counts and
    log-probabilities (the temperature passed for its inverse fails it; a rounded 1 / T
    for T = 3 moves p by an ulp at most and these rows do not catch it)."""
    vocab = 2500 if device == "cpu" else 40000
    inputs = make_inputs([2, 1, 3, 0, 2, 1, 2, 3], vocab, seed=53, greedy_fraction=0.0, with_top=False)
    below_two = math.nextafter(2.0, 0.0)
    above_half = math.nextafter(0.5, 1.0)
    inputs["temperature"] = torch.tensor([0.5, 2.0, 2.0**-10, 4.0, 1.0, 3.0, below_two, above_half])
    inputs["top_p"] = torch.tensor([0.9, 0.5, 0.75, 0.95, 0.8, 0.9, 0.6, 0.85])
    assert_matches_reference(inputs, 3, device, backend)


@pytest.mark.parametrize("device,backend", TRITON_BACKENDS)
@pytest.mark.parametrize("finish,finish_keys", [(True, 64), (True, 4), (False, 64)],
                         ids=["finished", "too-many-keys", "rounds"])
def test_triton_top_p_after_top_k_finished_from_kept_keys(device, backend, finish, finish_keys, monkeypatch):
    """Top-p after top-k: the threshold taken in one launch from round 0's kept keys
    (verify_search_finish.py), the rounds skipped where a slot kept more keys than the
    finish takes (k = 5 past a limit of 4; k = 1 within it) or with the finish off: the
    reference's tokens, counts and log-probabilities every way. Rows of 300 in five
    programs of 64-entry blocks; k of 1 and 5 with top-p 0.9 and 0.5, one request top-p
    alone (no finish)."""
    from specops.triton_kernels import verify as triton_verify

    for name, value in (("BLOCK_V", 64), ("MIN_SPLIT_LEN", 64), ("PROGRAMS_PER_SM", 16),
                        ("TOP_P_FINISH", finish), ("TOP_P_FINISH_KEYS", finish_keys)):
        monkeypatch.setattr(triton_verify, name, value)
    inputs = threshold_inputs(300)
    inputs["top_k"][2] = 0  # request 2 (dense keys, top-p 1.0): no filter
    assert_matches_reference(inputs, 3, device, backend)


@pytest.mark.parametrize("device,backend", TRITON_BACKENDS)
@pytest.mark.parametrize("seed_values,coarse_values,seed_rounds,kept_rows,programs_per_sm",
                         [(2048, 512, 9, 16, 64), (2048, 128, 9, 16, 64), (2048, 512, 3, 16, 64), (8, 512, 9, 16, 64),
                          (2048, 512, 9, 1, 16), (0, 512, 9, 16, 64)],
                         ids=["lane-groups", "two-sets", "three-steps", "split-maxima", "lanes-overflow", "unseeded"])
def test_triton_top_k_search_seeded_from_the_max_pass(device, backend, seed_values, coarse_values, seed_rounds,
                                                      kept_rows, programs_per_sm, monkeypatch):
    """Top-k's round 0 starting from the k-th largest of the max pass's lane-group maxima
    (verify_search.top_k_seed, run to the k-th largest maximum itself, or its three steps: a
    bound below it, from which the later rounds narrow to the k-th largest logit). Rows of 300 in five
    programs of one 64-entry block, so with one lane a group the bound is the k-th largest
    logit itself (a bound one rank too high
    would lose the k-th of request 2's distinct logits, and its log-probabilities); two
    sets, k = 1 and 5 seeded from 80 maxima of four lanes, k = 150 from every logit; one
    group a program: the split maxima, fewer than k = 150 of them (that request starts
    unseeded) and a bound far below the 5th largest; programs of two blocks (a lane meets
    two logits) keeping one key a lane, so lanes overflow and read their rows again,
    counting; no seed. Each finds the reference's thresholds, so its tokens, counts and
    log-probabilities."""
    from specops.triton_kernels import verify as triton_verify

    monkeypatch.setattr(triton_verify, "SEED_VALUES", seed_values)
    monkeypatch.setattr(triton_verify, "SEED_COARSE_VALUES", coarse_values)
    monkeypatch.setattr(triton_verify, "SEED_ROUNDS", seed_rounds)  # 9: the k-th largest maximum itself
    monkeypatch.setattr(triton_verify, "SEARCH_KEPT_ROWS", kept_rows)
    for name, value in (("BLOCK_V", 64), ("MIN_SPLIT_LEN", 64), ("PROGRAMS_PER_SM", programs_per_sm)):
        monkeypatch.setattr(triton_verify, name, value)
    assert_matches_reference(threshold_inputs(300), 3, device, backend)


def marked_inputs(seed):
    """Five random requests (k of 3, 5, 8, 2 and 1, no top-p) over rows of 1024 whose 12
    largest logits lie one a 64-entry block, each at its own lane group (lanes 0, 4, ...),
    the rest far below: the k-th largest alone in its block, block 4m + (request + step) % 4
    (each request's step 0, always emitted, at another of a step's four loads)."""
    inputs = make_inputs([2, 3, 1, 2, 1], 1024, seed=seed, greedy_fraction=0.0)
    g = torch.Generator().manual_seed(seed)
    rows = torch.cat([inputs["target_logits"], inputs["bonus_logits"]])
    rows.copy_(torch.randn(rows.shape, generator=g) - 30.0)
    ks = [3, 5, 8, 2, 1]
    counts = torch.diff(inputs["cu_num_draft_tokens"].long(), prepend=torch.zeros(1, dtype=torch.long))
    owner = torch.cat([torch.repeat_interleave(torch.arange(5), counts), torch.arange(5)])
    step = torch.cat([torch.arange(int(c)) for c in counts] + [counts])
    for r in range(rows.shape[0]):
        k = ks[int(owner[r])]
        blocks = torch.randperm(16, generator=g)
        kth_block = 4 * int(torch.randint(0, 4, (1,), generator=g)) + int(owner[r] + step[r]) % 4
        blocks = torch.cat([blocks[blocks != kth_block][:k - 1], torch.tensor([kth_block]),
                            blocks[blocks != kth_block][k - 1:11]])
        lanes = torch.randperm(16, generator=g)[:12] * 4
        rows[r, blocks * 64 + lanes] = 5.0 - 0.5 * torch.arange(12.0)
    inputs["target_logits"], inputs["bonus_logits"] = rows[:-5].clone(), rows[-5:].clone()
    inputs["top_k"] = torch.tensor(ks, dtype=torch.int32)
    inputs["top_p"] = None
    return inputs


@pytest.mark.parametrize("device,backend", TRITON_BACKENDS)
@pytest.mark.parametrize("marks,max_k", [(True, 512), (True, 4), (False, 512)],
                         ids=["marked", "k-past-limit", "every-block"])
def test_triton_first_normaliser_reads_the_marked_blocks(device, backend, marks, max_k, monkeypatch):
    """With top-k, z1 reads only the blocks top-k's round 0 marked (a logit >= its low end,
    here the k-th largest itself: seeded from lane-group maxima to the k-th largest), and
    the others hold 0 (the draws' block masses). Rows of 1024 in four programs of four
    64-entry blocks, so the block holding the k-th largest alone sits at each of a step's
    four loads across the rows (a mark tested with > instead of >= drops it: z1 and the
    log-probabilities move); k = 1 searches nothing (its interval one key at once: no marks,
    z1 reads every block). Against the reference; with k of 5 and 8 past a limit of 4 (those
    rows unmarked, read whole), and with the marks off; every buffer from torch.empty
    zeroed, so a row z1 took as marked that round 0 did not mark would lose its mass."""
    from specops.triton_kernels import verify as triton_verify

    for name, value in (("BLOCK_V", 64), ("MIN_SPLIT_LEN", 256), ("PROGRAMS_PER_SM", 16), ("SEED_VALUES", 2048),
                        ("SEED_COARSE_VALUES", 512), ("SEED_ROUNDS", 9), ("TOP_K_MARKS", marks),
                        ("TOP_K_MARKS_MAX_K", max_k)):
        monkeypatch.setattr(triton_verify, name, value)
    real_empty = torch.empty  # buffers start as 0s: an unmarked block z1 read as marked would weigh nothing
    monkeypatch.setattr(torch, "empty", lambda *args, **kwargs: real_empty(*args, **kwargs).zero_())
    # One row set: its construction already puts the k-th largest's block at each of the
    # four loads (a second seed repeated that at twice the interpreter time).
    assert_matches_reference(marked_inputs(41), 3, device, backend)


@pytest.mark.parametrize("device,backend", TRITON_BACKENDS)
def test_triton_launches_with_top_k_capped(device, backend, monkeypatch):
    """With top-k the launcher caps both normalisers' registers and top-p's search rounds'
    (TOP_K_SUM_MAX_REGISTERS, SECOND_SUM_MAX_REGISTERS, TOP_P_SEARCH_MAX_REGISTERS: 5
    programs an SM, bench/NOTES.md); with top-p alone none (its search lost capped); the
    tokens match the reference either way."""
    from specops.triton_kernels import verify as triton_verify

    launches = []

    class Recorded:
        def __init__(self, kernel, name):
            self.kernel, self.name = kernel, name

        def __getitem__(self, grid):
            def launch(*args, **kwargs):
                if self.name == "sum":
                    launches.append(("second" if kwargs["SECOND"] else "first", kwargs.get("maxnreg")))
                elif kwargs["MODE"] == 1:  # top-p's rounds
                    launches.append(("top-p search", kwargs.get("maxnreg")))
                return self.kernel[grid](*args, **kwargs)
            return launch

    monkeypatch.setattr(triton_verify, "fixed_sum_kernel", Recorded(triton_verify.fixed_sum_kernel, "sum"))
    monkeypatch.setattr(triton_verify, "threshold_search_kernel",
                        Recorded(triton_verify.threshold_search_kernel, "search"))
    inputs = make_inputs([2, 3, 1], 300, seed=5, greedy_fraction=0.0)
    inputs["top_k"] = torch.tensor([5, 40, 300], dtype=torch.int32)
    assert_matches_reference(inputs, 3, device, backend)
    rounds = triton_verify.TOP_P_ROUNDS.value
    assert launches == [("first", triton_verify.TOP_K_SUM_MAX_REGISTERS),
                        *[("top-p search", triton_verify.TOP_P_SEARCH_MAX_REGISTERS)] * rounds,
                        ("second", triton_verify.SECOND_SUM_MAX_REGISTERS)]
    launches.clear()
    inputs["top_k"] = None
    assert_matches_reference(inputs, 3, device, backend)
    assert launches == [("first", None), *[("top-p search", None)] * rounds, ("second", None)]


@pytest.mark.parametrize("device,backend", TRITON_BACKENDS)
@pytest.mark.parametrize("poison", ["zeros", "large"])
def test_triton_search_reads_only_what_it_wrote(device, backend, poison, monkeypatch):
    """Every buffer the launcher takes from torch.empty starts as 0s, or as a large value
    (2^30; NaN in floats): a round that exits at once (its interval one key) and writes no
    partials, or any read of partials or kept keys no round wrote, would move a threshold
    with the poison. The seeded search of three steps (several rounds after the seed, the
    last ones of one key; coarse maxima for k = 1 and 5) and top-p after it, at the sizes of
    the seeded test."""
    from specops.triton_kernels import verify as triton_verify

    real_empty = torch.empty

    def poisoned(*args, **kwargs):
        tensor = real_empty(*args, **kwargs)
        if tensor.dtype.is_floating_point:
            return tensor.fill_(0.0 if poison == "zeros" else float("nan"))
        return tensor.fill_(0 if poison == "zeros" else 1 << 30)

    monkeypatch.setattr(triton_verify, "SEED_VALUES", 2048)
    monkeypatch.setattr(triton_verify, "SEED_COARSE_VALUES", 128)
    monkeypatch.setattr(triton_verify, "SEED_ROUNDS", 3)
    for name, value in (("BLOCK_V", 64), ("MIN_SPLIT_LEN", 64), ("SEARCH_KEPT_ROWS", 16)):
        monkeypatch.setattr(triton_verify, name, value)
    monkeypatch.setattr(torch, "empty", poisoned)
    assert_matches_reference(threshold_inputs(300), 3, device, backend)


def test_triton_top_k_seed_layout(monkeypatch):
    """The max pass stores SEED_VALUES lane-group maxima a row and SEED_COARSE_VALUES coarser
    ones, each a power of two a program that divides BLOCK_V (at least one, at most one a
    lane and one an entry of the split; no coarse set as fine as the other), and none past
    SEED_MAX_SPLITS splits a row or without SEED_VALUES."""
    from specops.triton_kernels import verify as triton_verify

    monkeypatch.setattr(triton_verify, "SEED_VALUES", 2048)
    monkeypatch.setattr(triton_verify, "SEED_COARSE_VALUES", 512)
    monkeypatch.setattr(triton_verify, "SEED_MAX_SPLITS", 16)
    monkeypatch.setattr(triton_verify, "BLOCK_V", 2048)
    assert [triton_verify.seed_bins_for(n, triton.next_power_of_2(n), 128256 // n) for n in (1, 2, 7, 16, 17, 63)] == [
        (2048, 512), (1024, 256), (256, 64), (128, 32), (0, 0), (0, 0)]
    assert triton_verify.seed_bins_for(1, 1, 40) == (32, 0)  # no more maxima than logits
    assert triton_verify.seed_bins_for(1, 1, 1000) == (512, 0)
    assert triton_verify.seed_bins_for(1, 1, 1024) == (1024, 512)
    monkeypatch.setattr(triton_verify, "BLOCK_V", 64)
    assert triton_verify.seed_bins_for(1, 1, 2048) == (64, 0)  # one lane a group at most: one set
    assert triton_verify.seed_bins_for(16, 16, 2048) == (64, 32)
    monkeypatch.setattr(triton_verify, "SEED_VALUES", 8)
    assert triton_verify.seed_bins_for(16, 16, 2048) == (1, 0)  # one group a program at least
    assert triton_verify.seed_bins_for(1, 1, 1) == (1, 0)
    monkeypatch.setattr(triton_verify, "SEED_VALUES", 0)
    assert triton_verify.seed_bins_for(2, 2, 2048) == (0, 0)


def threshold_inputs(vocab):
    """Four random requests whose top-k / top-p thresholds are hard to find exactly: bonus
    rows tied (inside and across splits); request 2's rows one logit of 0, the others
    consecutive floats from -70 down (each key once, shuffled), k of half the vocab, T =
    10: the k-th largest lies below max - 64 among logits one key apart that weigh in z1, so
    a threshold one key off changes the log-probabilities; k of 1 and 5, top-p 0.9, 0.5,
    0.75."""
    inputs = make_inputs([2, 0, 3, 1], vocab, seed=31, greedy_fraction=0.0)
    inputs["bonus_logits"] = (inputs["bonus_logits"] * 4).round() / 4
    dense = (0xC28C0000 + torch.stack([torch.randperm(vocab) for _ in range(3)])).int().view(torch.float32)
    inputs["target_logits"][2:5] = dense.index_fill(1, torch.tensor([0]), 0.0)
    inputs["temperature"][2] = 10.0
    inputs["top_k"] = torch.tensor([1, 5, vocab // 2, 0], dtype=torch.int32)
    inputs["top_p"] = torch.tensor([0.9, 0.5, 1.0, 0.75])
    return inputs


# The Triton kernel's searches have their own test above (its split and kept-key paths);
# under the interpreter this one would only repeat it, slowly.
THRESHOLD_BACKENDS = [p for p in KERNEL_BACKENDS if p.values != ("cpu", Backend.TRITON)]


@pytest.mark.parametrize("device,backend", THRESHOLD_BACKENDS)
@pytest.mark.parametrize("vocab", [700, 9000, 128256])
def test_threshold_searches_match_reference(device, backend, vocab):
    """The top-k / top-p thresholds of threshold_inputs at vocabularies that give the CUDA
    kernel clusters of 1 to 16 CTAs (the radix selection's histograms summed across them):
    exactly the reference's tokens, counts and log-probabilities."""
    assert_matches_reference(threshold_inputs(vocab), 3, device, backend)


@pytest.mark.parametrize("device,backend", THRESHOLD_BACKENDS)
@pytest.mark.parametrize("vocab", [300, 40000])
def test_top_p_extremes_match_reference(device, backend, vocab):
    """top_p_extremes' rows (thresholds at 1 / V over ties, under a dominant token, at the max
    alone, one step below 1): the C++ kernel's threshold, found 10 bits of p at a time, and
    the CUDA kernel's keep exactly the reference's tokens."""
    assert_matches_reference(top_p_extremes(vocab), 3, device, backend)


def test_triton_kept_keys_layout_is_bounded():
    """The search's kept-key buffer: its full SEARCH_KEPT_ROWS where a lane meets that many entries
    (B = 64's splits of 128256), no more rows than a lane meets, and never past
    SEARCH_KEPT_BYTES: fewer rows with the keep limit scaled, or none (a million requests
    of 40 entries wanted 128 GiB before the cap)."""
    from specops.triton_kernels import verify as triton_verify

    limit, rows, cap = triton_verify.SEARCH_KEEP_LIMIT, triton_verify.SEARCH_KEPT_ROWS, triton_verify.SEARCH_KEPT_BYTES
    assert triton_verify.kept_layout(640, 64128, 256) == (rows, limit)
    assert triton_verify.kept_layout(16, 2048, 256) == (8, limit)  # a lane meets 8 entries of a split
    assert triton_verify.kept_layout(4 << 20, 40, 256) == (0, -1)  # 2^20 requests, k = 3, V = 40
    assert triton_verify.kept_layout(640, 64128, 256, wanted_limit=-1) == (0, -1)  # never keeps: the same layout
    assert triton_verify.kept_layout(640, 64128, 256, 2 * rows, 2 * limit) == (2 * rows, 2 * limit)  # top-p's own
    programs = cap // (256 * 4 * 8)  # room for 8 rows each
    assert triton_verify.kept_layout(programs, 64128, 256) == (8, limit * 8 // rows)
    for programs in (1, 640, 10**4, 10**5, 10**6):
        got_rows, _ = triton_verify.kept_layout(programs, 64128, 256)
        assert got_rows * programs * 256 * 4 <= cap


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
    assert not specops.ops.triton_faster_eagerly(rows(1, 4) * 128256, filtered=False)
    assert not specops.ops.triton_faster_eagerly(rows(32, 4) * 128256, filtered=False)  # 20 Mi: 84 / 93 µs
    assert specops.ops.triton_faster_eagerly(rows(48, 4) * 128256, filtered=False)  # 29 Mi: 116 / 105
    assert specops.ops.triton_faster_eagerly(rows(64, 8) * 151936, filtered=False)
    assert not specops.ops.triton_faster_eagerly(rows(32, 4) * 128256, filtered=False, return_logprobs=True)  # 20 Mi
    assert specops.ops.triton_faster_eagerly(rows(48, 4) * 128256, filtered=False, return_logprobs=True)  # 29 Mi
    assert not specops.ops.triton_faster_eagerly(rows(1, 4) * 128256, filtered=True)  # 0.6 Mi: 123 / 186
    assert specops.ops.triton_faster_eagerly(rows(2, 4) * 128256, filtered=True)  # 1.2 Mi: 136 / 122


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
