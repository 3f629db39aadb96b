"""Where the Triton verify's decisions spend their time after the exact normaliser, on a GPU:
a copy of triton_kernels whose fixed_sum_kernel records its programs' first release from
the PDL wait and their last end, and whose decide_kernel records, per request, its start,
its release from the wait, when its last acceptance test resolved, when the first rounds of
residual proposals chose, scanned and tested their blocks, when its token was drawn and its
end (%globaltimer; diagnostic only: the copy's outputs are checked equal to the kernels').
Each stamp reads the timer in a branch on the value it follows, and its own reductions add
about a µs to the walk: compare stages within one run.

    python bench/trace_decide.py --shapes 16:4:128256:random,64:4:32000:random
    python bench/trace_decide.py --set PROPOSAL_ROUND=16 --shapes 64:4:128256:random:dscale1:dnoise0.1

Printed per shape (medians over --replays traced graph replays, µs from the normaliser's
last program end): the normaliser's first release and last end, then per stage of the
decisions the quantiles 0 / 50 / 100% over requests, the steps each walked and the
proposal rounds each took.
"""

from __future__ import annotations

import argparse
import importlib.util
import shutil
import statistics
import sys
import tempfile
from pathlib import Path

import torch

import specops.triton_kernels as kernels
from ab_verify import graph_of, shape_call
from profile_verify import add_set_option, apply_settings

NOW = '''

@triton.jit
def _now(dependency):
    """%globaltimer once ``dependency`` (an int32 scalar) is known: the read sits in a branch on it."""
    t = tl.zeros([], tl.int64)
    if dependency != -123456789:
        t = tl.inline_asm_elementwise("mov.u64 $0, %globaltimer;", "=l", [], dtype=tl.int64, is_pure=False, pack=1)
    return t
'''

# Trace layout (int64): [0] the normaliser's last program end (atomic max), [1] its first
# release from the wait (atomic min); then 24 a request from 8: [0] start, [1] released, [2]
# last acceptance test resolved, [3] token drawn, [4] end, [5] steps walked (i at the end),
# [7] proposal rounds, [8 + r] round r's blocks scanned, [12 + r] round r tested, [16 + r]
# round r's blocks chosen.
ROW = "trace_ptr + 8 + b.to(tl.int64) * 24"
# (file, old, new): the trace parameter and its arguments.
REPLACES = [
    ("verify_rows.py", "    batch,\n    SECOND: tl.constexpr,",
     "    batch,\n    trace_ptr,\n    SECOND: tl.constexpr,"),
    ("verify_decide.py", "    sum_splits,  # of the normaliser partials\n",
     "    sum_splits,  # of the normaliser partials\n    trace_ptr,\n"),
    ("verify.py", "**sum_flags, **first_sum_registers)", "trace_ptr=TRACE, **sum_flags, **first_sum_registers)"),
    ("verify.py", "**sum_flags, **second_sum_registers)", "trace_ptr=TRACE, **sum_flags, **second_sum_registers)"),
    ("verify.py", "else DECIDE_WARPS),\n", "else DECIDE_WARPS), trace_ptr=TRACE,\n"),
    ("verify.py", "\ndef launch_verify(\n", "\nTRACE = None\n\n\ndef launch_verify(\n"),
    ("verify_sample.py", "def propose_residual(block_sums,", "def propose_residual(trace_row, block_sums,"),
    ("verify_decide.py", "token = propose_residual(*proposing, max_logit",
     f"token = propose_residual({ROW}, *proposing, max_logit"),
]
# (file, anchor, stamp put after it)
INSERTS = [
    ("verify_rows.py",
     "    _start, num_drafts = draft_range(cu_ptr, b, num_tokens, width - 1)  # unused (dropped) when MARKED\n"
     "    chain_launch(PDL)\n", "    tl.atomic_min(trace_ptr + 1, _now(program))\n"),
    ("verify_rows.py",
     "            tl.store(part_sum_ptr + slot.to(tl.int64) * num_splits + split, total)\n"
     "        j = tl.where(verdict == FAILS, count, j + step_programs)\n",
     "    tl.atomic_max(trace_ptr, _now(j))\n"),
    ("verify_decide.py", "    b = tl.program_id(0)\n", f"    tl.store({ROW}, _now(b))\n"),
    ("verify_decide.py", "    chain_launch(PDL)\n", f"    tl.store({ROW} + 1, _now(b))\n"),
    ("verify_decide.py",
     "            passed, p_x = exact_test(z_x, q_x, u, x, in_vocab, max_logit, temperature, kth, z1, p_min, z2)\n",
     f"            tl.store({ROW} + 2, _now(passed.to(tl.int32)))\n"),
    ("verify_decide.py", "                    if token >= 0:\n",
     f"                        tl.store({ROW} + 3, _now(token))\n"),
    ("verify_decide.py", "    if i >= 0:\n        tl.store(num_accepted_ptr + b, accepted.to(tl.int32))\n",
     f"    tl.store({ROW} + 4, _now(i))\n    tl.store({ROW} + 5, i.to(tl.int64))\n"),
    ("verify_sample.py", "        q = tl.load(q_row_ptr + v, mask=v < vocab, other=0.0)\n",
     "        tl.store(trace_row + 16 + first // ROUND, _now(tl.sum(block, axis=0)))\n"),
    ("verify_sample.py", "        found = inside < MASS_BLOCK\n",
     "        tl.store(trace_row + 8 + first // ROUND, _now(tl.sum(inside, axis=0)))\n"),
    ("verify_sample.py", "        kept = tl.min(tl.where(kept, t, RESIDUAL_PROPOSALS), axis=0)\n",
     "        tl.store(trace_row + 12 + first // ROUND, _now(kept))\n"
     "        tl.store(trace_row + 7, (first // ROUND + 1).to(tl.int64))\n"),
]


def traced_package():
    """The traced copy of triton_kernels, imported as ``traced_kernels``; its verify module."""
    folder = Path(tempfile.mkdtemp()) / "traced_kernels"
    shutil.copytree(Path(kernels.__file__).parent, folder, ignore=shutil.ignore_patterns("__pycache__"))
    names = ("verify_rows.py", "verify_decide.py", "verify.py", "verify_sample.py")
    sources = {name: (folder / name).read_text() for name in names}
    for name, old, new in REPLACES:
        if old not in sources[name]:
            raise RuntimeError(f"{name} changed: {old.strip()[:60]!r} not found")
        sources[name] = sources[name].replace(old, new, 1)
    for name, anchor, text in INSERTS:
        if anchor not in sources[name]:
            raise RuntimeError(f"{name} changed: {anchor.strip()[:60]!r} not found")
        sources[name] = sources[name].replace(anchor, anchor + text, 1)
    for name in ("verify_rows.py", "verify_decide.py", "verify_sample.py"):
        head, sep, rest = sources[name].partition("\n\n\n")  # after the module's imports
        sources[name] = head + NOW + sep + rest
    for name, text in sources.items():
        (folder / name).write_text(text)
    init = folder / "__init__.py"
    spec = importlib.util.spec_from_file_location("traced_kernels", init, submodule_search_locations=[str(folder)])
    package = importlib.util.module_from_spec(spec)
    sys.modules["traced_kernels"] = package
    spec.loader.exec_module(package)
    return importlib.import_module("traced_kernels.verify")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", default="16:4:128256:random,64:4:32000:random,64:4:128256:random")
    parser.add_argument("--replays", type=int, default=30)
    add_set_option(parser)  # in the traced copy and the kernels it is checked against (apply_settings)
    args = parser.parse_args()
    device = torch.device("cuda")
    traced = traced_package()
    from specops.triton_kernels import verify as plain
    apply_settings(args.set, traced, plain)
    stages = ("start", "released", "last test", "drawn", "end")
    for shape in args.shapes.split(","):
        torch.manual_seed(0)
        label, call, logprobs = shape_call(shape, device)
        batch = call[1].shape[0]
        trace = torch.zeros(8 + 24 * batch, dtype=torch.int64, device=device)
        traced.TRACE = trace
        want = [t.clone() for t in plain.verify(*call, logprobs)]
        got = traced.verify(*call, logprobs)
        if not all(torch.equal(a, b) for a, b in zip(want, got)):
            raise AssertionError(f"{label}: the traced kernels' outputs differ from the kernels'")
        graph = graph_of(lambda: traced.verify(*call, logprobs))
        rows = []
        for _ in range(args.replays):
            trace.zero_()
            trace[1] = 2**62
            graph.replay()
            torch.cuda.synchronize()
            rows.append(trace.cpu())
        per_stage = {s: [] for s in stages}
        releases = []
        walked = []
        rounds = []
        for row in rows:
            t0 = row[0].item()  # the normaliser's last program end (with top-p, its second pass's)
            if t0 == 0:
                raise RuntimeError(f"{label}: no exact normaliser ran (one request's one-launch path, or every "
                                   "request greedy): trace a batch of two random requests or more")
            releases.append((t0 - row[1].item()) / 1e3)
            requests = row[8:].view(batch, 24)
            for k, s in enumerate(stages):
                values = requests[:, k]
                values = values[values > 0]
                if len(values):
                    per_stage[s].append([(v - t0) / 1e3 for v in values.tolist()])
            walked.extend(requests[:, 5].tolist())
            rounds.extend(requests[:, 7].tolist())
            for r in range(4):
                for k, what in ((16 + r, "blocks chosen"), (8 + r, "scanned"), (12 + r, "tested")):
                    values = requests[:, k]
                    values = values[values > 0]
                    if len(values):
                        per_stage.setdefault(f"round {r} {what}", []).append([(v - t0) / 1e3 for v in values.tolist()])
        print(f"== {label}: the normaliser's first release {statistics.median(releases):.2f} us before its last end")
        for s in [*stages, *(k for k in per_stage if k.startswith("round"))]:
            if not per_stage[s]:
                print(f"  {s:>22}: never reached")
                continue
            q = [statistics.median(sorted(r)[int(p * (len(r) - 1))] for r in per_stage[s]) for p in (0, 0.5, 1.0)]
            count = statistics.median(len(r) for r in per_stage[s])
            print(f"  {s:>22}: min {q[0]:7.2f}  median {q[1]:7.2f}  max {q[2]:7.2f}  (requests {count:.0f})")
        print(f"  steps walked (i at the end): {sorted(set(walked))}; proposal rounds: "
              f"{ {r: rounds.count(r) // args.replays for r in sorted(set(rounds))} }", flush=True)


if __name__ == "__main__":
    main()
