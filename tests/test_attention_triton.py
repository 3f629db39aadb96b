"""The paged_attention kernels beyond the shared op tests: split-KV with its exact LSE merge,
query tiles of several passes (GQA group x query rows), the launch plan, hypothesis-drawn
shapes, and, on a GPU, the ANCHORS.md shapes at reduced batch, every GQA group x head dim
x block size, outputs written into poisoned memory, and CUDA-graph capture and replay.

Under the interpreter (CPU) shapes stay tiny and bfloat16 is skipped (its dot is not
faithful there). The GPU tests are parametrized over every kernel backend on CUDA, so a
CUDA kernel is picked up when the op gets one; the split and tile tests call the Triton
launcher directly with a forced launch plan.
"""

from __future__ import annotations

import math

import pytest
import torch
import triton
from attention_inputs import TOLERANCES, make_batch, reference_float64, relative_error
from conftest import backend_params, capture
from hypothesis import given
from hypothesis import strategies as st
from specops.triton_kernels import attention as triton_attention
from specops.triton_kernels.attention_plan import (
    ASSUMED_MULTIPROCESSORS,
    AttentionLaunch,
    plan_paged_attention,
)
from specops.triton_kernels.launch import dram_gbs_per_multiprocessor

import specops
from specops.backend import Backend

TRITON_PARAMS = [p for p in backend_params() if p.values[1] is Backend.TRITON]
GPU_PARAMS = [p for p in backend_params() if p.values[0] == "cuda"]
TOLERANCE = {dtype: (max_error, lse_atol) for dtype, max_error, lse_atol in TOLERANCES}


def skip_unfaithful(device, dtype):
    if device == "cpu" and dtype == torch.bfloat16:
        pytest.skip("the Triton interpreter's bfloat16 dot is not faithful; runs on the GPU")


def assert_matches_reference(inputs, got, scale, window=0, cap=0.0):
    """out and LSE against the float64 reference; every element finite (no NaN from
    unused slots, no unwritten output)."""
    out, lse = got
    dtype = inputs["query"].dtype
    max_error, lse_atol = TOLERANCE[dtype]
    ref_out, ref_lse = reference_float64(inputs, scale, window, cap)
    assert out.dtype == dtype and out.shape == inputs["query"].shape
    assert torch.isfinite(out).all(), "NaN/inf in the output: unused slots leaked or rows were not written"
    assert torch.isfinite(lse).all()
    error = relative_error(out.to(ref_out.device), ref_out)
    assert error < max_error, f"relative error {error:.2e} >= {max_error:.0e}"
    torch.testing.assert_close(lse.double().to(ref_lse.device), ref_lse.double(), atol=lse_atol, rtol=0)


def run_launcher(inputs, scale, window, cap, launch):
    return triton_attention.launch_paged_attention(*inputs.values(), scale, window, cap, True, launch=launch)


def forced(rows, block_m, num_splits, block_n=16):
    return AttentionLaunch(rows=rows, block_m=block_m, block_n=block_n, num_splits=num_splits)


# (name, seq_lens, q_lens, Hq, Hkv, D, block_size, window, cap, launch): forced splits and
# passes on shapes small enough for the interpreter.
SPLIT_CASES = [
    # 5 splits of 16-key tiles: sequences of 1 and 3 keys leave most splits empty
    ("splits-decode", [1, 40, 3, 77], [1, 1, 1, 1], 4, 2, 64, 16, 0, 0.0, forced(1, 16, 5)),
    # q_len 5 and 9 through 2-row tiles: several passes, each split again
    ("splits-passes", [33, 9, 60], [5, 9, 1], 8, 2, 32, 8, 0, 0.0, forced(2, 16, 3)),
    ("group16-passes", [21, 12], [9, 3], 16, 1, 32, 16, 0, 0.0, forced(2, 32, 2)),
    # every window start modulo the 16-key tile: the first tile a row needs is never skipped
    ("window-edges", list(range(28, 50)), [1, 2] * 11, 2, 1, 16, 16, 9, 0.0, forced(2, 16, 2)),
    ("window-splits", [70, 20, 5], [5, 1, 5], 4, 1, 64, 16, 9, 0.0, forced(4, 16, 4)),
    ("cap-splits", [50, 18], [1, 5], 4, 4, 64, 32, 0, 4.0, forced(8, 16, 3, block_n=32)),
    ("group3-dim48", [26, 30], [5, 2], 6, 2, 48, 16, 0, 0.0, forced(4, 16, 2)),
    ("more-splits-than-tiles", [10], [4], 2, 1, 16, 4, 0, 0.0, forced(1, 16, 7)),
]


@pytest.mark.parametrize("device,backend", TRITON_PARAMS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=str)
@pytest.mark.parametrize("case", SPLIT_CASES, ids=[c[0] for c in SPLIT_CASES])
def test_forced_splits_and_passes_match_reference(device, backend, case, dtype):
    name, seq_lens, q_lens, hq, hkv, d, block_size, window, cap, launch = case
    inputs = make_batch(seq_lens, q_lens, hq, hkv, d, block_size, dtype, seed=sum(map(ord, name)))
    scale = (8.0 if cap else 1.0) / math.sqrt(d)
    got = run_launcher({k: v.to(device) for k, v in inputs.items()}, scale, window, cap, launch)
    assert_matches_reference(inputs, [t.cpu() for t in got], scale, window, cap)


@pytest.mark.parametrize("device,backend", TRITON_PARAMS)
def test_split_merge_agrees_with_one_split(device, backend):
    """Splitting only regroups the same float32 sums: 1, 2 and 6 splits agree closely."""
    inputs = make_batch([90, 7], [3, 1], 4, 2, 64, 16, torch.float32, seed=21)
    inputs = {k: v.to(device) for k, v in inputs.items()}
    outs = [run_launcher(inputs, 0.125, 0, 0.0, forced(4, 16, s)) for s in (1, 2, 6)]
    for out, lse in outs[1:]:
        torch.testing.assert_close(out, outs[0][0], atol=2e-6, rtol=2e-6)
        torch.testing.assert_close(lse, outs[0][1], atol=2e-6, rtol=0)


@pytest.mark.parametrize("device,backend", TRITON_PARAMS)
def test_planned_splits_through_the_op(device, backend):
    """A small batch over a long block table: the plan splits, and the op agrees."""
    inputs = make_batch([600, 1], [2, 1], 4, 1, 32, 16, torch.float16, seed=22)
    max_context = inputs["block_table"].shape[1] * 16
    plan = plan_paged_attention(3, 2, 4, 1, 32, max_context, ASSUMED_MULTIPROCESSORS)
    assert plan.num_splits > 1
    got = specops.paged_attention(*{k: v.to(device) for k, v in inputs.items()}.values(), 0.2, 0, 0.0, True,
                                  backend=backend)
    assert_matches_reference(inputs, [t.cpu() for t in got], 0.2)


@pytest.mark.parametrize("device,backend", TRITON_PARAMS)
@pytest.mark.parametrize("num_splits", [1, 3])
def test_rows_without_visible_keys_follow_the_cpu_kernel(device, backend, num_splits):
    """validate=False with seq_len < q_len: rows at negative positions see no key; they
    get output 0 and LSE -inf, as the C++ CPU kernel gives them, splits or not."""
    inputs = make_batch([3, 30], [5, 2], 4, 2, 32, 16, torch.float32, seed=23)
    expected = specops.paged_attention(*inputs.values(), 0.2, 0, 0.0, True, backend="cpu", validate=False)
    got = run_launcher({k: v.to(device) for k, v in inputs.items()}, 0.2, 0, 0.0, forced(2, 16, num_splits))
    assert (expected[0][:2] == 0).all() and (expected[1][:2] == float("-inf")).all()
    torch.testing.assert_close(got[0].cpu(), expected[0], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(got[1].cpu(), expected[1], atol=1e-5, rtol=0)


@pytest.mark.parametrize("device,backend", TRITON_PARAMS)
def test_hypothesis_shapes_match_reference(device, backend):
    """Drawn batches: lengths off the block size (1 included), q_len 0..9 mixed, GQA groups
    1..16, head dims off a power of two, windows, caps, any split count and tile rows."""
    big = device == "cuda"

    @given(
        data=st.data(),
        group=st.sampled_from([1, 2, 3, 4, 8, 16]),
        num_kv_heads=st.integers(1, 2),
        head_dim=st.sampled_from([64, 128, 256] if big else [16, 24, 32]),
        block_size=st.sampled_from([16, 32, 64] if big else [1, 4, 16]),
        dtype=st.sampled_from([torch.float16, torch.bfloat16] if big else [torch.float32, torch.float16]),
        window=st.sampled_from([0, 0, 1, 6]),
        cap=st.sampled_from([0.0, 0.0, 3.0]),
        num_splits=st.sampled_from([None, 1, 2, 5]),
        rows=st.sampled_from([None, 1, 4]),
    )
    def check(data, group, num_kv_heads, head_dim, block_size, dtype, window, cap, num_splits, rows):
        batch = data.draw(st.integers(1, 4), label="batch")
        q_lens = data.draw(st.lists(st.integers(0, 9), min_size=batch, max_size=batch), label="q_lens")
        max_len = 1500 if big else 48
        seq_lens = [data.draw(st.integers(max(q, 1), max_len), label="seq_len") for q in q_lens]
        num_heads = group * num_kv_heads
        inputs = make_batch(seq_lens, q_lens, num_heads, num_kv_heads, head_dim, block_size, dtype,
                            seed=data.draw(st.integers(0, 2**31), label="seed"))
        if sum(q_lens) == 0:
            return
        launch = plan_paged_attention(sum(q_lens), batch, num_heads, num_kv_heads, head_dim,
                                      inputs["block_table"].shape[1] * block_size, ASSUMED_MULTIPROCESSORS,
                                      rows=rows, num_splits=num_splits)
        scale = (4.0 if cap else 1.0) / math.sqrt(head_dim)
        got = run_launcher({k: v.to(device) for k, v in inputs.items()}, scale, window, cap, launch)
        assert_matches_reference(inputs, [t.cpu() for t in got], scale, window, cap)

    check()


# ---- the launch plan ----


@pytest.mark.parametrize(
    "shape,expected",
    [
        # (Tq, B, Hq, Hkv, D, max_context) -> (rows, block_m, num_splits): ANCHORS.md section 2
        ((1, 1, 32, 8, 128, 4096), (1, 16, 32)),  # B=1 decode: 8 programs -> 32 splits of 128 keys
        ((5, 1, 32, 8, 128, 4096), (8, 32, 32)),  # B=1 verify: 5 rows x group 4 in one tile
        ((64, 64, 32, 8, 128, 4096), (1, 16, 1)),  # 512 programs fill 132 SMs
        ((320, 64, 32, 8, 128, 4096), (16, 64, 1)),
        ((80, 16, 32, 8, 128, 4096), (16, 64, 2)),  # 128 programs: 2 splits of 2048 keys
        ((32, 32, 32, 8, 128, 16384), (1, 16, 1)),  # 256 programs: no split
        ((9, 1, 16, 1, 256, 8192), (4, 64, 32)),  # group 16 x D 256: 4 rows a pass
        ((20, 2, 32, 8, 128, 300), (16, 64, 2)),  # short block table: 2 splits of >= 128 keys
    ],
)
def test_plan_at_anchor_shapes(shape, expected):
    launch = plan_paged_attention(*shape, 132)
    assert (launch.rows, launch.block_m, launch.num_splits) == expected
    assert launch.block_m * max(16, shape[4]) <= 16384


def test_plan_with_max_query_len_hint():
    """B=64 verify with k=4: 320 rows could hold a sequence of 257, so without a hint the
    tile takes 16 rows; the hint 5 (k + 1) takes 8. A hint above the worst case changes nothing."""
    shape = (320, 64, 32, 8, 128, 4096, 132)
    assert plan_paged_attention(*shape).rows == 16
    assert plan_paged_attention(*shape, max_query_len=5).rows == 8
    assert plan_paged_attention(*shape, max_query_len=1).rows == 1
    assert plan_paged_attention(64, 64, 32, 8, 128, 4096, 132, max_query_len=5).rows == 1  # decode: 1 row each
    assert plan_paged_attention(*shape, max_query_len=1000) == plan_paged_attention(*shape)
    # 32-row verify tiles stream 128-key tiles two stages deep; 64-row tiles and whole-sequence
    # decode tiles 64 keys three deep (bench/NOTES.md: the H100 sweep behind these choices).
    verify = plan_paged_attention(*shape, max_query_len=5)
    assert (verify.block_n, verify.num_stages) == (128, 2)
    assert (plan_paged_attention(*shape).block_n, plan_paged_attention(*shape).num_stages) == (64, 3)
    assert plan_paged_attention(64, 64, 32, 8, 128, 4096, 132).block_n == 64
    assert plan_paged_attention(1, 1, 32, 8, 128, 4096, 132).block_n == 128  # split decode
    small_heads = plan_paged_attention(160, 32, 32, 8, 64, 1040, 132, max_query_len=5)  # head dim 64
    assert (small_heads.block_n, small_heads.num_stages) == (128, 3)
    # 32-row tiles at head dim 128 over 70-100% of the SMs (B=12..16): an SM each, not split,
    # 128-key tiles three deep; 16-bit caches only (float32 tiles would not fit)
    for batch in (12, 16):
        alone = plan_paged_attention(5 * batch, batch, 32, 8, 128, 4096, 132, max_query_len=5)
        assert (alone.block_m, alone.num_splits, alone.block_n, alone.num_stages) == (32, 1, 128, 3)
    split = plan_paged_attention(50, 10, 32, 8, 128, 4096, 132, max_query_len=5)  # 61% of the SMs
    assert (split.num_splits, split.num_stages) == (3, 2)
    # where an SM's share of the memory bandwidth outruns one program (an H200's 36 GB/s an SM
    # against an H100's 25), the same grids split in two, two stages deep
    for batch in (12, 16):
        h100 = plan_paged_attention(5 * batch, batch, 32, 8, 128, 4096, 132, max_query_len=5,
                                    dram_gbs_per_multiprocessor=25)
        assert (h100.num_splits, h100.num_stages) == (1, 3)
        h200 = plan_paged_attention(5 * batch, batch, 32, 8, 128, 4096, 132, max_query_len=5,
                                    dram_gbs_per_multiprocessor=36)
        assert (h200.block_m, h200.num_splits, h200.block_n, h200.num_stages) == (32, 2, 128, 2)
    # off a GPU the bandwidth is unknown (0): the plan is an H100's
    assert dram_gbs_per_multiprocessor(torch.device("cpu")) == 0
    assert plan_paged_attention(80, 16, 32, 8, 128, 4096, 132, max_query_len=5).num_splits == 1
    wide_float = plan_paged_attention(80, 16, 32, 8, 128, 4096, 132, max_query_len=5, element_size=4)
    assert (wide_float.num_splits, wide_float.num_stages) == (2, 2)
    head_dim_64 = plan_paged_attention(80, 16, 32, 8, 64, 4096, 132, max_query_len=5)
    assert (head_dim_64.num_splits, head_dim_64.num_stages) == (2, 3)
    decode = plan_paged_attention(16, 16, 32, 8, 128, 4096, 132)
    assert (decode.block_m, decode.num_splits, decode.block_n, decode.num_stages) == (16, 2, 128, 2)
    # Whole-sequence decode tiles: 128-key tiles up to two programs an SM (B x Hkv <= 264),
    # 64-key tiles above (H100 sweep, bench/NOTES.md)
    for batch, head_dim, wide in ((22, 128, (128, 2)), (33, 128, (128, 2)), (32, 64, (128, 3)),
                                  (34, 128, (64, 3)), (64, 128, (64, 3))):
        decode = plan_paged_attention(batch, batch, 32, 8, head_dim, 16384, 132)
        assert (decode.num_splits, decode.block_n, decode.num_stages) == (1, *wide), (batch, head_dim)
    for batch, tile in ((64, (128, 2)), (128, (128, 2)), (32, (128, 3))):  # head dim 64 decode
        small_heads = plan_paged_attention(batch, batch, 32, 8, 64, 4096, 132)
        assert (small_heads.num_splits, small_heads.block_n, small_heads.num_stages) == (1, *tile), batch
    verify_64 = plan_paged_attention(320, 64, 32, 8, 64, 1024, 132, max_query_len=5)
    assert (verify_64.block_m, verify_64.block_n, verify_64.num_stages) == (32, 128, 3)
    mha = plan_paged_attention(16, 16, 32, 32, 128, 4096, 132)  # 512 programs
    assert (mha.block_n, mha.num_stages) == (64, 3)
    # 16-row decode tiles of 1-1.25 programs an SM split in two, above not; verify tiles not
    for batch, q_len, splits in ((18, 1, 2), (20, 1, 2), (21, 1, 1), (24, 1, 1), (18, 5, 1)):
        launch = plan_paged_attention(q_len * batch, batch, 32, 8, 128, 16384, 132, max_query_len=q_len)
        assert (launch.num_splits, launch.block_n) == (splits, 128), (batch, q_len)
    for batch, element_size, tile in ((24, 2, (64, 3)), (32, 2, (64, 3)), (64, 2, (32, 2)), (24, 4, (32, 2))):
        large_heads = plan_paged_attention(batch, batch, 32, 8, 256, 8192, 132, element_size=element_size)
        assert (large_heads.block_n, large_heads.num_stages) == tile, (batch, element_size)  # head dim 256


@pytest.mark.parametrize("device,backend", TRITON_PARAMS)
@pytest.mark.parametrize("hint", [1, 3, 4, 9])
def test_launcher_max_query_len_below_and_above_the_truth(device, backend, hint):
    """q_len 9 and 5 sequences planned for fewer rows than they hold (hint 1, 3, 4: several
    passes each) or for exactly the longest (9): the reference's answer every time."""
    inputs = make_batch([40, 9, 23], [9, 5, 1], 4, 2, 32, 16, torch.float32, seed=24)
    plan = plan_paged_attention(15, 3, 4, 2, 32, inputs["block_table"].shape[1] * 16, ASSUMED_MULTIPROCESSORS,
                                max_query_len=hint)
    assert plan.rows == triton.next_power_of_2(hint)
    got = triton_attention.launch_paged_attention(*{k: v.to(device) for k, v in inputs.items()}.values(), 0.2, 0, 0.0,
                                           True, hint)
    assert_matches_reference(inputs, [t.cpu() for t in got], 0.2)


@pytest.mark.parametrize("device,backend", TRITON_PARAMS)
def test_launcher_rejects_a_tile_too_small_for_its_rows(device, backend):
    """8 rows x a group of 3 in a 16-row tile: rows 6 and 7 of each pass would never be written."""
    inputs = make_batch([9], [8], 6, 2, 16, 16, torch.float32, seed=24)
    with pytest.raises(ValueError, match="block_m"):
        run_launcher({k: v.to(device) for k, v in inputs.items()}, 0.25, 0, 0.0, forced(8, 16, 1))
    got = run_launcher({k: v.to(device) for k, v in inputs.items()}, 0.25, 0, 0.0, forced(4, 16, 1))
    assert_matches_reference(inputs, [t.cpu() for t in got], 0.25)


def test_launch_rejects_bad_values():
    with pytest.raises(ValueError, match="block_m must be a power of two"):
        AttentionLaunch(rows=1, block_m=24, block_n=16, num_splits=1)
    with pytest.raises(ValueError, match="num_splits must be a positive int"):
        AttentionLaunch(rows=1, block_m=16, block_n=16, num_splits=0)
    with pytest.raises(ValueError, match="num_splits must be <="):
        AttentionLaunch(rows=1, block_m=16, block_n=16, num_splits=1000)
    with pytest.raises(ValueError, match="must be >= 16"):
        AttentionLaunch(rows=1, block_m=16, block_n=8, num_splits=1)


# ---- GPU: full sizes, poisoned memory, CUDA graphs ----


def poison_cuda_allocator(nbytes: int = 64 << 20) -> None:
    """Fill freed blocks of the caching allocator (large and small pools) with NaN, so that
    the op's next torch.empty outputs and workspace start as NaN: an element the kernels
    do not write then fails the finiteness checks. Best effort: the allocator decides."""
    large = torch.full((nbytes // 4,), float("nan"), device="cuda")
    small = [torch.full((1 << 16,), float("nan"), device="cuda") for _ in range(64)]  # 256 KB each
    del large, small


def on_gpu(inputs):
    return {k: v.cuda() for k, v in inputs.items()}


# (B, L, q_lens): ANCHORS.md section 2 (GQA 32/8, D 128, block 16, shuffled blocks) at
# reduced batch; long contexts at small batch split.
ANCHOR_CASES = [
    ("B1-L4096-decode", [4096], [1]),
    ("B1-L4096-verify", [4096], [5]),
    ("B4-L16384-decode", [16384] * 4, [1] * 4),
    ("B8-L1024-verify", [1024] * 8, [5] * 8),
    ("B6-mixed", [4096, 17, 4000, 1, 2048, 999], [5, 1, 9, 1, 5, 3]),
]


@pytest.mark.gpu
@pytest.mark.parametrize("device,backend", GPU_PARAMS)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("case", ANCHOR_CASES, ids=[c[0] for c in ANCHOR_CASES])
def test_gpu_anchor_shapes(device, backend, case, dtype):
    name, seq_lens, q_lens = case
    inputs = on_gpu(make_batch(seq_lens, q_lens, 32, 8, 128, 16, dtype, seed=sum(map(ord, name))))
    for _ in range(2):  # fresh poison each run
        poison_cuda_allocator()
        got = specops.paged_attention(*inputs.values(), 128**-0.5, 0, 0.0, True, backend=backend)
        assert_matches_reference(inputs, got, 128**-0.5)


# (Hq, Hkv, D, block_size) covering GQA groups 1..16 x head dims 64/128/256 x blocks 16/32/64.
GEOMETRIES = [(8, 8, 64, 16), (8, 4, 128, 32), (16, 4, 256, 64), (16, 2, 64, 32), (16, 1, 128, 16),
              (32, 2, 256, 16), (32, 8, 128, 64), (4, 4, 256, 32)]


@pytest.mark.gpu
@pytest.mark.parametrize("device,backend", GPU_PARAMS)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("geometry", GEOMETRIES, ids=lambda g: "hq{}-hkv{}-d{}-bs{}".format(*g))
def test_gpu_geometries_mixed_batch(device, backend, geometry, dtype):
    """Decode and verify rows (q_len 1..9) mixed, one long sequence (splits when the batch
    is small), windows and caps on half of the runs."""
    hq, hkv, d, block_size = geometry
    seq_lens, q_lens = [3000, 1, 77, 512, 9, 1200], [9, 1, 5, 2, 9, 1]
    inputs = on_gpu(make_batch(seq_lens, q_lens, hq, hkv, d, block_size, dtype, seed=hq * d + block_size))
    for window, cap in [(0, 0.0), (100, 20.0)]:
        poison_cuda_allocator()
        scale = d**-0.5
        got = specops.paged_attention(*inputs.values(), scale, window, cap, True, backend=backend)
        assert_matches_reference(inputs, got, scale, window, cap)


@pytest.mark.gpu
@pytest.mark.parametrize("device,backend", GPU_PARAMS)
@pytest.mark.parametrize("batch", [2, 64], ids=["split", "no-split"])
def test_gpu_cuda_graph_replays_follow_new_inputs(device, backend, batch):
    """Captured once (no host sync, workspace sized from shapes), replayed after changing
    seq_lens, cu_query_lens, block_table and the query in place: each replay equals an
    eager call on the new inputs and the float64 reference."""
    max_len = 2048
    seq_lens, q_lens = [max_len] * batch, [5 if b % 2 else 1 for b in range(batch)]
    inputs = on_gpu(make_batch(seq_lens, q_lens, 32, 8, 128, 16, torch.bfloat16, seed=31 + batch))
    scale = 128**-0.5

    def step():
        return specops.paged_attention(*inputs.values(), scale, 0, 0.0, True, backend=backend)

    graph, (static_out, static_lse) = capture(step)
    g = torch.Generator().manual_seed(32)
    for replay in range(3):
        new_q = torch.tensor(q_lens)[torch.randperm(batch, generator=g)]  # same num_query_tokens
        new_lens = torch.maximum(torch.randint(1, max_len + 1, (batch,), generator=g), new_q)
        inputs["seq_lens"].copy_(new_lens.to(torch.int32))
        inputs["cu_query_lens"].copy_(torch.cat([torch.zeros(1, dtype=torch.int64), new_q.cumsum(0)]).to(torch.int32))
        inputs["block_table"].copy_(inputs["block_table"][torch.randperm(batch, generator=g).cuda()])
        inputs["query"].normal_()
        graph.replay()
        torch.cuda.synchronize()
        eager_out, eager_lse = step()
        assert torch.equal(static_out, eager_out) and torch.equal(static_lse, eager_lse), f"replay {replay}"
        assert_matches_reference(inputs, (static_out, static_lse), scale)
