"""N-gram prompt lookup (specops.engine.ngram) against a plain-loop reference."""

from __future__ import annotations

from array import array

import pytest
from hypothesis import given
from hypothesis import strategies as st

from specops.engine.ngram import NgramProposer


def reference_propose(token_ids: list[int], min_n: int, max_n: int, k: int) -> list[int]:
    """The definition, as loops: longest n first, latest earlier start first."""
    for n in range(max_n, min_n - 1, -1):
        if len(token_ids) < n + 1:
            continue
        suffix = token_ids[-n:]
        for start in range(len(token_ids) - n - 1, -1, -1):
            if token_ids[start:start + n] == suffix:
                return token_ids[start + n:start + n + k]
    return []


@pytest.mark.parametrize(
    "token_ids, min_n, max_n, k, expected",
    [
        ([5, 6, 7, 1, 5, 6], 1, 3, 2, [7, 1]),
        ([5, 6, 7, 1, 5, 6], 1, 3, 8, [7, 1, 5, 6]),  # fewer than k tokens follow
        ([1, 2, 3, 9, 2, 3, 8, 1, 2, 3], 1, 3, 2, [9, 2]),  # the 3-gram wins over a later 2-gram
        ([1, 2, 3, 9, 2, 3, 8, 1, 2, 3], 1, 2, 2, [8, 1]),  # the latest 2-gram
        ([4, 4, 4, 4], 2, 2, 3, [4]),  # latest earlier start is 1; only token 3 follows it
        ([1, 2, 3, 4], 1, 3, 4, []),  # nothing repeats
        ([7], 1, 1, 4, []),
        ([], 1, 3, 4, []),
        ([3, 1, 3], 2, 3, 4, []),  # no 2-gram repeats; 1-grams not tried
        ([3, 1, 3], 1, 3, 4, [1, 3]),
    ],
)
def test_cases(token_ids, min_n, max_n, k, expected):
    assert NgramProposer(min_n=min_n, max_n=max_n, k=k).propose(token_ids) == expected
    assert reference_propose(token_ids, min_n, max_n, k) == expected


def test_misaligned_byte_matches_are_skipped():
    # 256 packs to bytes 00 01 00 00 and 1 to 01 00 00 00: the byte pattern of [1] occurs
    # inside 256 at byte offset 1, which is no token boundary.
    assert NgramProposer(min_n=1, max_n=1, k=2).propose([256, 0, 1]) == []
    assert NgramProposer(min_n=1, max_n=1, k=2).propose([1, 256, 0, 1]) == [256, 0]


def test_per_call_k_and_zero_drafts():
    proposer = NgramProposer(min_n=1, max_n=2, k=3)
    tokens = [1, 2, 3, 4, 5, 1, 2]
    assert proposer.propose(tokens) == [3, 4, 5]
    assert proposer.propose(tokens, k=1) == [3]
    assert proposer.propose(tokens, k=0) == []


def test_batch():
    proposer = NgramProposer(min_n=1, max_n=2, k=2)
    batch = [[1, 2, 3, 1, 2], [9, 8], [5, 6, 5]]
    assert proposer.propose_batch(batch) == [[3, 1], [], [6, 5]]
    assert proposer.propose_batch(batch, [1, 2, 0]) == [[3], [], []]
    with pytest.raises(ValueError, match="num_drafts"):
        proposer.propose_batch(batch, [1, 2])


@pytest.mark.parametrize(
    "kwargs, match",
    [({"min_n": 0}, "min_n"), ({"max_n": 0}, "max_n"), ({"k": 0}, "k"), ({"min_n": 3, "max_n": 2}, "min_n"),
     ({"k": True}, "k")],
)
def test_config_validation(kwargs, match):
    with pytest.raises(ValueError, match=match):
        NgramProposer(**kwargs)


def test_bad_inputs():
    proposer = NgramProposer()
    with pytest.raises(ValueError, match="k must"):
        proposer.propose([1, 2, 1], k=-1)
    with pytest.raises(ValueError, match="token_ids"):
        proposer.propose([2**40, 1, 2**40])


@given(
    token_ids=st.lists(st.integers(0, 3) | st.sampled_from([255, 256, 65536, 2**31 - 1]), max_size=40),
    min_n=st.integers(1, 4),
    extra_n=st.integers(0, 3),
    k=st.integers(0, 6),
)
def test_matches_reference(token_ids, min_n, extra_n, k):
    proposer = NgramProposer(min_n=min_n, max_n=min_n + extra_n, k=max(k, 1))
    expected = reference_propose(token_ids, min_n, min_n + extra_n, k)
    assert proposer.propose(token_ids, k) == expected
    assert proposer.propose(array("i", token_ids), k) == expected  # the packed fast path
