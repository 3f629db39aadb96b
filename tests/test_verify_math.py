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

    from specops.triton_kernels.verify_math import exponent_scale, fixed_weights, processed_weights, scaled_weights
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

    @triton.jit
    def _folded_kernel(out_ptr, z_ptr, max_ptr, t_ptr, n, BLOCK: tl.constexpr):
        """Per entry (int64 columns): exponent_scale's scale (bits), then the weight (bits)
        and the fixed-point term by the folded multiply (the scale where nonzero) and by
        the division."""
        i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        mask = i < n
        z = tl.load(z_ptr + i, mask=mask, other=0.0)
        m = tl.load(max_ptr + i, mask=mask, other=0.0)
        t = tl.load(t_ptr + i, mask=mask, other=1.0)
        kth = float("-inf")
        scale = exponent_scale(t)
        folded = tl.where(scale > 0.0, scale, 1.0)
        columns = (scale, processed_weights(z, m, folded, kth, 1.0, 0.0, True, False),
                   processed_weights(z, m, t, kth, 1.0, 0.0, False, False))
        for c in tl.static_range(3):
            tl.store(out_ptr + i * 5 + c, columns[c].to(tl.int32, bitcast=True).to(tl.int64), mask=mask)
        tl.store(out_ptr + i * 5 + 3, fixed_weights(z, m, folded, kth, True, False), mask=mask)
        tl.store(out_ptr + i * 5 + 4, fixed_weights(z, m, t, kth, False, False), mask=mask)

    @triton.jit
    def _scaled_kernel(out_ptr, z_ptr, max_ptr, t_ptr, BLOCK: tl.constexpr):
        """scaled_weights' weights (bits, int64) of BLOCK entries a program, which share one
        temperature (its branch is on a scalar, as in the proposals)."""
        i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        t = tl.load(t_ptr + tl.program_id(0) * BLOCK)
        w = scaled_weights(tl.load(z_ptr + i), tl.load(max_ptr + i), t, exponent_scale(t), float("-inf"), 1.0, 0.0,
                           False)
        tl.store(out_ptr + i, w.to(tl.int32, bitcast=True).to(tl.int64))


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


def _folded_cases() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(z, max, T): every power of two T = 2^-126 .. 2^127 and its float neighbours, T = 3
    and 0.7, against z - max over every binade the kernels meet, subnormal differences
    (logits next to a subnormal max), differences whose scaled product leaves the float
    range, 0 and -inf."""
    g = torch.Generator().manual_seed(11)
    powers = [2.0**e for e in range(-126, 128)]
    temperatures = torch.tensor(powers + [p * (1 + 2**-23) for p in powers] + [p * (1 - 2**-24) for p in powers]
                                + [3.0, 0.7], dtype=torch.float32)
    per_t = 64
    t = temperatures.repeat_interleave(per_t)
    n = t.numel()
    # Logits at the temperature's scale, (z - max) / T over 2^-30 .. 2^8: every binade of exp;
    # for the smallest T the logits themselves are subnormal, for the largest near the float range.
    m = (torch.randn(n, generator=g) * 8 * t).clamp(-1e38, 1e38)
    z = (m - t * torch.exp2(torch.rand(n, generator=g) * 38 - 30)).clamp(min=-3e38)  # finite: as the kernels load
    tiny = torch.finfo(torch.float32).tiny
    sub = torch.arange(n) % 8 == 1  # a subnormal max and a logit a few subnormal steps below it
    m[sub] = tiny * torch.rand(int(sub.sum()), generator=g)
    z[sub] = m[sub] - tiny * 2.0**-20 * torch.randint(1, 64, (int(sub.sum()),), generator=g)
    ulps = torch.arange(n) % 8 == 5  # differences of 1 to 63 of the least subnormal: halving 1 rounds to 0
    m[ulps] = tiny * torch.rand(int(ulps.sum()), generator=g)
    z[ulps] = m[ulps] - tiny * 2.0**-23 * torch.randint(1, 64, (int(ulps.sum()),), generator=g)
    big = torch.arange(n) % 8 == 2  # (z - max) 2^n log2(e) past the float range
    m[big] = 3e38
    z[big] = -3e38 * torch.rand(int(big.sum()), generator=g)
    z[torch.arange(n) % 8 == 3] = m[torch.arange(n) % 8 == 3]
    z[torch.arange(n) % 8 == 4] = float("-inf")
    return z, m, t


@pytest.mark.parametrize("device", DEVICES)
def test_exponent_scale_folds_exp_first_step_bit_for_bit(device):
    """The kernels' multiply path for a power of two T: (z - max) (log2(e) / T) in place of
    ((z - max) / T) log2(e) gives the same weight and fixed-point term as the division, bit
    for bit, at every such T with a normal inverse and at differences that are subnormal or
    leave the float range; every other T (2^127, the neighbours, 3, 0.7) gets no scale.
    scaled_weights, which takes either path by the scale, gives the division's weight at
    every T."""
    z, m, t = _folded_cases()
    n = z.numel()
    out = torch.full((n, 5), -7, dtype=torch.int64, device=device)  # poisoned: every entry written
    _folded_kernel[(triton.cdiv(n, 512),)](out, z.to(device), m.to(device), t.to(device), n, BLOCK=512,
                                           enable_fp_fusion=False)
    out = out.cpu()
    assert (out >= 0).all(), "an entry left unwritten (every column is a non-negative float's bits or term)"
    scale = out[:, 0].to(torch.int32).view(torch.float32)
    bits = t.view(torch.int32)
    foldable = ((bits & 0x7FFFFF) == 0) & (t < 2.0**127)
    assert torch.equal(scale > 0, foldable)
    assert torch.equal(scale[foldable], (1.0 / t[foldable]) * torch.tensor(1.4426950408889634, dtype=torch.float32))
    assert torch.equal(out[foldable, 1], out[foldable, 2]), "weights differ between multiply and division"
    assert torch.equal(out[foldable, 3], out[foldable, 4]), "fixed-point terms differ between multiply and division"
    scaled = torch.full((n,), -7, dtype=torch.int64, device=device)  # poisoned
    _scaled_kernel[(n // 64,)](scaled, z.to(device), m.to(device), t.to(device), BLOCK=64, enable_fp_fusion=False)
    assert torch.equal(scaled.cpu(), out[:, 2]), "scaled_weights differs from the division"
    weights = out[foldable, 1].to(torch.int32).view(torch.float32)
    assert not torch.isnan(weights).any() and (weights == 1).sum() > 100 and (weights == 0).sum() > 100
    assert ((weights > 0) & (weights < 1)).sum() > 1000


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
