"""Where each launch of one specops.verify call starts and ends inside a CUDA-graph replay
(torch.profiler over replays, medians): how the launches of the chain overlap under
programmatic dependent launch, and what each adds after the one before (bench/NOTES.md
quotes these timelines).

    python bench/timeline_verify.py                                  # B=16 random, B=1 random
    python bench/timeline_verify.py --shapes 64:4:128256:random --set PDL=0
    python bench/timeline_verify.py --shapes 64:4:128256:random:topp0.9   # ab_verify's tags: the Triton launcher
"""

from __future__ import annotations

import argparse
import collections
import statistics

import torch

from ab_verify import shape_call
from bench_verify import graph_time_us
from profile_verify import apply_settings, shape_parser, verify_calls

from specops.triton_kernels import verify as triton_verify

DEFAULT_SHAPES = "16:4:128256:random,1:4:128256:random"


def replay_timeline(graph: torch.cuda.CUDAGraph, replays: int) -> tuple[list[tuple[str, float, float]], float]:
    """(kernel name, median start, median end) in µs from each replay's first kernel start,
    in launch order, and the median span from the first start to the last end."""
    for _ in range(20):
        graph.replay()
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(replays):
            graph.replay()
            torch.cuda.synchronize()  # replays apart: no kernel of one overlaps the next
    kernels = sorted((e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA),
                     key=lambda e: e.time_range.start)
    per_replay = len(kernels) // replays
    if per_replay * replays != len(kernels):
        raise RuntimeError(f"{len(kernels)} kernels over {replays} replays: not the same launches each replay")
    starts, ends, names, spans = collections.defaultdict(list), collections.defaultdict(list), {}, []
    for r in range(replays):
        group = kernels[r * per_replay:(r + 1) * per_replay]
        t0 = group[0].time_range.start
        spans.append(max(e.time_range.end for e in group) - t0)
        for i, event in enumerate(group):
            names[i] = event.name
            starts[i].append(event.time_range.start - t0)
            ends[i].append(event.time_range.end - t0)
    rows = [(names[i], statistics.median(starts[i]), statistics.median(ends[i])) for i in range(per_replay)]
    return rows, statistics.median(spans)


def tagged_calls(args):
    """verify_calls, but a shape with ab_verify's tags (topkN, toppF, tempF, logprobs, ...)
    calls the Triton launcher on ab_verify's inputs for it, seeded as ab_verify seeds them
    (0, its default): the same rows as an A/B of that shape."""
    plain = ",".join(shape for shape in args.shapes.split(",") if shape.count(":") == 3)
    tagged = [shape for shape in args.shapes.split(",") if shape.count(":") > 3]
    if plain:
        yield from verify_calls(argparse.Namespace(**{**vars(args), "shapes": plain}))
    apply_settings(args.set)  # (verify_calls applies them too: the same constants)
    for shape in tagged:
        torch.manual_seed(0)
        _label, call, logprobs = shape_call(shape, torch.device("cuda"))
        yield tuple(shape.split(":", 3)), lambda call=call, logprobs=logprobs: triton_verify.verify(*call, logprobs)


def main() -> None:
    args = shape_parser(__doc__.splitlines()[0], DEFAULT_SHAPES, 40).parse_args()
    device = torch.device("cuda")
    for (B, k, V, mode), fn in tagged_calls(args):
        fn()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            fn()
        rows, span = replay_timeline(graph, args.replays)
        queued = graph_time_us(fn, device, 200, queued=True)
        print(f"B={B} k={k} V={V} {mode} ({args.backend}, {' '.join(args.set)}): replay {queued:.1f} us queued, "
              f"{span:.1f} from the first kernel's start to the last one's end")
        previous_end = 0.0
        for name, start, end in rows:
            print(f"  start {start:6.1f}  end {end:6.1f}  (+{end - previous_end:4.1f})  {name[:70]}")
            previous_end = max(previous_end, end)


if __name__ == "__main__":
    main()
