"""Where paged decode's time over the floor goes, on a GPU: copies of
triton_kernels/attention.py with one piece of _attend_tile's work taken out (diagnostic only:
the copies' outputs are wrong by design and not checked), each timed at the kernel's planned
launch beside the kernel itself, in alternating rounds of queued graph replays.

Every variant still loads each key and value tile whole and uses every element, so it moves
the kernel's bytes; what it drops is work on them:
- no-exp: the online softmax's exp2s (p = s - max, alpha = 1);
- no-qk: the scores' dot (a key's score is the max of its row of K, plus a query row's sum);
- no-pv: the p.V dot (the accumulator adds V's column sums and p's row sums);
- no-mask: the visibility mask (every key loaded counts, padding rows too);
- read-only: no-qk, no-exp and no-pv at once.
The read probe (probe_read_balance.py) read these bytes at 1.000-1.005x the floor where the
kernel took 1.043-1.05x (bench/NOTES.md, session 75): the variant that closes the gap names
the work to cut. Triton stages through shared memory (cp.async) only the loads that feed a
dot, so a variant without one reads that tile into registers instead (offline sm_90, B=64
decode tile: the kernel 126 registers and 64 LDGSTS; no-qk 128 and 72, no-pv 148 and 40,
read-only 106 and none, as the probe): read each time beside its load path.

    python3 bench/ablate_attention.py --shapes 64,1024,1 64,1024,5 --out $OUT
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path

import common
import torch
from bench_attention import graph_replay, parse_shape
from sweep_attention import BLOCK_SIZE, inputs, kernel_module

from specops.triton_kernels import attention as kernels

NO_EXP = [("    alpha = _exp2(m_i - m_safe, FAST_EXP2)\n    p = _exp2(s - m_safe[:, None], FAST_EXP2)\n",
           "    alpha = tl.zeros_like(m_i) + 1.0\n    p = s - m_safe[:, None]\n")]
NO_QK = [("""    if IEEE:
        s = tl.dot(q, tl.trans(k), input_precision="ieee")
    else:
        s = tl.dot(q, tl.trans(k))
""", "    s = tl.max(k, axis=1).to(tl.float32)[None, :] + tl.sum(q.to(tl.float32), axis=1)[:, None]\n")]
NO_PV = [("""    if IEEE:
        acc = acc * alpha[:, None] + tl.dot(p, v, input_precision="ieee")
    else:
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
""", "    acc = acc * alpha[:, None] + (tl.sum(v.to(tl.float32), axis=0)[None, :] + tl.sum(p, axis=1)[:, None])\n")]
NO_MASK = [('    s = tl.where(visible, s, float("-inf"))\n', "")]
ABLATIONS = {"no-exp": NO_EXP, "no-qk": NO_QK, "no-pv": NO_PV, "no-mask": NO_MASK, "read-only": NO_QK + NO_EXP + NO_PV}


def ablated_module(name: str):
    """triton_kernels/attention.py with ``name``'s edits, loaded as a module of its own."""
    source = Path(kernels.__file__).read_text()
    for anchor, text in ABLATIONS[name]:
        if source.count(anchor) != 1:
            raise RuntimeError(f"triton_kernels/attention.py changed: {anchor.strip()!r} not found once")
        source = source.replace(anchor, text)
    return kernel_module(source, f"ablate_{name.replace('-', '_')}")


def ablate_shape(shape, device, copy_bw_tbs: float, rounds: int, iters: int, names=tuple(ABLATIONS)) -> list[dict]:
    B, L, q_len, Hq, Hkv, D = shape
    args = inputs(*shape, device)
    floor_us = 2 * (2 * B * L * Hkv * D + 2 * B * q_len * Hq * D) / copy_bw_tbs / 1e6
    launchers = {"kernel": kernels.launch_paged_attention}
    launchers.update({name: ablated_module(name).launch_paged_attention for name in names})
    replays = {name: graph_replay(lambda f=f: f(*args, max_query_len=q_len)) for name, f in launchers.items()}
    times = {name: [] for name in replays}
    for _ in range(rounds):  # in turn, so that a drift of the machine hits every variant alike
        for name, replay in replays.items():
            times[name].append(common.time_us(replay, device, iters=iters, queued=True))
    rows = []
    for name, ts in times.items():
        us = statistics.median(ts)
        rows.append({"bench": "ablate_attention", "impl": "specops-triton", "variant": name, "B": B, "L": L,
                     "q_len": q_len, "Hq": Hq, "Hkv": Hkv, "D": D, "block": BLOCK_SIZE, "us": round(us, 2),
                     "rounds_us": [round(t, 2) for t in ts], "floor_us": round(floor_us, 2)})
        print(f"B={B} L={L} q_len={q_len}: {name:10s} {us:7.1f} us ({us / floor_us:.3f}x the floor)", flush=True)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--shapes", nargs="+", default=["64,1024,1"], help="B,L,q_len (GQA 32/8, D 128)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--iters", type=int, default=50)
    parser.add_argument("--out", default=None, help="folder for the results file")
    args = parser.parse_args()
    device = torch.device("cuda")
    env = common.env_stamp(device)
    rows = []
    for text in args.shapes:
        B, L, q_len = parse_shape(text)
        rows += ablate_shape((B, L, q_len, 32, 8, 128), device, env["copy_bw_tbs"], args.rounds, args.iters)
    if args.out:
        print(f"wrote {common.write_results('ablate_attention', env, rows, args.out)}")


if __name__ == "__main__":
    main()
