"""The llama-1b projections at the scoring step's token count (B=32 windows of k+1 = 160
rows, bf16), timed in CUDA graphs in a few forms: which one the engine's linear layers
should use (bench/NOTES.md quotes the result).

Forms: ``linear`` F.linear(x, W) with W [out, in] (nn.Linear's layout, the engine's now);
``kn`` x @ Wt with Wt [in, out] contiguous; ``autotune`` F.linear through
torch.compile(mode="max-autotune-no-cudagraphs") (Triton GEMM templates searched against
cuBLAS). Each form's output is compared with ``linear``'s. A graph holds ``--chain``
calls back to back (as in a forward, where each launch follows the one before without a
host round trip); the figure is a replay's time divided by the chain.

    python3 bench/sweep_gemm.py [--rows 160] [--forms linear,kn,autotune] [--chain 16]
"""

from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F
from bench_verify import graph_time_us

# name -> (in, out) of llama-1b (bench_e2e.LLAMA_1B)
PROJECTIONS = {"qkv": (2048, 3072), "o": (2048, 2048), "gate_up": (2048, 16384), "down": (8192, 2048),
               "lm_head": (2048, 128256)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=160)
    parser.add_argument("--forms", default="linear,kn,autotune")
    parser.add_argument("--projections", default=",".join(PROJECTIONS))
    parser.add_argument("--chain", type=int, default=1, help="calls a graph replays back to back")
    parser.add_argument("--iters", type=int, default=200)
    args = parser.parse_args()
    device = torch.device("cuda")
    forms = args.forms.split(",")
    autotuned = torch.compile(F.linear, mode="max-autotune-no-cudagraphs", dynamic=False)
    for name in args.projections.split(","):
        k, n = PROJECTIONS[name]
        x = torch.randn(args.rows, k, device=device, dtype=torch.bfloat16)
        w = torch.randn(n, k, device=device, dtype=torch.bfloat16) * k**-0.5
        wt = w.t().contiguous()
        fns = {"linear": lambda: F.linear(x, w), "kn": lambda: x @ wt, "autotune": lambda: autotuned(x, w)}
        expected = F.linear(x, w).float()
        floor_us = 2 * k * n / 3.0e6  # weight bytes at 3.0 TB/s
        line = f"{name:8s} M={args.rows} K={k} N={n} (weights at 3 TB/s {floor_us:6.1f} us):"
        for form in forms:
            got = fns[form]().float()
            error = (got - expected).abs().max().item() / expected.abs().max().item()
            us = graph_time_us(lambda fn=fns[form]: [fn() for _ in range(args.chain)], device, args.iters) / args.chain
            line += f"  {form} {us:7.1f} us (rel err {error:.1e})"
        print(line, flush=True)


if __name__ == "__main__":
    main()
