"""Sweep the Triton paged_attention launch (tiles, warps, pipeline depth, splits) at a few
shapes against the planned launch, on a GPU: which settings the plan should pick; or A/B
versions of the kernel file against each other at their planned launches.

Each shape (B, L, q_len, Hq, Hkv, D; bf16, block 16, blocks shuffled or, with
--contiguous, in order, every sequence L keys) runs every candidate; each output is
compared with the planned launch's (a candidate that differs by more than bf16 rounding is
reported, not timed). Times are medians of CUDA-graph replays, ROUNDS (--rounds) rounds
over the candidates in turn (the figure is the median of the rounds), so a drift of the
machine hits every candidate alike. The CUDA kernel is timed beside them when it is built.

    python3 bench/sweep_attention.py                       # the default shapes, launch grid
    python3 bench/sweep_attention.py --shape 32,1024,5,32,8,64 --out $OUT
    python3 bench/sweep_attention.py --grid plan --kernels old_attention.py   # A/B kernel files
    python3 bench/sweep_attention.py --grid plan --shape 1,4096,1,32,8,128 --queued   # GPU time
"""

from __future__ import annotations

import argparse
import functools
import importlib.util
import itertools
import json
import statistics
import tempfile
from pathlib import Path

import common
import torch
from bench_attention import graph_replay

import specops
from specops.triton_kernels import attention as kernels
from specops.triton_kernels.attention_plan import ASSUMED_MULTIPROCESSORS, AttentionLaunch, plan_paged_attention
from specops.triton_kernels.launch import dram_gbs_per_multiprocessor, multiprocessor_count

BLOCK_SIZE = 16
ROUNDS = 3
LAUNCH_CHOICES = ("rows", "block_n", "warps", "stages", "splits")  # --rows 8,16 etc.
# (B, L, q_len, Hq, Hkv, D): the engine's llama-1b verify step (issue 5), then the
# ANCHORS.md attention shapes nearest their targets.
DEFAULT_SHAPES = [(32, 1024, 5, 32, 8, 64), (32, 4096, 5, 32, 8, 64), (16, 4096, 5, 32, 8, 128),
                  (64, 1024, 1, 32, 8, 128), (1, 4096, 1, 32, 8, 128), (64, 4096, 5, 32, 8, 128)]


def inputs(B, L, q_len, Hq, Hkv, D, device, contiguous=False):
    """bf16 inputs; each sequence's blocks shuffled over the cache, or (``contiguous``) in
    order, sequence after sequence, as an engine's allocator hands them out."""
    g = torch.Generator(device=device).manual_seed(0)
    blocks = -(-L // BLOCK_SIZE)
    cache_shape = (B * blocks, BLOCK_SIZE, Hkv, D)
    key_cache = torch.randn(cache_shape, generator=g, device=device).to(torch.bfloat16)
    value_cache = torch.randn(cache_shape, generator=g, device=device).to(torch.bfloat16)
    if contiguous:
        order = torch.arange(B * blocks, device=device)
    else:
        order = torch.randperm(B * blocks, generator=g, device=device)
    block_table = order.view(B, blocks).to(torch.int32)
    seq_lens = torch.full((B,), L, dtype=torch.int32, device=device)
    cu_query_lens = (torch.arange(B + 1, device=device) * q_len).to(torch.int32)
    query = torch.randn(B * q_len, Hq, D, generator=g, device=device).to(torch.bfloat16)
    return query, key_cache, value_cache, block_table, seq_lens, cu_query_lens, D**-0.5


def launch_grid(planned: AttentionLaunch, D: int, group: int, choices: dict) -> list[AttentionLaunch]:
    """The plan, then the launches near it: every tile-row count in ``choices["rows"]`` (default:
    the plan's) with every block_n / warps / stages / splits (``choices`` narrows each list)."""
    splits = sorted({1, 2, 3, 4, planned.num_splits, max(1, planned.num_splits // 2), planned.num_splits * 2})
    options = {"rows": [planned.rows], "block_n": [32, 64, 128] if D <= 128 else [32, 64], "warps": [4, 8],
               "stages": [2, 3, 4], "splits": [s for s in splits if s <= 32]}
    options.update({name: values for name, values in choices.items() if values})
    found = [planned]
    for rows, block_n, warps, stages, num_splits in itertools.product(*options.values()):
        block_m = max(16, 1 << (rows * group - 1).bit_length())
        launch = AttentionLaunch(rows=rows, block_m=block_m, block_n=block_n, num_splits=num_splits,
                                 num_warps=warps, num_stages=stages)
        if launch not in found:
            found.append(launch)
    return found


# Where a version of triton_kernels/attention.py turns to its planned calls (plans track the
# modules by name, so a copy is called through launch_paged_attention, never through plans).
PLANNED_ANCHOR = "\n# Eager calls replayed from plans"


def kernel_module(source: str, name: str):
    """``source``, a version of triton_kernels/attention.py, as a module of its own: its
    relative imports made absolute, its planned calls left out; written to a file of the
    temporary folder first, since triton.jit reads the source."""
    source = (source.replace("from . import", "from specops.triton_kernels import")
              .replace("from .", "from specops.triton_kernels."))
    if PLANNED_ANCHOR in source:
        source = source[:source.index(PLANNED_ANCHOR)]
    path = Path(tempfile.gettempdir()) / f"{name}.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def load_kernel_file(path: str):
    """Another version of triton_kernels/attention.py (a file) as a module of its own."""
    return kernel_module(Path(path).read_text(), f"sweep_kernel_{Path(path).stem}")


def label(launch: AttentionLaunch) -> str:
    return f"M={launch.block_m} N={launch.block_n} w={launch.num_warps} st={launch.num_stages} sp={launch.num_splits}"


def sweep_shape(shape, device, copy_bw_tbs, iters, grid, kernel_files, timer=common.time_us, choices=None,
                rounds=ROUNDS, contiguous=False) -> list[dict]:
    B, L, q_len, Hq, Hkv, D = shape
    args = inputs(*shape, device, contiguous)
    planned = plan_paged_attention(B * q_len, B, Hq, Hkv, D, args[3].shape[1] * BLOCK_SIZE,
                                   multiprocessor_count(device, ASSUMED_MULTIPROCESSORS),
                                   max_query_len=q_len,
                                   dram_gbs_per_multiprocessor=dram_gbs_per_multiprocessor(device))
    want = kernels.launch_paged_attention(*args, max_query_len=q_len)[0].float()
    floor_bytes = 2 * (2 * B * L * Hkv * D + 2 * B * q_len * Hq * D)
    # name -> callable: this tree's kernel at each launch, other kernel files at the plan,
    # the CUDA kernel at its own plan.
    calls = {}
    for launch in launch_grid(planned, D, Hq // Hkv, choices or {}) if grid == "launches" else [planned]:
        calls["this " + label(launch)] = (
            lambda launch=launch: kernels.launch_paged_attention(*args, max_query_len=q_len, launch=launch))
    for path, module in kernel_files.items():
        calls[f"{path} {label(planned)}"] = (
            lambda module=module: module.launch_paged_attention(*args, max_query_len=q_len))
    calls["cuda kernel"] = lambda: specops.paged_attention(*args, max_query_len=q_len, backend="cuda", validate=False)
    replays = {}
    for name, fn in calls.items():
        try:
            relative = ((fn()[0].float() - want).norm() / want.norm()).item()
            if not relative < 1e-2:
                print(f"  {name}: output differs from the plan's (relative {relative:.1e}), not timed")
                continue
            replays[name] = graph_replay(fn)
        except Exception as error:  # noqa: BLE001 -- a launch that does not compile, a kernel not built: skip
            print(f"  {name}: {type(error).__name__}: {str(error)[:120]}")
            torch.cuda.synchronize()
    times = {name: [] for name in replays}
    for _ in range(rounds):
        for name, replay in replays.items():
            times[name].append(timer(replay, device, iters=iters))
    floor_us = floor_bytes / copy_bw_tbs / 1e6
    rows = [{"B": B, "L": L, "q_len": q_len, "Hq": Hq, "Hkv": Hkv, "D": D, "what": name,
             "us": round(statistics.median(ts), 2), "rounds_us": [round(t, 2) for t in ts],
             "floor_us": round(floor_us, 2)} for name, ts in times.items()]
    rows.sort(key=lambda row: row["us"])
    print(f"B={B} L={L} q_len={q_len} {Hq}/{Hkv} D={D}: floor {floor_us:.1f} us, plan {label(planned)}")
    for row in rows[:10]:
        print(f"  {row['what']:50s} {row['us']:7.1f} us ({row['us'] / floor_us:.2f}x the floor) rounds "
              f"{row['rounds_us']}")
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--shape", action="append", type=lambda v: tuple(int(x) for x in v.split(",")),
                        help="B,L,q_len,Hq,Hkv,D (repeatable); default: the engine's and ANCHORS.md's")
    parser.add_argument("--grid", choices=["launches", "plan"], default="launches",
                        help="launches: the plan and the launches near it; plan: the planned launch alone")
    parser.add_argument("--kernels", action="append", default=[],
                        help="another version of triton_kernels/attention.py to time at its plan (repeatable)")
    for name in (name.replace("_", "-") for name in LAUNCH_CHOICES):
        parser.add_argument(f"--{name}", type=lambda v: [int(x) for x in v.split(",")], default=None,
                            help=f"launch grid: the {name.replace('-', '_')} values to try (default: around the plan)")
    parser.add_argument("--iters", type=int, default=50)
    parser.add_argument("--rounds", type=int, default=ROUNDS)
    parser.add_argument("--contiguous", action="store_true",
                        help="each sequence's cache blocks in order (default: shuffled over the cache)")
    parser.add_argument("--queued", action="store_true",
                        help="GPU time with the queue kept ahead of the host (common.time_us queued=True)")
    parser.add_argument("--out", default=None, help="folder for sweep-attention.json")
    args = parser.parse_args()
    device = torch.device("cuda")
    env = common.env_stamp(device)
    kernel_files = {path: load_kernel_file(path) for path in args.kernels}
    rows = []
    for shape in args.shape or DEFAULT_SHAPES:
        rows += sweep_shape(shape, device, env["copy_bw_tbs"], args.iters, args.grid, kernel_files,
                            functools.partial(common.time_us, queued=args.queued),
                            {name: getattr(args, name) for name in LAUNCH_CHOICES}, args.rounds, args.contiguous)
    if args.out:
        Path(args.out).mkdir(parents=True, exist_ok=True)
        (Path(args.out) / "sweep-attention.json").write_text(json.dumps({"env": env, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
