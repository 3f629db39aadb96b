"""How many rounds of the Triton verify's top-k / top-p searches read their rows: the
launcher runs as it is, and after each search launch the splits' kept-key records
(verify_search.py) say which programs will read their row in the next round. Runs on a
GPU or, on bench_sampling's random logits at a reduced batch, under TRITON_INTERPRET=1
on the CPU (--sms sets the split count the interpreter pretends to have SMs for).

    TRITON_INTERPRET=1 python bench/search_rounds.py --shapes 2:4:128256 --sms 5   # 2 splits a row, as B=64 on an H100
    python bench/search_rounds.py --shapes 64:4:128256,16:4:128256,1:4:128256      # a GPU
"""

from __future__ import annotations

import argparse

import torch

from bench_sampling import make_inputs
from bench_verify import verify_args
from profile_verify import add_set_option, apply_settings
from specops.triton_kernels import verify as triton_verify


def row_reads(shape: str, top_k: int, top_p: float, device: torch.device) -> tuple[dict, int]:
    """{mode: [programs reading their row in each round]} and the programs a round."""
    B, k, V = (int(part) for part in shape.split(":"))
    x = make_inputs(B, k, V, "random", device, for_flashinfer=False)
    args = verify_args(x, device, top_k, top_p)
    kernel = triton_verify.threshold_search_kernel
    records = []

    class Recorded:  # the launcher's kernel[grid](...) with the kept records copied after each launch
        def __getitem__(self, grid):
            def launch(*launch_args, **kwargs):
                kernel[grid](*launch_args, **kwargs)
                records.append((int(kwargs["MODE"]), grid[0] * grid[1], launch_args[4][:, 0].clone()))
            return launch

    triton_verify.threshold_search_kernel = Recorded()
    try:
        triton_verify.verify(*args, False)
    finally:
        triton_verify.threshold_search_kernel = kernel
    reads, kept_after = {}, {}  # per search: programs reading their row a round; splits kept
    for mode, programs, kept in records:
        name = ("top-k", "top-p")[mode]
        reads.setdefault(name, []).append(programs - kept_after.get(name, 0))
        kept_after[name] = int((kept >= 0).sum())
    return reads, programs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", default="64:4:128256,16:4:128256,1:4:128256", help="B:k:V, comma-separated")
    parser.add_argument("--top-k", type=int, default=50)
    parser.add_argument("--top-p", type=float, default=0.9)
    parser.add_argument("--sms", type=int, default=None, help="SMs the interpreter pretends to have")
    add_set_option(parser)
    args = parser.parse_args()
    apply_settings(args.set)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if args.sms:
        triton_verify.CPU_NUM_SMS = args.sms
    for shape in args.shapes.split(","):
        torch.manual_seed(0)
        reads, programs = row_reads(shape, args.top_k, args.top_p, device)
        for mode, rounds in reads.items():
            print(f"B:k:V {shape} {mode} {args.top_k if mode == 'top-k' else args.top_p}: programs reading their "
                  f"row by round {rounds} of {programs}: {sum(rounds) / programs:.2f} row passes")


if __name__ == "__main__":
    main()
