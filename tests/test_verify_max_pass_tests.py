"""The screened Triton verify's acceptance tests settled in its max pass (row_max_kernel's
TESTS, triton_kernels/verify_rows.py) instead of a screen launch: a verdict that passes is
an exact pass and one that fails an exact failure, every test far from its boundary is
settled, greedy verdicts are the argmax's; the tokens equal the reference's with the max
pass's tests and with the screen launch; after an unsettled test the normaliser sums only
the steps the decisions test; the packed departures are left at zero; the calls the max
pass cannot serve take the screen launch. Each with the walked max pass (verify_walk.py,
the default) and the pass over every row. Rows of 3-4 programs under the
interpreter; on a GPU 5 and 18."""

from __future__ import annotations

import pytest
import torch

from conftest import HAS_CUDA, launch_grids
from verify_inputs import make_inputs, triton_tokens

from specops.reference.verify import accept_uniform, processed_probs
from specops.reference.verify import verify as reference_verify
from specops.triton_kernels.verify_rows import FAILS, PASSES, UNSETTLED
from specops.triton_kernels.verify_rows import fixed_sum_kernel as FIXED_SUM_KERNEL
from specops.triton_kernels.verify_walk import row_walk_kernel as WALK_KERNEL
from specops.triton_kernels.stream_counters import row_counters

DEVICES = ["cpu"] + ([pytest.param("cuda", marks=pytest.mark.gpu)] if HAS_CUDA else [])


UNWRITTEN = -1  # a normaliser partial no pass writes (they are sums of masses >= 0)


@pytest.fixture
def verdicts_seen(triton_verify, monkeypatch):
    """(verdicts, partials) of each call's normaliser launch: the verdicts it reads (the max
    pass wrote them) and the partials it wrote, poisoned with UNWRITTEN before it runs (the
    decisions read those of the steps they test: a step not summed poisons its test); a
    screen launch fails the test."""
    seen = []

    class Recorded:
        def __getitem__(self, grid):
            def launch(*args, **kwargs):
                if kwargs.get("VERDICTS"):
                    args[0].fill_(UNWRITTEN)
                    seen.append((args[3], args[0]))
                return FIXED_SUM_KERNEL[grid](*args, **kwargs)

            return launch

    class RecordedWalk:  # the walk sums them (SUMS): its verdicts and partials
        def __getitem__(self, grid):
            def launch(*args, **kwargs):
                if kwargs.get("SUMS"):
                    args[2].fill_(UNWRITTEN)
                    seen.append((args[10], args[2]))
                return WALK_KERNEL[grid](*args, **kwargs)

            return launch

    class Refused:
        def __getitem__(self, grid):
            raise AssertionError("screen_kernel launched: the max pass did not test the steps")

    monkeypatch.setattr(triton_verify, "fixed_sum_kernel", Recorded())
    monkeypatch.setattr(triton_verify, "row_walk_kernel", RecordedWalk())
    monkeypatch.setattr(triton_verify, "screen_kernel", Refused())
    return seen


def set_walk(triton_verify, monkeypatch, walk):
    """The max pass: "walk-sums" (the walk, with the exact normalisers: the default), "walk"
    (the normaliser launch after it) or "all-rows" (row_max_kernel's tests)."""
    monkeypatch.setattr(triton_verify, "MAX_PASS_WALK", walk != "all-rows")
    monkeypatch.setattr(triton_verify, "WALK_SUMS", walk == "walk-sums")


def boundary_inputs(vocab, seed, ngram):
    """Four requests (3, 4, 2 and 4 drafts), one greedy; a step placed within 4e-6 of its
    boundary on each side, a draft prob of 0, a draft outside the vocab, drafts whose logit
    lies 126.5 and 288 binades (200 T) below the max, a greedy draft that is the argmax."""
    inputs = make_inputs([3, 4, 2, 4], vocab, seed=seed, greedy_fraction=0.0, ngram=ngram, with_top=False)
    inputs["temperature"][2] = 0.0
    target, drafts = inputs["target_logits"], inputs["draft_token_ids"]
    drafts[7] = int(target[7].argmax())  # request 2's first step passes
    t_of = lambda b, i: (0, 3, 7, 9)[b] + i  # noqa: E731
    for b, i, factor in ((0, 0, 1 - 4e-6), (1, 0, 1 + 4e-6)):
        place_test(inputs, b, i, t_of(b, i), factor, seed)
    if not ngram:
        inputs["draft_probs"][t_of(1, 1), int(drafts[t_of(1, 1)])] = 0.0
        # p(x) = 0 (its weight 2^-126.5 relative to the max rounds to 0), q(x) = 2^-128: an
        # approximate sum u q(x) / p(x) of about u 2^-1.5 would pass it.
        t, x = t_of(0, 2), int(drafts[t_of(0, 2)])
        target[t] = -1e4
        target[t, (x + 1) % vocab] = 0.0
        target[t, x] = -126.5 * float(inputs["temperature"][0]) * 0.6931471805599453
        inputs["draft_probs"][t, x] = 2.0**-128
    drafts[t_of(1, 2)] = vocab + 3
    far = t_of(3, 1)
    target[far, int(drafts[far])] = target[far].max() - 200 * float(inputs["temperature"][3])
    return inputs


def place_test(inputs, b, i, t, ratio, seed):
    """Step i of request b (target row t) given the acceptance ratio u q(x) / p(x) = ratio:
    with draft probs by q(x), n-gram (q(x) = 1) by moving the row's logits (p(x) = u / ratio,
    below 1). ratio None: a sure pass (0.5; n-gram p(x) = (1 + u) / 2)."""
    target, x = inputs["target_logits"], int(inputs["draft_token_ids"][t])
    temperature = float(inputs["temperature"][b])
    u = accept_uniform(int(inputs["seeds"][b]), int(inputs["positions"][b]) + i)
    if ratio is None:
        ratio = 0.5 if inputs["draft_probs"] is not None else 2 * u / (1 + u)
    if inputs["draft_probs"] is None:
        target[t] = torch.randn(target.shape[1], generator=torch.Generator().manual_seed(seed)) * 0.01
        target[t, x] = 0.0
        rest = torch.logsumexp(torch.cat([target[t, :x], target[t, x + 1:]]) / temperature, 0)
        want = u / ratio
        target[t, x] = temperature * (torch.log(torch.tensor(want / (1 - want))) + rest)
    else:
        inputs["draft_probs"][t, x] = processed_probs(target[t], temperature, 0, 1.0)[x] / u * ratio


def expected_verdicts(inputs, width):
    """{slot: (exact pass, whether the max pass must settle it)} of every draft step."""
    cu = [0] + inputs["cu_num_draft_tokens"].tolist()
    out = {}
    for b in range(len(cu) - 1):
        temperature = float(inputs["temperature"][b])
        for i in range(cu[b + 1] - cu[b]):
            t = cu[b] + i
            x = int(inputs["draft_token_ids"][t])
            row = inputs["target_logits"][t].float()
            if not 0 <= x < row.numel():
                out[b * width + i] = (False, True)
            elif temperature == 0.0:
                out[b * width + i] = (x == int(row.argmax()), True)
            else:
                p_x = processed_probs(row, temperature, 0, 1.0)[x]
                q_x = inputs["draft_probs"][t, x] if inputs["draft_probs"] is not None else torch.tensor(1.0)
                u = torch.as_tensor(accept_uniform(int(inputs["seeds"][b]), int(inputs["positions"][b]) + i))
                passed = bool(q_x > 0) and bool(u * q_x < p_x)  # reference/verify.py: q(x) = 0 rejects
                near = p_x == 0 or abs(float(u * q_x / p_x) - 1) < 2**-8
                far = float(row.max() - row[x]) / temperature * 1.4426950408889634 > 90
                out[b * width + i] = (passed, q_x <= 0 or not (near or far))
    return out


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("ngram", [False, True], ids=["draft", "ngram"])
@pytest.mark.parametrize("walk", ["walk-sums", "walk", "all-rows"])
def test_verdicts_are_exact_where_settled(device, ngram, walk, verdicts_seen, triton_verify, monkeypatch):
    """With the walk (verify_walk.py; summing the normalisers itself or not) a request's
    steps after its first failure have no verdict: those are skipped."""
    set_walk(triton_verify, monkeypatch, walk)
    vocab = 9000  # 3 programs a row under the interpreter (all rows; the walk 1), 5 on a GPU
    kinds = set()
    for seed in (1, 2):
        inputs = boundary_inputs(vocab, seed, ngram)
        expected = reference_verify(**inputs, max_spec_len=4)
        got = triton_tokens(inputs, device, 4, validate=False)
        assert torch.equal(got[0], expected[0]) and torch.equal(got[1], expected[1]), seed
        verdicts = verdicts_seen[-1][0].cpu()
        failed = set()  # the requests whose walk ended
        for slot, (passed, settles) in expected_verdicts(inputs, 5).items():
            if walk != "all-rows" and slot // 5 in failed:
                continue
            verdict = int(verdicts[slot])
            if verdict == FAILS.value:
                failed.add(slot // 5)
            assert verdict in (PASSES.value, FAILS.value, UNSETTLED.value), (slot, verdict)
            assert verdict != (FAILS.value if passed else PASSES.value), (seed, slot, passed, verdict)
            assert not settles or verdict != UNSETTLED.value, (seed, slot, verdict)
            kinds.add(verdict)
    assert kinds == {PASSES.value, FAILS.value, UNSETTLED.value}, kinds  # every verdict occurs
    assert not row_counters(torch.device(device), 1).any().item()


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("ngram", [False, True], ids=["draft", "ngram"])
@pytest.mark.parametrize("walk", ["walk-sums", "walk", "all-rows"])
def test_the_normaliser_sums_only_the_steps_the_decisions_test(device, ngram, walk, verdicts_seen, triton_verify,
                                                                monkeypatch):
    """After an unsettled test the steps that surely pass need no normaliser: the launch
    sums the unsettled steps and the one that samples (the first sure failure after, or the
    bonus step), and the decisions take the passes from their verdicts (an unsummed step's
    partials stay poisoned; reading them would change the tokens). Every request's walk
    reads all its steps here (none fails before its last)."""
    set_walk(triton_verify, monkeypatch, walk)
    P, F, U = PASSES.value, FAILS.value, UNSETTLED.value
    # Per request: each step's verdict (a ratio far from 1, or 4e-6 from it: unsettled), and
    # the slots summed. Request 1 samples at its step 0 (an exact failure) and request 3 at
    # its step 3, their bonus steps summed all the same (no sure failure after the first).
    plan = [((U, 1 - 4e-6), (P, None), (P, None), (F, 8.0)),
            ((U, 1 + 4e-6), (P, None), (P, None), (P, None)),
            ((P, None), (U, 1 + 4e-6), (F, 8.0)),
            ((P, None), (U, 1 - 4e-6), (P, None), (U, 1 + 4e-6))]
    summed = [{0, 3}, {0, 4}, {1, 2}, {1, 3, 4}]
    width = 5
    inputs = make_inputs([len(steps) for steps in plan], 9000, seed=7, greedy_fraction=0.0, ngram=ngram,
                         with_top=False)
    t = 0
    for b, steps in enumerate(plan):
        for i, (_verdict, ratio) in enumerate(steps):
            place_test(inputs, b, i, t, ratio, seed=100 + t)
            t += 1
    expected = reference_verify(**inputs, max_spec_len=width - 1)
    got = triton_tokens(inputs, device, width - 1, validate=False)
    assert torch.equal(got[0], expected[0]) and torch.equal(got[1], expected[1])
    verdicts, partials = (tensor.cpu() for tensor in verdicts_seen[-1])
    written = (partials != UNWRITTEN).all(1).view(-1, width)
    assert ((partials == UNWRITTEN).all(1) | (partials != UNWRITTEN).all(1)).all()  # a slot's splits together
    for b, steps in enumerate(plan):
        assert [int(v) for v in verdicts[b * width: b * width + len(steps)]] == [v for v, _ in steps], b
        assert {i for i in range(width) if written[b, i]} == summed[b], b


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("tests", ["walk-sums", "walk", "max-pass", "screen-launch"])
def test_batches_match_reference(device, tests, triton_verify, monkeypatch):
    """Random batches with greedy requests among them, draft and n-gram, with the walked max
    pass's tests, the max pass's over every row and the screen launch, twice in a row (the
    departures the first call left serve the second)."""
    monkeypatch.setattr(triton_verify, "MAX_PASS_TESTS", tests != "screen-launch")
    set_walk(triton_verify, monkeypatch, tests if tests.startswith("walk") else "all-rows")
    vocab = 2000 if device == "cpu" else 128256
    for seed, ngram in ((5, False), (6, True)):
        inputs = make_inputs([4, 1, 0, 3, 2, 4], vocab, seed=seed, ngram=ngram, with_top=False)
        expected = reference_verify(**inputs, max_spec_len=4)
        for _ in range(2):
            got = triton_tokens(inputs, device, 4, validate=False)
            assert torch.equal(got[0], expected[0]) and torch.equal(got[1], expected[1]), seed
    assert not row_counters(torch.device(device), 1).any().item()


@pytest.fixture
def launches_of_the_screen(triton_verify, monkeypatch):
    """The grids the screen launch is called with."""
    return launch_grids(monkeypatch, triton_verify, "screen_kernel")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("limit", ["programs", "counters"])
def test_calls_the_max_pass_cannot_serve_take_the_screen_launch(device, limit, triton_verify, monkeypatch,
                                                                launches_of_the_screen):
    """Rows of more programs than a packed departure counts (65 here), and no zeroed
    counters to be had (too many slots, or a new stream capturing with no spare left:
    row_counters returns None): the screen launch decides, with the reference's tokens. (The
    walked max pass caps its splits at what a packed departure counts: the pass over every
    row here.)"""
    inputs = make_inputs([3, 1, 2], 3000, seed=4, with_top=False)
    if limit == "programs":
        monkeypatch.setattr(triton_verify, "MAX_PASS_WALK", False)
        monkeypatch.setattr(triton_verify, "PROGRAMS_PER_SM", 1 << 12)  # a split per 2048-entry block
        inputs = make_inputs([1, 1], 64 * 2048 + 5, seed=3, with_top=False)
    else:
        monkeypatch.setattr(triton_verify, "row_counters", lambda device, num_slots: None)
    expected = reference_verify(**inputs, max_spec_len=3)
    got = triton_tokens(inputs, device, 3, validate=False)
    assert torch.equal(got[0], expected[0]) and torch.equal(got[1], expected[1])
    assert len(launches_of_the_screen) == 1
