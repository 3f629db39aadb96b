"""A/B of the Triton verify launcher: this tree's kernels against a copy of older ones, in
one process, alternating rounds of queued graph replays, outputs checked equal first.

    git archive REV triton_kernels | tar -x -C .ab_base     # here: the older kernels
    python bench/ab_verify.py --base .ab_base               # there: with the copy carried
    python bench/ab_verify.py --base .ab_base --shapes 64:4:128256:random:topk50:topp0.9:logprobs --profile
    python bench/ab_verify.py --set SEARCH_BLOCK_V=512      # this tree alone, a constant changed
    python bench/ab_verify.py --variant SEARCH_UNROLL=2 --variant SEARCH_KEEP_LIMIT=-1   # sides in one process

A shape is B:k:V:mode, then optional tags: topkN (every request top_k = N), toppF (every
request top_p = F), tempF (every request at temperature F: flatter rows above 1; else 1,
0 for greedy), logprobs (return the log-probabilities), dscaleF / dnoiseF (the draft logits'
scale of the target's and noise: bench_sampling.make_inputs; dscale1:dnoise0.1 passes ~0.88
of the steps against ~0.35 by default). Each shape prints the drafts accepted a request
(its mean over the batch), the regime the times are for. Times are medians over rounds
of each variant's median (common.time_us, queued), in µs; --profile adds the per-kernel
split of each variant (profile_verify.call_kernel_times).
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import sys
from pathlib import Path

import torch

import common
from bench_sampling import make_inputs
from bench_verify import verify_args
from profile_verify import add_set_option, apply_settings, call_kernel_times
from specops.triton_kernels import verify as this_verify

DEFAULT_SHAPES = ("64:4:128256:random:topk50,64:4:128256:random:topp0.9,"
                  "64:4:128256:random:topk50:topp0.9:logprobs,16:4:128256:random:topk50:topp0.9,"
                  "1:4:128256:random:topk50:topp0.9,64:4:128256:random,1:4:128256:random")


def load_base(folder: str):
    """The ``verify`` module of the triton_kernels package copied under ``folder``."""
    init = Path(folder) / "triton_kernels" / "__init__.py"
    spec = importlib.util.spec_from_file_location("ab_base_kernels", init,
                                                  submodule_search_locations=[str(init.parent)])
    package = importlib.util.module_from_spec(spec)
    sys.modules["ab_base_kernels"] = package
    spec.loader.exec_module(package)
    return importlib.import_module("ab_base_kernels.verify")


def shape_call(shape: str, device: torch.device) -> tuple[str, tuple, bool]:
    """(label, launcher arguments, return_logprobs) of one --shapes entry."""
    B, k, V, mode, *tags = shape.split(":")
    batch = int(B)
    draft, overrides, logprobs = {}, {}, False  # overrides: launcher argument index -> tensor
    for tag in tags:
        if tag.startswith("dscale"):
            draft["draft_scale"] = float(tag[6:])
        elif tag.startswith("dnoise"):
            draft["draft_noise"] = float(tag[6:])
        elif tag.startswith("topk"):
            overrides[6] = torch.full((batch,), int(tag[4:]), dtype=torch.int32, device=device)
        elif tag.startswith("topp"):
            overrides[7] = torch.full((batch,), float(tag[4:]), dtype=torch.float32, device=device)
        elif tag.startswith("temp"):
            overrides[5] = torch.full((batch,), float(tag[4:]), dtype=torch.float32, device=device)
        elif tag == "logprobs":
            logprobs = True
        else:
            raise ValueError(f"unknown tag {tag!r} in shape {shape!r}")
    x = make_inputs(batch, int(k), int(V), mode, device, for_flashinfer=False, **draft)
    args = list(verify_args(x, device))
    for index, value in overrides.items():
        args[index] = value
    return shape, tuple(args), logprobs


def with_settings(settings: str):
    """This tree's launcher with launch constants changed for the call ("NAME=VALUE,..."),
    then restored: a graph captured from it keeps the launches it made."""
    def launch(*args):
        saved = {}
        for setting in settings.split(","):
            name, value = setting.split("=")
            assert isinstance(getattr(this_verify, name), int), f"{name} is not a launch constant"
            saved[name] = getattr(this_verify, name)
            setattr(this_verify, name, int(value))
        try:
            return this_verify.verify(*args)
        finally:
            for name, value in saved.items():
                setattr(this_verify, name, value)

    return launch


def graph_of(fn):
    """``fn`` captured in a CUDA graph (after one eager call: compiles, allocates)."""
    fn()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return graph


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base", default=None, help="folder holding an older triton_kernels/ (absent: no B side)")
    parser.add_argument("--shapes", default=DEFAULT_SHAPES)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--iters", type=int, default=30)
    parser.add_argument("--seed", type=int, default=0, help="of the inputs (the same in every process)")
    parser.add_argument("--profile", action="store_true", help="also print each variant's kernel times")
    parser.add_argument("--device", default="cuda", help="cpu: a smoke run under TRITON_INTERPRET=1 (no graphs)")
    add_set_option(parser)  # this tree's constants
    parser.add_argument("--variant", action="append", default=[], metavar="NAME=VALUE[,NAME=VALUE]",
                        help="one more side: this tree with these launch constants (in the same process)")
    args = parser.parse_args()
    apply_settings(args.set)
    variants = {"this": this_verify.verify} | {settings: with_settings(settings) for settings in args.variant}
    if args.base:
        variants = {"base": load_base(args.base).verify, **variants}
    device = torch.device(args.device)
    summary = []
    for shape in args.shapes.split(","):
        torch.manual_seed(args.seed)  # the same inputs in every process
        label, call, logprobs = shape_call(shape, device)
        fns = {name: (lambda launch=launch: launch(*call, logprobs)) for name, launch in variants.items()}
        outputs = {name: [t.clone() for t in fn()] for name, fn in fns.items()}
        first = next(iter(outputs.values()))
        equal = all(all(torch.equal(a, b) for a, b in zip(first, out)) for out in outputs.values())
        accepted = first[1].float().mean().item()
        on_gpu = device.type == "cuda"
        graphs = {name: graph_of(fn).replay if on_gpu else fn for name, fn in fns.items()}
        times = {name: [] for name in fns}
        for _ in range(args.rounds):
            for name, replay in graphs.items():
                times[name].append(common.time_us(replay, device, iters=args.iters, queued=True))
        medians = {name: statistics.median(t) for name, t in times.items()}
        summary.append((label, accepted, medians, equal))
        print(f"{label} ({accepted:.2f} accepted): " + ", ".join(f"{n} {us:.1f} us" for n, us in medians.items())
              + ("" if equal else "  *** OUTPUTS DIFFER"), flush=True)
        if args.profile and on_gpu:
            for name, replay in graphs.items():
                kernels = call_kernel_times(replay, 20)
                print(f"  {name}: " + ", ".join(f"{k.split('_kernel')[0][:24]} {us:.1f}"
                                                for k, us in sorted(kernels.items(), key=lambda kv: -kv[1])))
        del graphs
        if on_gpu:
            torch.cuda.empty_cache()
    print("\n| shape | accepted | " + " | ".join(variants) + " | outputs |")
    print("|---|---|" + "---|" * len(variants) + "---|")
    for label, accepted, medians, equal in summary:
        print(f"| {label} | {accepted:.2f} | " + " | ".join(f"{us:.1f}" for us in medians.values())
              + f" | {'equal' if equal else 'DIFFER'} |")


if __name__ == "__main__":
    main()
