"""Eager Triton paged_attention calls replayed from plans (triton_kernels/launch_plan.py):
on the CPU, every tensor the launches take is one a plan rebuilds (the tracked modules:
test_triton_launch_plan.py); on a GPU, replays on fresh inputs equal the launcher's own launches bit for bit in
both replay forms (one launch; split programs and their merge; LSE, sliding window, soft
cap; float32, float16 and bfloat16), and the op still raises on bad arguments once plans
exist."""

from __future__ import annotations

import pytest
import torch
from attention_inputs import make_batch
from conftest import requires_gpu
from plan_replays import both_forms, native_built, replays_of

from specops.triton_kernels import attention as triton_attention
from specops.triton_kernels import attention_plan, launch_plan


class _ReportingKernel:  # a kernel whose launches are reported to the recorder, not run
    function, packed_metadata = 1, (4, 1, 0)

    class run:  # Triton's CudaLauncher, as a plan reads it
        global_scratch_size = profile_scratch_size = 0
        launch_cooperative_grid = launch_pdl = False
        launch = None

    def __getitem__(self, grid):
        grid = (*grid, 1, 1)[:3]
        return lambda *args, **constants: launch_plan.report_launch(self, grid, args)


@pytest.mark.parametrize("splits,return_lse", [(1, False), (1, True), (3, True), (3, False)])
def test_every_tensor_the_launches_take_is_one_a_plan_rebuilds(splits, return_lse, monkeypatch):
    """On the CPU: the launcher's launches (reported, not run) take only the call's
    arguments, its outputs and its workspace, so each key gets a plan (none falls back to
    the launcher every call)."""
    for name in ("_paged_attention_kernel", "_merge_splits_kernel"):
        monkeypatch.setattr(triton_attention, name, _ReportingKernel())
    inputs = make_batch([40, 7, 90], [2, 1, 3], 8, 2, 32, 16, torch.float16, seed=3)
    args = (*inputs.values(), 0.2, 0, 0.0, return_lse, 3)
    launch = attention_plan.AttentionLaunch(rows=4, block_m=16, block_n=16, num_splits=splits)
    launch_plan._local.recorder = recorder = launch_plan._Recorder()
    try:
        returned = triton_attention.launch_paged_attention(*args, launch=launch)
    finally:
        launch_plan._local.recorder = None
    plan = launch_plan._plan_of(recorder, args, returned)
    assert plan is not None
    assert plan.outputs == ((tuple(inputs["query"].shape), torch.float16),
                            ((6, 8) if return_lse else (0, 0), torch.float32))
    assert len(plan.launches) == (2 if splits > 1 else 1) and (plan.workspace_bytes > 0) == (splits > 1)
    first = plan.launches[0]
    assert [which for _, which in first.inputs] == [0, 1, 2, 3, 4, 5]  # query .. cu_query_lens
    if splits > 1:
        assert len(first.scratch) == 2 and not first.outputs
    written = plan.launches[-1].outputs  # the output and the LSE (the output again without one)
    assert sorted(which for _, which in written) == ([0, 1] if return_lse else [0, 0])


@pytest.fixture
def replays(monkeypatch):
    """The replays of plans from now on, counted; plans recorded before are dropped."""
    yield from replays_of(monkeypatch, triton_attention.paged_attention)


# (seq_lens, q_lens, Hq, Hkv, D, block_size, dtype, window, cap, LSE, launches a call makes)
CASES = {
    "decode-bf16": ([300, 17, 512, 64] * 16, [1] * 64, 32, 8, 128, 16, torch.bfloat16, 0, 0.0, False, 1),
    "verify-splits-lse": ([4096], [5], 32, 8, 128, 16, torch.bfloat16, 0, 0.0, True, 2),
    "window-cap-fp16": ([200, 900, 33, 640], [3, 5, 1, 4], 16, 4, 64, 32, torch.float16, 64, 30.0, True, None),
    "fp32-no-gqa": ([129, 700, 5], [2, 1, 4], 4, 4, 64, 16, torch.float32, 0, 0.0, True, None),
}


def _arguments(case, seed):
    seq_lens, q_lens, num_heads, num_kv_heads, head_dim, block_size, dtype, window, cap, lse, _ = CASES[case]
    inputs = make_batch(seq_lens, q_lens, num_heads, num_kv_heads, head_dim, block_size, dtype, seed=seed)
    return (*(v.cuda() for v in inputs.values()), head_dim**-0.5, window, cap, lse, max(q_lens))


@requires_gpu
@pytest.mark.gpu
@both_forms
@pytest.mark.parametrize("case", list(CASES))
def test_replays_equal_the_launcher(case, native, replays, monkeypatch):
    monkeypatch.setattr(launch_plan, "NATIVE", native)
    for call in range(5):  # fresh inputs (new pointers and values) every call
        args = _arguments(case, seed=200 + call)
        got = triton_attention.paged_attention(*args)
        want = triton_attention.launch_paged_attention(*args)
        assert all(torch.equal(g, w) for g, w in zip(got, want, strict=True)), f"call {call}"
        assert torch.isfinite(got[0]).all()
    assert len(replays) >= 3  # the first call (or two, while compiling) records
    (plan,) = triton_attention.paged_attention.plans.values()
    assert isinstance(plan, launch_plan._Plan)
    assert (plan.native is not None) == (native and native_built())
    launches = CASES[case][-1]
    if launches is not None:  # the planner's split (or not) on this GPU, as the case is meant
        assert len(plan.launches) == launches


@requires_gpu
@pytest.mark.gpu
def test_bad_arguments_raise_after_plans_exist(replays):
    """A replay skips the arguments' checks only for a key that passed them."""
    args = _arguments("decode-bf16", seed=7)
    for _ in range(3):
        torch.ops.specops_triton.paged_attention(*args)
    assert len(replays) >= 1
    seen = len(replays)
    query, key_cache, value_cache, block_table = args[:4]
    strided = torch.empty(query.shape[::-1], dtype=query.dtype, device="cuda").permute(2, 1, 0)
    strided.copy_(query)
    cases = [
        ((strided, *args[1:]), ValueError, "query must be contiguous"),
        ((*args[:3], block_table.long(), *args[4:]), TypeError, "block_table"),
        ((query, key_cache, value_cache.float(), *args[3:]), TypeError, "value_cache"),
    ]
    for bad, error, words in cases:
        with pytest.raises(error, match=words):
            torch.ops.specops_triton.paged_attention(*bad)
    assert len(replays) == seen
