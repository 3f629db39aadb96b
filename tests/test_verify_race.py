"""The Triton verify race's pruning: the fast bounds of a race score hold the exact score
between them (fresh random rows, temperatures, top-k/top-p cuts, Philox words at the edges
of the Exp(1) draw), and they are tight enough to prune; a race whose programs walk many
blocks, most of them pruned, returns exactly the reference's tokens.

Under TRITON_INTERPRET=1 the fast exp2 and divisions are numpy's; on a GPU (gpu marker)
they are the hardware's approximate instructions the bounds were written against."""

from __future__ import annotations

import pytest
import torch

from conftest import HAS_CUDA
from specops.backend import Backend, triton_available
from verify_inputs import make_inputs

pytestmark = pytest.mark.skipif(not triton_available(), reason="needs triton")

DEVICES = ["cpu"] + ([pytest.param("cuda", marks=pytest.mark.gpu)] if HAS_CUDA else [])

if triton_available():
    import triton
    import triton.language as tl

    from specops.triton_kernels.verify_math import probs, race_score_bounds, repro_exponential

    @triton.jit
    def _bounds_and_exact_kernel(
        upper_ptr,  # [n] float32
        lower_ptr,  # [n] float32
        exact_ptr,  # [n] float32
        z_ptr,  # [n] float32 logits
        q_ptr,  # [n] float32 draft probs
        word_ptr,  # [n] int64 holding uint32 Philox words
        params_ptr,  # [6] float32: max logit, temperature, kth, z1, p_min, z2
        n,
        BLOCK: tl.constexpr,
    ):
        v = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        mask = v < n
        z = tl.load(z_ptr + v, mask=mask, other=0.0)
        q = tl.load(q_ptr + v, mask=mask, other=0.0)
        word = tl.load(word_ptr + v, mask=mask, other=0).to(tl.uint32)
        max_logit, temperature = tl.load(params_ptr), tl.load(params_ptr + 1)
        kth, z1 = tl.load(params_ptr + 2), tl.load(params_ptr + 3)
        p_min, z2 = tl.load(params_ptr + 4), tl.load(params_ptr + 5)
        upper, lower = race_score_bounds(z, q, word, v < 0, max_logit,
                                         tl.math.div_rn(1.4426950408889634, temperature), kth,
                                         tl.math.div_rn(1.0, z1), p_min, tl.math.div_rn(1.0, z2))
        r = probs(z, max_logit, temperature, kth, z1, p_min, z2) - q
        exact = tl.where(r > 0.0, tl.math.div_rn(r, repro_exponential(word)), -1.0)
        tl.store(upper_ptr + v, upper, mask=mask)
        tl.store(lower_ptr + v, lower, mask=mask)
        tl.store(exact_ptr + v, exact, mask=mask)


def _edge_words(n: int, g: torch.Generator) -> torch.Tensor:
    """Random uint32 words with the Exp(1) draw's edges mixed in: E near 0 (word 0), the
    switch of its two formulas (v = 1/2) and E = +inf (the top words)."""
    words = torch.randint(0, 2**32, (n,), generator=g, dtype=torch.int64)
    edges = torch.tensor([0, 1, 2, 255, 2**31 - 129, 2**31 - 1, 2**31, 2**31 + 1, 2**32 - 257, 2**32 - 128,
                          2**32 - 2, 2**32 - 1])
    words[: edges.numel()] = edges
    small = torch.randint(0, 2**12, (n // 8,), generator=g, dtype=torch.int64)  # E ~ 1e-9..1e-6
    words[edges.numel(): edges.numel() + small.numel()] = small
    return words


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("temperature", [0.05, 0.7, 1.0, 3.3])
@pytest.mark.parametrize("cut", ["none", "top-k", "top-p"])
@pytest.mark.parametrize("residual", [False, True], ids=["bonus", "residual"])
def test_bounds_hold_the_exact_score(device, temperature, cut, residual):
    from specops.reference.verify import _fixed_sum
    from specops.reference.repro_math import repro_exp

    n = 4099
    g = torch.Generator().manual_seed(int(temperature * 100) + len(cut) + residual)
    z = torch.randn(n, generator=g) * 4
    z[:40] = z.max() - torch.rand(40, generator=g) * 0.01  # near-ties at the top, edge words
    z[600:640] = z.max() - torch.rand(40, generator=g) * 0.01  # and with random words
    z[40:80] = z.max() - 150 * temperature * torch.rand(40, generator=g)  # weights near exp's flush
    max_logit = z.max()
    kth = torch.quantile(z, 0.7) if cut == "top-k" else torch.tensor(float("-inf"))
    w = torch.where(z >= kth, repro_exp((z - max_logit) / torch.tensor(temperature)), torch.zeros(()))
    z1 = _fixed_sum(w)
    p_min = (torch.quantile(w / z1, 0.9) if cut == "top-p" else torch.tensor(0.0)).float()
    z2 = _fixed_sum(torch.where(w / z1 >= p_min, w, torch.zeros(()))) if cut == "top-p" else z1
    q = torch.softmax(z + torch.randn(n, generator=g), -1) if residual else torch.zeros(n)
    params = torch.stack([max_logit, torch.tensor(temperature), kth, z1, p_min, z2]).float()
    words = _edge_words(n, g)
    upper, lower, exact = (torch.full((n,), float("nan"), device=device) for _ in range(3))
    _bounds_and_exact_kernel[(triton.cdiv(n, 1024),)](
        upper, lower, exact, z.to(device), q.to(device), words.to(device), params.to(device), n, BLOCK=1024,
        enable_fp_fusion=False)
    upper, lower, exact = upper.cpu(), lower.cpu(), exact.cpu()
    assert not upper.isnan().any() and not lower.isnan().any() and not exact.isnan().any()
    assert (upper >= exact).all(), f"upper bound below the exact score at {torch.nonzero(upper < exact)[:8].tolist()}"
    assert (lower <= exact).all(), f"lower bound above the exact score at {torch.nonzero(lower > exact)[:8].tolist()}"
    positive = exact > 1e-27  # above the upper bound's floor
    assert positive.sum() >= 20  # the race has real contenders
    # Tight where it matters (draws of E below 1/2, words not near 0): E >= v and
    # E <= v + v^2 lose about v/2 relative, the margins 0.1%; residuals p - q lose relative
    # precision where q nearly cancels p, so there only most entries are that tight.
    v = words.double() / 2**32
    decisive = positive & (words >= 2**20) & (v < 0.5)
    assert decisive.sum() >= 5
    slack = 0.002 + v[decisive]
    tight = (upper[decisive] <= exact[decisive] * (1 + slack)) & (lower[decisive] >= exact[decisive] * (1 - slack))
    assert tight.all() if not residual else tight.float().mean() > 0.8
    # Tight enough to prune: the entries whose upper bound reaches the best lower bound are
    # under 3% of the row (most of them the 1/8 of words planted near E = 0).
    assert (upper >= lower.max()).float().mean() < 0.03


@pytest.mark.parametrize("ngram", [False, True], ids=["draft", "ngram"])
def test_race_walks_many_pruned_blocks_exactly(ngram, monkeypatch):
    """16-entry blocks and few programs: each race program walks ~10 blocks, the bound
    prunes most of them, and the tokens stay the reference's (CPU, interpreter)."""
    from specops.triton_kernels import verify as triton_verify
    from test_verify_ops import assert_tokens_match_reference

    for name, value in (("BLOCK_V", 16), ("MIN_SPLIT_LEN", 64), ("PROGRAMS_PER_SM", 1), ("RACE_RESIDENT", 1)):
        monkeypatch.setattr(triton_verify, name, value)
    # One race program per request walks all 19 blocks (4 interpreter SMs x 1 < 5 requests).
    assert triton_verify.wave_split_len(5, 300, torch.device("cpu"), 1, 16) == 19 * 16
    for seed in range(3):
        inputs = make_inputs([2, 0, 3, 1, 4], 300, seed=seed, greedy_fraction=0.0, ngram=ngram, with_top=False)
        assert_tokens_match_reference(inputs, 4, "cpu", Backend.TRITON)
