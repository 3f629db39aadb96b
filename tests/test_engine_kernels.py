"""The engine's own Triton kernels (triton_kernels/rope_cache.py, silu_mul.py) against the
eager steps they replace (specops/engine/model.py), on fresh random inputs."""

from __future__ import annotations

import os

import pytest
import torch
import torch.nn.functional as F
from conftest import HAS_CUDA

from specops import ops
from specops.engine.model import rope_qkv

pytest.importorskip("triton")
from specops.triton_kernels.rope_cache import rope_cache  # noqa: E402
from specops.triton_kernels.silu_mul import silu_mul  # noqa: E402

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


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n, intermediate", [(7, 136), (3, 2048), (1, 1500)])
def test_silu_mul_matches_eager(device, dtype, n, intermediate):
    """Within one rounding of the eager result (the exponentials differ in the last float32
    bits), and in bf16/fp16 equal on nearly every entry."""
    g = torch.Generator().manual_seed(intermediate + n)
    wide = (torch.randn(n, 2 * intermediate + 8, generator=g) * 4).to(dtype).to(device)
    gate_up = wide[:, 8:]  # a row stride wider than the row
    gate, up = gate_up.chunk(2, dim=-1)
    expected = F.silu(gate.contiguous()) * up
    got = silu_mul(gate_up)
    assert got.shape == (n, intermediate) and got.dtype == dtype
    assert not got.isnan().any()
    rtol = {torch.float32: 1e-6, torch.bfloat16: 2**-7, torch.float16: 2**-10}[dtype]
    torch.testing.assert_close(got, expected, rtol=rtol, atol=1e-6)
    if dtype != torch.float32:
        assert (got == expected).float().mean() > 0.98


def test_silu_mul_errors_name_the_argument():
    with pytest.raises(ValueError, match="gate_up"):
        silu_mul(torch.randn(3, 5))
