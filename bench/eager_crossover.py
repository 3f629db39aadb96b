"""Eager specops.verify, the CUDA kernel against the Triton kernel, on a GPU: where the
eager default (specops/ops.py, TRITON_EAGER_MIN_LOGITS*) should switch to Triton.

Both backends run each call in turn over ROUNDS rounds in one process (the Triton call's
host time moves between processes); the tokens of the two are checked equal first.
Rows: tokens only, with log-probabilities, and with top-k 50 + top-p 0.9, at k = 4,
V = 128256, random requests, batches on either side of each threshold; and all-greedy calls
(temperature=None, which spares the Triton kernel every launch after the max pass), at
V = 128256 and, for the smallest calls, V = 32000.

    python3 bench/eager_crossover.py --out $OUT [--mode greedy]
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

import common
import torch
from bench_sampling import make_inputs
from bench_verify import verify_args

import specops

ROUNDS = 5
# (B, V, top_k, top_p, return_logprobs, mode)
CASES = ([(B, 128256, 50, 0.9, False, "random") for B in (1, 2, 4, 8, 12, 16, 32)]
         + [(B, 128256, None, None, False, "random") for B in (1, 2, 4, 8, 16, 32, 48, 64, 96, 128)]
         + [(B, 128256, None, None, True, "random") for B in (1, 4, 8, 16, 32, 48, 64)]
         + [(B, 32000, None, None, False, "greedy") for B in (1, 2, 4)]
         + [(B, 128256, None, None, False, "greedy") for B in (1, 2, 4, 16, 64)])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--iters", type=int, default=20)
    parser.add_argument("--out", default=None, help="folder for eager-crossover.json")
    parser.add_argument("--mode", choices=("random", "greedy"), default=None, help="only the cases of this mode")
    args = parser.parse_args()
    device = torch.device("cuda")
    k = 4
    rows = []
    for B, V, top_k, top_p, logprobs, mode in CASES:
        if args.mode not in (None, mode):
            continue
        x = make_inputs(B, k, V, mode, device, for_flashinfer=False)
        call_args = verify_args(x, device, top_k, top_p)
        if mode == "greedy":  # the all-greedy promise (temperature=None), as bench_verify's greedy rows
            call_args = call_args[:5] + (None,) + call_args[6:]
        calls = {backend: (lambda backend=backend: specops.verify(*call_args, return_logprobs=logprobs,
                                                                   backend=backend, validate=False))
                 for backend in ("cuda", "triton")}
        if not torch.equal(calls["cuda"]()[0], calls["triton"]()[0]):
            raise AssertionError(f"B={B}: the CUDA and Triton tokens differ")
        times = common.time_in_turns(calls, device, ROUNDS, args.iters)
        row = {"B": B, "k": k, "V": V, "logits_mi": round(B * (k + 1) * V / 2**20, 2),
               "filtered": top_k is not None, "logprobs": logprobs, "mode": mode,
               **{f"{backend}_us": round(statistics.median(ts), 1) for backend, ts in times.items()},
               **{f"{backend}_rounds_us": [round(t) for t in ts] for backend, ts in times.items()}}
        print(row, flush=True)
        rows.append(row)
        del x, call_args
        torch.cuda.empty_cache()
    if args.out:
        Path(args.out, "eager-crossover.json").write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
