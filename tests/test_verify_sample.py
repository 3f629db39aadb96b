"""The sampled token of the fused verify: inversion from integer masses (reference/verify.py).
The reference maps every draw U in [0, M) to the token whose mass range holds it; the
Triton kernel's 64-bit multiply-high is the exact high word; and the Triton kernel's two
levels (block sums, then one block) return the reference's tokens when the mass sits at
block edges, when the n-gram draft is taken out of a block, and across many blocks; the
residual draw, by the last of a row's programs to finish, in every request of a batch."""

from __future__ import annotations

import pytest
import torch

from conftest import HAS_CUDA
from specops.backend import Backend, triton_available
from specops.reference import verify as reference_verify
from verify_inputs import assert_matches_reference, assert_tokens_match_reference, make_inputs, rejecting_first_drafts

DEVICES = ["cpu"] + ([pytest.param("cuda", marks=pytest.mark.gpu)] if HAS_CUDA else [])
needs_triton = pytest.mark.skipif(not triton_available(), reason="needs triton")

if triton_available():
    import triton
    import triton.language as tl

    from specops.triton_kernels.verify_math import mulhi64
    from specops.triton_kernels.verify_sample import _blocks_holding

    @triton.jit
    def _blocks_holding_kernel(block_ptr, before_ptr, sums_ptr, u_ptr, BLOCK_B: tl.constexpr, ROUND: tl.constexpr,
                               GROUP: tl.constexpr):
        inclusive = tl.cumsum(tl.load(sums_ptr + tl.arange(0, BLOCK_B)), axis=0)
        group_last = tl.max(tl.reshape(inclusive, [BLOCK_B // GROUP, GROUP]), axis=1)
        block, before = _blocks_holding(inclusive, group_last, tl.load(u_ptr + tl.arange(0, ROUND)), GROUP)
        tl.store(block_ptr + tl.arange(0, ROUND), block)
        tl.store(before_ptr + tl.arange(0, ROUND), before)

    @triton.jit
    def _mulhi64_kernel(out_ptr, lo_ptr, hi_ptr, m_ptr, n, BLOCK: tl.constexpr):
        i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        mask = i < n
        lo = tl.load(lo_ptr + i, mask=mask, other=0).to(tl.uint32)
        hi = tl.load(hi_ptr + i, mask=mask, other=0).to(tl.uint32)
        tl.store(out_ptr + i, mulhi64(lo, hi, tl.load(m_ptr + i, mask=mask, other=0)), mask=mask)


def test_reference_maps_each_draw_to_its_mass_range(monkeypatch):
    masses = torch.tensor([3, 0, 5, 2, 0, 1], dtype=torch.int64)
    draws = []
    monkeypatch.setattr(reference_verify, "sample_uniform_int", lambda seed, position, total: draws.pop())
    tokens = []
    for u in range(int(masses.sum())):
        draws.append(u)
        tokens.append(reference_verify.sample_masses(masses, 0, 0))
    assert tokens == [0, 0, 0, 2, 2, 2, 2, 2, 3, 3, 5]
    assert reference_verify.sample_masses(torch.zeros(4, dtype=torch.int64), 0, 0) == 0  # M = 0: token 0


def test_reference_draw_is_the_high_word_of_x_times_m():
    words = reference_verify._words(7, 11, 1, 2)
    x = int(words[0]) | (int(words[1]) << 32)
    for total in (1, 3, 2**40, 2**57 + 12345):
        assert reference_verify.sample_uniform_int(7, 11, total) == (x * total) >> 64 < total


def test_reference_proposal_is_the_inversion_draw_kept_by_the_second_word():
    """Proposal t of a residual draw: words 0-1 of the proposal block t draw from W by
    inversion, words 2-3 keep it when floor(Y W_x / 2^64) < R_x; the first kept one wins."""
    weights = torch.tensor([3, 0, 5, 2, 0, 1], dtype=torch.int64)
    cumulative = torch.cumsum(weights, 0)
    for seed in range(40):
        residual = torch.randint(0, 6, (6,), generator=torch.Generator().manual_seed(seed)) * (weights > 0)
        residual = torch.minimum(residual, weights)
        words = [int(w) for w in reference_verify._words(seed, 9, 2, 4 * reference_verify.RESIDUAL_PROPOSALS)]
        expected = None
        for t in range(reference_verify.RESIDUAL_PROPOSALS):
            a0, a1, a2, a3 = words[4 * t : 4 * t + 4]
            token = int(torch.searchsorted(cumulative, ((a0 | a1 << 32) * 11) >> 64, right=True))
            if ((a2 | a3 << 32) * int(weights[token])) >> 64 < int(residual[token]):
                expected = token
                break
        assert reference_verify.propose_residual(weights, residual, seed, 9) == expected
    assert reference_verify.propose_residual(torch.zeros(4, dtype=torch.int64), torch.zeros(4, dtype=torch.int64),
                                             0, 0) is None  # M_W = 0: no proposal
    assert reference_verify.propose_residual(weights, torch.zeros(6, dtype=torch.int64), 0, 0) is None  # R = 0


@pytest.mark.parametrize("closeness", [0.0, 0.97])
def test_reference_residual_draw_follows_the_residual(closeness):
    """The residual token (a proposal, else the direct draw) follows max(p - q, 0)
    normalised, whether the proposals settle most draws (q far from p) or leave many to the
    direct draw (q close to p: the residual mass is small)."""
    from distribution_harness import assert_follows

    vocab, copies = 6, 3000
    g = torch.Generator().manual_seed(11)
    logits = torch.randn(vocab, generator=g)
    w = reference_verify.processed_weights(logits, 1.0, 0, 1.0)
    p = reference_verify._normalise(w)
    q = closeness * p + (1 - closeness) * torch.softmax(torch.randn(vocab, generator=g), -1)
    z = reference_verify._fixed_sum(w)
    residual = reference_verify.fixed_masses(torch.clamp(w - q * z, min=0))
    weights = reference_verify.fixed_masses(w)
    tokens, proposed = [], 0
    for seed in range(copies):
        token = reference_verify.propose_residual(weights, residual, seed, 3)
        proposed += token is not None
        tokens.append(token if token is not None else reference_verify.sample_masses(residual, seed, 3))
    law = residual.double() / residual.sum()
    assert_follows(torch.tensor(tokens), law, f"residual token, q {closeness} of the way to p")
    # Each proposal is kept with probability M_R / M_W: the share of draws the proposals settle.
    kept = float(residual.sum()) / float(weights.sum())
    expected = 1 - (1 - kept) ** reference_verify.RESIDUAL_PROPOSALS
    assert abs(proposed / copies - expected) < 6 * (expected * (1 - expected) / copies) ** 0.5 + 1e-9


@needs_triton
@pytest.mark.parametrize("device", DEVICES)
def test_triton_mulhi64_is_the_exact_high_word(device):
    g = torch.Generator().manual_seed(3)
    n = 4096
    lo = torch.randint(0, 2**32, (n,), generator=g, dtype=torch.int64)
    hi = torch.randint(0, 2**32, (n,), generator=g, dtype=torch.int64)
    m = torch.randint(0, 2**62, (n,), generator=g, dtype=torch.int64) >> torch.randint(0, 62, (n,), generator=g)
    edges = [(0, 0, 0), (2**32 - 1, 2**32 - 1, 2**63 - 1), (2**32 - 1, 2**32 - 1, 1), (0, 1, 2**32),
             (2**32 - 1, 0, 2**32 - 1), (1, 2**32 - 1, 2**57), (2**31, 2**31, 2**62 + 2**31)]
    for k, (a, b, c) in enumerate(edges):
        lo[k], hi[k], m[k] = a, b, c
    out = torch.full((n,), -1, dtype=torch.int64, device=device)
    _mulhi64_kernel[(triton.cdiv(n, 1024),)](out, lo.to(device), hi.to(device), m.to(device), n, BLOCK=1024)
    expected = [((int(a) | (int(b) << 32)) * int(c)) >> 64 for a, b, c in zip(lo, hi, m)]
    assert out.cpu().tolist() == expected


@needs_triton
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("block_b,group", [(1024, 32), (256, 16), (32, 32), (64, 4)])
def test_triton_grouped_block_search_is_the_full_search(device, block_b, group):
    """_blocks_holding (the proposals' search in two levels) gives every draw the count of
    inclusive prefix sums <= U and the largest of them, as the search of every block does:
    block sums with runs of empty blocks (whole groups of them too), draws at each prefix
    sum, one below it, 0 and the last mass unit."""
    g = torch.Generator().manual_seed(block_b + group)
    sums = torch.randint(0, 2**40, (block_b,), generator=g, dtype=torch.int64)
    sums[torch.rand(block_b, generator=g) < 0.4] = 0
    sums[group:3 * group] = 0  # two empty groups
    sums[-group // 2:] = 0  # padding past the row's blocks
    inclusive = torch.cumsum(sums, 0)
    total = int(inclusive[-1])
    picks = inclusive[torch.randint(0, block_b, (40,), generator=g)]
    u = torch.cat([picks, (picks - 1).clamp(min=0), torch.tensor([0, total - 1]),
                   torch.randint(0, total, (46,), generator=g)])  # 128 draws, all < total
    rounds = 16
    for start in range(0, len(u), rounds):
        draws = u[start:start + rounds]
        block = torch.full((rounds,), -1, dtype=torch.int32, device=device)
        before = torch.full((rounds,), -1, dtype=torch.int64, device=device)
        _blocks_holding_kernel[(1,)](block, before, sums.to(device), draws.to(device), BLOCK_B=block_b, ROUND=rounds,
                                     GROUP=group)
        below = inclusive[None, :] <= draws[:, None]
        assert block.cpu().tolist() == below.sum(1).tolist()
        assert before.cpu().tolist() == torch.where(below, inclusive[None, :], 0).max(1).values.tolist()


def _peaked(inputs, vocab, edges, g):
    """Rows whose mass sits on a few tokens at block edges (the rest 30 below), drafts among
    them: the draw lands at the edges of blocks, and n-gram drafts are taken out there."""
    for key in ("target_logits", "bonus_logits"):
        rows = torch.full_like(inputs[key], -30.0)
        rows[:, edges] = torch.randn(rows.shape[0], len(edges), generator=g) * 2
        inputs[key] = rows
    if inputs["draft_probs"] is not None:
        q = torch.rand(inputs["draft_probs"].shape, generator=g) ** 8
        q[:, edges] += torch.rand(q.shape[0], len(edges), generator=g) * 50
        inputs["draft_probs"] = q / q.sum(-1, keepdim=True)
    pick = torch.randint(0, len(edges), inputs["draft_token_ids"].shape, generator=g)
    inputs["draft_token_ids"] = torch.tensor(edges)[pick].to(inputs["draft_token_ids"].dtype)
    return inputs


@needs_triton
@pytest.mark.parametrize("ngram,group,with_top",
                         [(False, 0, False), (False, 0, True), (True, 0, False), (True, 0, True), (False, 4, False)],
                         ids=["plain-draft", "top-draft", "plain-ngram", "top-ngram",
                              "plain-draft-grouped"])  # the search alone: top-k/top-p change the masses only
def test_triton_draw_across_blocks_matches_reference(ngram, group, with_top, monkeypatch):
    """16-entry blocks (10 a row at V = 150, the last one partial) for the residual pass,
    8-entry ones (19) for the normaliser's masses: the block sums of both, the proposals'
    search, and the scan inside a block; mass on block edges (15/16, 31/32, the last token)
    or spread over the row (CPU, interpreter: rows of 150 cross every kind of edge rows of
    300 did, in fewer blocks for the searches' rounds to read); "grouped": the proposals'
    block search in two levels of 4 of the 32 (PROPOSAL_GROUP; else in one)."""
    from specops.triton_kernels import verify as triton_verify

    for name, value in (("BLOCK_V", 16), ("MIN_SPLIT_LEN", 64), ("PROGRAMS_PER_SM", 1), ("SUM_RESIDENT", 1),
                        ("MASS_BLOCK", 8), ("PROPOSAL_GROUP", group), ("RESIDUAL_FEW_REQUESTS", 0)):
        monkeypatch.setattr(triton_verify, name, value)
    vocab = 150
    # The residual pass: 16 programs over rows of 10 blocks: one request left to sample
    # gets 10 splits of a block, two get 8 of two blocks (the last three empty), three 5.
    assert triton_verify.residual_programs(5, vocab, torch.device("cpu")) == 16
    for seed in range(2 if with_top else 3):  # with top-k/top-p: one spread and one peaked row set (CI time)
        g = torch.Generator().manual_seed(100 + seed)
        inputs = make_inputs([2, 0, 3, 1, 4], vocab, seed=seed, greedy_fraction=0.0, ngram=ngram, with_top=with_top)
        if seed > 0:
            inputs = _peaked(inputs, vocab, [15, 16, 31, 32, vocab - 1], g)
        assert_matches_reference(inputs, 4, "cpu", Backend.TRITON)


def test_residual_programs_fewer_for_few_requests():
    """The residual pass's grid: RESIDUAL_FEW_RESIDENT programs a SM up to
    RESIDUAL_FEW_REQUESTS requests, RESIDUAL_RESIDENT past them, never more than the
    requests' blocks (CPU: CPU_NUM_SMS SMs)."""
    from specops.triton_kernels import verify as triton_verify

    cpu, sms = torch.device("cpu"), triton_verify.CPU_NUM_SMS
    few, vocab = triton_verify.RESIDUAL_FEW_REQUESTS, 128256
    assert triton_verify.RESIDUAL_FEW_RESIDENT < triton_verify.RESIDUAL_RESIDENT
    assert triton_verify.residual_programs(few, vocab, cpu) == triton_verify.RESIDUAL_FEW_RESIDENT * sms
    assert triton_verify.residual_programs(few + 1, vocab, cpu) == triton_verify.RESIDUAL_RESIDENT * sms
    assert triton_verify.residual_programs(1, triton_verify.BLOCK_V, cpu) == 1  # one block, one program


class _GarbageTorch:
    """torch, except that empty() int32 tensors start full of garbage (the launcher's counters
    and indices must be written before they are read)."""

    def __getattr__(self, name):
        return getattr(torch, name)

    @staticmethod
    def empty(*shape, dtype, device):
        size = shape[0] if len(shape) == 1 and isinstance(shape[0], (tuple, list)) else shape
        if dtype == torch.int32:
            return torch.full(size, 12345, dtype=dtype, device=device)
        return torch.empty(size, dtype=dtype, device=device)


@needs_triton  # top + proposal: test_verify_ops.py
@pytest.mark.parametrize("with_top,path,programs", [(False, "proposal", 64), (False, "late", 64),
                                                     (False, "direct", 64), (False, "direct", 3), (True, "direct", 64)],
                         ids=["plain-proposal", "plain-late", "plain-direct", "plain-direct-3", "top-direct"])
def test_triton_residual_draw_in_every_request(with_top, path, programs, monkeypatch):
    """Four random requests reject their first draft (p ~ 0 there, q well above it): each
    draws its residual token. "proposal": q ~ 1 at the draft, so the residual is nearly p
    and a proposal is kept (in the decisions, 4-entry mass blocks);
    "late": q is p but for 0.15 moved onto the draft, so a proposal is kept with probability
    ~0.15 and some draw is settled by a later round than the first;
    "direct": q is p but for 1e-3 moved onto the draft, so the residual mass is ~1e-3 of
    W, no proposal is kept, and the residual pass draws: with 64 programs each of the four
    rows (19 blocks) is cut into 16 splits of 2 blocks (the last 6 empty) whose last
    arrival draws; with 3 programs, fewer than the requests, each row is one split and
    program 0 takes the first and the fourth. A greedy request and one without drafts
    leave the programs to the others; the residual pass reads the requests 2 at a time
    (RESIDUAL_SCAN), so finding the nth left to sample crosses chunks. int32 workspaces
    start as garbage: the decisions zero the arrival counters, no memset (CPU, interpreter:
    the programs run one at a time, in one order)."""
    from specops.triton_kernels import verify as triton_verify

    for name, value in (("BLOCK_V", 16), ("MIN_SPLIT_LEN", 64), ("PROGRAMS_PER_SM", 1), ("SUM_RESIDENT", 1),
                        ("RESIDUAL_RESIDENT", programs // 4 if programs > 4 else programs), ("MASS_BLOCK", 4),
                        ("RESIDUAL_SCAN", 2), ("RESIDUAL_FEW_REQUESTS", 0)):
        monkeypatch.setattr(triton_verify, name, value)
    if programs <= 4:
        monkeypatch.setattr(triton_verify, "CPU_NUM_SMS", 1)
    monkeypatch.setattr(triton_verify, "torch", _GarbageTorch())
    counts, vocab = [2, 1, 0, 3, 1, 2], 300
    inputs = make_inputs(counts, vocab, seed=11, greedy_fraction=0.0, with_top=with_top)
    inputs["temperature"][4] = 0.0
    inputs = rejecting_first_drafts(inputs, path)
    assert triton_verify.residual_programs(len(counts), vocab, torch.device("cpu")) == programs
    kept = []  # (t, token) of each residual draw's kept proposal, None where none is
    keep = reference_verify.kept_proposal
    monkeypatch.setattr(reference_verify, "kept_proposal", lambda *a: kept.append(keep(*a)) or kept[-1])
    _tokens, num_accepted, _logprobs = reference_verify.verify(**inputs, max_spec_len=3)
    assert num_accepted.tolist() == [0] * len(counts)  # request 2: its bonus; 4: greedy
    assert len(kept) == 4
    if path == "late":  # some draw is settled by a proposal of a later round than the first
        assert any(k is not None and k[0] >= triton_verify.PROPOSAL_ROUND for k in kept), kept
    else:
        assert all((k is not None) == (path == "proposal") for k in kept), kept
    assert_matches_reference(inputs, 3, "cpu", Backend.TRITON)


@needs_triton
@pytest.mark.parametrize("group,q_tile", [(0, False), (0, True), (8, True)],
                         ids=["one-level", "q-tile", "grouped-q-tile"])
def test_triton_later_proposal_rounds_match_reference(group, q_tile, monkeypatch):
    """24 requests reject their first draft with a residual of ~0.15 of p ("late"): most
    draws end in a later round of proposals than the first; PROPOSAL_GROUP searches the
    blocks in two levels, PROPOSAL_Q_TILE selects each proposal's draft prob from its
    block's (CPU, interpreter)."""
    from specops.triton_kernels import verify as triton_verify

    for name, value in (("MASS_BLOCK", 4), ("PROPOSAL_GROUP", group), ("PROPOSAL_Q_TILE", q_tile)):
        monkeypatch.setattr(triton_verify, name, value)
    counts, vocab = [1] * 24, 256
    inputs = rejecting_first_drafts(make_inputs(counts, vocab, seed=5, greedy_fraction=0.0, with_top=False), "late")
    kept = []
    keep = reference_verify.kept_proposal
    monkeypatch.setattr(reference_verify, "kept_proposal", lambda *a: kept.append(keep(*a)) or kept[-1])
    reference_verify.verify(**inputs, max_spec_len=1)
    rounds = [k[0] // triton_verify.PROPOSAL_ROUND for k in kept if k is not None]
    later = [r for r in rounds if r > 0]
    assert len(kept) == 24 and len(later) >= 8 and len(set(later)) == 3, kept  # rounds 2, 3 and 4 each
    assert_tokens_match_reference(inputs, 1, "cpu", Backend.TRITON)


@needs_triton
@pytest.mark.gpu
@pytest.mark.skipif(not HAS_CUDA, reason="needs a GPU")
@pytest.mark.parametrize("batch,vocab,few", [(3, 128256, 16), (3, 128256, 0), (700, 4096, 16)],
                         ids=["few-requests", "few-requests-4-an-sm", "more-than-programs"])
def test_gpu_residual_pass_shares_its_programs(batch, vocab, few, monkeypatch):
    """On the GPU, the launcher's own layout, every random request's first draft rejected,
    a proposal kept for ~1.6% of them ("direct"): 3 requests at V = 128256 share the
    programs (one a SM, RESIDUAL_FEW_RESIDENT: each row cut into 44 splits of 2 blocks, the
    last 12 empty; with RESIDUAL_FEW_REQUESTS 0, 4 a SM: 63 one-block splits whose arrivals
    race at once); the ~620 of 700 requests at V = 4096 left to sample outnumber the
    programs (528 on an H100), one split a row, a program taking several. Both calls
    (log-probabilities: the screen launch; tokens only: the max pass's tests) return the
    reference's tokens."""
    from specops.triton_kernels import verify as triton_verify

    monkeypatch.setattr(triton_verify, "RESIDUAL_FEW_REQUESTS", few)
    device = torch.device("cuda")
    programs = triton_verify.residual_programs(batch, vocab, device)
    assert (programs > batch) == (batch == 3)
    inputs = rejecting_first_drafts(make_inputs([1 + b % 3 for b in range(batch)], vocab, seed=batch,
                                                greedy_fraction=0.1, with_top=False), "direct")
    proposals = []
    propose = reference_verify.propose_residual
    monkeypatch.setattr(reference_verify, "propose_residual", lambda *a: proposals.append(propose(*a)) or proposals[-1])
    assert_matches_reference(inputs, 3, "cuda", Backend.TRITON)
    assert len(proposals) == int((inputs["temperature"] > 0).sum())
    left = sum(token is None for token in proposals)  # requests the residual pass draws for
    assert left == len(proposals) if batch == 3 else left > programs
    assert_tokens_match_reference(inputs, 3, "cuda", Backend.TRITON)
