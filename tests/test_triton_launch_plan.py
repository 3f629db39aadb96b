"""Eager Triton verify calls replayed from plans (triton_kernels/launch_plan.py): on the
CPU, a hand-made record maps every tensor to what a replay rebuilds it from (or leaves the
key unplanned), and the tracked modules switch plans off while an attribute differs from
its import; on a GPU, replays on fresh inputs equal the launcher's own launches bit for bit on every path
(screened, one launch, n-gram, greedy, top-k / top-p with log-probabilities, bf16),
misaligned inputs and another stream take plans of their own, a key whose launcher
allocates outside the plan is never replayed, and monkeypatched constants, launch hooks
and graph capture run the launcher."""

from __future__ import annotations

import dataclasses
import os
import types

import pytest
import torch
from conftest import capture, requires_gpu
from plan_replays import both_forms, native_built, replays_of
from verify_inputs import make_inputs

from specops.triton_kernels import launch_plan
from specops.triton_kernels import verify as triton_verify


def test_tracked_modules_switch_plans_off_while_changed(monkeypatch):
    assert launch_plan.plans_active()
    monkeypatch.setattr(triton_verify, "PDL", not triton_verify.PDL)
    assert not launch_plan.plans_active()
    monkeypatch.undo()
    assert launch_plan.plans_active()
    monkeypatch.setattr(triton_verify, "PDL", triton_verify.PDL)  # its own value again
    assert launch_plan.plans_active()
    monkeypatch.setattr(triton_verify, "A_NEW_NAME", 1, raising=False)
    assert not launch_plan.plans_active()
    monkeypatch.undo()  # deleted again
    assert launch_plan.plans_active()
    from specops.triton_kernels import attention, attention_plan, stream_counters

    # verify's helpers, and the attention launcher's modules (its plans: test_attention_launch_plan.py)
    for module, name in ((stream_counters, "_COUNTERS"), (attention, "PREFETCH_TABLE"),
                         (attention_plan, "ASSUMED_MULTIPROCESSORS")):
        monkeypatch.setattr(module, name, object())
        assert not launch_plan.plans_active(), name
        monkeypatch.undo()
    assert launch_plan.plans_active()


@pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1", reason="CPU tensors run under the interpreter")
def test_cpu_calls_run_the_launcher(monkeypatch):
    calls = []
    monkeypatch.setattr(launch_plan._Plan, "replay", lambda *a: calls.append(a))
    inputs = make_inputs([2, 3], 40, seed=1, with_top=False)
    for _ in range(3):
        triton_verify.verify(*inputs.values(), 3, False)
    assert not calls


class _FakeLauncher:  # Triton's CudaLauncher as a plan reads it, its C launch recorded
    global_scratch_size = profile_scratch_size = 0
    launch_cooperative_grid, launch_pdl = False, True

    def __init__(self):
        self.calls = []

    def launch(self, *args):
        self.calls.append(args)


class _FakeKernel:
    def __init__(self):
        self.run, self.function, self.packed_metadata = _FakeLauncher(), 1234, ("metadata",)


def _record(call_args, launches, extra=None):
    """A launcher call recorded by hand: two outputs and three workspace buffers, then the
    launches ``launches(outputs, workspace)`` returns (kernel, grid, arguments)."""
    launch_plan._local.recorder = recorder = launch_plan._Recorder()
    try:
        outs = (launch_plan.output((2, 3), torch.int32, "cpu"), launch_plan.output((0, 0), torch.float32, "cpu"))
        work = [launch_plan.workspace((5,), torch.int64, "cpu"), launch_plan.workspace((300,), torch.float32, "cpu"),
                launch_plan.workspace((0,), torch.int32, "cpu")]
        for kernel, grid, args in launches(outs, work):
            launch_plan.report_launch(kernel, grid, args)
    finally:
        launch_plan._local.recorder = None
    return launch_plan._plan_of(recorder, call_args, outs), outs, work


def test_plans_rebuild_every_pointer():
    """A record maps each tensor a launch took to a call argument, an output, a byte offset
    into one workspace (views too, 256-byte aligned buffers) or a persistent buffer; a
    replay passes the new call's pointers as ints and every other argument unchanged."""
    a, b = torch.randn(4, 8), torch.arange(6)
    counters = launch_plan.persistent(torch.zeros(64, dtype=torch.int32))
    first, second = _FakeKernel(), _FakeKernel()

    def launches(outs, work):
        return [(first, (3, 1, 1), (a, work[1][10:], 7, outs[0], None, 2.5, counters.view(torch.int64)[4:])),
                (second, (1, 2, 1), (work[0], b, outs[1], work[2], True, a))]

    plan, _, _ = _record((a, None, b, 4), launches)
    assert plan is not None and plan.workspace_bytes == 256 + 1280
    a2, b2 = torch.randn(4, 8), torch.arange(6)
    outs = plan.replay((a2, None, b2, 4), torch.device("cpu"), 99)
    assert [(o.shape, o.dtype) for o in outs] == [((2, 3), torch.int32), ((0, 0), torch.float32)]
    (call_1,), (call_2,) = first.run.calls, second.run.calls
    head = (1234, False, True, None, None, ("metadata",), None, None, None)
    assert call_1[:4] == (3, 1, 1, 99) and call_1[4:13] == head
    assert call_2[:4] == (1, 2, 1, 99) and call_2[4:13] == head
    base = call_2[13]  # the first workspace buffer opens the allocation
    assert call_1[13:] == (a2.data_ptr(), base + 256 + 10 * 4, 7, outs[0].data_ptr(), None, 2.5,
                           counters.data_ptr() + 32)
    assert call_2[13:] == (base, b2.data_ptr(), outs[1].data_ptr(), 0, True, a2.data_ptr())
    # A native replay that could not be made (None) falls back to the kernels' launchers.
    failing = dataclasses.replace(plan, native=types.SimpleNamespace(replay=lambda pointers, stream: None))
    failing.replay((a2, None, b2, 4), torch.device("cpu"), 99)
    assert len(first.run.calls) == len(second.run.calls) == 2


class _SignedKernel(_FakeKernel):  # a compiled kernel's signature, as CudaLauncher reads it
    def __init__(self, signature):
        super().__init__()
        self.src = types.SimpleNamespace(signature=dict(enumerate(signature)))
        self.packed_metadata = (4, 1, 1024)  # num_warps, num_ctas, shared memory


def test_native_launches_pack_parameters_as_the_kernel_takes_them():
    """launch_plan._native_launch: every non-constexpr argument at an 8-byte offset in the
    kernel's order (ints, bools and floats in their C widths, pointers as 8 bytes with the
    replayed ones patched), then Triton's two scratch pointers, 0; types it cannot pack leave
    the launch to the Python replay (None)."""
    import struct

    a, out = torch.randn(4), torch.zeros(3, dtype=torch.int32)
    persistent = torch.zeros(2)
    signature = ["*fp32", "i32", "constexpr", "fp32", "i1", "*i32", "i64", "u64", "fp64", "*fp32"]
    args = (a, 7, 16, 2.5, True, out, -3, 2**63, 1.5, persistent)
    kernel = _SignedKernel(signature)
    packed = launch_plan._native_launch(kernel, (3, 2, 1), args, {0: (0, 0), 5: (1, 0)})
    function, grid, threads, shared, ctas, pdl, cooperative, params, offsets, patches = packed
    assert (function, grid, threads, shared, ctas, pdl, cooperative) == (1234, (3, 2, 1), 128, 1024, 1, True, False)
    assert offsets == [0, 8, 16, 24, 32, 40, 48, 56, 64, 72, 80] and len(params) == 88
    assert patches == [(0, 0, 0), (32, 1, 0)]
    assert params[0:8] == bytes(8) and params[32:40] == bytes(8)  # patched at replay
    assert struct.unpack_from("<i", params, 8) == (7,)
    assert struct.unpack_from("<f", params, 16) == (2.5,)
    assert params[24:32] == b"\x01" + bytes(7)
    assert struct.unpack_from("<q", params, 40) == (-3,)
    assert struct.unpack_from("<Q", params, 48) == (2**63,)
    assert struct.unpack_from("<d", params, 56) == (1.5,)
    assert struct.unpack_from("<Q", params, 64) == (persistent.data_ptr(),)  # the same buffer every call
    assert params[72:88] == bytes(16)  # global and profile scratch: none
    # A float past float32's range packs as the C cast Triton's launcher makes: inf.
    big = launch_plan._native_launch(_SignedKernel(["fp32"]), (1, 1, 1), (1e300,), {})
    assert struct.unpack_from("<f", big[7], 0) == (float("inf"),)
    for bad_signature, bad_args in [
        (["fp16"], (1.0,)),  # a 16-bit float scalar
        ([("i32", "i32")], ((1, 2),)),  # a tuple argument
        (["i32"], (2**40,)),  # out of the type's range
        (["*fp32"], ("not a pointer",)),
        (["i32", "i32"], (1,)),  # the signature does not match the arguments
    ]:
        assert launch_plan._native_launch(_SignedKernel(bad_signature), (1, 1, 1), bad_args, {}) is None


def test_plans_take_the_native_form_where_built(monkeypatch):
    """A record whose launches all pack becomes a native plan of the same outputs, workspace
    and call arity; a native plan that reports an error, or one unpackable launch, leaves the
    Python replay."""
    made = []

    class FakeNative:
        error = ""

        def __init__(self, outputs, workspace_bytes, num_inputs, launches):
            made.append((outputs, workspace_bytes, num_inputs, launches))

    monkeypatch.setattr(launch_plan, "_native_plan_class", lambda: FakeNative)
    a = torch.randn(4)
    kernel = _SignedKernel(["*fp32", "*i32", "i32"])

    def launches(outs, work):
        return [(kernel, (2, 1, 1), (a, outs[0], 5))]

    plan, outs, _ = _record((a, 5), launches)
    assert isinstance(plan.native, FakeNative)
    (outputs, workspace_bytes, num_inputs, native_launches), = made
    assert outputs == list(outs) and workspace_bytes == plan.workspace_bytes and num_inputs == 2
    assert native_launches[0][9] == [(0, 0, 0), (8, 1, 0)]
    FakeNative.error = "LaunchPlan: malformed"
    plan, _, _ = _record((a, 5), launches)
    assert plan.native is None and plan.launches
    FakeNative.error = ""
    unpackable = _SignedKernel(["*fp32", "*i32", "fp16"])
    plan, _, _ = _record((a, 5), lambda outs, work: [(kernel, (1, 1, 1), (a, outs[0], 5)),
                                                     (unpackable, (1, 1, 1), (a, outs[0], 1.0))])
    assert plan.native is None and len(plan.launches) == 2


def test_tensors_a_plan_cannot_rebuild_leave_the_key_unplanned():
    a = torch.randn(4)
    stranger = torch.zeros(3)  # made by the launcher outside output / workspace (a fill, say)
    plan, _, _ = _record((a,), lambda outs, work: [(_FakeKernel(), (1, 1, 1), (a, stranger))])
    assert plan is None
    plan, _, _ = _record((a,), lambda outs, work: [(_FakeKernel(), (1, 1, 1), (a[1:],))])  # a view of an argument
    assert plan is None
    scratchy = _FakeKernel()
    scratchy.run.global_scratch_size = 128  # Triton's launcher would allocate scratch memory
    plan, _, _ = _record((a,), lambda outs, work: [(scratchy, (1, 1, 1), (a,))])
    assert plan is None
    plan, _, _ = _record((a,), lambda outs, work: [])  # nothing launched
    assert plan is None


def _cuda(inputs):
    return {k: v.cuda() if v is not None else None for k, v in inputs.items()}


@pytest.fixture
def replays(monkeypatch):
    """The replays of plans from now on, counted; plans recorded before are dropped."""
    yield from replays_of(monkeypatch, triton_verify.verify)


# (draft counts, vocab, make_inputs options, no temperature, log-probabilities)
CASES = {
    "screened": ([4] * 40, 4096, {"with_top": False}, False, False),
    "one-launch": ([4], 3000, {"with_top": False}, False, False),
    "ngram-bf16": ([3, 0, 4, 2, 4, 1, 4, 4], 5000, {"with_top": False, "ngram": True, "dtype": torch.bfloat16},
                   False, False),
    "top-k-top-p-logprobs": ([2, 4, 1, 3], 2000, {"greedy_fraction": 0.0}, False, True),
    "greedy": ([4, 2, 3, 0, 1, 4], 1000, {"with_top": False}, True, False),
    "fp16-int64-ids": ([4, 4, 4], 2500, {"with_top": False, "dtype": torch.float16, "id_dtype": torch.int64},
                       False, False),
}


@requires_gpu
@pytest.mark.gpu
@both_forms
@pytest.mark.parametrize("case", list(CASES))
def test_replays_equal_the_launcher(case, native, replays, monkeypatch):
    monkeypatch.setattr(launch_plan, "NATIVE", native)
    counts, vocab, options, no_temperature, logprobs = CASES[case]
    for call in range(5):  # fresh inputs (new pointers and values) every call
        inputs = _cuda(make_inputs(counts, vocab, seed=100 + call, **options))
        if no_temperature:
            inputs["temperature"] = None
        got = triton_verify.verify(*inputs.values(), 4, logprobs)
        want = triton_verify.launch_verify(*inputs.values(), 4, logprobs)
        for g, w in zip(got, want, strict=True):
            assert g.shape == w.shape and g.dtype == w.dtype
            assert torch.equal(g, w), (case, call)
    assert len(replays) >= 3, "the calls after the recorded one replay its plan"
    plans = [p for p in triton_verify.verify.plans.values() if isinstance(p, launch_plan._Plan)]
    assert plans and all((p.native is not None) == (native and native_built()) for p in plans)


@requires_gpu
@pytest.mark.gpu
def test_native_keys_hold_what_a_plan_depends_on():
    """specops._C.plan_key: the same key for fresh tensors of the same layout and the same
    host values; another for each change a replay could get wrong; None for an argument it
    cannot key (the caller keys those itself); the pointers in argument order."""
    from specops import _C

    if not hasattr(_C, "plan_key"):
        pytest.skip("specops._C built without CUDA")
    a, b = torch.randn(4, 8, device="cuda"), torch.arange(6, device="cuda")
    base = (a, None, b, 4, 2.5, True)
    key, pointers = _C.plan_key(base)
    assert pointers == [a.data_ptr(), 0, b.data_ptr(), 0, 0, 0]
    assert _C.plan_key((torch.randn(4, 8, device="cuda"), None, torch.arange(6, device="cuda"), 4, 2.5, True))[0] == key
    buffer = torch.empty(33, device="cuda")
    changed = [
        (torch.randn(4, 9, device="cuda"), None, b, 4, 2.5, True),  # shape
        (a.double(), None, b, 4, 2.5, True),  # dtype
        (torch.randn(8, 4, device="cuda").t(), None, b, 4, 2.5, True),  # strides, not contiguous
        (buffer[1:].view(4, 8), None, b, 4, 2.5, True),  # not 16-byte aligned
        (a.cpu(), None, b, 4, 2.5, True),  # device
        (a, b, b, 4, 2.5, True),  # None -> a tensor
        (a, None, b, 5, 2.5, True),  # int value
        (a, None, b, 4.0, 2.5, True),  # int -> float
        (a, None, b, 4, 2.25, True),  # float value
        (a, None, b, 4, 2.5, False),  # bool value
        (a, None, b, True, 2.5, True),  # int 4 -> bool
    ]
    keys = [_C.plan_key(args)[0] for args in changed]
    assert key not in keys and len(set(keys)) == len(keys)
    for odd in ("text", [1], (1,), 2**63, torch.float32):
        assert _C.plan_key((a, odd)) is None


# Run in a child process, so that a crash fails this test alone: built with libstdc++ linked
# statically (before setup.py's _shared_cxx_runtime), a record whose error message streams
# an integer crashed the process (bench/NOTES.md).
_MALFORMED_RECORDS = """
import torch
from specops import _C

out = [torch.empty(3, dtype=torch.int32, device="cuda")]
params = bytes(24)


def launch(offsets=(0, 8, 16), patches=()):
    return (0, (1, 1, 1), 32, 0, 1, False, False, params, list(offsets), list(patches))


assert _C.LaunchPlan(out, 64, 2, [launch(patches=[(0, 0, 1), (8, 1, 0), (16, 2, 8)])]).error == ""
bad = [
    ([launch(offsets=(0, 4))], "offset"),  # not 8-byte aligned
    ([launch(offsets=(0, 24))], "offset"),  # past the parameters
    ([launch(patches=[(20, 0, 0)])], "patch"),
    ([launch(patches=[(0, 0, 2)])], "input index"),
    ([launch(patches=[(0, 1, 1)])], "output index"),
    ([launch(patches=[(0, 2, 64)])], "workspace offset"),
    ([launch(patches=[(0, 7, 0)])], "source"),
    ([launch()[:9]], "10 fields"),
    ([("not a function",) + launch()[1:]], "wrong type"),
]
for launches, words in bad:
    plan = _C.LaunchPlan(out, 64, 2, launches)
    assert words in plan.error, (words, plan.error)
    assert plan.replay([0, 0], 0) is None
assert "CUDA tensor" in _C.LaunchPlan([torch.empty(3)], 0, 2, []).error
plan = _C.LaunchPlan(out, 0, 2, [])
assert plan.replay([0], 0) is None  # a wrong number of pointers: nothing made, nothing thrown
(fresh,) = plan.replay([0, 0], torch.cuda.current_stream().cuda_stream)
assert fresh.shape == (3,) and fresh.dtype == torch.int32 and fresh.is_cuda
print("records checked")
"""


@requires_gpu
@pytest.mark.gpu
def test_native_plans_refuse_malformed_records():
    """A malformed record is flagged (``error`` names what is wrong) and never replays; a
    replay that cannot be made returns None (the plan then replays through the kernels'
    launchers). Nothing raises across the binding."""
    import subprocess
    import sys

    from specops import _C

    if not hasattr(_C, "LaunchPlan"):
        pytest.skip("specops._C built without CUDA")
    child = subprocess.run([sys.executable, "-X", "faulthandler", "-c", _MALFORMED_RECORDS],
                           capture_output=True, text=True, timeout=300)
    assert child.returncode == 0 and "records checked" in child.stdout, child.stderr[-3000:]


@requires_gpu
@pytest.mark.gpu
def test_misaligned_inputs_and_other_streams_take_their_own_plans(replays):
    counts, vocab = [4, 3, 4], 1000

    def misaligned(x):  # the same values one element into a fresh buffer: no longer 16-byte aligned
        buffer = torch.empty(x.numel() + 1, dtype=x.dtype, device=x.device)
        view = buffer[1:].view(x.shape)
        view.copy_(x)
        return view

    side = torch.cuda.Stream()
    for call in range(4):
        inputs = _cuda(make_inputs(counts, vocab, seed=7 + call, with_top=False))
        moved = {**inputs, "target_logits": misaligned(inputs["target_logits"])}
        assert moved["target_logits"].data_ptr() % 16 != 0
        for args in (inputs, moved):
            want = triton_verify.launch_verify(*args.values(), 4, False)
            assert all(torch.equal(g, w) for g, w in zip(triton_verify.verify(*args.values(), 4, False), want))
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            got = triton_verify.verify(*inputs.values(), 4, False)
        torch.cuda.current_stream().wait_stream(side)
        assert all(torch.equal(g, w) for g, w in zip(got, triton_verify.launch_verify(*inputs.values(), 4, False)))
    keys = [k for k, plan in triton_verify.verify.plans.items() if isinstance(plan, launch_plan._Plan)]
    assert len(keys) == 3  # aligned, misaligned, and the side stream
    assert len(replays) >= 6


@requires_gpu
@pytest.mark.gpu
def test_allocations_outside_the_plan_are_never_replayed(replays):
    # No temperature with log-probabilities: the launcher fills a zero temperature itself.
    for call in range(4):
        inputs = _cuda(make_inputs([3, 2], 800, seed=30 + call, with_top=False))
        inputs["temperature"] = None
        got = triton_verify.verify(*inputs.values(), 3, True)
        want = triton_verify.launch_verify(*inputs.values(), 3, True)
        assert all(torch.equal(g, w) for g, w in zip(got, want))
    assert not replays
    assert list(triton_verify.verify.plans.values()) == [launch_plan._UNPLANNED]


@requires_gpu
@pytest.mark.gpu
def test_changed_constants_hooks_and_capture_run_the_launcher(replays, monkeypatch):
    import triton

    counts, vocab = [4, 4], 2048

    def fresh(seed):
        return _cuda(make_inputs(counts, vocab, seed=seed, with_top=False))

    for seed in range(3):  # recorded, then replayed
        triton_verify.verify(*fresh(seed).values(), 4, False)
    assert len(replays) == 1
    # A launch constant changed: the launcher runs (and still computes what the plan would).
    monkeypatch.setattr(triton_verify, "SUM_RESIDENT", triton_verify.SUM_RESIDENT + 1)
    inputs = fresh(10)
    got = triton_verify.verify(*inputs.values(), 4, False)
    assert len(replays) == 1
    monkeypatch.undo()
    assert all(torch.equal(g, w) for g, w in zip(got, triton_verify.launch_verify(*inputs.values(), 4, False)))
    # A launch hook sees every launch.
    seen = []
    monkeypatch.setattr(triton.knobs.runtime, "launch_enter_hook", lambda *a: seen.append(a))
    triton_verify.verify(*fresh(11).values(), 4, False)
    assert seen and len(replays) == 1
    monkeypatch.undo()
    # A CUDA graph captures the launcher's launches; its replays read fresh inputs.
    static = fresh(12)
    graph, outputs = capture(lambda: triton_verify.verify(*static.values(), 4, False))
    assert len(replays) == 1
    for seed in (13, 14):
        new = fresh(seed)
        for name, value in new.items():
            if value is not None:
                static[name].copy_(value)
        graph.replay()
        want = triton_verify.launch_verify(*new.values(), 4, False)
        assert all(torch.equal(g, w) for g, w in zip(outputs, want))


@requires_gpu
@pytest.mark.gpu
def test_bad_arguments_raise_after_plans_exist(replays):
    """A replay skips the arguments' checks only for a key that passed them: the same shapes
    non-contiguous, of another dtype or on another device still raise, named."""
    inputs = _cuda(make_inputs([4, 4], 512, seed=40, with_top=False))
    for _ in range(3):
        torch.ops.specops_triton.verify(*inputs.values(), 4, False)
    assert len(replays) == 1
    strided = torch.empty(512, 8, device="cuda").t()  # [8, 512] with strides (1, 8)
    strided.copy_(inputs["target_logits"])
    assert strided.shape == inputs["target_logits"].shape and not strided.is_contiguous()
    cases = [
        (dict(target_logits=strided), ValueError, "target_logits must be contiguous"),
        (dict(seeds=inputs["seeds"].int()), TypeError, "seeds"),
        (dict(positions=inputs["positions"].cpu()), ValueError, "positions must be on the same device"),
        (dict(temperature=inputs["temperature"][:1].expand(2)), ValueError, "temperature must be contiguous"),
    ]
    for override, error, words in cases:
        with pytest.raises(error, match=words):
            torch.ops.specops_triton.verify(*{**inputs, **override}.values(), 4, False)
    assert len(replays) == 1
