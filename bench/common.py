"""What every specops benchmark shares: the environment stamp, the copy bandwidth every
floor is divided by, the timer, and the results file and table (DESIGN.md, "Benchmark
results format").

Timing follows ANCHORS.md: warm-up, then CUDA events around each of 50 calls, median,
L2 not flushed. On a CPU the same loop uses time.perf_counter (smoke runs only).
"""

from __future__ import annotations

import datetime
import json
import os
import platform
import re
import statistics
import subprocess
import time
from pathlib import Path
from typing import Callable

import torch

REPO_ROOT = Path(__file__).resolve().parents[1]


def captured(launches: Callable[[], object]) -> torch.cuda.CUDAGraph:
    """``launches`` (a call making the launches) run once on a side stream (compiles and
    allocates outside the graph), then captured in a CUDA graph."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        launches()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        launches()
    return graph


def time_us(fn: Callable[[], object], device: torch.device, warmup: int = 10, iters: int = 50,
            queued: bool = False) -> float:
    """Median wall time of one call of ``fn`` in microseconds (CUDA: events around each call).

    ``queued`` (CUDA): a ~10 ms sleep kernel first keeps the GPU queue ahead of the host, so
    every call is submitted before the GPU reaches it and no interval includes a wait on the
    host; without it an interval does when the GPU runs dry (the B = 1 rows, bench/NOTES.md).
    """
    for _ in range(warmup):
        fn()
    if device.type != "cuda":
        times = []
        for _ in range(iters):
            start = time.perf_counter()
            fn()
            times.append((time.perf_counter() - start) * 1e6)
        return statistics.median(times)
    torch.cuda.synchronize(device)
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(iters)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(iters)]
    if queued:
        torch.cuda._sleep(20_000_000)
    for start, end in zip(starts, ends):
        start.record()
        fn()
        end.record()
    torch.cuda.synchronize(device)
    return statistics.median(start.elapsed_time(end) * 1e3 for start, end in zip(starts, ends))


def time_in_turns(fns: dict[str, Callable[[], object]], device: torch.device, rounds: int = 5,
                  iters: int = 50) -> dict[str, list[float]]:
    """Each call's median time (time_us, ``iters`` calls) in each of ``rounds`` rounds, every
    call timed once a round, in turn: for calls bound by the host's submission, whose times
    drift over a process's life (the same eager call 42 µs in one bench run, 55 in the next),
    the calls compared are timed under the same drift. Returns the rounds' medians a call;
    report their median (statistics.median)."""
    times: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(rounds):
        for name, fn in fns.items():
            times[name].append(time_us(fn, device, iters=iters))
    return times


def sm_clock_mhz(device: torch.device) -> int | None:
    """The GPU's SM clock now, in MHz (NVML, through torch.cuda.clock_rate); None off a GPU
    or without NVML. Launch-bound rows slow down when it drops (a B = 1 verify rejected at
    step 0: 14.4 µs at 1980 MHz, 17-18 at ~1500 after a matmul load; bench/NOTES.md), so
    rows record it beside their times."""
    if device.type != "cuda":
        return None
    try:
        return int(torch.cuda.clock_rate(device))
    except Exception:  # noqa: BLE001 -- no NVML (pynvml or amdsmi) in this environment
        return None


def copy_bandwidth_tbs(device: torch.device) -> float:
    """Device-to-device copy bandwidth, bytes read + written, in TB/s (median of 10).

    1 GiB on a GPU (far beyond L2); 64 MiB on a CPU so smoke runs stay short.
    """
    nbytes = (1 << 30) if device.type == "cuda" else (64 << 20)
    src = torch.randint(0, 255, (nbytes,), dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    us = time_us(lambda: dst.copy_(src), device, warmup=3, iters=10)
    return 2 * nbytes / us / 1e6


def git_revision() -> str:
    """$SPECOPS_GIT_REV when set (a copy sent to a GPU machine may carry no .git, or a
    stale one), else ``git rev-parse HEAD`` of the repo (with "+dirty" when tracked files
    differ from it), else "unknown"."""
    if os.environ.get("SPECOPS_GIT_REV"):
        return os.environ["SPECOPS_GIT_REV"]
    try:
        if not (REPO_ROOT / ".git").exists():  # never report a parent folder's repository
            raise OSError("no .git")
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO_ROOT, capture_output=True, text=True, timeout=10)
        if out.returncode == 0 and out.stdout.strip():
            status = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=REPO_ROOT,
                                    capture_output=True, text=True, timeout=10)
            return out.stdout.strip() + ("+dirty" if status.stdout.strip() else "")
    except (OSError, subprocess.SubprocessError):
        pass
    return "unknown"


def env_stamp(device: torch.device) -> dict:
    """{gpu, torch, triton, cuda, git, copy_bw_tbs, date} for the results file."""
    try:
        import triton

        triton_version = triton.__version__
    except ImportError:
        triton_version = "none"
    if device.type == "cuda":
        gpu = torch.cuda.get_device_name(device)
    else:
        gpu = f"cpu ({platform.processor() or platform.machine()})"
    return {
        "gpu": gpu,
        "torch": torch.__version__,
        "triton": triton_version,
        "cuda": torch.version.cuda or "none",
        "git": git_revision(),
        "copy_bw_tbs": round(copy_bandwidth_tbs(device), 4),
        "date": datetime.datetime.now().isoformat(timespec="seconds"),
    }


def gpu_slug(gpu_name: str) -> str:
    """Short name for file names: h100, h200, cpu, else the name in lower-case words."""
    name = gpu_name.lower()
    for slug in ("h100", "h200", "b200", "a100"):
        if slug in name:
            return slug
    if name.startswith("cpu"):
        return "cpu"
    return re.sub(r"[^a-z0-9]+", "-", name).strip("-")


def write_results(bench: str, env: dict, rows: list[dict], out_dir: str | Path) -> Path:
    """Write ``<out_dir>/<bench>-<gpu>-<YYYYMMDD>.json`` (overwriting), one row a line."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"{bench}-{gpu_slug(env['gpu'])}-{datetime.date.today():%Y%m%d}.json"
    body = ",\n  ".join(json.dumps(row) for row in rows)
    path.write_text(f'{{"env": {json.dumps(env)},\n "rows": [\n  {body}\n ]}}\n')
    return path


def speedup(peer_us: float | None, us: float) -> str:
    """How many times faster than the peer (peer time / our time)."""
    return "" if peer_us is None else f"{peer_us / us:.2f}x"


def print_table(
    rows: list[dict],
    group_keys: tuple[str, ...],
    peers: tuple[str, ...],
    fixed: dict[str, Callable[[dict], float | None]] | None = None,
) -> None:
    """One line per row: time, floor, x over floor, GB/s and % of copy bandwidth (when the
    row has them), then, on specops rows, the speed-up over each peer measured in the same
    run (same group) and over each ``fixed`` figure (a label and a lookup by row)."""
    fixed = fixed or {}
    by_group: dict[tuple, dict[str, dict]] = {}
    for row in rows:
        by_group.setdefault(tuple(row[key] for key in group_keys), {})[row["impl"]] = row
    header = [*group_keys, "impl", "us", "floor_us", "x_floor", "GB/s", "%copy"]
    header += [f"vs {peer}" for peer in peers]
    for label in fixed:
        header += [label, "vs it"]
    lines = [header]
    for group, impls in by_group.items():
        for impl, row in impls.items():
            line = [str(value) for value in group] + [impl, f"{row['us']:.1f}", f"{row['floor_us']:.1f}"]
            line += [f"{row['us'] / row['floor_us']:.2f}", f"{row['gbps']:.0f}" if "gbps" in row else ""]
            line += [f"{row['pct_copy_bw']:.0f}%" if "pct_copy_bw" in row else ""]
            ours = impl.startswith("specops")
            for peer in peers:
                peer_row = impls.get(peer)
                line.append(speedup(peer_row["us"], row["us"]) if ours and peer_row and peer != impl else "")
            for lookup in fixed.values():
                figure = lookup(row)
                line += ["" if figure is None else f"{figure:.0f}", speedup(figure, row["us"]) if ours else ""]
            lines.append(line)
    shown = [i for i in range(len(header)) if any(line[i] for line in lines[1:])]  # drop empty columns
    widths = {i: max(len(line[i]) for line in lines) for i in shown}
    for line in lines:
        print("  ".join(line[i].rjust(widths[i]) for i in shown))
