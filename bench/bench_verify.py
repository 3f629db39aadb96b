"""Fused verify: specops.verify from target logits against the peers' full paths at the
shapes of ANCHORS.md section 1 (bench "verify", DESIGN.md's row format).

Rows, all from fp32 target logits (+ bonus logits), temperature 1 (greedy: 0):
  specops-<backend>  specops.verify (draws in-kernel from Philox), validate=False; greedy
                     rows pass temperature=None (the all-greedy promise an engine makes
                     from its host-side sampling parameters).
  specops-<backend>-zeros  greedy rows only: a temperature tensor of zeros, the
                     per-request path a batch mixing greedy and random requests takes.
  torch-eager        softmax, then the decomposed pipeline written in torch (bench_sampling).
  flashinfer         flashinfer.sampling.softmax + chain_speculative_sampling ("full").
  flashinfer-kern    chain_speculative_sampling alone, from ready probs ("kern").
Filtered rows (FILTERED_SHAPES, modes "random+topk50+topp0.9" and "random+topp0.9"): every
request with top-k then top-p, or top-p alone; torch eager filters by topk and sort,
FlashInfer by top_k_renorm_probs and top_p_renorm_probs, both after a softmax and before
the same pipelines; the floor is the unfiltered one (a row can be filtered in the pass that
reads it).
Accepting rows (ACCEPTING_SHAPES, modes "random+dscale1+dnoise0.1"): drafts close to the
target (bench_sampling.make_inputs' draft scale 1, noise 0.1: ~0.88 of the steps pass against
~0.35 at the defaults), so most requests accept every draft and draw their bonus token, or
reject late: the regime of a good draft model, where the default inputs reject early (their
n-gram and greedy drafts accept none). Every row carries ``accepted``: the drafts a request
accepted, the mean over the batch, from specops' own output on the shape's inputs.
Floor (ANCHORS.md): every target and bonus logit row read once, plus one residual row
pair per request (random: target and draft rows; n-gram: the target row; greedy: none):
4 V (T + B + r B) bytes, r = 2 random, 1 n-gram, 0 greedy, over the copy bandwidth.

``us`` is the eager call's time: every call of a shape (specops and peers) is timed in turn,
``--rounds`` (EAGER_ROUNDS) rounds of ``--iters`` calls (common.time_in_turns), and ``us`` is the median of
the rounds' medians, ``us_rounds`` the rounds' own. An eager call at B = 1-16 is bound by the
host's submission, which drifts within a run: timed one after another, the same call read
42 µs in one run and 55 in the next, and two backends' order flipped between runs.

specops and FlashInfer rows on a GPU also carry ``us_graph``: the same call captured in a CUDA
graph and replayed (no Python or launch overhead; how an engine runs its step; FlashInfer's
draws then replay the seed and offset its capture took, the same kernels), timed as ANCHORS.md
times (events around each replay), and ``us_graph_queued``: the same replays with the GPU
queue kept ahead of the host (common.time_us), the GPU's time alone. The two differ where a
replay takes less GPU time than the host takes to submit it (B = 1: then each event
interval holds the host's submission too, which moves between processes). ``sm_clock_mhz``:
the SM clock read just after those replays (launch-bound B = 1 rows slow down when it
drops; their time also grows ~0.6 µs with each draft accepted, bench/NOTES.md).

Before timing, each specops backend is checked against specops.reference.verify on the
first requests of the batch (a seeded request's tokens do not depend on its batch).
"""

from __future__ import annotations

import argparse
import functools
import os
import statistics

import torch

import common
import specops
from bench_sampling import (
    QUICK_SHAPES,
    SHAPES,
    draw,
    flashinfer_generator,
    flashinfer_pipeline,
    full_input,
    import_flashinfer,
    make_inputs,
    torch_pipeline,
)
from specops.reference.verify import verify as reference_verify

# Rows also timed as CUDA-graph replays: specops' and FlashInfer's (a peer's replays beside
# ours, the same measure; its eager row stays where its call cannot be captured).
GRAPHED = ("specops", "flashinfer")
EAGER_ROUNDS = 5  # rounds of a shape's eager calls in turn (common.time_in_turns)
CHECKED_REQUESTS = 4  # requests compared with the reference per shape (the reference is slow)
# (B, k, V, mode) -> FlashInfer "full" µs on an H100, from ANCHORS.md section 1.
FLASHINFER_FULL_ANCHOR_US = {
    (1, 4, 128256, "random"): 153, (1, 4, 128256, "ngram"): 123, (16, 4, 128256, "random"): 156,
    (64, 4, 128256, "random"): 357, (64, 4, 128256, "ngram"): 355, (256, 4, 128256, "random"): 1085,
    (64, 8, 151936, "random"): 644, (64, 4, 32000, "random"): 93,
}
ANCHOR_LABEL = "FlashInfer full (ANCHORS.md, H100)"
# (B, k, V, mode, top_k, top_p): every request filtered by top-k then top-p (top-p alone
# where top_k is None).
FILTERED_SHAPES = [(64, 4, 128256, "random", 50, 0.9), (16, 4, 128256, "random", 50, 0.9),
                   (1, 4, 128256, "random", 50, 0.9), (64, 4, 128256, "random", None, 0.9)]
QUICK_FILTERED_SHAPES = [(8, 3, 5000, "random", 50, 0.9), (8, 3, 5000, "random", None, 0.9)]
# (B, k, V, mode, top_k, top_p, (draft scale, draft noise)): drafts that mostly pass.
CLOSE_DRAFTS = (1.0, 0.1)
ACCEPTING_SHAPES = [(64, 4, 128256, "random", None, None, CLOSE_DRAFTS),
                    (16, 4, 128256, "random", None, None, CLOSE_DRAFTS),
                    (64, 4, 32000, "random", None, None, CLOSE_DRAFTS)]
QUICK_ACCEPTING_SHAPES = [(8, 3, 5000, "random", None, None, CLOSE_DRAFTS)]


def row_mode(mode: str, top_k: int | None, top_p: float | None, drafts: tuple[float, float] | None = None) -> str:
    """A row's mode: the drafts' mode, then the filters (random+topk50+topp0.9), then the
    drafts' scale and noise where not the defaults (random+dscale1+dnoise0.1)."""
    return (mode + (f"+topk{top_k}" if top_k else "") + (f"+topp{top_p}" if top_p else "")
            + (f"+dscale{drafts[0]:g}+dnoise{drafts[1]:g}" if drafts else ""))


def shape_label(B: int, k: int, V: int, mode: str, top_k: int | None, top_p: float | None,
                drafts: tuple[float, float] | None = None) -> str:
    """A shape as --shapes names it: B:k:V:mode, the mode as its rows carry it."""
    return f"{B}:{k}:{V}:{row_mode(mode, top_k, top_p, drafts)}"


def pick_shapes(shapes: list, names: str) -> list:
    """The shapes (B, k, V, mode, top_k, top_p) that ``names`` (--shapes: shape_label's, comma
    separated) names, in the benchmark's order; a name that is none of them is an error."""
    wanted = set(names.split(","))
    unknown = wanted - {shape_label(*s) for s in shapes}
    if unknown:
        raise ValueError(f"--shapes names no shape of the benchmark: {sorted(unknown)} "
                         f"(its shapes: {[shape_label(*s) for s in shapes]})")
    return [s for s in shapes if shape_label(*s) in wanted]


def verify_args(x, device, top_k: int | None = None, top_p: float | None = None) -> tuple:
    """specops.verify's arguments for bench_sampling's inputs (every request with the same
    top-k / top-p when given)."""
    B, k, V = x.shape
    temperature = torch.full((B,), 0.0 if x.mode == "greedy" else 1.0, device=device)
    seeds = torch.arange(B, dtype=torch.int64, device=device) + 1000
    positions = torch.full((B,), 17, dtype=torch.int64, device=device)
    bonus_logits = x.logits_with_bonus[:, k].contiguous()
    top_k = None if top_k is None else torch.full((B,), top_k, dtype=torch.int32, device=device)
    top_p = None if top_p is None else torch.full((B,), top_p, dtype=torch.float32, device=device)
    return (x.target_logits.contiguous(), bonus_logits, x.draft_token_ids, x.draft_probs, x.cu_num_draft_tokens,
            temperature, top_k, top_p, seeds, positions, k)


def first_requests(args: tuple, count: int, k: int) -> tuple:
    """The same call restricted to its first ``count`` requests (k drafts each), on the CPU."""
    rows = count * k
    target, bonus, drafts, draft_probs, cu, temperature, top_k, top_p, seeds, positions, width = args
    first = lambda t: None if t is None else t[:count].cpu()  # noqa: E731
    return (target[:rows].cpu(), bonus[:count].cpu(), drafts[:rows].cpu(),
            None if draft_probs is None else draft_probs[:rows].cpu(), cu[:count].cpu(), first(temperature),
            first(top_k), first(top_p), first(seeds), first(positions), width)


def filtered_probs(logits: torch.Tensor, top_k: int | None, top_p: float) -> torch.Tensor:
    """torch eager top-k (where given) then top-p (on the renormalised probs) of each row, by
    sorting."""
    if top_k:
        logits = logits.masked_fill(logits < torch.topk(logits, top_k, dim=-1).values[:, -1:], float("-inf"))
    probs = torch.softmax(logits, dim=-1)
    sorted_probs, order = torch.sort(probs, dim=-1, descending=True)
    outside = (sorted_probs.cumsum(-1) - sorted_probs) >= top_p  # the mass before a token reaches top_p
    probs = probs.scatter(-1, order, sorted_probs.masked_fill(outside, 0.0))
    return probs / probs.sum(-1, keepdim=True)


def flashinfer_filtered(flashinfer, top_k: int | None, top_p: float):
    """FlashInfer's path from logits with top-k (where given) and top-p: softmax,
    top_k_renorm_probs, top_p_renorm_probs, chain_speculative_sampling."""
    def run(x) -> torch.Tensor:
        B, k, V = x.shape
        probs = flashinfer.sampling.softmax(x.logits_with_bonus.view(-1, V))
        if top_k:
            probs = flashinfer.sampling.top_k_renorm_probs(probs, top_k)
        probs = flashinfer.sampling.top_p_renorm_probs(probs, top_p).view(B, k + 1, V)
        out, _, _ = flashinfer.sampling.chain_speculative_sampling(
            x.flashinfer_draft_probs, x.draft_token_ids.view(B, k), probs,
            generator=flashinfer_generator(probs.device))
        return out

    return run


def floor_bytes(B: int, k: int, V: int, mode: str) -> int:
    residual_rows = {"random": 2, "ngram": 1, "greedy": 0}[mode]
    return 4 * V * (B * k + B + residual_rows * B)


def graph_time_us(fn, device, iters: int, queued: bool = False) -> float:
    """Median time of one replay of ``fn`` captured in a CUDA graph: the kernels' time
    without the Python and launch overhead of an eager call (how engines run a step).
    ``queued``: with the GPU queue kept ahead of the host (common.time_us), so a replay
    shorter than its own host submission is not timed with that submission."""
    return common.time_us(common.captured(fn).replay, device, iters=iters, queued=queued)


def bench_shape(x, device, backends, flashinfer, copy_bw_tbs, iters, top_k=None, top_p=None,
                rounds=EAGER_ROUNDS, drafts=None) -> list[dict]:
    B, k, V = x.shape
    mode = row_mode(x.mode, top_k, top_p, drafts)
    accepted = None  # the drafts a request accepted (batch mean), from the first specops output
    calls: dict[str, tuple] = {}  # impl -> (call, note), timed together below

    def add(impl: str, fn, note: str = "") -> None:
        try:
            fn()
        except Exception as error:  # a kernel that is missing or failing: report, go on
            print(f"skipped {impl} B={B} k={k} V={V} {mode}: {type(error).__name__}: {error}")
            return
        calls[impl] = (fn, note)

    args = verify_args(x, device, top_k, top_p)
    small = first_requests(args, min(B, CHECKED_REQUESTS), k)
    want = reference_verify(*small)
    variants = [("", args, small)]
    if x.mode == "greedy":  # temperature=None (every request greedy, promised), then zeros
        variants = [("", args[:5] + (None,) + args[6:], small[:5] + (None,) + small[6:]), ("-zeros", args, small)]
    for backend in backends:
        for suffix, call_args, small_args in variants:
            impl = f"specops-{backend}{suffix}"
            run = functools.partial(specops.verify, *call_args, backend=backend, validate=False)
            whole = run() if device.type != "cpu" or accepted is None else None
            if accepted is None:  # the whole batch's, from the first backend's output
                accepted = whole[1].float().mean().item()
            if device.type == "cpu":
                got = specops.verify(*small_args, backend=backend, validate=False)
            else:  # the first requests of the full batch: same seeds and positions as `small`
                got = tuple(t[: small[4].shape[0]] for t in whole[:2])
            note = "temperature=None" if call_args[5] is None else ""
            if not all(torch.equal(g.cpu(), w) for g, w in zip(got[:2], want[:2])):
                print(f"*** MISMATCH: {impl} B={B} k={k} V={V} {mode} differs from the reference")
                note = "output differs from the reference"
            add(impl, run, note)
    if top_k or top_p:  # every request filtered (bench_filtered's shapes): the peers' filtered paths
        add("torch-eager", lambda: torch_pipeline(x, filtered_probs(x.target_logits, top_k, top_p), *draw(x)))
        if flashinfer is not None:
            add("flashinfer", functools.partial(flashinfer_filtered(flashinfer, top_k, top_p), x),
                note="softmax + top_k_renorm_probs + top_p_renorm_probs + chain_speculative_sampling")
    else:
        add("torch-eager", lambda: torch_pipeline(x, full_input(x), *draw(x)))
        if flashinfer is not None and x.mode != "greedy":
            add("flashinfer", functools.partial(flashinfer_pipeline(flashinfer, from_logits=True), x),
                note="softmax + chain_speculative_sampling; own RNG, not checked")
            add("flashinfer-kern", functools.partial(flashinfer_pipeline(flashinfer, from_logits=False), x),
                note="chain_speculative_sampling from ready probs; own RNG, not checked")

    # The eager calls of the shape in turn, `rounds` rounds (common.time_in_turns): an
    # eager call at B = 1-16 is bound by its host submission, which drifts within a run.
    times = common.time_in_turns({impl: fn for impl, (fn, _) in calls.items()}, device, rounds, iters)
    rows = []
    for impl, (fn, note) in calls.items():
        row = {"bench": "verify", "impl": impl, "B": B, "k": k, "V": V, "mode": mode,
               "us": round(statistics.median(times[impl]), 2), "us_rounds": [round(t, 1) for t in times[impl]],
               "floor_us": round(floor_bytes(B, k, V, x.mode) / copy_bw_tbs / 1e6, 2)}
        if accepted is not None:
            row["accepted"] = round(accepted, 3)
        if impl.startswith(GRAPHED) and device.type == "cuda":
            try:
                row["us_graph"] = round(graph_time_us(fn, device, iters), 2)
                row["us_graph_queued"] = round(graph_time_us(fn, device, iters, queued=True), 2)
            except Exception as error:  # noqa: BLE001 -- a peer's uncapturable call keeps its eager row
                if impl.startswith("specops"):
                    raise
                torch.cuda.synchronize()
                print(f"no CUDA graph for {impl} B={B} k={k} V={V} {mode}: {type(error).__name__}: {error}")
                note = "; ".join(filter(None, (note, "not capturable in a CUDA graph")))
            if (clock := common.sm_clock_mhz(device)) is not None and "us_graph" in row:
                row["sm_clock_mhz"] = clock  # read just after the replays
        rows.append(row | ({"note": note} if note else {}))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description="Fused verify benchmark (see the module docstring).")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--quick", action="store_true", help="small shapes (smoke runs)")
    parser.add_argument("--out", default=str(common.REPO_ROOT / "bench" / "results"))
    parser.add_argument("--no-flashinfer", action="store_true")
    parser.add_argument("--iters", type=int, default=50)
    parser.add_argument("--rounds", type=int, default=EAGER_ROUNDS,
                        help="rounds of the eager calls in turn (1 for smoke runs)")
    parser.add_argument("--backends", default=None, help="comma-separated specops backends (default: all here)")
    parser.add_argument("--only-filtered", action="store_true", help="only the top-k / top-p shapes")
    parser.add_argument("--shapes", default=None, metavar="B:k:V:mode[,...]",
                        help="only these of the plain and filtered shapes (a filtered one's mode as its rows': "
                             "random+topk50+topp0.9)")
    args = parser.parse_args()
    device = torch.device(args.device)
    torch.manual_seed(0)
    env = common.env_stamp(device)
    print(env)
    if args.backends:
        backends = args.backends.split(",")
    elif device.type == "cuda":
        backends = ["cuda", "triton"]
    else:
        backends = ["cpu"] + (["triton"] if os.environ.get("TRITON_INTERPRET") == "1" else [])
    flashinfer = None if args.no_flashinfer or device.type != "cuda" else import_flashinfer()
    rows = []
    plain = QUICK_SHAPES if args.quick else SHAPES
    shapes = [] if args.only_filtered else [(*shape, None, None, None) for shape in plain]
    shapes += [(*shape, None) for shape in (QUICK_FILTERED_SHAPES if args.quick else FILTERED_SHAPES)]
    if not args.only_filtered:
        shapes += QUICK_ACCEPTING_SHAPES if args.quick else ACCEPTING_SHAPES
    if args.shapes:
        try:
            shapes = pick_shapes(shapes, args.shapes)
        except ValueError as error:
            parser.error(str(error))
    for B, k, V, mode, top_k, top_p, drafts in shapes:
        # Each shape's inputs from the same seed: the torch pipeline's draws consume the global
        # generator, so without it a row's data hung on how many calls the shapes before it
        # timed (the B=256 Triton row read 213-247 µs between runs for its data; NOTES).
        torch.manual_seed(0)
        closeness = dict(zip(("draft_scale", "draft_noise"), drafts)) if drafts else {}
        x = make_inputs(B, k, V, mode, device, flashinfer is not None, **closeness)
        rows += bench_shape(x, device, backends, flashinfer, env["copy_bw_tbs"], args.iters, top_k, top_p, args.rounds,
                            drafts)
        if device.type == "cuda":
            torch.cuda.empty_cache()
    print()
    anchor = {ANCHOR_LABEL: lambda row: FLASHINFER_FULL_ANCHOR_US.get((row["B"], row["k"], row["V"], row["mode"]))}
    common.print_table(rows, ("B", "k", "V", "mode"), ("torch-eager", "flashinfer", "flashinfer-kern"), anchor)
    for row in rows:
        if "us_graph" in row:
            print(f"graph replay  B={row['B']:>3} k={row['k']} V={row['V']:>6} {row['mode']:>6} {row['impl']:>15}: "
                  f"{row['us_graph']:.1f} us ({row['us_graph'] / row['floor_us']:.2f}x floor), "
                  f"queued {row['us_graph_queued']:.1f} us, {row.get('accepted', float('nan')):.2f} accepted")
    path = common.write_results("verify", env, rows, args.out)
    print(f"wrote {path}")
    try:
        import plot_results

        print(f"wrote {plot_results.plot([path])}")
    except ImportError as error:
        print(f"no plot ({error})")


if __name__ == "__main__":
    main()
