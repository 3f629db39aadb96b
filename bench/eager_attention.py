"""Eager specops.paged_attention, the CUDA kernel against the Triton kernel, on a GPU:
where an eager call's default should take the CUDA kernel (lower host time) and where the
Triton kernel (lower GPU time).

Each shape (B, L, q_len, Hq, Hkv, D; bf16, block 16, blocks shuffled, as sweep_attention)
runs both backends in turn over ROUNDS rounds in one process, after checking that their
outputs agree to bf16 rounding; also each one's CUDA-graph replay (its GPU time). Results
as DESIGN.md's format, ``attention_eager-<gpu>-<date>.json``: one row an impl, shape and
stage ("eager": the median of the rounds' medians, "graph": the replay), the floor as
bench_attention.py's (keys, values, queries and outputs over the copy bandwidth).

    python3 bench/eager_attention.py --out $OUT
"""

from __future__ import annotations

import argparse
import statistics

import common
import torch
from bench_attention import floor_bytes
from bench_verify import graph_time_us
from sweep_attention import inputs

import specops

ROUNDS = 5
SHAPES = [(B, L, q, 32, 8, 128) for q in (1, 5) for B, L in
          ((1, 4096), (4, 4096), (16, 4096), (32, 2048), (64, 1024), (96, 1024), (64, 2048), (128, 1024),
           (64, 4096))]
SHAPES += [(1, 4096, 1, 32, 8, 64), (32, 1024, 5, 32, 8, 64), (64, 1024, 1, 32, 8, 64), (128, 1024, 1, 32, 8, 64),
           (64, 4096, 1, 32, 8, 64), (4, 4096, 128, 32, 8, 128), (1, 2048, 512, 32, 8, 128),
           (16, 1024, 64, 32, 8, 128)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--iters", type=int, default=20)
    parser.add_argument("--out", default=None, help="folder for the results JSON")
    args = parser.parse_args()
    device = torch.device("cuda")
    env = common.env_stamp(device)
    rows = []
    for shape in SHAPES:
        B, L, q_len, Hq, Hkv, D = shape
        call_args = inputs(*shape, device)
        calls = {backend: (lambda backend=backend: specops.paged_attention(
            *call_args, max_query_len=q_len, backend=backend, validate=False)) for backend in ("cuda", "triton")}
        cuda_out, triton_out = calls["cuda"]()[0].float(), calls["triton"]()[0].float()
        relative = ((cuda_out - triton_out).norm() / triton_out.norm()).item()
        if not relative < 1e-2:
            raise AssertionError(f"{shape}: the CUDA and Triton outputs differ (relative {relative:.1e})")
        times = common.time_in_turns(calls, device, ROUNDS, args.iters)
        floor_us = floor_bytes(*shape, element_size=2) / env["copy_bw_tbs"] / 1e6
        key = {"bench": "attention_eager", "B": B, "L": L, "q_len": q_len, "Hq": Hq, "Hkv": Hkv, "D": D,
               "block": 16, "dtype": "bf16"}
        for backend, fn in calls.items():
            stages = {"eager": statistics.median(times[backend]),
                      "graph": graph_time_us(fn, device, args.iters, queued=True)}
            for stage, us in stages.items():
                rows.append(key | {"stage": stage, "impl": f"specops-{backend}", "us": round(us, 1),
                                   "floor_us": round(floor_us, 2)})
        print(shape, {backend: [round(t) for t in ts] for backend, ts in times.items()},
              [(row["impl"], row["stage"], row["us"]) for row in rows[-4:]], flush=True)
        del call_args
        torch.cuda.empty_cache()
    if args.out:
        print(common.write_results("attention_eager", env, rows, args.out))


if __name__ == "__main__":
    main()
