"""Eager specops.paged_attention, the CUDA kernel against the Triton kernel, on a GPU:
where an eager call's default should take the CUDA kernel (lower host time) and where the
Triton kernel (lower GPU time).

Each shape (B, L, q_len, Hq, Hkv, D; bf16, block 16, blocks shuffled, as sweep_attention)
runs both backends in turn over ROUNDS rounds in one process, after checking that their
outputs agree to bf16 rounding; also each one's CUDA-graph replay (its GPU time).

    python3 bench/eager_attention.py --out $OUT
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

import common
import torch
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
    parser.add_argument("--out", default=None, help="folder for eager-attention.json")
    args = parser.parse_args()
    device = torch.device("cuda")
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
        times = {backend: [] for backend in calls}
        for _ in range(ROUNDS):
            for backend, fn in calls.items():
                times[backend].append(common.time_us(fn, device, iters=args.iters))
        kv_mib = 2 * B * call_args[3].shape[1] * 16 * Hkv * D * 2 / 2**20
        row = {"B": B, "L": L, "q_len": q_len, "Hq": Hq, "Hkv": Hkv, "D": D, "kv_mib": round(kv_mib, 1),
               **{f"{backend}_us": round(statistics.median(ts), 1) for backend, ts in times.items()},
               **{f"{backend}_graph_us": round(graph_time_us(fn, device, args.iters, queued=True), 1)
                  for backend, fn in calls.items()},
               **{f"{backend}_rounds_us": [round(t) for t in ts] for backend, ts in times.items()}}
        print(row, flush=True)
        rows.append(row)
        del call_args
        torch.cuda.empty_cache()
    if args.out:
        Path(args.out, "eager-attention.json").write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
