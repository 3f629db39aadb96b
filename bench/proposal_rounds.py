"""How the residual draws of one verify call end, counted on the reference (CPU; its
kept_proposal wrapped to record the index it returns): for each
request that rejects with draft probs, which of its RESIDUAL_PROPOSALS proposals was kept (by
round of PROPOSAL_ROUND) or whether none was and the residual pass draws the token, and the
residual mass sum(R) / sum(W) of its row. The inputs are bench_verify's (bench_sampling.make_inputs
from seed 0, its seeds and positions) on the CPU: not the GPU's draws, the same regime. A
draw keeps a proposal with probability R_x / W_x, so it takes about 1 / (residual mass)
proposals; the rounds it walks and the requests that reach the residual pass are the tail of
the decisions (bench/NOTES.md, "the bench's accepting shapes").

    python3 bench/proposal_rounds.py --shapes 64:4:128256,16:4:128256 [--close]
"""

from __future__ import annotations

import argparse
import collections

import torch

import bench_verify
from bench_sampling import make_inputs
from specops.reference import verify as reference

PROPOSAL_ROUND = 4  # triton_kernels/verify.py's, screened calls


def count(B: int, k: int, V: int, drafts: tuple[float, float] | None) -> dict:
    """One verify call's residual draws on bench_verify's inputs: accepted mean, bonus draws,
    the kept proposals' rounds (0: none kept, the residual pass) and the median residual mass."""
    seen = []
    keep = reference.kept_proposal

    def counting(weights, residual, seed, position):  # the reference's own, its index recorded
        kept = keep(weights, residual, seed, position)
        seen.append((None if kept is None else kept[0], float(residual.double().sum() / weights.double().sum())))
        return kept

    torch.manual_seed(0)
    closeness = dict(zip(("draft_scale", "draft_noise"), drafts)) if drafts else {}
    x = make_inputs(B, k, V, "random", torch.device("cpu"), False, **closeness)
    reference.kept_proposal = counting
    try:
        _out, accepted, _ = reference.verify(*bench_verify.verify_args(x, torch.device("cpu")))
    finally:
        reference.kept_proposal = keep
    rounds = collections.Counter(0 if t is None else t // PROPOSAL_ROUND + 1 for t, _ in seen)
    masses = sorted(m for _, m in seen)
    return {"accepted": accepted.float().mean().item(), "bonus": int((accepted == k).sum()), "residual": len(seen),
            "rounds": dict(sorted(rounds.items())), "mass": masses[len(masses) // 2] if masses else None}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--shapes", default="64:4:128256,16:4:128256,64:4:32000", help="B:k:V, comma-separated")
    parser.add_argument("--close", action="store_true", help="bench_verify's close drafts (CLOSE_DRAFTS) only")
    args = parser.parse_args()
    for shape in args.shapes.split(","):
        B, k, V = (int(x) for x in shape.split(":"))
        for drafts in ((bench_verify.CLOSE_DRAFTS,) if args.close else (None, bench_verify.CLOSE_DRAFTS)):
            c = count(B, k, V, drafts)
            print(f"B={B} k={k} V={V} {bench_verify.row_mode('random', None, None, drafts)}: "
                  f"{c['accepted']:.2f} accepted, {c['bonus']} bonus draws, {c['residual']} residual draws, "
                  f"kept in round (0: none, the residual pass) {c['rounds']}, residual mass median {c['mass']:.3f}",
                  flush=True)


if __name__ == "__main__":
    main()
