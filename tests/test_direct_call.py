"""Eager Triton calls of the functional ops (verify, paged_attention) through specops.ops run
the function the op is registered with, without the dispatcher, where nothing would
intercept the call; anything that would (a dispatch mode, the profiler, torch.jit.trace, a
tensor that needs a gradient) keeps the dispatcher. Both ways give the same result."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import specops
from attention_inputs import make_batch
from conftest import HAS_CUDA
from specops import _triton_ops
from specops.backend import Backend
from verify_inputs import make_inputs

DEVICES = [pytest.param("cpu", id="cpu")]
if HAS_CUDA:
    DEVICES.append(pytest.param("cuda", id="cuda", marks=pytest.mark.gpu))


def _case(device, name):
    """(arguments, the public call, the registered op's call) of one op on ``device``."""
    _needs_triton(device)
    make_args, public, registered = CASES[name]
    return make_args(device), public, registered


def _needs_triton(device):
    if Backend.TRITON not in specops.available_backends(torch.device(device)):
        pytest.skip("the Triton backend does not run on these tensors here (TRITON_INTERPRET=1 on the CPU)")


def _attention_args(device):
    batch = make_batch([21, 7], [3, 1], 4, 2, 32, 16, torch.float32, seed=5)
    return tuple(v.to(device) for v in batch.values()) + (32**-0.5,)


def _verify_args(device):
    inputs = make_inputs([2, 0, 3], 96, seed=11, greedy_fraction=0.4)
    return tuple(v.to(device) if v is not None else None for v in inputs.values()) + (3,)


CASES = {
    "paged_attention": (_attention_args, lambda args, **kw: specops.paged_attention(
        *args, max_query_len=3, validate=False, backend="triton", **kw),
        lambda args: torch.ops.specops_triton.paged_attention.default(*args, 0, 0.0, False, 3)),
    "verify": (_verify_args, lambda args, **kw: specops.verify(*args, False, validate=False, backend="triton", **kw),
               lambda args: torch.ops.specops_triton.verify.default(*args, False)),
}

EACH_OP = pytest.mark.parametrize("name", list(CASES))
EACH_DEVICE = pytest.mark.parametrize("device", DEVICES)


class _Spy:
    """Counts the direct calls of one op (the registered op still calls the original)."""

    def __init__(self, fn):
        self.fn, self.calls = fn, 0

    def __call__(self, *args, **kwargs):
        self.calls += 1
        return self.fn(*args, **kwargs)


class _OpLog(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.ops = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops.append(str(func))
        return func(*args, **(kwargs or {}))


@pytest.fixture
def spy(monkeypatch):
    def install(name):
        spy = _Spy(_triton_ops.DIRECT[name])
        monkeypatch.setitem(_triton_ops.DIRECT, name, spy)
        return spy

    return install


def _assert_same(got, want):
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g.dtype == w.dtype and g.shape == w.shape
        assert torch.equal(g, w) or (g.is_floating_point() and torch.equal(g.isnan(), w.isnan())
                                     and torch.equal(g.nan_to_num(), w.nan_to_num()))


@EACH_OP
@EACH_DEVICE
def test_direct_call_equals_the_registered_op(device, name, spy):
    args, public, registered = _case(device, name)
    counted = spy(name)
    got = public(args)
    assert counted.calls == 1, "an eager call with nothing intercepting it should skip the dispatcher"
    want = registered(args)
    assert counted.calls == 1, "the registered op runs its own function, not the table's"
    _assert_same(got, want)
    assert not any(torch.isnan(t).any() for t in got if t.is_floating_point() and t.numel())


def _tensors(args):
    return tuple(a for a in args if isinstance(a, torch.Tensor))


def _jit_traced(public, args):
    """``public`` traced by torch.jit.trace over the tensors of ``args``; fails unless the op
    is in the traced graph (a direct call would bypass the tracer, which also hands the
    launcher traced sizes where it expects ints)."""
    slots = [i for i, a in enumerate(args) if isinstance(a, torch.Tensor)]

    def call(*tensors):
        filled = list(args)
        for i, t in zip(slots, tensors):
            filled[i] = t
        return public(tuple(filled))

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", torch.jit.TracerWarning)
        traced = torch.jit.trace(call, _tensors(args), check_trace=False)
    assert any(node.kind().startswith("specops_triton::") for node in traced.graph.nodes()), traced.graph
    return traced


@EACH_OP
@EACH_DEVICE
def test_dispatcher_kept_where_something_intercepts(device, name, spy):
    args, public, _ = _case(device, name)
    want = public(args)
    counted = spy(name)
    log = _OpLog()
    with log:
        got = public(args)
    assert f"specops_triton.{name}.default" in log.ops, log.ops
    _assert_same(got, want)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as profile:
        public(args)
    assert any(f"specops_triton::{name}" in event.name for event in profile.events())
    _assert_same(_jit_traced(public, args)(*_tensors(args)), want)  # the op recorded in the trace
    needing_grad = tuple(a.clone().requires_grad_() if isinstance(a, torch.Tensor) and a.is_floating_point()
                         else a for a in args)
    outputs = public(needing_grad)
    assert counted.calls == 0
    if name == "paged_attention":  # the dispatcher's autograd fallback: a grad_fn that warns on backward
        with pytest.warns(UserWarning, match="autograd kernel was not registered"):
            outputs[0].sum().backward()
    with torch.no_grad():  # no gradient, nothing to intercept: direct again
        public(needing_grad)
    assert counted.calls == 1


@EACH_DEVICE
def test_host_values_of_other_types_keep_the_dispatcher(device, spy):
    """The dispatcher converts a host value to its schema's type (a 0-d tensor or numpy scale,
    an int soft cap); the direct call would pass it on as it is, so it is not taken."""
    _needs_triton(device)
    args, verify_args = _attention_args(device), _verify_args(device)
    want, want_verify = CASES["paged_attention"][1](args), CASES["verify"][1](verify_args)
    counted, counted_verify = spy("paged_attention"), spy("verify")
    for scale in (torch.tensor(args[6]), np.float32(args[6]), np.float64(args[6])):
        got = CASES["paged_attention"][1](args[:6] + (scale,))
        _assert_same(got, want)
    _assert_same(CASES["paged_attention"][1](args, soft_cap=0), want)
    _assert_same(CASES["verify"][1](verify_args[:-1] + (np.int64(3),)), want_verify)
    assert counted.calls == 0
    assert counted_verify.calls == 0
