"""The engine's own Triton kernel (triton_kernels/rope_cache.py) against the eager steps it
replaces (specops/engine/model.py), on fresh random inputs."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch
from conftest import HAS_CUDA

from specops import ops
from specops.engine.model import fast_steps, rope_qkv

pytest.importorskip("triton")
from specops.triton_kernels.rope_cache import rope_cache  # noqa: E402

DEVICES = [pytest.param("cpu", marks=pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1",
                                                         reason="Triton on the CPU needs TRITON_INTERPRET=1"))]
if HAS_CUDA:
    DEVICES.append(pytest.param("cuda", marks=pytest.mark.gpu))
DTYPES = [torch.float32, torch.bfloat16, torch.float16]


def rope_inputs(n, hq, hkv, d, num_blocks, block_size, dtype, device, seed):
    g = torch.Generator().manual_seed(seed)
    # qkv rows inside a wider buffer: the kernel takes a row stride.
    qkv = torch.randn(n, (hq + 2 * hkv) * d + 24, generator=g).to(dtype)[:, 24:]
    angles = torch.rand(n, d // 2, generator=g) * 1000
    angles = torch.cat((angles, angles), -1)
    cache = torch.randn(2, num_blocks, block_size, hkv, d, generator=g).to(dtype)
    slots = torch.randperm(num_blocks * block_size, generator=g)[:n]
    slots[torch.rand(n, generator=g) < 0.2] = -1  # padding rows: no write
    return [t.to(device) for t in (qkv, angles.cos(), angles.sin(), cache[0], cache[1], slots)]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n, hq, hkv, d", [(13, 6, 2, 32), (9, 32, 8, 64), (5, 3, 3, 128), (1, 4, 1, 24)])
def test_rope_cache_equals_eager_steps(device, dtype, n, hq, hkv, d):
    """Bit for bit: q, and the whole of both caches (rows not written keep their values)."""
    qkv, cos, sin, key_cache, value_cache, slots = rope_inputs(n, hq, hkv, d, 7, 4, dtype, device, seed=n * d)
    q_ref, k_ref, v_ref = rope_qkv(qkv, cos, sin, hq, hkv)
    key_ref, value_ref = key_cache.clone(), value_cache.clone()
    ops.reshape_and_cache(k_ref, v_ref, key_ref, value_ref, slots)
    q = rope_cache(qkv, cos, sin, hq, hkv, key_cache, value_cache, slots)
    assert q.shape == (n, hq, d) and q.is_contiguous()
    assert torch.equal(q, q_ref)
    assert torch.equal(key_cache, key_ref) and torch.equal(value_cache, value_ref)
    assert not torch.equal(key_ref, key_cache.clone().zero_())  # the comparison sees data


@pytest.mark.parametrize("device", DEVICES)
def test_fast_step_checks_slot_values_when_validating(device):
    """The engine's fast step (specops/engine/model.py) checks the slots as reshape_and_cache
    does when asked; the kernel alone skips a bad slot."""
    qkv, cos, sin, key_cache, value_cache, slots = rope_inputs(4, 4, 2, 16, 3, 4, torch.float32, device, seed=2)
    slots[1] = key_cache.shape[0] * key_cache.shape[1]  # one past the last slot
    step = fast_steps().rope_cache
    with pytest.raises(ValueError, match="slot_mapping"):
        step(qkv, cos, sin, 4, 2, key_cache, value_cache, slots, True)
    key_ref, value_ref = key_cache.clone(), value_cache.clone()
    _, k_ref, v_ref = rope_qkv(qkv, cos, sin, 4, 2)
    ops.reshape_and_cache(k_ref, v_ref, key_ref, value_ref, torch.where(slots == slots[1], -1, slots))
    step(qkv, cos, sin, 4, 2, key_cache, value_cache, slots, False)  # the bad slot skipped, the others written
    assert torch.equal(key_cache, key_ref) and torch.equal(value_cache, value_ref)


@pytest.mark.parametrize("device", DEVICES)
def test_rope_cache_errors_name_the_argument(device):
    qkv, cos, sin, key_cache, value_cache, slots = rope_inputs(4, 4, 2, 16, 3, 4, torch.float32, device, seed=1)
    with pytest.raises(ValueError, match="qkv"):
        rope_cache(qkv[:, :-16], cos, sin, 4, 2, key_cache, value_cache, slots)
    with pytest.raises(ValueError, match="cos"):
        rope_cache(qkv, cos.double(), sin, 4, 2, key_cache, value_cache, slots)
    with pytest.raises(ValueError, match="key_cache"):
        rope_cache(qkv, cos, sin, 4, 2, key_cache.half(), value_cache, slots)
    with pytest.raises(ValueError, match="slot_mapping"):
        rope_cache(qkv, cos, sin, 4, 2, key_cache, value_cache, slots.int())


COMPILE_SCRIPT = """
import triton
from triton.backends.compiler import GPUTarget
from specops.triton_kernels.rope_cache import rope_cache_kernel

def compile_for_sm90(fn, pointers, constexprs):
    signature = {name: constexprs and name in constexprs and 'constexpr' or pointers.get(name, 'i32')
                 for name in fn.arg_names}
    source = triton.compiler.ASTSource(fn=fn, signature=signature, constexprs=constexprs)
    triton.compile(source, target=GPUTarget('cuda', 90, 32), options={'enable_fp_fusion': False})

for dtype in ('bf16', 'fp16', 'fp32'):
    compile_for_sm90(rope_cache_kernel, {'q_ptr': '*' + dtype, 'key_cache_ptr': '*' + dtype,
                     'value_cache_ptr': '*' + dtype, 'qkv_ptr': '*' + dtype, 'cos_ptr': '*fp32', 'sin_ptr': '*fp32',
                     'slot_mapping_ptr': '*i64'},
                     {'NUM_HEADS': 32, 'NUM_KV_HEADS': 8, 'HEAD_DIM': 64, 'BLOCK_HQ': 32, 'BLOCK_HKV': 8,
                      'BLOCK_HALF': 32})
print('compiled')
"""


def test_kernels_compile_for_sm90():
    """The GPU compiler is stricter than the interpreter (a variable may not change type in a
    branch): compile the kernel for sm_90 offline, in a process without the interpreter."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    result = subprocess.run([sys.executable, "-c", COMPILE_SCRIPT], check=False, env=env, capture_output=True,
                            text=True, timeout=600)
    assert result.returncode == 0 and "compiled" in result.stdout, result.stderr[-3000:]
