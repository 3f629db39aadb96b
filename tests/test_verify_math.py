"""The Triton verify kernels' fused multiply-add, exp and log (triton_kernels/verify_math.py)
equal the reference's (reference/repro_math.py) bit for bit, the fused multiply-add also
a * b + c rounded once where rounding twice differs, and fixed_exp equals floor(exp 2^40),
over a sweep of arguments that crosses every binade the kernels meet, the 2^-125 flush, 0,
-inf and NaN (CPU under the interpreter; the GPU with contraction off, as the kernels are
launched: only the explicit fused multiply-adds are fused); on the GPU fixed_exp also at
every float32 x <= 0 but the subnormals."""

from __future__ import annotations

import pytest
import torch

from conftest import HAS_CUDA, requires_gpu
from fma_cases import fma_cases, fma_exact
from specops.backend import triton_available
from specops.reference.repro_math import fma, repro_exp, repro_log

DEVICES = ["cpu"] + ([pytest.param("cuda", marks=pytest.mark.gpu)] if HAS_CUDA else [])
pytestmark = pytest.mark.skipif(not triton_available(), reason="needs triton")

if triton_available():
    import triton
    import triton.language as tl

    from specops.triton_kernels.verify_math import fixed_exp as triton_fixed_exp
    from specops.triton_kernels.verify_math import repro_exp as triton_exp
    from specops.triton_kernels.verify_math import repro_log as triton_log

    @triton.jit
    def _exp_log_kernel(exp_ptr, log_ptr, fixed_ptr, x_ptr, n, BLOCK: tl.constexpr):
        i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        mask = i < n
        x = tl.load(x_ptr + i, mask=mask, other=0.0)
        tl.store(exp_ptr + i, triton_exp(x), mask=mask)
        tl.store(log_ptr + i, triton_log(tl.abs(x)), mask=mask)
        tl.store(fixed_ptr + i, triton_fixed_exp(x), mask=mask)

    @triton.jit
    def _fma_kernel(out_ptr, a_ptr, b_ptr, c_ptr, n, BLOCK: tl.constexpr):
        i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        mask = i < n
        a = tl.load(a_ptr + i, mask=mask, other=0.0)
        b = tl.load(b_ptr + i, mask=mask, other=0.0)
        c = tl.load(c_ptr + i, mask=mask, other=0.0)
        tl.store(out_ptr + i, tl.fma(a, b, c), mask=mask)

    @triton.jit
    def _fixed_exp_kernel(fixed_ptr, first_bits, n, BLOCK: tl.constexpr):
        """fixed_exp of the float32 whose bits are first_bits + i (no load: every pattern)."""
        i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        x = (first_bits + i).to(tl.float32, bitcast=True)
        tl.store(fixed_ptr + i, triton_fixed_exp(x), mask=i < n)


def _arguments() -> torch.Tensor:
    g = torch.Generator().manual_seed(5)
    # -x spans 2^-30 .. 2^8 by exponent, random mantissas: every binade of (z - max) / T.
    magnitudes = torch.exp2(torch.rand(6000, generator=g) * 38 - 30)
    edges = torch.tensor([0.0, -0.0, -1e-30, -86.6, -86.64, -86.65, -87.0, -88.7, -103.0, -1000.0,
                          float("-inf"), float("nan")])
    near_flush = -125.0 * 0.6931471805599453 + torch.linspace(-0.01, 0.01, 257, dtype=torch.float64)
    return torch.cat([-magnitudes, edges, near_flush.float()]).to(torch.float32)


@pytest.mark.parametrize("device", DEVICES)
def test_triton_fma_rounds_once(device):
    """tl.fma as the kernels get it (fma.rn.f32 on the GPU; under the interpreter the one
    verify_math installs, which rounds once where Triton's own rounds twice) equals a * b + c
    rounded once, on triples where rounding twice gives the other neighbour too."""
    a, b, c, _hard = fma_cases(count=1000, seed=1)
    n = a.numel()
    out = torch.full((n,), float("nan"), device=device)
    _fma_kernel[(triton.cdiv(n, 512),)](out, a.to(device), b.to(device), c.to(device), n, BLOCK=512,
                                        enable_fp_fusion=False)
    expected = fma_exact(a, b, c)
    assert torch.equal(out.cpu().view(torch.int32), expected.view(torch.int32))
    assert torch.equal(fma(a.to(device), b.to(device), c.to(device)).cpu().view(torch.int32), expected.view(torch.int32))


@pytest.mark.parametrize("device", DEVICES)
def test_triton_exp_and_log_equal_the_reference_bit_for_bit(device):
    x = _arguments()
    n = x.numel()
    exp_out = torch.full((n,), float("nan"), device=device)  # poisoned: every entry written
    log_out = torch.full((n,), float("nan"), device=device)
    fixed_out = torch.full((n,), -1, dtype=torch.int64, device=device)
    _exp_log_kernel[(triton.cdiv(n, 1024),)](exp_out, log_out, fixed_out, x.to(device), n, BLOCK=1024,
                                             enable_fp_fusion=False)
    finite = torch.isfinite(x)
    expected_exp = repro_exp(x)
    assert torch.equal(exp_out.cpu()[finite].view(torch.int32), expected_exp[finite].view(torch.int32))
    assert exp_out.cpu()[x == float("-inf")].eq(0).all()
    # fixed_exp (the exact normaliser's terms): floor(repro_exp(x) 2^40), x <= 0 or -inf.
    at_most_0 = ~torch.isnan(x)
    expected_fixed = torch.floor(repro_exp(x[at_most_0]) * 2.0**40).to(torch.int64)
    assert torch.equal(fixed_out.cpu()[at_most_0], expected_fixed)
    assert (expected_fixed > 0).sum() > 1000 and (expected_fixed == 0).sum() > 100  # both sides of the flush
    normal = finite & (x.abs() >= torch.finfo(torch.float32).tiny)
    expected_log = repro_log(x.abs()[normal])
    assert torch.equal(log_out.cpu()[normal].view(torch.int32), expected_log.view(torch.int32))


@pytest.mark.gpu
@requires_gpu
def test_fixed_exp_equals_the_reference_at_every_float_at_most_0():
    """Every float32 x <= 0 the kernels can meet (-0, the negative normals, -inf), on the GPU
    as the kernels are launched, against floor(repro_exp(x) 2^40) from the reference's torch
    operations there: every binade, rounding and the flush at 2^-125, not a sample (a
    rewrite of fixed_exp is checked at all of them). Subnormal x are left out: the kernels
    flush them to 0 (and the reference does not); x = (z - max) / T is subnormal only for
    logits within 2^-126 of a subnormal max."""
    chunk = 1 << 26
    first, last = 0x80800000, 0xFF800000  # -2^-126 (the least negative normal) .. -inf
    out = torch.empty(chunk, dtype=torch.int64, device="cuda")
    checked = nonzero = 0
    for start in [0x80000000, *range(first, last + 1, chunk)]:
        n = 1 if start == 0x80000000 else min(chunk, last + 1 - start)
        out[:n].fill_(-1)  # poisoned: every entry written
        signed = start - (1 << 32)  # the int32 of these bits
        _fixed_exp_kernel[(triton.cdiv(n, 4096),)](out, signed, n, BLOCK=4096, enable_fp_fusion=False)
        bits = torch.arange(signed, signed + n, dtype=torch.int64, device="cuda").to(torch.int32)
        expected = torch.floor(repro_exp(bits.view(torch.float32)) * 2.0**40).to(torch.int64)
        mismatch = (out[:n] != expected).nonzero()
        if mismatch.numel():
            i = int(mismatch[0, 0])
            raise AssertionError(f"{int(mismatch.numel())} of {n} differ from bits {start:#x}; first "
                                 f"x = {bits.view(torch.float32)[i].item()!r}: {int(out[i])} != {int(expected[i])}")
        checked += n
        nonzero += int((expected > 0).sum())
    assert checked == last - first + 2
    assert nonzero > 1 << 29  # x from -27.7 (the last term of at least 2^-40) up to -0
