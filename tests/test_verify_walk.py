"""The Triton verify's walked max pass (triton_kernels/verify_walk.py): each request's rows
read in order up to its first failed step. Against row_max_kernel's TESTS launch over the
same splits: the walked slots' max and argmax partials and verdicts are the same, bit for
bit, and they are exactly the slots up to the first failure (every later one keeps its
poison); the counters are left at zero; the tokens equal the reference's with the walk,
twice in a row. One split a request under the interpreter (which runs programs in turn);
on a GPU 63, 16 and 9."""

from __future__ import annotations

import pytest
import torch

from conftest import HAS_CUDA
from verify_inputs import make_inputs, triton_tokens

from specops.reference.verify import verify as reference_verify
from specops.triton_kernels.stream_counters import row_counters
from specops.triton_kernels.verify_rows import FAILS, row_max_kernel
from specops.triton_kernels.verify_unscreened import packed_departures
from specops.triton_kernels.verify_walk import row_walk_kernel

DEVICES = ["cpu"] + ([pytest.param("cuda", marks=pytest.mark.gpu)] if HAS_CUDA else [])
BLOCK_V = 2048
POISON_MAX, POISON_ARG, POISON_VERDICT = float("nan"), -7, -9


def walk_inputs(vocab, seed, ngram):
    """Eight requests of 0-5 drafts, two greedy, at two temperatures; request 1's drafts
    are the argmax of a row whose max is its draft (all pass: its bonus row is read), and
    request 3's first draft is outside the vocab (it fails at once)."""
    inputs = make_inputs([4, 5, 0, 3, 5, 1, 2, 4], vocab, seed=seed, greedy_fraction=0.25, ngram=ngram,
                         with_top=False)
    target, drafts = inputs["target_logits"], inputs["draft_token_ids"]
    inputs["temperature"][1] = 0.0
    for t in range(4, 9):
        drafts[t] = int(target[t].argmax())
    drafts[9] = vocab + 2
    return inputs


def launch_both(inputs, device, split_len, lookahead):
    """(walk's partials and verdicts, the TESTS launch's), from poisoned buffers."""
    x = {key: value.to(device) if value is not None else None for key, value in inputs.items()}
    batch, vocab = x["bonus_logits"].shape
    width = 6
    num_slots, num_splits = batch * width, -(-vocab // split_len)
    draft_probs = x["draft_probs"] if x["draft_probs"] is not None else x["target_logits"]
    sides = []
    for walk in (True, False):
        part_max = torch.full((num_slots, num_splits), POISON_MAX, device=device)
        part_arg = torch.full((num_slots, num_splits), POISON_ARG, dtype=torch.int32, device=device)
        verdicts = torch.full((num_slots,), POISON_VERDICT, dtype=torch.int32, device=device)
        counters = row_counters(torch.device(device), num_slots)
        common = (x["target_logits"], x["bonus_logits"], x["cu_num_draft_tokens"], x["temperature"])
        tests = (x["draft_token_ids"], draft_probs, x["seeds"], x["positions"])
        if walk:
            unused = torch.empty(1, dtype=torch.int64, device=device)
            row_walk_kernel[(num_splits, batch)](
                part_max, part_arg, unused, unused, *common, counters, packed_departures(counters), verdicts, *tests,
                x["target_logits"].shape[0], vocab, width, split_len, HAS_DRAFT_PROBS=x["draft_probs"] is not None,
                BLOCK_V=BLOCK_V, BLOCK_W=8, LOOKAHEAD=lookahead, num_warps=8)
        else:
            row_max_kernel[(num_slots, num_splits)](
                part_max, part_arg, part_max, part_max, *common, packed_departures(counters), verdicts, *tests,
                x["target_logits"].shape[0], vocab, width, split_len, ALL_GREEDY=False, BLOCK_V=BLOCK_V, TESTS=True,
                HAS_DRAFT_PROBS=x["draft_probs"] is not None, num_warps=8)
        assert not counters.any().item(), "counters left nonzero"
        sides.append((part_max.cpu(), part_arg.cpu(), verdicts.cpu()))
    return sides, width


def walked_slots(verdicts, counts, width):
    """The slots a walk reads, from the TESTS launch's verdicts: each request's steps up to
    its first failure, its bonus step when none fails."""
    slots = set()
    for b, count in enumerate(counts):
        for i in range(count + 1):
            slots.add(b * width + i)
            if i < count and int(verdicts[b * width + i]) == FAILS.value:
                break
    return slots


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("ngram", [False, True], ids=["draft", "ngram"])
@pytest.mark.parametrize("lookahead", [True, False], ids=["lookahead", "no-lookahead"])
def test_walk_reads_the_rows_up_to_the_first_failure(device, ngram, lookahead):
    # Under the interpreter one split a request; on a GPU 63, 16 and 9.
    vocab, split_lens = (5000, [3 * BLOCK_V]) if device == "cpu" else (63 * BLOCK_V - 5, [1, 4, 7])
    for seed, split_len in enumerate(split_lens):
        split_len = split_len * BLOCK_V if device != "cpu" else split_len
        inputs = walk_inputs(vocab, seed, ngram)
        counts = torch.diff(inputs["cu_num_draft_tokens"].long(), prepend=torch.zeros(1, dtype=torch.long)).tolist()
        sides, width = launch_both(inputs, device, split_len, lookahead)
        (walk_max, walk_arg, walk_verdicts), (all_max, all_arg, all_verdicts) = sides
        walked = walked_slots(all_verdicts, counts, width)
        assert len(walked) < sum(c + 1 for c in counts), "no request failed before its bonus step"
        assert {b * width + counts[b] for b in (1, 2)} <= walked  # every draft passed / no drafts
        for slot in range(len(counts) * width):
            b, i = divmod(slot, width)
            if slot in walked:
                assert torch.equal(walk_max[slot], all_max[slot]) and torch.equal(walk_arg[slot], all_arg[slot]), slot
                assert not walk_max[slot].isnan().any(), slot
                if i < counts[b]:
                    assert int(walk_verdicts[slot]) == int(all_verdicts[slot]), slot
            else:
                assert walk_max[slot].isnan().all() and (walk_arg[slot] == POISON_ARG).all(), slot
                assert int(walk_verdicts[slot]) == POISON_VERDICT, slot


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("ngram", [False, True], ids=["draft", "ngram"])
def test_walked_calls_match_reference(device, ngram, triton_verify, monkeypatch):
    """The launcher's walked calls, summing the normalisers (MAX_PASS_WALK, WALK_SUMS; a
    walk refused would fail the launch count below), twice in a row."""
    monkeypatch.setattr(triton_verify, "MAX_PASS_WALK", True)
    monkeypatch.setattr(triton_verify, "WALK_SUMS", True)
    launched = []
    kernel = triton_verify.row_walk_kernel

    class Recorded:
        def __getitem__(self, grid):
            launched.append(grid)
            return kernel[grid]

    monkeypatch.setattr(triton_verify, "row_walk_kernel", Recorded())
    vocab = 5000 if device == "cpu" else 128256
    inputs = walk_inputs(vocab, 11, ngram)
    expected = reference_verify(**inputs, max_spec_len=5)
    for _ in range(2):
        got = triton_tokens(inputs, device, 5, validate=False)
        assert torch.equal(got[0], expected[0]) and torch.equal(got[1], expected[1])
    assert len(launched) == 2 and launched[0][1] == 8
    assert not row_counters(torch.device(device), 1).any().item()
