"""torch.ops.specops.sampling_value_stats and paged_attention_value_stats, the statistics
behind the ops' value checks: every kernel (C++ CPU, CUDA) equal to reference/checks.py on
fresh random inputs, with non-finite logits at awkward places (first and last element, the
unaligned edges of a view, past the first CTA's share), every dtype, empty tensors, extreme
ids, block ids out of range in used and unused entries; opcheck; named argument errors; the
one-op path of validate=True."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import specops
from conftest import HAS_CUDA, requires_gpu
from verify_inputs import make_inputs
from specops import _value_checks
from specops.reference.checks import ATTENTION_STATS, EMPTY_MAX, EMPTY_MIN, STATS
from specops.reference.checks import paged_attention_value_stats as reference_attention_stats
from specops.reference.checks import sampling_value_stats as reference_stats

DEVICES = ["cpu"] + ([pytest.param("cuda", marks=pytest.mark.gpu)] if HAS_CUDA else [])
LOGIT_DTYPES = [torch.float32, torch.bfloat16, torch.float16]
op = torch.ops.specops.sampling_value_stats
attention_op = torch.ops.specops.paged_attention_value_stats


def _poison_allocator(device: str) -> None:
    """Leave a freed block of NaN in the CUDA caching allocator, so a result slot the kernel
    failed to write reads NaN (on the CPU the op's result is compared whole anyway)."""
    if device == "cuda":
        torch.full((1 << 12,), float("nan"), dtype=torch.float64, device=device)


def assert_stats_equal(args, device):
    _poison_allocator(device)
    got = op(*args)
    expected = reference_stats(*[a.cpu() if a is not None else None for a in args])
    assert got.device.type == device and got.dtype == torch.float64 and got.shape == (len(STATS),)
    assert not torch.isnan(got).any(), got
    assert got.cpu().tolist() == expected.tolist(), dict(zip(STATS, zip(got.tolist(), expected.tolist())))


def make_args(batch, vocab, dtype, device, seed, ids_dtype=torch.int32, cu_dtype=torch.int32):
    g = torch.Generator().manual_seed(seed)
    counts = torch.randint(0, 5, (batch,), generator=g)
    cu = counts.cumsum(0).to(cu_dtype)
    num_tokens = int(counts.sum())
    ids = torch.randint(0, vocab, (num_tokens,), generator=g).to(ids_dtype)
    target = (torch.randn(num_tokens, vocab, generator=g) * 4).to(dtype)
    bonus = (torch.randn(batch, vocab, generator=g) * 4).to(dtype)
    temperature = torch.rand(batch, generator=g) * 2
    top_p = torch.rand(batch, generator=g) * 0.9 + 0.1
    return [t.to(device) for t in (cu, ids, target, bonus, temperature, top_p)]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", LOGIT_DTYPES, ids=str)
@pytest.mark.parametrize("batch,vocab", [(1, 1), (3, 7), (8, 111), (5, 4099)])
def test_matches_reference_with_each_bad_value(device, dtype, batch, vocab):
    args = make_args(batch, vocab, dtype, device, seed=batch * vocab)
    assert_stats_equal(args, device)
    for value in (float("nan"), float("inf"), float("-inf")):
        for position in (0, -1, vocab // 2):  # logits: first, last, middle element of the flat tensor
            for which in (2, 3):
                bad = [a.clone() for a in args]
                if bad[which].numel():
                    bad[which].view(-1)[position] = value
                assert_stats_equal(bad, device)
    bad = [a.clone() for a in args]
    bad[4][-1], bad[5][0] = float("nan"), 0.0
    assert_stats_equal(bad, device)
    bad[4][0], bad[5][-1] = -1.0, float("nan")
    assert_stats_equal(bad, device)


@pytest.mark.parametrize("device", DEVICES)
def test_extreme_and_empty_values(device):
    def on(*ts):
        return [t.to(device) if t is not None else None for t in ts]

    empty_i32 = torch.empty(0, dtype=torch.int32)
    # Nothing at all: the min / max slots hold their empty values, the flags 0.
    got = op(*on(empty_i32, None, None, None, None, None)).cpu().tolist()
    assert got == [float(EMPTY_MIN), float(EMPTY_MAX), 0, float(EMPTY_MIN), float(EMPTY_MAX), 0, 0, 0, 0]
    assert_stats_equal(on(empty_i32, empty_i32, torch.empty(0, 5), torch.empty(0, 5), torch.empty(0),
                          torch.empty(0)), device)
    # int64 extremes, a decreasing cu (negative count), a negative first entry.
    ids = torch.tensor([2**62, -(2**62), 0, 2**63 - 1, -(2**63)], dtype=torch.int64)
    cu = torch.tensor([-3, 4, 2, 2**40], dtype=torch.int64)
    assert_stats_equal(on(cu, ids, None, None, None, None), device)
    assert_stats_equal(on(cu.int().clamp(-5, 100).contiguous(), ids.clamp(-(2**31), 2**31 - 1).int(), None,
                          None, None, None), device)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", LOGIT_DTYPES, ids=str)
def test_views_off_the_16_byte_grid(device, dtype):
    """Logits views that start and end off a 16-byte boundary: the elements outside the
    kernel's aligned middle are tested too."""
    cu, ids = make_args(4, 300, dtype, device, seed=3)[:2]
    logits = torch.randn(1100, generator=torch.Generator().manual_seed(3)).to(dtype).to(device)
    for start in range(0, 9):
        for length in (1, 5, 1051):
            flat = logits[start: start + length]
            for position in sorted({0, 1, 7, 8, length // 2, length - 9, length - 8, length - 1} & set(range(length))):
                view = flat.new_empty(start + length)[start:]  # flat's misalignment, in a copy
                view.copy_(flat)
                view[position] = float("nan")
                assert_stats_equal([cu, ids, view, None, None, None], device)
                assert_stats_equal([cu, ids, None, view, None, None], device)
            assert_stats_equal([cu, ids, flat, flat, None, None], device)


@requires_gpu
@pytest.mark.gpu
@pytest.mark.parametrize("dtype", LOGIT_DTYPES, ids=str)
def test_gpu_full_size_logits(dtype):
    """A B=64 V=128256 batch of up to 4 drafts a request (many CTAs, each striding over many
    words): one bad logit
    anywhere is found, in the target or the bonus rows; clean logits are not flagged."""
    args = make_args(64, 128256, dtype, "cuda", seed=9)
    cu, ids, target, bonus = args[:4]
    assert_stats_equal(args, "cuda")
    g = torch.Generator().manual_seed(1)
    positions = [0, target.numel() - 1, *torch.randint(0, target.numel(), (6,), generator=g).tolist()]
    for position in positions:
        for value in (float("nan"), float("inf"), float("-inf")):
            bad = target.clone()
            bad.view(-1)[position] = value
            got = op(cu, ids, bad, bonus, None, None).tolist()
            assert got[STATS.index("target_non_finite")] == 1 and got[STATS.index("bonus_non_finite")] == 0
    bad = bonus.clone()
    bad.view(-1)[-1] = float("nan")
    got = op(cu, ids, target, bad, None, None).tolist()
    assert got[STATS.index("target_non_finite")] == 0 and got[STATS.index("bonus_non_finite")] == 1


@given(data=st.data())
def test_hypothesis_matches_reference(data):
    batch = data.draw(st.integers(0, 9), label="batch")
    vocab = data.draw(st.integers(1, 70), label="vocab")
    dtype = data.draw(st.sampled_from(LOGIT_DTYPES), label="dtype")
    ids_dtype = data.draw(st.sampled_from([torch.int32, torch.int64]), label="ids dtype")
    cu_dtype = data.draw(st.sampled_from([torch.int32, torch.int64]), label="cu dtype")
    args = make_args(batch, vocab, dtype, "cpu", data.draw(st.integers(0, 2**16), label="seed"), ids_dtype, cu_dtype)
    for i in range(len(args)):
        t = args[i]
        if t.numel() and data.draw(st.booleans(), label=f"spoil {i}"):
            position = data.draw(st.integers(0, t.numel() - 1), label=f"position {i}")
            if t.dtype.is_floating_point:
                values = [float("nan"), float("inf"), float("-inf"), -1.0, 0.0]
            else:
                values = [-7, -1, 0, 2**31 - 1, -(2**31)] + ([2**40, 2**63 - 1] if t.dtype == torch.int64 else [])
            t.view(-1)[position] = data.draw(st.sampled_from(values), label=f"value {i}")
    if data.draw(st.booleans(), label="drop optional"):
        args[data.draw(st.integers(1, 5), label="dropped")] = None
    assert_stats_equal(args, "cpu")


@pytest.mark.parametrize("device", DEVICES)
def test_opcheck(device):
    args = make_args(3, 40, torch.float32, device, seed=2)
    torch.library.opcheck(op.default, tuple(args))
    torch.library.opcheck(op.default, (args[0], None, None, None, None, None))


@pytest.mark.parametrize("device", DEVICES)
def test_compile_fullgraph_matches_eager(device):
    """Both ops traced by torch.compile(fullgraph=True) through their fake kernels (the
    value checks themselves are skipped while compiling; a caller may still trace the ops)."""
    torch._dynamo.reset()
    args = make_args(3, 40, torch.float32, device, seed=6)
    args[2].view(-1)[5] = float("nan")
    tables = make_tables(3, 5, 16, 20, device, seed=6)

    def both(cu, ids, target, bonus, temperature, top_p, table, seq_lens, cu_query_lens):
        return op(cu, ids, target, bonus, temperature, top_p), attention_op(table, seq_lens, cu_query_lens, 16, 20)

    compiled = torch.compile(both, fullgraph=True, backend="aot_eager" if device == "cpu" else "inductor")
    for got, expected in zip(compiled(*args, *tables), both(*args, *tables)):
        assert torch.equal(got, expected)


@pytest.mark.parametrize("device", DEVICES)
def test_bad_arguments_raise_named_errors(device):
    cu, ids, target, bonus, temperature, top_p = make_args(3, 40, torch.float32, device, seed=2)
    cases = [
        ((cu.float(), ids, target, bonus, temperature, top_p), TypeError, "cu_num_draft_tokens must be int32"),
        ((cu, ids.float(), target, bonus, temperature, top_p), TypeError, "token_ids must be int32 or int64"),
        ((cu, ids, target.double(), bonus, temperature, top_p), TypeError, "target_logits must be float32"),
        ((cu, ids, target, bonus.int(), temperature, top_p), TypeError, "bonus_logits must be float32"),
        ((cu, ids, target, bonus, temperature.half(), top_p), TypeError, "temperature must be float32"),
        ((cu, ids, target, bonus, temperature, top_p.double()), TypeError, "top_p must be float32"),
        ((cu, ids, target.t(), bonus, temperature, top_p), ValueError, "target_logits must be contiguous"),
        ((torch.stack([cu, cu], 1)[:, 0], ids, target, bonus, temperature, top_p), ValueError,
         "cu_num_draft_tokens must be contiguous"),
    ]
    if device == "cuda":
        cases.append(((cu, ids, target, bonus.cpu(), temperature, top_p), ValueError,
                      "bonus_logits must be on the same device as cu_num_draft_tokens"))
    for args, error, words in cases:
        with pytest.raises((error, RuntimeError), match=words):
            op(*args)
        with pytest.raises(error, match=words):  # the fake kernel's message
            _value_checks.check_sampling_value_stats(*args)


@pytest.mark.parametrize("device", DEVICES)
def test_validation_takes_the_op_and_falls_back_for_odd_arguments(device, monkeypatch):
    """validate=True runs the op once for a well-formed call and reads it once; arguments the
    op does not take (a float64 temperature) go to the reference statistics, and the verify
    op's own checks name them."""
    counts = {"op": 0, "reference": 0}

    def counted(name, fn):
        def call(*args):
            counts[name] += 1
            return fn(*args)
        return call

    monkeypatch.setattr(_value_checks.reference_checks, "sampling_value_stats",
                        counted("reference", _value_checks.reference_checks.sampling_value_stats))
    monkeypatch.setattr(torch.ops.specops, "sampling_value_stats", counted("op", op))
    inputs = {k: v.to(device) if v is not None else None for k, v in make_inputs([2, 0, 3], 50, seed=4).items()}
    specops.verify(*inputs.values(), 3)
    assert counts == {"op": 1, "reference": 0}
    with pytest.raises(TypeError, match="temperature must be"):
        specops.verify(*{**inputs, "temperature": inputs["temperature"].double()}.values(), 3)
    assert counts == {"op": 1, "reference": 1}
    with pytest.raises(ValueError, match="target_logits holds NaN"):  # the op's verdict
        specops.verify(*{**inputs, "target_logits": inputs["target_logits"] * float("nan")}.values(), 3)
    assert counts == {"op": 2, "reference": 1}


# ---- paged_attention_value_stats ----


def make_tables(batch, max_blocks, block_size, num_blocks, device, seed):
    """A block table, seq_lens (some 0, negative, past the table) and cu_query_lens (some
    decreasing steps), with bad block ids in used and in unused entries."""
    g = torch.Generator().manual_seed(seed)
    table = torch.randint(0, num_blocks, (batch, max_blocks), generator=g, dtype=torch.int32)
    seq_lens = torch.randint(-3, max_blocks * block_size + block_size, (batch,), generator=g, dtype=torch.int32)
    query_lens = torch.randint(0, 6, (batch,), generator=g)
    cu = torch.cat([torch.zeros(1, dtype=torch.int64), query_lens.cumsum(0)]).to(torch.int32)
    return [t.to(device) for t in (table, seq_lens, cu)]


def assert_attention_stats_equal(args, block_size, num_blocks, device):
    _poison_allocator(device)
    got = attention_op(*args, block_size, num_blocks)
    expected = reference_attention_stats(*[a.cpu() for a in args], block_size, num_blocks)
    assert got.device.type == device and got.dtype == torch.float64 and got.shape == (len(ATTENTION_STATS),)
    assert not torch.isnan(got).any(), got
    assert got.cpu().tolist() == expected.tolist(), dict(zip(ATTENTION_STATS, zip(got.tolist(), expected.tolist())))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("batch,max_blocks,block_size", [(1, 1, 16), (3, 7, 16), (9, 33, 1), (40, 130, 64)])
def test_attention_stats_match_reference(device, batch, max_blocks, block_size):
    num_blocks = 3 * max_blocks
    table, seq_lens, cu = make_tables(batch, max_blocks, block_size, num_blocks, device, seed=batch + max_blocks)
    assert_attention_stats_equal([table, seq_lens, cu], block_size, num_blocks, device)
    for b in range(batch):  # one bad id at a time: at a used entry's edge (flagged) and past it (not)
        used = min(max(0, -(-int(seq_lens[b]) // block_size)), max_blocks)
        for j, value in ((used - 1, num_blocks), (used - 1, -1), (used, -5), (0, num_blocks + 7)):
            if 0 <= j < max_blocks:
                bad = table.clone()
                bad[b, j] = value
                assert_attention_stats_equal([bad, seq_lens, cu], block_size, num_blocks, device)
    spoiled = cu.clone()
    spoiled[batch // 2 + 1] = -4
    assert_attention_stats_equal([table, seq_lens, spoiled], block_size, num_blocks, device)


@pytest.mark.parametrize("device", DEVICES)
def test_attention_stats_of_an_empty_batch_or_table(device):
    empty = torch.empty(0, dtype=torch.int32, device=device)
    zero = torch.zeros(1, dtype=torch.int32, device=device)
    assert_attention_stats_equal([empty.view(0, 4), empty, zero], 16, 5, device)
    got = attention_op(empty.view(0, 4), empty, zero, 16, 5).cpu().tolist()
    assert got == [0, 0, float(EMPTY_MIN), float(EMPTY_MIN), float(EMPTY_MAX), 0]
    seq_lens = torch.tensor([0, 5], dtype=torch.int32, device=device)  # a table of no columns
    cu = torch.tensor([0, 1, 2], dtype=torch.int32, device=device)
    assert_attention_stats_equal([empty.view(2, 0), seq_lens, cu], 16, 5, device)


@requires_gpu
@pytest.mark.gpu
def test_gpu_attention_stats_full_size():
    """B=128 sequences of up to 16384 keys in 16-key blocks: many CTAs over the table."""
    table, seq_lens, cu = make_tables(128, 1024, 16, 200_000, "cuda", seed=5)
    assert_attention_stats_equal([table, seq_lens, cu], 16, 200_000, "cuda")
    g = torch.Generator().manual_seed(2)
    for b in torch.randint(0, 128, (5,), generator=g).tolist():
        used = min(max(0, -(-int(seq_lens[b]) // 16)), 1024)
        if used:
            bad = table.clone()
            bad[b, used - 1] = -1
            assert attention_op(bad, seq_lens, cu, 16, 200_000).tolist()[ATTENTION_STATS.index("bad_block_id")] == 1


@pytest.mark.parametrize("device", DEVICES)
def test_attention_stats_opcheck_and_errors(device):
    table, seq_lens, cu = make_tables(3, 5, 16, 20, device, seed=1)
    torch.library.opcheck(attention_op.default, (table, seq_lens, cu, 16, 20))
    cases = [
        ((table.long(), seq_lens, cu, 16), TypeError, "block_table must be int32"),
        ((table, seq_lens.long(), cu, 16), TypeError, "seq_lens must be int32"),
        ((table.t(), seq_lens, cu, 16), ValueError, "block_table must be contiguous"),
        ((table[0], seq_lens, cu, 16), ValueError, "block_table must have shape"),
        ((table, seq_lens[:2], cu, 16), ValueError, r"seq_lens must have shape \[batch\] = \[3\]"),
        ((table, seq_lens, cu[:3], 16), ValueError, r"cu_query_lens must have shape \[batch \+ 1\] = \[4\]"),
        ((table, seq_lens, cu, 0), ValueError, "block_size must be >= 1"),
    ]
    if device == "cuda":
        cases.append(((table, seq_lens.cpu(), cu, 16), ValueError, "seq_lens must be on the same device"))
    for args, error, words in cases:
        with pytest.raises((error, RuntimeError), match=words):
            attention_op(*args, 20)
        with pytest.raises(error, match=words):
            _value_checks.check_paged_attention_value_stats(*args)
