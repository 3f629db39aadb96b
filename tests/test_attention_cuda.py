"""The CUDA paged-attention kernels beyond the shared op tests (test_attention_ops.py,
test_attention_triton.py): which cases the CUDA kernel covers and the Triton fallback for
the rest; which eager calls take it by default; on a GPU, split-KV (small batches over
long contexts, more splits than tiles), row chunks (long query runs, GQA groups that do
not divide the 16-row tile), inputs that skipped validation against the C++ CPU kernel,
cache writes of any row size and alignment, and opcheck on CUDA tensors.

The launcher picks the row tile and the split count from shapes alone, so the cases below
are chosen to reach each path: one sequence over thousands of keys splits 16 to 32 ways;
a mean query run of q_len x group > 16 rows takes 32- or 64-row tiles; q_len 300 spreads
its row chunks over several programs.
"""

from __future__ import annotations

import math

import pytest
import torch
from attention_inputs import TOLERANCES, make_batch, reference_float64, relative_error
from conftest import HAS_CUDA

import specops
from specops.backend import Backend
from specops.ops import cuda_paged_attention_covers

CUDA_KERNELS = HAS_CUDA and Backend.CUDA in specops.available_backends(torch.device("cuda"))
requires_cuda_kernels = pytest.mark.skipif(not CUDA_KERNELS, reason="needs a GPU and specops' CUDA kernels")
TOLERANCE = {dtype: (max_error, lse_atol) for dtype, max_error, lse_atol in TOLERANCES}


@pytest.mark.parametrize(
    "dtype,head_dim,num_heads,num_kv_heads,covered",
    [
        (torch.bfloat16, 128, 32, 8, True),
        (torch.float16, 64, 16, 1, True),
        (torch.float16, 256, 6, 2, True),  # group 3: any group up to 16
        (torch.float32, 128, 32, 8, False),  # float32: Triton
        (torch.float16, 96, 8, 8, False),  # head dim off 64/128/256
        (torch.bfloat16, 64, 32, 1, False),  # group 32
    ],
)
def test_coverage_of_the_cuda_kernel(dtype, head_dim, num_heads, num_kv_heads, covered):
    query = torch.empty(3, num_heads, head_dim, dtype=dtype, device="meta")
    key_cache = torch.empty(4, 16, num_kv_heads, head_dim, dtype=dtype, device="meta")
    assert cuda_paged_attention_covers(query, key_cache) is covered


@pytest.mark.parametrize(
    "dtype,batch,context,head_dim,num_kv_heads,cuda",
    [
        (torch.bfloat16, 1, 4096, 128, 8, True),  # 16 MiB: eager 49.3 / 53.3 µs (H200, bench/NOTES.md)
        (torch.bfloat16, 4, 4096, 128, 8, True),  # 64 MiB: 51.2 / 53.9
        (torch.float16, 32, 1024, 64, 8, True),  # 64 MiB: verify 47.6 / 51.0
        (torch.float16, 64, 1024, 64, 8, False),  # 128 MiB: 52.8 / 38.8
        (torch.bfloat16, 64, 1024, 128, 8, False),  # 256 MiB: 78.6 / 70.0, verify 89.7 / 77.2
        (torch.bfloat16, 96, 1024, 128, 8, False),  # 384 MiB: verify 129.5 / 111.2
        (torch.bfloat16, 64, 4096, 128, 8, False),  # 1 GiB: 274.5 / 251.6
        (torch.float16, 128, 1024, 64, 8, False),  # 256 MiB: 84.5 / 71.5
        (torch.float32, 1, 4096, 128, 8, False),  # not covered
        (torch.bfloat16, 1, 4096, 64, 1, False),  # group 32: not covered
    ],
)
def test_eager_default_takes_the_cuda_kernel_up_to_its_crossover(dtype, batch, context, head_dim, num_kv_heads,
                                                                  cuda):
    """specops.ops.cuda_attention_faster_eagerly at the measured shapes (32 query heads,
    block 16): by the keys and values the block table addresses."""
    query = torch.empty(batch, 32, head_dim, dtype=dtype, device="meta")
    key_cache = torch.empty(8, 16, num_kv_heads, head_dim, dtype=dtype, device="meta")
    block_table = torch.empty(batch, context // 16, dtype=torch.int32, device="meta")
    assert specops.ops.cuda_attention_faster_eagerly(query, key_cache, block_table) is cuda


@pytest.mark.gpu
@requires_cuda_kernels
def test_gpu_default_backend_eager_and_in_capture(chosen_backends):
    """On the GPU: a small eager bfloat16 call runs the CUDA kernel by default (its result
    is the CUDA kernel's, bit for bit); the same call captured in a CUDA graph, one whose
    block table addresses past the crossover, and one misaligned for the CUDA kernel run
    the Triton kernel."""
    if torch.cuda.get_device_capability()[0] < 9:
        pytest.skip("the eager default takes the CUDA kernel on sm_90+ only")
    inputs = on_gpu(make_batch([300, 17], [5, 1], 8, 2, 128, 16, torch.bfloat16, seed=45))
    got = specops.paged_attention(*inputs.values(), 0.1, 0, 0.0, True)
    cuda = specops.paged_attention(*inputs.values(), 0.1, 0, 0.0, True, backend="cuda")
    assert chosen_backends == [Backend.CUDA, Backend.CUDA]
    assert torch.equal(got[0], cuda[0]) and torch.equal(got[1], cuda[1])
    check_against_reference(inputs, got, 0.1)

    specops.paged_attention(*inputs.values(), 0.1, 0, 0.0, True, backend="triton")  # compiled before capture
    chosen_backends.clear()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        specops.paged_attention(*inputs.values(), 0.1, 0, 0.0, True)
    assert chosen_backends == [Backend.TRITON]

    chosen_backends.clear()
    wide = dict(inputs)  # same keys; the table's extra columns (never read) reach 512 MiB
    columns = (512 << 20) // (2 * 2 * 16 * 2 * 128 * 2) + 1
    wide["block_table"] = torch.cat([inputs["block_table"], inputs["block_table"][:, :1].expand(2, columns)], 1)
    wide_out = specops.paged_attention(*wide.values(), 0.1, 0, 0.0, True)
    check_against_reference(inputs, wide_out, 0.1)

    storage = torch.empty(inputs["query"].numel() + 1, dtype=torch.bfloat16, device="cuda")
    misaligned = dict(inputs, query=storage[1:].view_as(inputs["query"]).copy_(inputs["query"]))
    specops.paged_attention(*misaligned.values(), 0.1, 0, 0.0, True)
    assert chosen_backends == [Backend.TRITON, Backend.TRITON]


def poison_cuda_allocator(nbytes: int = 64 << 20) -> None:
    """Leave NaN in freed allocator blocks so that unwritten outputs or workspace show."""
    large = torch.full((nbytes // 4,), float("nan"), device="cuda")
    small = [torch.full((1 << 16,), float("nan"), device="cuda") for _ in range(32)]
    del large, small


def on_gpu(inputs):
    return {k: v.cuda() for k, v in inputs.items()}


def check_against_reference(inputs, got, scale, window=0, cap=0.0):
    out, lse = (t.cpu() for t in got)
    max_error, lse_atol = TOLERANCE[out.dtype]
    cpu_inputs = {k: v.cpu() for k, v in inputs.items()}
    ref_out, ref_lse = reference_float64(cpu_inputs, scale, window, cap)
    assert torch.isfinite(out).all() and torch.isfinite(lse).all(), "unwritten rows or NaN from unused slots"
    error = relative_error(out, ref_out)
    assert error < max_error, f"relative error {error:.2e} >= {max_error:.0e}"
    torch.testing.assert_close(lse.double(), ref_lse.double(), atol=lse_atol, rtol=0)


# (dtype, Hq, Hkv, D, error, message): outside the CUDA kernel's coverage
UNCOVERED = [
    (torch.float32, 8, 2, 128, TypeError, "query must be float16 or bfloat16"),
    (torch.float16, 4, 4, 96, ValueError, "head_dim must be 64, 128 or 256"),
    (torch.bfloat16, 32, 1, 64, ValueError, "GQA group"),
]


@pytest.mark.gpu
@requires_cuda_kernels
@pytest.mark.parametrize("dtype,hq,hkv,d,error,match", UNCOVERED, ids=["float32", "dim96", "group32"])
def test_uncovered_cases_raise_on_cuda_and_default_to_triton(dtype, hq, hkv, d, error, match):
    inputs = on_gpu(make_batch([40, 7], [5, 1], hq, hkv, d, 16, dtype, seed=d + hq))
    with pytest.raises(error, match=match):
        specops.paged_attention(*inputs.values(), d**-0.5, backend="cuda")
    got = specops.paged_attention(*inputs.values(), d**-0.5, 0, 0.0, True)
    triton = specops.paged_attention(*inputs.values(), d**-0.5, 0, 0.0, True, backend="triton")
    assert torch.equal(got[0], triton[0]) and torch.equal(got[1], triton[1])
    check_against_reference(inputs, got, d**-0.5)


# (name, seq_lens, q_lens, Hq, Hkv, D, block_size, window, cap, extra block-table columns)
SPLIT_AND_CHUNK_CASES = [
    ("B1-decode-long", [5000], [1], 32, 8, 128, 16, 0, 0.0, 0),
    ("B1-verify-group8", [3000], [5], 16, 2, 128, 32, 0, 0.0, 0),  # 40 rows: two 32-row chunks
    ("group16-d256-verify", [2500, 40], [5, 3], 16, 1, 256, 64, 0, 0.0, 0),  # one query row per chunk
    ("group3-d64", [700, 33, 2], [7, 4, 2], 6, 2, 64, 16, 0, 0.0, 0),  # 5 rows x 3 heads of 16
    ("prefill-chunks", [300, 20], [300, 1], 8, 2, 64, 16, 0, 0.0, 0),  # 64-row tiles, 10 chunk programs
    ("more-splits-than-tiles", [10, 3], [3, 1], 8, 8, 128, 16, 0, 0.0, 200),
    ("window-cap-splits", [4000, 100], [5, 1], 32, 8, 128, 16, 300, 30.0, 0),
    ("window-one", [1000], [5], 8, 2, 64, 32, 1, 0.0, 0),
    ("block-size-24", [700, 50, 3], [5, 1, 2], 8, 2, 128, 24, 0, 0.0, 0),  # blocks by division, not shift
    ("block-size-48-window", [1500], [5], 32, 8, 128, 48, 100, 0.0, 0),
]


@pytest.mark.gpu
@requires_cuda_kernels
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("case", SPLIT_AND_CHUNK_CASES, ids=[c[0] for c in SPLIT_AND_CHUNK_CASES])
def test_splits_and_row_chunks_match_reference(case, dtype):
    name, seq_lens, q_lens, hq, hkv, d, block_size, window, cap, extra_columns = case
    inputs = make_batch(seq_lens, q_lens, hq, hkv, d, block_size, dtype, seed=sum(map(ord, name)))
    if extra_columns:  # a long block table over short sequences: most splits see no key
        invalid = torch.full((len(seq_lens), extra_columns), -3, dtype=torch.int32)
        inputs["block_table"] = torch.cat([inputs["block_table"], invalid], dim=1)
    inputs = on_gpu(inputs)
    scale = (4.0 if cap else 1.0) / math.sqrt(d)
    for _ in range(2):
        poison_cuda_allocator()
        got = specops.paged_attention(*inputs.values(), scale, window, cap, True, backend="cuda")
        check_against_reference(inputs, got, scale, window, cap)


@pytest.mark.gpu
@requires_cuda_kernels
def test_unvalidated_inputs_follow_the_cpu_kernel():
    """validate=False: block ids outside the cache are masked, seq_lens beyond the block
    table clamped, rows whose position is negative (seq_len < q_len) get zeros and LSE
    -inf; as the C++ CPU kernel does, with splits (batch 3) and without (batch 3 x 200)."""
    for repeat in (1, 200):
        inputs = make_batch([20, 3, 300] * repeat, [5, 1, 4] * repeat, 8, 2, 64, 16, torch.float16, seed=41)
        for name in ("key_cache", "value_cache"):  # defined data in every slot the clamps expose
            inputs[name] = torch.nan_to_num(inputs[name], nan=0.25)
        inputs["block_table"][0, 0] = -5
        inputs["block_table"][1, 0] = 1 << 30
        inputs["seq_lens"][2] = 100_000
        inputs["seq_lens"][1] = 0
        expected = specops.paged_attention(*inputs.values(), 0.125, 0, 0.0, True, backend="cpu", validate=False)
        got = specops.paged_attention(*on_gpu(inputs).values(), 0.125, 0, 0.0, True, backend="cuda", validate=False)
        out, lse = (t.cpu() for t in got)
        no_key = expected[1] == float("-inf")
        assert no_key.any() and torch.equal(lse == float("-inf"), no_key)
        assert (out[no_key] == 0).all()
        assert relative_error(out, expected[0].double()) < 2e-3
        torch.testing.assert_close(lse[~no_key], expected[1][~no_key], atol=1e-3, rtol=0)


def _misaligned(t: torch.Tensor) -> torch.Tensor:
    """The same values, contiguous, starting one element past a 16-byte boundary."""
    flat = torch.empty(t.numel() + 1, dtype=t.dtype, device=t.device)
    view = flat[1:].view(t.shape)
    view.copy_(t)
    return view


@pytest.mark.gpu
@requires_cuda_kernels
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("hkv,d,misaligned", [(2, 64, False), (1, 5, False), (3, 3, False), (2, 64, True)])
def test_reshape_and_cache_any_row_size(dtype, hkv, d, misaligned):
    g = torch.Generator().manual_seed(hkv * d)
    key_cache = torch.randn(6, 16, hkv, d, generator=g).to(dtype)
    value_cache = torch.randn(6, 16, hkv, d, generator=g).to(dtype)
    slots = torch.randperm(6 * 16, generator=g)[:40]
    slots[::3] = -1
    key, value = torch.randn(40, hkv, d, generator=g).to(dtype), torch.randn(40, hkv, d, generator=g).to(dtype)
    expected_k, expected_v = key_cache.clone(), value_cache.clone()
    specops.reshape_and_cache(key, value, expected_k, expected_v, slots, backend="cpu")
    got_k, got_v = key_cache.cuda(), value_cache.cuda()
    key, value = key.cuda(), value.cuda()
    if misaligned:
        key, value = _misaligned(key), _misaligned(value)
    specops.reshape_and_cache(key, value, got_k, got_v, slots.cuda(), backend="cuda")
    assert torch.equal(got_k.cpu(), expected_k) and torch.equal(got_v.cpu(), expected_v)


@pytest.mark.gpu
@requires_cuda_kernels
def test_opcheck_on_cuda():
    inputs = make_batch([40, 3], [5, 1], 8, 2, 128, 16, torch.bfloat16, seed=43)
    for name in ("key_cache", "value_cache"):  # opcheck compares runs: no NaN
        inputs[name] = torch.nan_to_num(inputs[name], nan=0.0)
    args = tuple(on_gpu(inputs).values())
    for return_lse, max_query_len in ((True, 0), (False, 2)):
        torch.library.opcheck(torch.ops.specops.paged_attention.default,
                              (*args, 0.125, 4, 2.0, return_lse, max_query_len))
    g = torch.Generator().manual_seed(44)
    cache = torch.randn(3, 16, 2, 64, generator=g).half().cuda()
    new = torch.randn(5, 2, 64, generator=g).half().cuda()
    slots = torch.tensor([3, -1, 17, 40, 0]).cuda()
    torch.library.opcheck(torch.ops.specops.reshape_and_cache.default, (new, new.clone(), cache, cache.clone(), slots))
