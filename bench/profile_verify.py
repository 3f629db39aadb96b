"""Kernel times of one specops.verify call, from torch.profiler over CUDA-graph replays:
which launch of the fused verify costs what (bench/NOTES.md quotes these splits).

    python bench/profile_verify.py                      # B=64 random and n-gram, B=256, B=1
    python bench/profile_verify.py --shapes 64:4:128256:random --backend cuda
    python bench/profile_verify.py --set RESIDUAL_WARPS=4 --set RESIDUAL_RESIDENT=5   # A/B a launch
"""

from __future__ import annotations

import argparse
import collections

import torch

import specops
from specops.triton_kernels import verify as triton_verify
from bench_sampling import make_inputs
from bench_verify import graph_time_us, verify_args

DEFAULT_SHAPES = "64:4:128256:random,64:4:128256:ngram,256:4:128256:random,1:4:128256:random"


def kernel_times(fn, replays: int) -> dict[str, float]:
    """Mean µs per call of each kernel ``fn`` launches, over ``replays`` graph replays."""
    fn()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return call_kernel_times(graph.replay, replays)


def call_kernel_times(call, calls: int, warmup: int = 20) -> dict[str, float]:
    """Mean µs per call of each kernel over ``calls`` calls of ``call``, after ``warmup``."""
    for _ in range(warmup):
        call()
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            call()
        torch.cuda.synchronize()
    totals = collections.defaultdict(float)
    for event in prof.events():
        if event.device_type == torch.autograd.DeviceType.CUDA:
            totals[event.name] += event.device_time / calls
    return dict(totals)


def add_set_option(parser: argparse.ArgumentParser) -> None:
    """--set NAME=VALUE (repeatable): an integer launch constant of triton_kernels/verify.py."""
    parser.add_argument("--set", action="append", default=[], metavar="NAME=VALUE",
                        help="override an integer launch constant of triton_kernels/verify.py")


def apply_settings(settings: list[str], *modules) -> None:
    """Each --set NAME=VALUE, checked to name an integer launch constant, set in each of
    ``modules`` (verify modules: triton_kernels/verify.py when none is given)."""
    for setting in settings:
        name, _, value = setting.partition("=")
        for module in modules or (triton_verify,):
            if not isinstance(getattr(module, name, None), int):
                raise ValueError(f"--set: {name!r} is not a launch constant of {module.__name__}")
            setattr(module, name, int(value))


def shape_parser(description: str, default_shapes: str, replays: int) -> argparse.ArgumentParser:
    """The options of the per-shape verify tools: --shapes, --backend, --replays, --set."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--shapes", default=default_shapes, help="B:k:V:mode, comma-separated")
    parser.add_argument("--backend", default="triton")
    parser.add_argument("--replays", type=int, default=replays)
    add_set_option(parser)
    return parser


def verify_calls(args: argparse.Namespace):
    """For each of --shapes: (B, k, V, mode) and a call of specops.verify on its inputs, after
    --set. The inputs are seeded once, so every process draws the same: A/B runs compare
    like with like."""
    apply_settings(args.set)
    device = torch.device("cuda")
    torch.manual_seed(0)
    for shape in args.shapes.split(","):
        B, k, V, mode = shape.split(":")
        call = verify_args(make_inputs(int(B), int(k), int(V), mode, device, for_flashinfer=False), device)
        yield (B, k, V, mode), lambda call=call: specops.verify(*call, backend=args.backend, validate=False)


def main() -> None:
    args = shape_parser(__doc__.splitlines()[0], DEFAULT_SHAPES, 50).parse_args()
    device = torch.device("cuda")
    for (B, k, V, mode), fn in verify_calls(args):
        times = kernel_times(fn, args.replays)
        print(f"B={B} k={k} V={V} {mode} ({args.backend}, {' '.join(args.set)}): graph replay "
              f"{graph_time_us(fn, device, 200):.1f} us (queued {graph_time_us(fn, device, 200, queued=True):.1f}), "
              f"kernels {sum(times.values()):.1f} us")
        for name, us in sorted(times.items(), key=lambda item: -item[1]):
            print(f"  {us:7.1f}  {name[:90]}")


if __name__ == "__main__":
    main()
