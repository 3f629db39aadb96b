"""The Triton launchers' host helpers (triton_kernels/launch.py): integer helpers equal to
Triton's, and DirectLaunch, which launches a compiled kernel without JITFunction.run once
its specialization has been seen. On a GPU: a second launch of a seen specialization skips
JITFunction.run and computes the same; a new dtype, alignment, integer specialization or
constexpr compiles through it; launch hooks and CUDA graphs keep working."""

from __future__ import annotations

import pytest
import torch
import triton
import triton.language as tl
from conftest import capture, requires_gpu
from specops.triton_kernels.launch import (DIRECT_TRITON_RELEASES, DirectLaunch, cdiv, direct_launch,
                                           next_power_of_2, observed)
from triton.runtime.jit import JITFunction


def test_host_integer_helpers_equal_tritons():
    for n in range(-8, 70000, 7):
        assert next_power_of_2(n) == triton.next_power_of_2(n), n
    for a in range(0, 5000, 13):
        for b in (1, 2, 3, 16, 2048, 4097):
            assert cdiv(a, b) == triton.cdiv(a, b), (a, b)


def test_observed_sees_each_hook_and_knob(monkeypatch):
    """What sends launches back through JITFunction.run: a hook in Triton's chains, a plain
    hook set in their place, the debug and instrumentation knobs; none of them: not observed."""
    from triton import knobs

    assert not observed()
    hook = lambda *args: None  # noqa: E731
    for chain in (knobs.runtime.launch_enter_hook, knobs.runtime.launch_exit_hook):
        chain.add(hook)
        try:
            assert observed()
        finally:
            chain.remove(hook)
        assert not observed()
    with monkeypatch.context() as m:
        m.setattr(knobs.runtime, "launch_exit_hook", hook)
        assert observed()
    with monkeypatch.context() as m:
        m.setattr(knobs.runtime, "debug", True)
        assert observed()
    with monkeypatch.context() as m:
        m.setattr(knobs.compilation, "instrumentation_mode", "consan")
        assert observed()
    assert not observed()


def _scale_kernel(out_ptr, in_ptr, n, factor, BLOCK: tl.constexpr, SHIFT: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n
    x = tl.load(in_ptr + offsets, mask=mask)
    tl.store(out_ptr + offsets, x * factor + SHIFT, mask=mask)


def test_direct_launch_wraps_jit_functions_only():
    from triton.runtime.interpreter import InterpretedFunction

    interpreted = InterpretedFunction(_scale_kernel)
    assert direct_launch(interpreted) is interpreted
    jit = JITFunction(_scale_kernel)
    wrapped = direct_launch(jit)
    if not triton.__version__.startswith(DIRECT_TRITON_RELEASES):  # another release: launched as usual
        assert wrapped is jit
        return
    assert isinstance(wrapped, DirectLaunch) and wrapped.fn is jit
    assert wrapped.arg_names == jit.arg_names  # attributes reach the JITFunction


SCALE = direct_launch(JITFunction(_scale_kernel))


def _launch(out, x, factor=3.0, shift=1, block=128):
    SCALE[(cdiv(x.numel(), block),)](out, x, x.numel(), factor, BLOCK=block, SHIFT=shift, enable_fp_fusion=False)


def _expected(x, factor=3.0, shift=1):  # one rounding an operation (no fused multiply-add)
    return x * factor + shift


@pytest.fixture
def runs(monkeypatch):
    """The launches that went through JITFunction.run (compiled or slow-path), counted."""
    calls = []
    real = SCALE.fn.run

    def counted(*args, **kwargs):
        calls.append(kwargs.get("grid"))
        return real(*args, **kwargs)

    monkeypatch.setattr(SCALE.fn, "run", counted)
    SCALE.kernels.clear()
    yield calls
    SCALE.kernels.clear()


def _fresh(n, dtype=torch.float32, offset=0):
    x = torch.randn(n + offset, device="cuda").to(dtype)[offset:]
    out = torch.full((n + offset,), float("nan"), device="cuda", dtype=dtype)[offset:]
    return out, x


@requires_gpu
@pytest.mark.gpu
def test_gpu_seen_specialization_skips_jit_run(runs):
    out, x = _fresh(1024)
    _launch(out, x)
    assert len(runs) == 1
    torch.testing.assert_close(out, _expected(x), rtol=0, atol=0)
    for _ in range(3):  # the same specialization, fresh inputs: straight to the compiled kernel
        out, x = _fresh(1024)
        _launch(out, x)
        torch.testing.assert_close(out, _expected(x), rtol=0, atol=0)
    assert len(runs) == 1
    # n = 1037 (not divisible by 16) is another specialization of n: compiled through run
    # once; n = 1000 is of the same one as 1037: direct.
    for n in (1037, 1037, 1000):
        out, x = _fresh(n)
        _launch(out, x)
        torch.testing.assert_close(out, _expected(x), rtol=0, atol=0)
    assert len(runs) == 2


@requires_gpu
@pytest.mark.gpu
@pytest.mark.parametrize("change", ["misaligned", "dtype", "constexpr", "n is 1"])
def test_gpu_new_specialization_compiles_through_jit_run(runs, change):
    out, x = _fresh(1024)
    _launch(out, x)
    assert len(runs) == 1
    shift = 1
    if change == "misaligned":  # pointers 4 bytes past a 16-byte boundary: no alignment hint
        out, x = _fresh(1024, offset=1)
        assert x.data_ptr() % 16 != 0
    elif change == "dtype":
        out, x = _fresh(1024, dtype=torch.float64)
    elif change == "constexpr":
        shift = 5
    else:
        out, x = _fresh(1)
    for _ in range(2):
        _launch(out, x, shift=shift)
        torch.testing.assert_close(out, _expected(x, shift=shift), rtol=0, atol=0)
    assert len(runs) == 2


@requires_gpu
@pytest.mark.gpu
def test_gpu_launch_hooks_take_jit_run(runs):
    from triton import knobs

    out, x = _fresh(512)
    _launch(out, x)
    seen = []
    hook = lambda metadata: seen.append(metadata.get()["name"])  # noqa: E731
    knobs.runtime.launch_enter_hook.add(hook)
    try:
        _launch(out, x)
        _launch(out, x)
    finally:
        knobs.runtime.launch_enter_hook.remove(hook)
    assert len(runs) == 3 and seen == ["_scale_kernel"] * 2
    _launch(out, x)  # hooks gone: direct again
    assert len(runs) == 3


@requires_gpu
@pytest.mark.gpu
def test_gpu_direct_launch_in_a_cuda_graph(runs):
    out, x = _fresh(4096)
    graph, _ = capture(lambda: _launch(out, x), warmups=2)
    assert len(runs) == 1  # the first warm-up compiled; the second and the capture were direct
    for _ in range(2):
        x.copy_(torch.randn_like(x))
        out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        torch.testing.assert_close(out, _expected(x), rtol=0, atol=0)
