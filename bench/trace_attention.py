"""When each program of the Triton paged_attention kernel starts and ends, on a GPU: a copy
of triton_kernels/attention.py whose kernel stores %globaltimer at its start and end and
its %smid (diagnostic only; the copy's outputs are checked equal to the kernel's).

For each shape (B, L, q_len, Hq, Hkv, D; bf16, block 16, blocks shuffled, as
sweep_attention) a CUDA graph of REPS traced launches is replayed; printed per launch: the
gap after the previous launch's last program, the span, quantiles of the programs' start,
end and duration; for the last launch the programs running every 2 µs and the end
quantiles by programs an SM. Timer resolution: what the GPU gives (H100: ~0.26 µs).

    python3 bench/trace_attention.py 64,1024,1,32,8,128 64,4096,1,32,8,128 --out $OUT
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

import torch
from common import captured
from sweep_attention import PLANNED_ANCHOR, inputs, kernel_module

import specops  # noqa: F401 (the triton_kernels package)
from specops.triton_kernels import attention as kernels

REPS = 8
HELPERS = '''

@triton.jit
def _now():
    return tl.inline_asm_elementwise("mov.u64 $0, %globaltimer;", "=l", [], dtype=tl.int64, is_pure=False, pack=1)


@triton.jit
def _smid():
    return tl.inline_asm_elementwise("mov.u32 $0, %smid;", "=r", [], dtype=tl.int32, is_pure=False, pack=1)


TRACE = None
'''
# (anchor in the kernel file, text inserted after it); the kernel's end: before the PDL release.
EDITS = [
    ("LOG2E = tl.constexpr(1.4426950408889634)\n", HELPERS),
    ("    out_ptr,  # [Tq, Hq, D] dtype of query; [NUM_SPLITS, Tq, Hq, D] float32 when NUM_SPLITS > 1\n",
     "    trace_ptr,\n"),
    ("    GROUP: tl.constexpr = NUM_HEADS // NUM_KV_HEADS\n", "    t_start = _now()\n"),
    ("    _paged_attention_kernel[(batch * num_kv_heads, splits)](\n        kernel_out, ", "TRACE, "),
]
END_ANCHOR = "    if PDL:  # this program's partials are stored: the merge launch may be scheduled\n"
END = ("    t_end = _now()\n"
       "    slot = (tl.program_id(0) + tl.program_id(1) * tl.num_programs(0)).to(tl.int64) * 4\n"
       "    tl.store(trace_ptr + slot, t_start)\n    tl.store(trace_ptr + slot + 1, t_end)\n"
       "    tl.store(trace_ptr + slot + 2, _smid().to(tl.int64))\n")


def traced_module():
    source = Path(kernels.__file__).read_text()
    for anchor, text in EDITS:
        if anchor not in source:
            raise RuntimeError(f"triton_kernels/attention.py changed: {anchor.strip()!r} not found")
        source = source.replace(anchor, anchor + text, 1)
    if END_ANCHOR not in source:
        raise RuntimeError("triton_kernels/attention.py changed: the PDL release not found")
    source = source.replace(END_ANCHOR, END + END_ANCHOR, 1)
    if PLANNED_ANCHOR not in source:
        raise RuntimeError("triton_kernels/attention.py changed: its planned calls not found")
    return kernel_module(source, "traced_attention")


def quantiles(x: torch.Tensor) -> list[float]:
    return [round(float(torch.quantile(x, p)), 2) for p in (0.0, 0.1, 0.5, 0.9, 1.0)]


def per_launch_us(graph: torch.cuda.CUDAGraph, reps: int = REPS, rounds: int = 20) -> float:
    """Median time of a replay of ``graph`` (``reps`` launches) by events, per launch."""
    graph.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(rounds):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) * 1e3 / reps)
    return statistics.median(times)


def trace_shape(shape, traced, device) -> list[str]:
    B, L, q_len, Hq, Hkv, D = shape
    args = inputs(*shape, device)
    programs_max = B * Hkv * 32  # splits <= 32
    buffers = [torch.zeros(programs_max * 4, dtype=torch.int64, device=device) for _ in range(REPS)]
    want = kernels.launch_paged_attention(*args, max_query_len=q_len)[0]
    traced.TRACE = buffers[0]
    if not torch.equal(traced.launch_paged_attention(*args, max_query_len=q_len)[0], want):
        raise AssertionError("the traced kernel's output differs from the kernel's")

    def launches(module, traced_buffers):
        for buffer in traced_buffers:
            module.TRACE = buffer
            module.launch_paged_attention(*args, max_query_len=q_len)

    graphs = {name: captured(lambda module=module, traced_buffers=traced_buffers: launches(module, traced_buffers))
              for name, module, traced_buffers in (("plain", kernels, [None] * REPS), ("traced", traced, buffers))}
    per_launch = {name: per_launch_us(graph) for name, graph in graphs.items()}
    for buffer in buffers:
        buffer.zero_()
    graphs["traced"].replay()
    torch.cuda.synchronize()
    lines = [f"== B={B} L={L} q_len={q_len} {Hq}/{Hkv} D={D}: per launch {per_launch['plain']:.2f} us "
             f"(traced {per_launch['traced']:.2f})"]
    previous_end = None
    for i, buffer in enumerate(buffers):
        trace = buffer.view(-1, 4)
        trace = trace[trace[:, 1] > 0].cpu()
        start, end, sm = trace[:, 0].double(), trace[:, 1].double(), trace[:, 2]
        t0 = start.min()
        gap = "-" if previous_end is None else f"{float(t0 - previous_end) / 1e3:.2f}"
        per_sm = torch.bincount(sm, minlength=int(sm.max()) + 1)
        lines.append(f" launch {i}: {len(trace)} programs, {int(per_sm[per_sm > 0].min())}-{int(per_sm.max())} an SM; "
                     f"gap {gap} us; span {float(end.max() - t0) / 1e3:.2f} us; start {quantiles((start - t0) / 1e3)}; "
                     f"end {quantiles((end - t0) / 1e3)}; duration {quantiles((end - start) / 1e3)}")
        if i == REPS - 1:
            rel_start, rel_end = (start - t0) / 1e3, (end - t0) / 1e3
            edges = torch.arange(0.0, float(rel_end.max()) + 2.0, 2.0)
            running = [int(((rel_start <= e) & (rel_end > e)).sum()) for e in edges]
            lines.append("  programs running every 2 us: " + " ".join(map(str, running)))
            by_count = {int(c): quantiles(rel_end[torch.isin(sm, torch.nonzero(per_sm == c).flatten())])
                        for c in sorted(set(per_sm[per_sm > 0].tolist()))}
            lines.append(f"  end quantiles by programs on the SM: {by_count}")
        previous_end = end.max()
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("shapes", nargs="+", help="B,L,q_len,Hq,Hkv,D")
    parser.add_argument("--out", default=None, help="folder for trace-attention.json")
    args = parser.parse_args()
    device = torch.device("cuda")
    traced = traced_module()
    report = {}
    for text in args.shapes:
        shape = tuple(int(v) for v in text.split(","))
        lines = trace_shape(shape, traced, device)
        print("\n".join(lines), flush=True)
        report[text] = lines
    if args.out:
        Path(args.out, "trace-attention.json").write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
