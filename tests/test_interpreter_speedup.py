"""tests/interpreter_speedup.py under the interpreter: a kernel whose device functions run
many times gives the same result with the skip as the reference computation, its device
calls skip the patch, and triton.language is as it was once the grid has ended."""

from __future__ import annotations

import os

import pytest
import torch
import triton
import triton.language as tl

import interpreter_speedup

pytestmark = pytest.mark.skipif(
    os.environ.get("TRITON_INTERPRET") != "1" or os.environ.get("SPECOPS_INTERPRETER_SPEEDUP") == "0",
    reason="the Triton interpreter's patching, installed by conftest")


@triton.jit
def _scaled(x, k):
    return x * k + tl.sum(x, axis=0)  # tl.sum: a jit function of triton.language (sees tl.core)


@triton.jit
def _repeat_kernel(x_ptr, out_ptr, N: tl.constexpr, STEPS: tl.constexpr):
    i = tl.program_id(0)
    x = tl.load(x_ptr + i * N + tl.arange(0, N))
    acc = tl.zeros([N], dtype=tl.float32)
    for step in tl.static_range(STEPS):
        acc += _scaled(x, step + 1.0)
    tl.store(out_ptr + i * N + tl.arange(0, N), acc)


def test_device_calls_skip_the_patch_and_compute_the_same():
    assert interpreter_speedup.install() is False  # installed once, by conftest
    load = tl.load
    x = torch.randn(3, 16)
    out = torch.full_like(x, float("nan"))
    before = dict(interpreter_speedup.COUNTS)
    _repeat_kernel[(3,)](x, out, N=16, STEPS=5)
    want = sum(x * (k + 1.0) + x.sum(dim=1, keepdim=True) for k in range(5))
    torch.testing.assert_close(out, want)
    skipped = interpreter_speedup.COUNTS["skipped"] - before["skipped"]
    patched = interpreter_speedup.COUNTS["patched"] - before["patched"]
    # 3 programs x (tl.zeros + 5 x (_scaled + tl.sum)) = 33 device calls: the first (tl.zeros,
    # a jit function of triton.language: it sees tl.core) patches tl.core once for the grid
    assert (skipped, patched) == (32, 2)  # + the grid's own patch
    assert tl.load is load and triton.language.core.is_builtin(tl.load)  # restored after the grid
