"""The paged-attention ops' C++ CPU kernels against their float64 reference: shuffled block
tables, lengths off the block size, ragged query lengths (decode and verify in one batch),
GQA, sliding window, soft cap, LSE; NaN in unused cache slots must not leak; opcheck and
torch.compile; named errors. The Triton kernel's own tests (splits, tiles, GPU sizes, CUDA
graphs) are in test_attention_triton.py."""

from __future__ import annotations

import math

import pytest
import torch
from attention_inputs import TOLERANCES, make_batch, reference_float64, relative_error
from conftest import backend_params, requires_gpu
from specops.reference import attention as reference
from torch._subclasses.fake_tensor import FakeTensorMode

import specops
from specops.backend import Backend

# (name, seq_lens, q_lens, num_heads, num_kv_heads, head_dim, block_size, sliding_window, soft_cap, logit_gain)
CASES = [
    ("decode", [1, 17, 40], [1, 1, 1], 4, 4, 64, 16, 0, 0.0, 1.0),
    ("mixed-gqa4", [33, 5, 70, 1], [5, 1, 5, 1], 8, 2, 128, 32, 0, 0.0, 1.0),
    ("verify-gqa8", [50, 9, 6], [1, 5, 5], 8, 1, 64, 16, 0, 0.0, 1.0),
    ("window", [33, 5, 70, 1], [5, 1, 5, 1], 4, 1, 64, 16, 7, 0.0, 1.0),
    ("window-longer-than-seq", [12, 40], [5, 1], 4, 2, 64, 32, 20, 0.0, 1.0),
    ("soft-cap", [33, 70], [5, 1], 8, 2, 64, 16, 0, 5.0, 8.0),
    ("window-and-cap", [45, 18], [1, 5], 4, 4, 128, 16, 9, 3.0, 8.0),
]


@pytest.mark.parametrize("dtype,max_error,lse_atol", TOLERANCES, ids=lambda v: str(v).replace("torch.", ""))
@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_paged_attention_matches_reference(case, dtype, max_error, lse_atol):
    _, seq_lens, q_lens, hq, hkv, d, block_size, window, cap, gain = case
    inputs = make_batch(seq_lens, q_lens, hq, hkv, d, block_size, dtype, seed=sum(map(ord, case[0])))
    scale = gain / math.sqrt(d)
    out, lse = specops.paged_attention(*inputs.values(), scale, window, cap, True)
    ref_out, ref_lse = reference_float64(inputs, scale, window, cap)
    assert out.dtype == dtype and out.shape == inputs["query"].shape
    assert lse.dtype == torch.float32 and lse.shape == inputs["query"].shape[:2]
    assert torch.isfinite(out).all() and torch.isfinite(lse).all(), "NaN from unused cache slots leaked"
    assert relative_error(out, ref_out) < max_error
    torch.testing.assert_close(lse.double(), ref_lse.double(), atol=lse_atol, rtol=0)


def test_lse_empty_unless_asked_and_reference_backend():
    inputs = make_batch([20, 3], [5, 1], 4, 2, 64, 16, torch.float32, seed=1)
    out, lse = specops.paged_attention(*inputs.values(), 0.125)
    assert lse.shape == (0, 0) and lse.dtype == torch.float32
    ref_out, ref_lse = specops.paged_attention(*inputs.values(), 0.125, backend="reference")
    assert ref_lse.shape == (0, 0)
    assert relative_error(out, ref_out.double()) < 1e-5


def test_window_of_one_returns_own_value():
    """With sliding_window = 1 every query sees only its own key, so out = its value."""
    inputs = make_batch([9, 21], [5, 1], 2, 2, 64, 16, torch.float32, seed=2)
    out, _ = specops.paged_attention(*inputs.values(), 0.125, 1, 0.0, True)
    block_table, cache = inputs["block_table"], inputs["value_cache"]
    for row, (b, position) in enumerate([(0, p) for p in range(4, 9)] + [(1, 20)]):
        block = block_table[b, position // 16]
        torch.testing.assert_close(out[row], cache[block, position % 16])


def make_cache_update(n, num_blocks, block_size, hkv, d, dtype, seed):
    g = torch.Generator().manual_seed(seed)
    key_cache = torch.randn(num_blocks, block_size, hkv, d, generator=g).to(dtype)
    value_cache = torch.randn(num_blocks, block_size, hkv, d, generator=g).to(dtype)
    slots = torch.randperm(num_blocks * block_size, generator=g)[:n]
    slots[torch.rand(n, generator=g) < 0.3] = -1
    key = torch.randn(n, hkv, d, generator=g).to(dtype)
    value = torch.randn(n, hkv, d, generator=g).to(dtype)
    return key, value, key_cache, value_cache, slots


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("block_size", [16, 32])
def test_reshape_and_cache_writes_exactly_the_mapped_slots(dtype, block_size):
    key, value, key_cache, value_cache, slots = make_cache_update(23, 5, block_size, 2, 64, dtype, seed=block_size)
    expected_k, expected_v = key_cache.clone(), value_cache.clone()
    keep = slots >= 0
    expected_k.view(-1, 2, 64)[slots[keep]] = key[keep]
    expected_v.view(-1, 2, 64)[slots[keep]] = value[keep]
    ref_k, ref_v = key_cache.clone(), value_cache.clone()
    reference.reshape_and_cache(key, value, ref_k, ref_v, slots)
    specops.reshape_and_cache(key, value, key_cache, value_cache, slots)
    assert torch.equal(key_cache, expected_k) and torch.equal(value_cache, expected_v)
    assert torch.equal(ref_k, expected_k) and torch.equal(ref_v, expected_v)


def test_cache_then_attend_end_to_end():
    """reshape_and_cache fills the cache that paged_attention then reads."""
    inputs = make_batch([30, 4], [5, 1], 4, 2, 64, 16, torch.float32, seed=3)
    block_table, key_cache, value_cache = inputs["block_table"], inputs["key_cache"], inputs["value_cache"]
    g = torch.Generator().manual_seed(4)
    new_key, new_value = torch.randn(6, 2, 64, generator=g), torch.randn(6, 2, 64, generator=g)
    positions = [(0, p) for p in range(25, 30)] + [(1, 3)]
    slots = torch.tensor([int(block_table[b, p // 16]) * 16 + p % 16 for b, p in positions])
    specops.reshape_and_cache(new_key, new_value, key_cache, value_cache, slots)
    out, _ = specops.paged_attention(*inputs.values(), 0.125)
    ref_out, _ = reference_float64(inputs, 0.125, 0, 0.0)
    assert relative_error(out, ref_out) < 1e-5


def test_kernel_stays_in_bounds_without_validation():
    """Bad block ids and too-long seq_lens are masked or clamped, never read."""
    inputs = make_batch([20, 3], [5, 1], 4, 2, 64, 16, torch.float32, seed=5)
    inputs["block_table"][0, 0] = -5
    inputs["block_table"][1, 0] = 1 << 30
    inputs["seq_lens"][0] = 10_000
    out, lse = specops.paged_attention(*inputs.values(), 0.125, 0, 0.0, True, validate=False)
    assert out.shape == inputs["query"].shape and lse.shape == (6, 4)
    key, value, key_cache, value_cache, _ = make_cache_update(3, 2, 16, 2, 64, torch.float32, seed=6)
    before = key_cache.clone()
    specops.reshape_and_cache(key, value, key_cache, value_cache, torch.tensor([-7, 32, 1 << 40]), validate=False)
    assert torch.equal(key_cache, before)


def test_opcheck():
    inputs = make_batch([20, 3], [5, 1], 4, 2, 64, 16, torch.float32, seed=7)
    # opcheck compares runs, so no NaN (unused slots) in the caches here.
    for name in ("key_cache", "value_cache"):
        inputs[name] = torch.nan_to_num(inputs[name], nan=0.0)
    for return_lse, max_query_len in ((True, 0), (False, 2)):
        args = (*inputs.values(), 0.125, 4, 2.0, return_lse, max_query_len)
        torch.library.opcheck(torch.ops.specops.paged_attention.default, args)
    cache_args = make_cache_update(7, 3, 16, 2, 64, torch.float32, seed=8)
    torch.library.opcheck(torch.ops.specops.reshape_and_cache.default, cache_args)


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=[pytest.mark.gpu, requires_gpu])])
def test_torch_compile_fullgraph(device):
    """On CUDA tensors (bf16, a shape the CUDA kernel covers) the traced default takes the
    Triton kernel, the eager one the CUDA kernel: the choice must trace without data pointers."""
    dtype = torch.float32 if device == "cpu" else torch.bfloat16
    inputs = {k: v.to(device) for k, v in make_batch([20, 3], [5, 1], 4, 2, 64, 16, dtype, seed=9).items()}
    g = torch.Generator().manual_seed(10)
    new_key, new_value = (torch.randn(2, 2, 64, generator=g).to(device, dtype) for _ in range(2))
    slots = torch.tensor([int(inputs["block_table"][0, 1]) * 16 + 3, -1], device=device)

    def step(key, value, slot_mapping, query, key_cache, value_cache, block_table, seq_lens, cu_query_lens):
        specops.reshape_and_cache(key, value, key_cache, value_cache, slot_mapping)
        return specops.paged_attention(
            query, key_cache, value_cache, block_table, seq_lens, cu_query_lens, 0.125, 0, 0.0, True
        )

    compiled = torch.compile(step, fullgraph=True, backend="aot_eager")
    eager_inputs = {k: v.clone() for k, v in inputs.items()}
    got = compiled(new_key, new_value, slots, *inputs.values())
    expected = step(new_key, new_value, slots, *eager_inputs.values())
    assert torch.equal(inputs["key_cache"].nan_to_num(), eager_inputs["key_cache"].nan_to_num())
    for a, b in zip(got, expected):
        torch.testing.assert_close(a, b, **({} if device == "cpu" else {"atol": 2e-2, "rtol": 2e-2}))


def test_cuda_backend_needs_cuda_tensors():
    """The CUDA kernels take CUDA tensors only: asked for on CPU tensors, a named error."""
    inputs = make_batch([4], [1], 2, 2, 64, 16, torch.float32, seed=11)
    with pytest.raises(ValueError, match="backend 'cuda' cannot run on cpu"):
        specops.paged_attention(*inputs.values(), 0.125, backend="cuda")


# The Triton kernels: under the interpreter on CPU tensors (float32 and float16: the
# interpreter's bfloat16 matrix products are not faithful), every dtype on a GPU.
TRITON_PARAMS = [p for p in backend_params() if p.values[1] is Backend.TRITON]
# The CUDA kernels (GPU only): float16/bfloat16 attention, every dtype for the cache writes.
CUDA_PARAMS = [p for p in backend_params() if p.values[1] is Backend.CUDA]


@pytest.mark.parametrize("device,backend", TRITON_PARAMS + CUDA_PARAMS)
@pytest.mark.parametrize("dtype,max_error,lse_atol", TOLERANCES, ids=lambda v: str(v).replace("torch.", ""))
@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_triton_paged_attention_matches_reference(device, backend, case, dtype, max_error, lse_atol):
    if device == "cpu" and dtype == torch.bfloat16:
        pytest.skip("the Triton interpreter's bfloat16 dot is not faithful; runs on the GPU")
    if backend is Backend.CUDA and dtype == torch.float32:
        pytest.skip("float32 runs on Triton: test_attention_cuda.py checks the CUDA kernel's error and fallback")
    _, seq_lens, q_lens, hq, hkv, d, block_size, window, cap, gain = case
    inputs = make_batch(seq_lens, q_lens, hq, hkv, d, block_size, dtype, seed=sum(map(ord, case[0])))
    scale = gain / math.sqrt(d)
    on_device = {k: v.to(device) for k, v in inputs.items()}
    out, lse = specops.paged_attention(*on_device.values(), scale, window, cap, True, backend=backend)
    ref_out, ref_lse = reference_float64(inputs, scale, window, cap)
    assert out.dtype == dtype and torch.isfinite(out).all() and torch.isfinite(lse).all()
    assert relative_error(out.cpu(), ref_out) < max_error
    torch.testing.assert_close(lse.cpu().double(), ref_lse.double(), atol=lse_atol, rtol=0)


@pytest.mark.parametrize("device,backend", TRITON_PARAMS + CUDA_PARAMS)
def test_triton_reshape_and_cache_matches_cpu(device, backend):
    key, value, key_cache, value_cache, slots = make_cache_update(9, 4, 16, 2, 64, torch.float16, seed=3)
    expected_k, expected_v = key_cache.clone(), value_cache.clone()
    specops.reshape_and_cache(key, value, expected_k, expected_v, slots, backend="cpu")
    got_k, got_v = key_cache.to(device), value_cache.to(device)
    specops.reshape_and_cache(key.to(device), value.to(device), got_k, got_v, slots.to(device), backend=backend)
    assert torch.equal(got_k.cpu().nan_to_num(), expected_k.nan_to_num())
    assert torch.equal(got_v.cpu().nan_to_num(), expected_v.nan_to_num())


# max_query_len below the true longest q_len (5): tiles of fewer rows, several passes;
# above it: larger tiles than needed. Either way the output of no hint, up to rounding.
HINTS = [1, 2, 8, 64]


@pytest.mark.parametrize("device,backend", backend_params())
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=str)
def test_max_query_len_hint_never_changes_results(device, backend, dtype):
    if backend is Backend.CUDA and dtype == torch.float32:
        pytest.skip("float32 runs on Triton: test_attention_cuda.py checks the CUDA kernel's error and fallback")
    max_error, lse_atol = next((e, a) for t, e, a in TOLERANCES if t == dtype)
    inputs = make_batch([33, 9, 70, 1], [5, 1, 5, 1], 8, 2, 64, 16, dtype, seed=15)
    on_device = {k: v.to(device) for k, v in inputs.items()}
    ref_out, ref_lse = reference_float64(inputs, 0.125, 0, 0.0)
    no_hint = specops.paged_attention(*on_device.values(), 0.125, 0, 0.0, True, backend=backend)
    for hint in HINTS:
        out, lse = specops.paged_attention(*on_device.values(), 0.125, 0, 0.0, True, max_query_len=hint,
                                           backend=backend)
        assert torch.isfinite(out).all() and torch.isfinite(lse).all()
        assert relative_error(out.cpu(), ref_out) < max_error, f"max_query_len={hint}"
        torch.testing.assert_close(lse.cpu().double(), ref_lse.double(), atol=lse_atol, rtol=0)
        torch.testing.assert_close(out, no_hint[0], atol=max_error, rtol=max_error)
        torch.testing.assert_close(lse, no_hint[1], atol=lse_atol, rtol=0)


def test_reference_ignores_max_query_len():
    inputs = make_batch([20, 3], [5, 1], 4, 2, 64, 16, torch.float32, seed=16)
    expected = specops.paged_attention(*inputs.values(), 0.125, 0, 0.0, True, backend="reference")
    got = specops.paged_attention(*inputs.values(), 0.125, 0, 0.0, True, max_query_len=1, backend="reference")
    assert all(torch.equal(a, b) for a, b in zip(got, expected))


# ---- named errors ----


@pytest.mark.parametrize("device,backend", backend_params())
def test_negative_max_query_len_names_the_argument(device, backend):
    inputs = {k: v.to(device) for k, v in make_batch([20, 3], [5, 1], 4, 2, 64, 16, torch.float16, seed=17).items()}
    with pytest.raises(ValueError, match="max_query_len must be >= 0"):
        specops.paged_attention(*inputs.values(), 0.125, max_query_len=-1, backend=backend)
    with pytest.raises(ValueError, match="max_query_len must be >= 0"):
        specops.paged_attention(*inputs.values(), 0.125, max_query_len=-1, backend=backend, validate=False)


@pytest.mark.parametrize("validate", [True, False])
def test_reference_backend_names_bad_arguments(validate):
    """The reference runs the kernels' argument checks too (shape checks, no device sync)."""
    inputs = make_batch([20, 3], [5, 1], 4, 2, 64, 16, torch.float16, seed=17)
    for kwargs, message in (({"max_query_len": -1}, "max_query_len must be >= 0"),
                            ({"sliding_window": -1}, "sliding_window"),
                            ({"soft_cap": -1.0}, "soft_cap")):
        with pytest.raises(ValueError, match=message):
            specops.paged_attention(*inputs.values(), 0.125, backend="reference", validate=validate, **kwargs)


@pytest.mark.parametrize("namespace", ["specops", "specops_triton"])
@pytest.mark.parametrize("mode", ["kernel", "fake"])
def test_negative_max_query_len_in_the_torch_ops(namespace, mode):
    """The C++ check (kernel, torch.ops.specops), the Triton launcher's and the fake kernel's
    (Python) all give the same message."""
    inputs = make_batch([20, 3], [5, 1], 4, 2, 64, 16, torch.float32, seed=18)
    op = getattr(torch.ops, namespace).paged_attention
    if mode == "fake":
        with FakeTensorMode() as fake_mode:
            inputs = {k: fake_mode.from_tensor(v) for k, v in inputs.items()}
            with pytest.raises(ValueError, match=r"max_query_len must be >= 0 \(0 = unknown\), got -1"):
                op(*inputs.values(), 0.125, 0, 0.0, False, -1)
    else:
        with pytest.raises(ValueError, match=r"max_query_len must be >= 0 \(0 = unknown\), got -1"):
            op(*inputs.values(), 0.125, 0, 0.0, False, -1)



def _bad_dtype(inputs):
    inputs["block_table"] = inputs["block_table"].long()


def _cache_dtype(inputs):
    inputs["key_cache"] = inputs["key_cache"].half()
    inputs["value_cache"] = inputs["value_cache"].half()


def _head_dim(inputs):
    inputs["query"] = inputs["query"][..., :32].contiguous()


def _heads(inputs):
    inputs["query"] = torch.randn(6, 3, 64)


def _rank(inputs):
    inputs["seq_lens"] = inputs["seq_lens"][None]


# (mutation, exception, message fragment): shape/dtype checks, run by the kernel and the fake
SHAPE_ERRORS = [
    (_bad_dtype, TypeError, "block_table must be int32"),
    (_cache_dtype, TypeError, "key_cache must be"),
    (_head_dim, ValueError, "key_cache head_dim"),
    (_heads, ValueError, "num_heads"),
    (_rank, ValueError, "seq_lens must have shape"),
]


@pytest.mark.parametrize("mode", ["kernel", "fake"])
@pytest.mark.parametrize("mutate,error,match", SHAPE_ERRORS, ids=[e[0].__name__ for e in SHAPE_ERRORS])
def test_shape_errors_name_the_argument(mutate, error, match, mode):
    inputs = make_batch([20, 3], [5, 1], 4, 2, 64, 16, torch.float32, seed=12)
    mutate(inputs)
    if mode == "fake":
        with FakeTensorMode() as fake_mode:
            inputs = {k: fake_mode.from_tensor(v) for k, v in inputs.items()}
            with pytest.raises(error, match=match):
                torch.ops.specops.paged_attention(*inputs.values(), 0.125)
    else:
        with pytest.raises(error, match=match):
            torch.ops.specops.paged_attention(*inputs.values(), 0.125)


def _block_out_of_range(inputs):
    inputs["block_table"][1, 0] = inputs["key_cache"].shape[0]


def _negative_block(inputs):
    inputs["block_table"][0, 1] = -1


def _seq_shorter_than_queries(inputs):
    inputs["seq_lens"][0] = 4


def _cu_inconsistent(inputs):
    inputs["cu_query_lens"][-1] = 5


def _seq_beyond_block_table(inputs):
    inputs["seq_lens"][1] = 16 * inputs["block_table"].shape[1] + 1


VALUE_ERRORS = [
    (_block_out_of_range, "block_table holds a block id outside"),
    (_negative_block, "block_table holds a block id outside"),
    (_seq_shorter_than_queries, "seq_lens must be >="),
    (_cu_inconsistent, "cu_query_lens is inconsistent"),
    (_seq_beyond_block_table, "seq_lens is too long for block_table"),
]


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=[pytest.mark.gpu, requires_gpu])])
@pytest.mark.parametrize("mutate,match", VALUE_ERRORS, ids=[e[0].__name__ for e in VALUE_ERRORS])
def test_value_errors_name_the_argument(mutate, match, device):
    inputs = make_batch([20, 3], [5, 1], 4, 2, 64, 16, torch.float16, seed=13)
    mutate(inputs)
    inputs = {k: v.to(device) for k, v in inputs.items()}
    with pytest.raises(ValueError, match=match):
        specops.paged_attention(*inputs.values(), 0.125)
    specops.paged_attention(*inputs.values(), 0.125, validate=False)  # unvalidated, the kernels take it


def test_reshape_and_cache_errors_name_the_argument():
    key, value, key_cache, value_cache, slots = make_cache_update(4, 3, 16, 2, 64, torch.float32, seed=14)
    with pytest.raises(TypeError, match="key must be"):
        specops.reshape_and_cache(key.half(), value, key_cache, value_cache, slots)
    with pytest.raises(TypeError, match="slot_mapping must be int64"):
        specops.reshape_and_cache(key, value, key_cache, value_cache, slots.int())
    with pytest.raises(ValueError, match="value must have shape"):
        specops.reshape_and_cache(key, value[..., :32].contiguous(), key_cache, value_cache, slots)
    with pytest.raises(ValueError, match="slot_mapping holds a slot outside"):
        specops.reshape_and_cache(key, value, key_cache, value_cache, torch.tensor([0, 1, 2, 48]))
    real = (key.half(), value, key_cache, value_cache, slots)
    with FakeTensorMode() as fake_mode:
        fakes = [fake_mode.from_tensor(t) for t in real]
        with pytest.raises(TypeError, match="key must be"):
            torch.ops.specops.reshape_and_cache(*fakes)
