"""Where an eager specops.paged_attention call spends its host time, layer by layer: the
public function, the registered op (the dispatcher), the launcher without the dispatcher,
the plan's key and its native replay, for the CUDA and the Triton kernel; FlashInfer's
planned call (its decode run, or its prefill for q_len > 1) and a few PyTorch calls as the
host's yardsticks; then cProfile over eager calls of one backend. Host time = calls queued
behind a sleep kernel (the GPU never waits on the host and the host never waits on the
GPU), wall time / calls. Usage (GPU):

    python bench/host_attention.py --shape 1:4096:1 --backend triton --flashinfer
"""

from __future__ import annotations

import argparse
import functools
import statistics

import torch
from bench_attention import Batch, flashinfer_calls, import_flashinfer
from host_verify import host_us, print_profile

import common
import specops
from specops import _triton_ops
from specops.triton_kernels import attention as attention_kernels
from specops.triton_kernels import launch_plan


def layers(call_args: tuple, q_len: int) -> dict[str, object]:
    """Callables, outermost first, each one layer less than the one before."""
    query, key_cache, value_cache, block_table, seq_lens, cu_query_lens, scale = call_args
    op_args = (query, key_cache, value_cache, block_table, seq_lens, cu_query_lens, scale, 0, 0.0, False, q_len)
    planned = attention_kernels.paged_attention
    out = {
        "specops.paged_attention default (validate=False)": functools.partial(
            specops.paged_attention, *call_args, max_query_len=q_len, validate=False),
        "specops.paged_attention default (validate=True)": functools.partial(
            specops.paged_attention, *call_args, max_query_len=q_len),
    }
    for backend in ("cuda", "triton"):
        out[f"specops.paged_attention backend={backend}"] = functools.partial(
            specops.paged_attention, *call_args, max_query_len=q_len, backend=backend, validate=False)
    out["torch.ops.specops.paged_attention (packet)"] = functools.partial(torch.ops.specops.paged_attention, *op_args)
    out["torch.ops.specops.paged_attention.default"] = functools.partial(
        torch.ops.specops.paged_attention.default, *op_args)
    out["torch.ops.specops_triton.paged_attention.default"] = functools.partial(
        torch.ops.specops_triton.paged_attention.default, *op_args)
    out["triton planned launcher, with check"] = functools.partial(
        planned, *op_args, check=_triton_ops._check_paged_attention)
    out["triton planned launcher, no check"] = functools.partial(planned, *op_args)
    native_key = launch_plan._native_key()
    if native_key is not None:
        out["specops._C.plan_key alone"] = functools.partial(native_key, op_args)
        planned(*op_args)
        planned(*op_args)
        plans = [p for p in planned.plans.values() if getattr(p, "native", None) is not None]
        if plans:
            device, stream = query.device, torch.cuda.current_stream().cuda_stream
            pointers = native_key(op_args)[1]
            out["plan.replay alone (native)"] = functools.partial(plans[0].replay, op_args, device, stream, pointers)
            out["LaunchPlan.replay alone (C++)"] = functools.partial(plans[0].native.replay, pointers, stream)
    return out


def yardsticks(query: torch.Tensor) -> dict[str, object]:
    small = torch.zeros(16, device=query.device)
    return {
        "torch.empty (16 floats, cuda)": functools.partial(torch.empty, 16, device=query.device),
        "torch.empty_like(query)": functools.partial(torch.empty_like, query),
        "small.add_(1) (one launch)": functools.partial(small.add_, 1),
        "torch.ops.aten.add_.Scalar (one launch)": functools.partial(torch.ops.aten.add_.Scalar, small, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", default="1:4096:1", help="B:L:q_len (GQA 32/8, D 128, bf16, block 16)")
    parser.add_argument("--backend", default="triton", help="of the cProfile run")
    parser.add_argument("--calls", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--top", type=int, default=25)
    parser.add_argument("--flashinfer", action="store_true", help="also FlashInfer's planned call (bench_attention's)")
    args = parser.parse_args()
    device = torch.device("cuda")
    B, L, q_len = (int(v) for v in args.shape.split(":"))
    batch = Batch(B, L, q_len, device, torch.bfloat16)
    call_args = batch.specops_args()
    calls = layers(call_args, q_len) | yardsticks(call_args[0])
    flashinfer = import_flashinfer() if args.flashinfer else None
    if flashinfer is not None:  # decode: the CUDA-cores wrapper (FlashInfer's default), else its prefill
        planned = flashinfer_calls(flashinfer, batch, ("cuda-cores",))
        calls |= {f"flashinfer {path}": fn for path, fn in planned.items()}
    for fn in calls.values():  # compile, plan, warm
        for _ in range(3):
            fn()
    torch.cuda.synchronize()
    hosts = {name: [] for name in calls}
    events = {name: [] for name in calls}
    for _ in range(args.rounds):
        for name, fn in calls.items():
            hosts[name].append(host_us(fn, calls=100))
            events[name].append(common.time_us(fn, device, iters=50))
    print(f"shape B={B} L={L} q_len={q_len}: host µs (median of {args.rounds} rounds, min-max) | eager by events")
    for name in calls:
        h = hosts[name]
        print(f"  {name:52s} {statistics.median(h):7.1f} ({min(h):.1f}-{max(h):.1f}) | "
              f"{statistics.median(events[name]):7.1f}", flush=True)

    def run():
        for _ in range(args.calls):
            specops.paged_attention(*call_args, max_query_len=q_len, backend=args.backend, validate=False)
        torch.cuda.synchronize()

    print_profile(run, args.top)


if __name__ == "__main__":
    main()
