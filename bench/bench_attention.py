"""Paged attention: specops.paged_attention against FlashInfer and torch eager at the shapes
of ANCHORS.md section 2 (bench "attention", DESIGN.md's row format).

Shapes: GQA 32 query / 8 KV heads, head dim 128, bf16, block 16, NHD caches whose blocks are
shuffled (a random permutation), every sequence L keys long, q_len 1 (decode) or 5 (verify
of k = 4 drafts, bottom-right causal).

Rows (impl):
  specops-<backend>  specops.paged_attention, validate=False, max_query_len=q_len (the hint an
                     engine has: 1 for decode, k + 1 for verify) (Triton; CUDA when the op has a
                     CUDA kernel: backend="cuda" raising NotImplementedError skips it).
  flashinfer         q_len 1: BatchDecodeWithPagedKVCacheWrapper, the faster of its
                     tensor-core and CUDA-core paths (--fi-decode); q_len 5:
                     BatchPrefillWithPagedKVCacheWrapper, causal=True.
  torch-eager        gather K/V through the block table, then SDPA (GQA, causal mask).
Stages: "eager" times each call as issued from Python (launch overheads included, as a
serving loop without graphs sees them); "cuda-graph" times replays of a CUDA graph of the
same call (kernel time; skipped for an impl whose call cannot be captured), CUDA events
around each replay as ANCHORS.md times them; a "cuda-graph" row also carries
"us_graph_queued", the same replays with the GPU queue kept ahead of the host
(common.time_us queued=True): the GPU time of a replay. The two differ only where a
replay's GPU time is shorter than its host submission (the B = 1 rows), where the
events-per-replay figure includes the wait for the host (bench/NOTES.md); and
"sm_clock_mhz", the SM clock read just after the replays (launch-bound B = 1 rows slow
down when it drops).
Floor (ANCHORS.md): K + V + Q + O bytes once, over the copy bandwidth measured in this run.

Before timing, every impl's output is compared once per shape with a float32 eager result
(gather + SDPA on upcast tensors): "max_err" is the largest absolute difference, and a
relative error ||out - ref|| / ||ref|| over 1e-2 marks the row "output differs".

    python3 bench/bench_attention.py --quick --out $OUT      # the key shapes (ANCHORS.md)
    python3 bench/bench_attention.py --shapes 64,1024,1 64,1024,5 --out $OUT   # these shapes only
    TRITON_INTERPRET=1 python3 bench/bench_attention.py --device cpu   # smoke run, tiny shapes
"""

from __future__ import annotations

import argparse
import functools
import os
import time

import common
import torch

import specops

NUM_HEADS, NUM_KV_HEADS, HEAD_DIM, BLOCK_SIZE = 32, 8, 128, 16
DTYPE = torch.bfloat16
CPU_DTYPE = torch.float16  # the interpreter's bfloat16 dot is not faithful
DTYPE_NAMES = {torch.bfloat16: "bf16", torch.float16: "fp16"}
SETTLE_SECONDS = 0.5  # untimed calls after each shape's reference (see Runner.bench_shape)
MAX_RELATIVE_ERROR = 1e-2  # bf16 (the tests' tolerance; fp16's is tighter)
# (B, L, q_len) -> FlashInfer µs on an H100 (ANCHORS.md section 2).
FLASHINFER_ANCHOR_US = {
    (1, 4096, 1): 28, (1, 4096, 5): 107, (16, 4096, 1): 119, (16, 4096, 5): 312, (64, 1024, 1): 114,
    (64, 1024, 5): 367, (64, 4096, 1): 379, (64, 4096, 5): 1364, (128, 4096, 1): 734, (128, 4096, 5): 3302,
    (32, 16384, 1): 733, (32, 16384, 5): 2400,
}
ANCHOR_LABEL = "FlashInfer (ANCHORS.md, H100)"
SHAPES = list(FLASHINFER_ANCHOR_US)
QUICK_SHAPES = [(1, 4096, 1), (1, 4096, 5), (16, 4096, 1), (16, 4096, 5), (64, 4096, 1), (64, 4096, 5)]
CPU_SHAPES = [(1, 256, 1), (1, 256, 5), (4, 64, 5)]  # interpreter smoke run


class Batch:
    """One shape's inputs: shuffled blocks, every sequence ``L`` keys, ``q_len`` rows each."""

    def __init__(self, B: int, L: int, q_len: int, device: torch.device, dtype: torch.dtype, seed: int = 0):
        g = torch.Generator(device=device).manual_seed(seed)
        self.shape, self.dtype = (B, L, q_len), dtype
        blocks_per_seq = -(-L // BLOCK_SIZE)
        num_blocks = B * blocks_per_seq
        cache_shape = (num_blocks, BLOCK_SIZE, NUM_KV_HEADS, HEAD_DIM)
        self.key_cache = torch.randn(cache_shape, generator=g, device=device).to(dtype)
        self.value_cache = torch.randn(cache_shape, generator=g, device=device).to(dtype)
        perm = torch.randperm(num_blocks, generator=g, device=device)
        self.block_table = perm.view(B, blocks_per_seq).to(torch.int32)  # [B, max_blocks]
        self.seq_lens = torch.full((B,), L, dtype=torch.int32, device=device)
        self.cu_query_lens = (torch.arange(B + 1, device=device) * q_len).to(torch.int32)
        self.query = torch.randn(B * q_len, NUM_HEADS, HEAD_DIM, generator=g, device=device).to(dtype)
        self.scale = HEAD_DIM**-0.5

    def specops_args(self) -> tuple:
        return (self.query, self.key_cache, self.value_cache, self.block_table, self.seq_lens, self.cu_query_lens,
                self.scale)

    def floor_bytes(self) -> int:
        return floor_bytes(*self.shape, NUM_HEADS, NUM_KV_HEADS, HEAD_DIM, torch.finfo(self.dtype).bits // 8)


def floor_bytes(B: int, L: int, q_len: int, Hq: int, Hkv: int, D: int, element_size: int) -> int:
    """The fewest bytes a call moves: every sequence's keys and values, its queries and outputs."""
    return element_size * (2 * B * L * Hkv * D + 2 * B * q_len * Hq * D)


def torch_eager(x: Batch, compute_dtype: torch.dtype | None = None) -> torch.Tensor:
    """Gather every sequence's K and V through the block table, then SDPA with GQA and the
    bottom-right causal mask; ``compute_dtype`` upcasts (the float32 check)."""
    B, L, q_len = x.shape
    blocks = -(-L // BLOCK_SIZE)

    def gather(cache):
        kv = cache[x.block_table[:, :blocks].long()].reshape(B, blocks * BLOCK_SIZE, NUM_KV_HEADS, HEAD_DIM)[:, :L]
        return kv.transpose(1, 2) if compute_dtype is None else kv.transpose(1, 2).to(compute_dtype)

    q = x.query.view(B, q_len, NUM_HEADS, HEAD_DIM).transpose(1, 2)
    q = q if compute_dtype is None else q.to(compute_dtype)
    mask = None
    if q_len > 1:
        key_positions = torch.arange(L, device=q.device)
        mask = key_positions[None, :] <= (L - q_len + torch.arange(q_len, device=q.device))[:, None]
    out = torch.nn.functional.scaled_dot_product_attention(
        q, gather(x.key_cache), gather(x.value_cache), attn_mask=mask, scale=x.scale, enable_gqa=True
    )
    return out.transpose(1, 2).reshape(B * q_len, NUM_HEADS, HEAD_DIM)


def import_flashinfer():
    try:
        import flashinfer

        print(f"FlashInfer {flashinfer.__version__} imported")
        return flashinfer
    except Exception as error:  # noqa: BLE001 -- any failure to import means "run without it"
        print(f"\n*** FlashInfer does not import ({type(error).__name__}: {error}): no FlashInfer rows ***\n")
        return None


def flashinfer_calls(flashinfer, x: Batch, decode_paths: tuple[str, ...]) -> dict[str, object]:
    """Planned FlashInfer calls for this batch, by path name (plan once, run many)."""
    B, L, q_len = x.shape
    device = x.query.device
    blocks = x.block_table.shape[1]
    indptr = (torch.arange(B + 1, device=device) * blocks).to(torch.int32)
    indices = x.block_table.flatten()
    last_page_len = torch.full((B,), (L - 1) % BLOCK_SIZE + 1, dtype=torch.int32, device=device)
    cache = (x.key_cache, x.value_cache)
    calls = {}
    if q_len == 1:
        for path in decode_paths:
            workspace = torch.empty(128 << 20, dtype=torch.uint8, device=device)
            wrapper = flashinfer.BatchDecodeWithPagedKVCacheWrapper(workspace, "NHD",
                                                                    use_tensor_cores=path == "tensor-cores")
            wrapper.plan(indptr, indices, last_page_len, NUM_HEADS, NUM_KV_HEADS, HEAD_DIM, BLOCK_SIZE,
                         q_data_type=x.dtype, kv_data_type=x.dtype, sm_scale=x.scale)
            calls[f"decode {path}"] = functools.partial(wrapper.run, x.query, cache)
    else:
        workspace = torch.empty(128 << 20, dtype=torch.uint8, device=device)
        wrapper = flashinfer.BatchPrefillWithPagedKVCacheWrapper(workspace, "NHD")
        wrapper.plan(x.cu_query_lens, indptr, indices, last_page_len, NUM_HEADS, NUM_KV_HEADS, HEAD_DIM, BLOCK_SIZE,
                     causal=True, sm_scale=x.scale, q_data_type=x.dtype, kv_data_type=x.dtype)
        calls["prefill causal"] = functools.partial(wrapper.run, x.query, cache)
    return calls


def graph_replay(fn):
    """A CUDA graph of ``fn`` (captured after warm-up on a side stream), as a callable."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return graph.replay


class Runner:
    """Checks each impl's output once per shape, then times it eagerly and as graph replays."""

    def __init__(self, device: torch.device, copy_bw_tbs: float, iters: int, settle_each: bool = False):
        self.device, self.copy_bw_tbs, self.iters = device, copy_bw_tbs, iters
        self.settle_each = settle_each  # --settle each: every impl's series after its own untimed calls
        self.rows: list[dict] = []

    def settle(self, fn) -> None:
        """Untimed calls of ``fn`` for SETTLE_SECONDS: the GPU's clocks and power state then are
        those of this call, not of what ran before (the float32 reference, a peer's heavier
        calls: 1965 -> 1725 MHz after FlashInfer's prefill and torch's SDPA, bench/NOTES.md)."""
        deadline = time.perf_counter() + SETTLE_SECONDS
        while time.perf_counter() < deadline:
            fn()
            torch.cuda.synchronize()

    def measure(self, x: Batch, impl: str, fn, want: torch.Tensor, note: str = "") -> None:
        B, L, q_len = x.shape
        label = f"{impl} B={B} L={L} q_len={q_len}"
        try:
            got = fn()
            got = got[0] if isinstance(got, tuple) else got
            diff = (got.float() - want).abs()
            max_err = diff.max().item()
            relative = (diff.norm() / want.norm()).item()
            if not relative < MAX_RELATIVE_ERROR:
                print(f"*** MISMATCH: {label}: relative error {relative:.2e} against the float32 eager result")
                note = f"output differs (relative error {relative:.1e}); " + note
            if self.settle_each and self.device.type == "cuda":
                self.settle(fn)
            timings = {"eager": common.time_us(fn, self.device, iters=self.iters)}
        except Exception as error:  # noqa: BLE001 -- a missing or failing kernel: report, go on
            print(f"skipped {label}: {type(error).__name__}: {error}")
            return
        queued_us = clock = None
        if self.device.type == "cuda":
            try:
                replay = graph_replay(fn)
                timings["cuda-graph"] = common.time_us(replay, self.device, iters=self.iters)
                queued_us = common.time_us(replay, self.device, iters=self.iters, queued=True)
                clock = common.sm_clock_mhz(self.device)  # read just after the replays
            except Exception as error:  # noqa: BLE001 -- an uncapturable call keeps its eager row
                torch.cuda.synchronize()
                print(f"no CUDA graph for {label}: {type(error).__name__}: {error}")
        floor_us = x.floor_bytes() / self.copy_bw_tbs / 1e6
        for stage, us in timings.items():
            row = {"bench": "attention", "stage": stage, "impl": impl, "B": B, "L": L, "q_len": q_len,
                   "Hq": NUM_HEADS, "Hkv": NUM_KV_HEADS, "D": HEAD_DIM, "block": BLOCK_SIZE, "dtype": DTYPE_NAMES[x.dtype],
                   "us": round(us, 2), "floor_us": round(floor_us, 2),
                   "gbps": round(x.floor_bytes() / us / 1e3, 1),
                   "pct_copy_bw": round(100 * floor_us / us, 1), "max_err": float(f"{max_err:.3g}")}
            if stage == "cuda-graph" and queued_us is not None:
                row["us_graph_queued"] = round(queued_us, 2)
                if clock is not None:
                    row["sm_clock_mhz"] = clock
            self.rows.append(row | ({"note": note.strip("; ")} if note else {}))

    def bench_shape(self, x: Batch, backends: list[str], flashinfer, decode_paths: tuple[str, ...]) -> None:
        want = torch_eager(x, torch.float32).float()
        settled = False
        for backend in backends:
            fn = functools.partial(specops.paged_attention, *x.specops_args(), backend=backend, validate=False,
                                   max_query_len=x.shape[2])  # an engine knows k + 1
            if not settled and self.device.type == "cuda":
                # After the float32 reference (GBs allocated and freed), the next timing series
                # of the Triton kernel ran 1.15-1.2x slow at L = 4096 shapes (whichever of eager
                # or graph came first; H100, bench/NOTES.md): run untimed until that passes.
                torch.cuda.empty_cache()
                if not self.settle_each:  # (else measure settles every impl)
                    self.settle(fn)
                settled = True
            self.measure(x, f"specops-{backend}", fn, want)
        self.measure(x, "torch-eager", functools.partial(torch_eager, x), want)
        if flashinfer is None:
            return
        try:
            calls = flashinfer_calls(flashinfer, x, decode_paths)
        except Exception as error:  # noqa: BLE001 -- FlashInfer failing to plan: no rows
            print(f"skipped flashinfer B={x.shape[0]} L={x.shape[1]} q_len={x.shape[2]}: "
                  f"{type(error).__name__}: {error}")
            return
        # One "flashinfer" row per stage: the fastest path (ANCHORS.md: best of decode paths).
        before = len(self.rows)
        for path, fn in calls.items():
            self.measure(x, "flashinfer", fn, want, note=path)
        best: dict[str, dict] = {}
        for row in self.rows[before:]:
            if row["stage"] not in best or row["us"] < best[row["stage"]]["us"]:
                best[row["stage"]] = row
        self.rows[before:] = list(best.values())


def print_targets(rows: list[dict]) -> None:
    """ANCHORS.md's targets for specops rows: decode within 1.05x of the floor at B >= 64;
    verify within 1.15x of the floor and of our decode; B=1 L=4096 decode under 12 µs."""
    ours = {(r["stage"], r["impl"], r["B"], r["L"], r["q_len"]): r for r in rows if r["impl"].startswith("specops")}
    print("\ntargets (ANCHORS.md section 2):")
    for (stage, impl, B, L, q_len), row in ours.items():
        x_floor = row["us"] / row["floor_us"]
        checks = []
        if q_len == 1 and B >= 64:
            checks.append(f"decode {x_floor:.2f}x floor (<= 1.05)")
        if q_len > 1:
            checks.append(f"verify {x_floor:.2f}x floor (<= 1.15)")
            decode = ours.get((stage, impl, B, L, 1))
            if decode:
                checks.append(f"{row['us'] / decode['us']:.2f}x own decode (<= 1.15)")
        if q_len == 1 and B == 1 and L == 4096:
            queued = f", {row['us_graph_queued']:.1f} queued" if "us_graph_queued" in row else ""
            checks.append(f"{row['us']:.1f} us{queued} (< 12)")
        if checks:
            print(f"  {stage:10s} {impl:15s} B={B:<3d} L={L:<5d} q_len={q_len}: " + "; ".join(checks))


def parse_shape(text: str) -> tuple[int, int, int]:
    """A shape as --shapes names it: B,L,q_len."""
    values = text.split(",")
    if len(values) != 3 or not all(v.strip().isdigit() and int(v) > 0 for v in values):
        raise ValueError(f"--shapes takes B,L,q_len of positive ints, got {text!r}")
    return tuple(int(v) for v in values)


def main() -> None:
    parser = argparse.ArgumentParser(description="Paged-attention benchmark (see the module docstring).")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--quick", action="store_true", help="only the key shapes (B 1/16/64, L 4096)")
    parser.add_argument("--shapes", nargs="+", default=None, metavar="B,L,q_len",
                        help="these shapes only (GPU), e.g. 64,1024,1 64,1024,5")
    parser.add_argument("--out", default=str(common.REPO_ROOT / "bench" / "results"))
    parser.add_argument("--no-flashinfer", action="store_true")
    parser.add_argument("--fi-decode", choices=["both", "tensor-cores", "cuda-cores"], default=None,
                        help="FlashInfer decode paths (each compiles on first use); "
                             "default: tensor-cores with --quick, else both")
    parser.add_argument("--iters", type=int, default=50)
    parser.add_argument("--settle", choices=["first", "each"], default="first",
                        help="untimed calls (SETTLE_SECONDS) before the first specops impl of a shape only, "
                             "or before every impl's series (H200: specops rows unchanged, FlashInfer's prefill "
                             "rows 4-8%% slower, B=1 eager rows 0.6-0.7x; bench/NOTES.md)")
    args = parser.parse_args()
    device = torch.device(args.device)
    env = common.env_stamp(device)
    print(env)
    if device.type == "cuda":
        backends = ["triton", "cuda"]  # "cuda" is skipped while the op has no CUDA kernel
        shapes = QUICK_SHAPES if args.quick else SHAPES
        if args.shapes:
            shapes = [parse_shape(text) for text in args.shapes]
    else:
        backends = ["cpu"] + (["triton"] if os.environ.get("TRITON_INTERPRET") == "1" else [])
        shapes = CPU_SHAPES
    fi_decode = args.fi_decode or ("tensor-cores" if args.quick else "both")
    decode_paths = ("tensor-cores", "cuda-cores") if fi_decode == "both" else (fi_decode,)
    flashinfer = None if args.no_flashinfer or device.type != "cuda" else import_flashinfer()
    runner = Runner(device, env["copy_bw_tbs"], args.iters, settle_each=args.settle == "each")
    for B, L, q_len in shapes:
        batch = Batch(B, L, q_len, device, DTYPE if device.type == "cuda" else CPU_DTYPE)
        runner.bench_shape(batch, backends, flashinfer, decode_paths)
        if device.type == "cuda":
            torch.cuda.empty_cache()
    print()
    anchor = {ANCHOR_LABEL: lambda row: FLASHINFER_ANCHOR_US.get((row["B"], row["L"], row["q_len"]))}
    common.print_table(runner.rows, ("stage", "B", "L", "q_len"), ("torch-eager", "flashinfer"), anchor)
    print_targets(runner.rows)
    path = common.write_results("attention", env, runner.rows, args.out)
    print(f"wrote {path}")
    try:
        import plot_results

        print(f"wrote {plot_results.plot([path])}")
    except ImportError as error:
        print(f"no plot ({error})")


if __name__ == "__main__":
    main()
