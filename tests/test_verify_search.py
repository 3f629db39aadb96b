"""The fused verify op's top-k / top-p threshold searches against the reference: the Triton
kernel's search paths one at a time (kept interval keys, top-p's bounds and its round-0
keep, powers-of-two temperatures, top-p after top-k from kept keys, top-k seeded from the
max pass, the first normaliser over marked blocks, capped launches, no read of what the
search did not write, the kept-key and seed layouts), then every backend at the searches'
extremes. On a GPU the same tests run on CUDA tensors."""

from __future__ import annotations

import math

import pytest
import torch
import triton
from conftest import backend_params
from verify_inputs import assert_matches_reference, make_inputs

from specops.backend import Backend

KERNEL_BACKENDS = backend_params()
TRITON_BACKENDS = [p for p in KERNEL_BACKENDS if p.values[1] is Backend.TRITON]


# No kept-key buffers past SEARCH_KEPT_BYTES is the layout (0, -1) of a negative keep limit
# (kept_layout, test_triton_kept_keys_layout_is_bounded): "never-keeps" runs its launches.
@pytest.mark.parametrize("device,backend", TRITON_BACKENDS)
@pytest.mark.parametrize("keep_limit,kept_rows", [(-1, 16), (6, 16), (10**6, 1), (10**6, 16)],
                         ids=["never-keeps", "keeps-late", "lanes-overflow", "keeps-early"])
@pytest.mark.parametrize("tiny", [True, False], ids=["tiny-blocks", "default-blocks"])
def test_triton_threshold_search_keeps_interval_keys(device, backend, keep_limit, kept_rows, tiny, monkeypatch):
    """The top-k / top-p searches of splits that read their rows every round (no kept-key
    buffers at all, as past SEARCH_KEPT_BYTES), keep their interval's keys in a late or an
    early round, or overflow a lane's column and read the row again (verify_search.py):
    the same thresholds, so the reference's tokens, counts and log-probabilities. Target
    rows continuous (a threshold off by one key changes z1, so the log-probabilities), bonus
    rows tied; k of 1, 5 and half the vocab (a threshold far below the max among logits one
    key apart: the rounds that converge), every request random."""
    from specops.triton_kernels import verify as triton_verify

    monkeypatch.setattr(triton_verify, "SEARCH_KEEP_LIMIT", keep_limit)
    monkeypatch.setattr(triton_verify, "SEARCH_KEPT_ROWS", kept_rows)
    if tiny:  # rows of 300 in five programs of a 64-entry block each
        for name, value in (("BLOCK_V", 64), ("MIN_SPLIT_LEN", 64), ("PROGRAMS_PER_SM", 16)):
            monkeypatch.setattr(triton_verify, name, value)
    vocab = 300 if tiny else 2500 if device == "cpu" else 40000
    assert_matches_reference(threshold_inputs(vocab), 3, device, backend)


def top_p_extremes(vocab):
    """Rows whose top-p thresholds lie at the ends of the search's first interval
    (verify_search.top_p_bounds), top-p alone: a flat row (every token kept at p = 1 / V), a
    token of p 0.49 over a flat tail at top_p 0.5 (the whole tail kept: the threshold 1 / (2V),
    4x the interval's low end), the max alone kept where the next token is almost as likely
    (top_p 2^-24: the threshold the max's p, near the high end), top_p a step below 1 at
    temperature 10, and a sharp row at 0.05."""
    inputs = make_inputs([1, 1, 1, 1, 1], vocab, seed=vocab, greedy_fraction=0.0, with_top=False)
    g = torch.Generator().manual_seed(vocab + 1)
    rows = torch.randn(5, vocab, generator=g) * 3
    rows[0] = 0.0
    rows[1] = 0.0
    rows[1, 7] = math.log(0.49 * (vocab - 1) / 0.51)
    rows[2, 3] = 30.0
    rows[2, 4] = 30.0 - 2.0**-18  # p ~32 ulps below the max's: above any high bound 1% short
    rows[2, 5] = 29.0  # both p then mid-binade (about 0.42): one 1024-key bucket of p's bits
    inputs["target_logits"] = rows
    inputs["bonus_logits"] = rows.flip(1).clone()
    inputs["temperature"] = torch.tensor([1.0, 1.0, 1.0, 10.0, 0.05])
    inputs["top_p"] = torch.tensor([0.9, 0.5, 2.0**-24, 1.0 - 2.0**-24, 0.9])
    return inputs


@pytest.mark.parametrize("device,backend", TRITON_BACKENDS)
@pytest.mark.parametrize("tiny", [True, False], ids=["tiny-blocks", "default-blocks"])
def test_triton_top_p_thresholds_at_its_bounds(device, backend, tiny, monkeypatch):
    """Top-p's search starts from bounds on its threshold, not [0, bits(1.0)]: the rows of
    top_p_extremes, whose thresholds lie near those bounds, get the reference's tokens,
    counts and log-probabilities (a low bound 8x higher, or a high one 1% short, fails)."""
    from specops.triton_kernels import verify as triton_verify

    if tiny:  # rows of 300 in five programs of a 64-entry block each
        for name, value in (("BLOCK_V", 64), ("MIN_SPLIT_LEN", 64), ("PROGRAMS_PER_SM", 16)):
            monkeypatch.setattr(triton_verify, name, value)
    assert_matches_reference(top_p_extremes(300 if tiny else 2500 if device == "cpu" else 40000), 3, device,
                             backend)


@pytest.mark.parametrize("device,backend", TRITON_BACKENDS)
@pytest.mark.parametrize("keep_first,kept_rows", [(True, 256), (True, 1), (False, 256)],
                         ids=["keeps", "lanes-overflow", "counts-first"])
def test_triton_top_p_alone_keeps_in_round_0(device, backend, kept_rows, keep_first, monkeypatch):
    """TOP_P_KEEP_FIRST (on by default, bench/NOTES.md): top-p alone keeps the keys of its
    first interval (top_p_bounds) in round 0, in a buffer of TOP_P_KEPT_ROWS rows a lane,
    counting its candidates as it reads, or overflows a lane and reads the row again; or,
    with it off, only counts in round 0: the reference's tokens, counts and
    log-probabilities every way."""
    from specops.triton_kernels import verify as triton_verify

    for name, value in (("TOP_P_KEEP_FIRST", keep_first), ("TOP_P_KEPT_ROWS", kept_rows),
                        ("TOP_P_KEEP_LIMIT", 10**6)):
        monkeypatch.setattr(triton_verify, name, value)
    vocab = 2500 if device == "cpu" else 40000  # splits whose lanes meet more entries than one row
    assert_matches_reference(top_p_extremes(vocab), 3, device, backend)
    inputs = threshold_inputs(vocab)
    inputs["top_k"] = None
    assert_matches_reference(inputs, 3, device, backend)


@pytest.mark.parametrize("device,backend", TRITON_BACKENDS)
@pytest.mark.parametrize("prefetch", [True, False], ids=["rows-ahead", "rows-in-turn"])
def test_triton_kept_rounds_load_ahead_or_not(device, backend, prefetch, monkeypatch):
    """The searches' kept rounds load their next rows of kept keys before counting and moving
    these (SEARCH_KEPT_PREFETCH, on by default) or load each step's rows in turn: both get
    the reference's tokens, counts and log-probabilities, top-k then top-p and top-p alone
    (round 0 keeps), over 64-entry blocks whose lanes keep several rows (a load ahead that
    skips rows fails it)."""
    from specops.triton_kernels import verify as triton_verify

    for name, value in (("SEARCH_KEPT_PREFETCH", prefetch), ("TOP_P_KEEP_LIMIT", 10**6), ("BLOCK_V", 64),
                        ("MIN_SPLIT_LEN", 64)):
        monkeypatch.setattr(triton_verify, name, value)
    inputs = threshold_inputs(2500)
    assert_matches_reference(inputs, 3, device, backend)
    inputs["top_k"] = None
    assert_matches_reference(inputs, 3, device, backend)


@pytest.mark.parametrize("device,backend", TRITON_BACKENDS)
def test_triton_top_p_alone_at_power_of_two_temperatures(device, backend):
    """Top-p alone's row passes multiply by log2(e) / T where T is a power of two
    (verify_math.exponent_scale) and divide elsewhere: requests at T = 0.5, 2, 2^-10, 4 and 1
    beside T = 3 and the floats next to 2 and 0.5, the reference's tokens, counts and
    log-probabilities (the temperature passed for its inverse fails it; a rounded 1 / T
    for T = 3 moves p by an ulp at most and these rows do not catch it)."""
    vocab = 2500 if device == "cpu" else 40000
    inputs = make_inputs([2, 1, 3, 0, 2, 1, 2, 3], vocab, seed=53, greedy_fraction=0.0, with_top=False)
    below_two = math.nextafter(2.0, 0.0)
    above_half = math.nextafter(0.5, 1.0)
    inputs["temperature"] = torch.tensor([0.5, 2.0, 2.0**-10, 4.0, 1.0, 3.0, below_two, above_half])
    inputs["top_p"] = torch.tensor([0.9, 0.5, 0.75, 0.95, 0.8, 0.9, 0.6, 0.85])
    assert_matches_reference(inputs, 3, device, backend)


@pytest.mark.parametrize("device,backend", TRITON_BACKENDS)
@pytest.mark.parametrize("finish,finish_keys", [(True, 64), (True, 4), (False, 64)],
                         ids=["finished", "too-many-keys", "rounds"])
def test_triton_top_p_after_top_k_finished_from_kept_keys(device, backend, finish, finish_keys, monkeypatch):
    """Top-p after top-k: the threshold taken in one launch from round 0's kept keys
    (verify_search_finish.py), the rounds skipped where a slot kept more keys than the
    finish takes (k = 5 past a limit of 4; k = 1 within it) or with the finish off: the
    reference's tokens, counts and log-probabilities every way. Rows of 300 in five
    programs of 64-entry blocks; k of 1 and 5 with top-p 0.9 and 0.5, one request top-p
    alone (no finish)."""
    from specops.triton_kernels import verify as triton_verify

    for name, value in (("BLOCK_V", 64), ("MIN_SPLIT_LEN", 64), ("PROGRAMS_PER_SM", 16),
                        ("TOP_P_FINISH", finish), ("TOP_P_FINISH_KEYS", finish_keys)):
        monkeypatch.setattr(triton_verify, name, value)
    inputs = threshold_inputs(300)
    inputs["top_k"][2] = 0  # request 2 (dense keys, top-p 1.0): no filter
    assert_matches_reference(inputs, 3, device, backend)


@pytest.mark.parametrize("device,backend", TRITON_BACKENDS)
@pytest.mark.parametrize("seed_values,coarse_values,seed_rounds,kept_rows,programs_per_sm",
                         [(2048, 512, 9, 16, 64), (2048, 128, 9, 16, 64), (2048, 512, 3, 16, 64), (8, 512, 9, 16, 64),
                          (2048, 512, 9, 1, 16), (0, 512, 9, 16, 64)],
                         ids=["lane-groups", "two-sets", "three-steps", "split-maxima", "lanes-overflow", "unseeded"])
def test_triton_top_k_search_seeded_from_the_max_pass(device, backend, seed_values, coarse_values, seed_rounds,
                                                      kept_rows, programs_per_sm, monkeypatch):
    """Top-k's round 0 starting from the k-th largest of the max pass's lane-group maxima
    (verify_search.top_k_seed, run to the k-th largest maximum itself, or its three steps: a
    bound below it, from which the later rounds narrow to the k-th largest logit). Rows of 300 in five
    programs of one 64-entry block, so with one lane a group the bound is the k-th largest
    logit itself (a bound one rank too high
    would lose the k-th of request 2's distinct logits, and its log-probabilities); two
    sets, k = 1 and 5 seeded from 80 maxima of four lanes, k = 150 from every logit; one
    group a program: the split maxima, fewer than k = 150 of them (that request starts
    unseeded) and a bound far below the 5th largest; programs of two blocks (a lane meets
    two logits) keeping one key a lane, so lanes overflow and read their rows again,
    counting; no seed. Each finds the reference's thresholds, so its tokens, counts and
    log-probabilities."""
    from specops.triton_kernels import verify as triton_verify

    monkeypatch.setattr(triton_verify, "SEED_VALUES", seed_values)
    monkeypatch.setattr(triton_verify, "SEED_COARSE_VALUES", coarse_values)
    monkeypatch.setattr(triton_verify, "SEED_ROUNDS", seed_rounds)  # 9: the k-th largest maximum itself
    monkeypatch.setattr(triton_verify, "SEARCH_KEPT_ROWS", kept_rows)
    for name, value in (("BLOCK_V", 64), ("MIN_SPLIT_LEN", 64), ("PROGRAMS_PER_SM", programs_per_sm)):
        monkeypatch.setattr(triton_verify, name, value)
    assert_matches_reference(threshold_inputs(300), 3, device, backend)


def marked_inputs(seed):
    """Five random requests (k of 3, 5, 8, 2 and 1, no top-p) over rows of 1024 whose 12
    largest logits lie one a 64-entry block, each at its own lane group (lanes 0, 4, ...),
    the rest far below: the k-th largest alone in its block, block 4m + (request + step) % 4
    (each request's step 0, always emitted, at another of a step's four loads)."""
    inputs = make_inputs([2, 3, 1, 2, 1], 1024, seed=seed, greedy_fraction=0.0)
    g = torch.Generator().manual_seed(seed)
    rows = torch.cat([inputs["target_logits"], inputs["bonus_logits"]])
    rows.copy_(torch.randn(rows.shape, generator=g) - 30.0)
    ks = [3, 5, 8, 2, 1]
    counts = torch.diff(inputs["cu_num_draft_tokens"].long(), prepend=torch.zeros(1, dtype=torch.long))
    owner = torch.cat([torch.repeat_interleave(torch.arange(5), counts), torch.arange(5)])
    step = torch.cat([torch.arange(int(c)) for c in counts] + [counts])
    for r in range(rows.shape[0]):
        k = ks[int(owner[r])]
        blocks = torch.randperm(16, generator=g)
        kth_block = 4 * int(torch.randint(0, 4, (1,), generator=g)) + int(owner[r] + step[r]) % 4
        blocks = torch.cat([blocks[blocks != kth_block][:k - 1], torch.tensor([kth_block]),
                            blocks[blocks != kth_block][k - 1:11]])
        lanes = torch.randperm(16, generator=g)[:12] * 4
        rows[r, blocks * 64 + lanes] = 5.0 - 0.5 * torch.arange(12.0)
    inputs["target_logits"], inputs["bonus_logits"] = rows[:-5].clone(), rows[-5:].clone()
    inputs["top_k"] = torch.tensor(ks, dtype=torch.int32)
    inputs["top_p"] = None
    return inputs


@pytest.mark.parametrize("device,backend", TRITON_BACKENDS)
@pytest.mark.parametrize("marks,max_k", [(True, 512), (True, 4), (False, 512)],
                         ids=["marked", "k-past-limit", "every-block"])
def test_triton_first_normaliser_reads_the_marked_blocks(device, backend, marks, max_k, monkeypatch):
    """With top-k, z1 reads only the blocks top-k's round 0 marked (a logit >= its low end,
    here the k-th largest itself: seeded from lane-group maxima to the k-th largest), and
    the others hold 0 (the draws' block masses). Rows of 1024 in four programs of four
    64-entry blocks, so the block holding the k-th largest alone sits at each of a step's
    four loads across the rows (a mark tested with > instead of >= drops it: z1 and the
    log-probabilities move); k = 1 searches nothing (its interval one key at once: no marks,
    z1 reads every block). Against the reference; with k of 5 and 8 past a limit of 4 (those
    rows unmarked, read whole), and with the marks off; every buffer from torch.empty
    zeroed, so a row z1 took as marked that round 0 did not mark would lose its mass."""
    from specops.triton_kernels import verify as triton_verify

    for name, value in (("BLOCK_V", 64), ("MIN_SPLIT_LEN", 256), ("PROGRAMS_PER_SM", 16), ("SEED_VALUES", 2048),
                        ("SEED_COARSE_VALUES", 512), ("SEED_ROUNDS", 9), ("TOP_K_MARKS", marks),
                        ("TOP_K_MARKS_MAX_K", max_k)):
        monkeypatch.setattr(triton_verify, name, value)
    real_empty = torch.empty  # buffers start as 0s: an unmarked block z1 read as marked would weigh nothing
    monkeypatch.setattr(torch, "empty", lambda *args, **kwargs: real_empty(*args, **kwargs).zero_())
    # One row set: its construction already puts the k-th largest's block at each of the
    # four loads (a second seed repeated that at twice the interpreter time).
    assert_matches_reference(marked_inputs(41), 3, device, backend)


@pytest.mark.parametrize("device,backend", TRITON_BACKENDS)
def test_triton_launches_with_top_k_capped(device, backend, monkeypatch):
    """With top-k the launcher caps both normalisers' registers and top-p's search rounds'
    (TOP_K_SUM_MAX_REGISTERS, SECOND_SUM_MAX_REGISTERS, TOP_P_SEARCH_MAX_REGISTERS: 5
    programs an SM, bench/NOTES.md); with top-p alone only the first normaliser, at the
    cap of every call without top-k (SUM_MAX_REGISTERS), not its search (it lost capped); the
    tokens match the reference either way."""
    from specops.triton_kernels import verify as triton_verify

    launches = []

    class Recorded:
        def __init__(self, kernel, name):
            self.kernel, self.name = kernel, name

        def __getitem__(self, grid):
            def launch(*args, **kwargs):
                if self.name == "sum":
                    launches.append(("second" if kwargs["SECOND"] else "first", kwargs.get("maxnreg")))
                elif kwargs["MODE"] == 1:  # top-p's rounds
                    launches.append(("top-p search", kwargs.get("maxnreg")))
                return self.kernel[grid](*args, **kwargs)
            return launch

    monkeypatch.setattr(triton_verify, "fixed_sum_kernel", Recorded(triton_verify.fixed_sum_kernel, "sum"))
    monkeypatch.setattr(triton_verify, "threshold_search_kernel",
                        Recorded(triton_verify.threshold_search_kernel, "search"))
    inputs = make_inputs([2, 3, 1], 300, seed=5, greedy_fraction=0.0)
    inputs["top_k"] = torch.tensor([5, 40, 300], dtype=torch.int32)
    assert_matches_reference(inputs, 3, device, backend)
    rounds = triton_verify.TOP_P_ROUNDS.value
    assert launches == [("first", triton_verify.TOP_K_SUM_MAX_REGISTERS),
                        *[("top-p search", triton_verify.TOP_P_SEARCH_MAX_REGISTERS)] * rounds,
                        ("second", triton_verify.SECOND_SUM_MAX_REGISTERS)]
    launches.clear()
    inputs["top_k"] = None
    assert_matches_reference(inputs, 3, device, backend)
    assert launches == [("first", triton_verify.SUM_MAX_REGISTERS), *[("top-p search", None)] * rounds,
                        ("second", None)]


@pytest.mark.parametrize("device,backend", TRITON_BACKENDS)
@pytest.mark.parametrize("poison", ["zeros", "large"])
def test_triton_search_reads_only_what_it_wrote(device, backend, poison, monkeypatch):
    """Every buffer the launcher takes from torch.empty starts as 0s, or as a large value
    (2^30; NaN in floats): a round that exits at once (its interval one key) and writes no
    partials, or any read of partials or kept keys no round wrote, would move a threshold
    with the poison. The seeded search of three steps (several rounds after the seed, the
    last ones of one key; coarse maxima for k = 1 and 5) and top-p after it, at the sizes of
    the seeded test."""
    from specops.triton_kernels import verify as triton_verify

    real_empty = torch.empty

    def poisoned(*args, **kwargs):
        tensor = real_empty(*args, **kwargs)
        if tensor.dtype.is_floating_point:
            return tensor.fill_(0.0 if poison == "zeros" else float("nan"))
        return tensor.fill_(0 if poison == "zeros" else 1 << 30)

    monkeypatch.setattr(triton_verify, "SEED_VALUES", 2048)
    monkeypatch.setattr(triton_verify, "SEED_COARSE_VALUES", 128)
    monkeypatch.setattr(triton_verify, "SEED_ROUNDS", 3)
    for name, value in (("BLOCK_V", 64), ("MIN_SPLIT_LEN", 64), ("SEARCH_KEPT_ROWS", 16)):
        monkeypatch.setattr(triton_verify, name, value)
    monkeypatch.setattr(torch, "empty", poisoned)
    assert_matches_reference(threshold_inputs(300), 3, device, backend)


def test_triton_top_k_seed_layout(monkeypatch):
    """The max pass stores SEED_VALUES lane-group maxima a row and SEED_COARSE_VALUES coarser
    ones, each a power of two a program that divides BLOCK_V (at least one, at most one a
    lane and one an entry of the split; no coarse set as fine as the other), and none past
    SEED_MAX_SPLITS splits a row or without SEED_VALUES."""
    from specops.triton_kernels import verify as triton_verify

    monkeypatch.setattr(triton_verify, "SEED_VALUES", 2048)
    monkeypatch.setattr(triton_verify, "SEED_COARSE_VALUES", 512)
    monkeypatch.setattr(triton_verify, "SEED_MAX_SPLITS", 16)
    monkeypatch.setattr(triton_verify, "BLOCK_V", 2048)
    assert [triton_verify.seed_bins_for(n, triton.next_power_of_2(n), 128256 // n) for n in (1, 2, 7, 16, 17, 63)] == [
        (2048, 512), (1024, 256), (256, 64), (128, 32), (0, 0), (0, 0)]
    assert triton_verify.seed_bins_for(1, 1, 40) == (32, 0)  # no more maxima than logits
    assert triton_verify.seed_bins_for(1, 1, 1000) == (512, 0)
    assert triton_verify.seed_bins_for(1, 1, 1024) == (1024, 512)
    monkeypatch.setattr(triton_verify, "BLOCK_V", 64)
    assert triton_verify.seed_bins_for(1, 1, 2048) == (64, 0)  # one lane a group at most: one set
    assert triton_verify.seed_bins_for(16, 16, 2048) == (64, 32)
    monkeypatch.setattr(triton_verify, "SEED_VALUES", 8)
    assert triton_verify.seed_bins_for(16, 16, 2048) == (1, 0)  # one group a program at least
    assert triton_verify.seed_bins_for(1, 1, 1) == (1, 0)
    monkeypatch.setattr(triton_verify, "SEED_VALUES", 0)
    assert triton_verify.seed_bins_for(2, 2, 2048) == (0, 0)


def threshold_inputs(vocab):
    """Four random requests whose top-k / top-p thresholds are hard to find exactly: bonus
    rows tied (inside and across splits); request 2's rows one logit of 0, the others
    consecutive floats from -70 down (each key once, shuffled), k of half the vocab, T =
    10: the k-th largest lies below max - 64 among logits one key apart that weigh in z1, so
    a threshold one key off changes the log-probabilities; k of 1 and 5, top-p 0.9, 0.5,
    0.75."""
    inputs = make_inputs([2, 0, 3, 1], vocab, seed=31, greedy_fraction=0.0)
    inputs["bonus_logits"] = (inputs["bonus_logits"] * 4).round() / 4
    dense = (0xC28C0000 + torch.stack([torch.randperm(vocab) for _ in range(3)])).int().view(torch.float32)
    inputs["target_logits"][2:5] = dense.index_fill(1, torch.tensor([0]), 0.0)
    inputs["temperature"][2] = 10.0
    inputs["top_k"] = torch.tensor([1, 5, vocab // 2, 0], dtype=torch.int32)
    inputs["top_p"] = torch.tensor([0.9, 0.5, 1.0, 0.75])
    return inputs


# The Triton kernel's searches have their own test above (its split and kept-key paths);
# under the interpreter this one would only repeat it, slowly.
THRESHOLD_BACKENDS = [p for p in KERNEL_BACKENDS if p.values != ("cpu", Backend.TRITON)]


@pytest.mark.parametrize("device,backend", THRESHOLD_BACKENDS)
@pytest.mark.parametrize("vocab", [700, 9000, 128256])
def test_threshold_searches_match_reference(device, backend, vocab):
    """The top-k / top-p thresholds of threshold_inputs at vocabularies that give the CUDA
    kernel clusters of 1 to 16 CTAs (the radix selection's histograms summed across them):
    exactly the reference's tokens, counts and log-probabilities."""
    assert_matches_reference(threshold_inputs(vocab), 3, device, backend)


@pytest.mark.parametrize("device,backend", THRESHOLD_BACKENDS)
@pytest.mark.parametrize("vocab", [300, 40000])
def test_top_p_extremes_match_reference(device, backend, vocab):
    """top_p_extremes' rows (thresholds at 1 / V over ties, under a dominant token, at the max
    alone, one step below 1): the C++ kernel's threshold, found 10 bits of p at a time, and
    the CUDA kernel's keep exactly the reference's tokens."""
    assert_matches_reference(top_p_extremes(vocab), 3, device, backend)


def test_triton_kept_keys_layout_is_bounded():
    """The search's kept-key buffer: its full SEARCH_KEPT_ROWS where a lane meets that many entries
    (B = 64's splits of 128256), no more rows than a lane meets, and never past
    SEARCH_KEPT_BYTES: fewer rows with the keep limit scaled, or none (a million requests
    of 40 entries wanted 128 GiB before the cap)."""
    from specops.triton_kernels import verify as triton_verify

    limit, rows, cap = triton_verify.SEARCH_KEEP_LIMIT, triton_verify.SEARCH_KEPT_ROWS, triton_verify.SEARCH_KEPT_BYTES
    assert triton_verify.kept_layout(640, 64128, 256) == (rows, limit)
    assert triton_verify.kept_layout(16, 2048, 256) == (8, limit)  # a lane meets 8 entries of a split
    assert triton_verify.kept_layout(4 << 20, 40, 256) == (0, -1)  # 2^20 requests, k = 3, V = 40
    assert triton_verify.kept_layout(640, 64128, 256, wanted_limit=-1) == (0, -1)  # never keeps: the same layout
    assert triton_verify.kept_layout(640, 64128, 256, 2 * rows, 2 * limit) == (2 * rows, 2 * limit)  # top-p's own
    programs = cap // (256 * 4 * 8)  # room for 8 rows each
    assert triton_verify.kept_layout(programs, 64128, 256) == (8, limit * 8 // rows)
    for programs in (1, 640, 10**4, 10**5, 10**6):
        got_rows, _ = triton_verify.kept_layout(programs, 64128, 256)
        assert got_rows * programs * 256 * 4 <= cap
