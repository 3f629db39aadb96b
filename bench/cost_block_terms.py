"""What the max pass would cost if it also summed terms of every block: a probe kernel against
the shipped row_max_kernel, both launched as the verify launcher launches its max pass, timed
in CUDA graphs with the queue kept ahead. Two contracts costed in bench/NOTES.md:

- ``--terms exact`` (the "exact normaliser by block maxima"): each mass block of BLOCK
  entries stores its max m_b and S_b = sum_v floor(repro_exp((z_v - m_b) / T) 2^40)
  (verify_math.fixed_exp, the exact terms the normaliser pass sums today);
- ``--terms envelope`` (a power-of-two envelope for draws by rejection, no row max needed):
  S_b = sum_v 2^max(40 - (R_b - e_v), 0), e_v = floor(z_v log2(e) / T) and R_b the block's
  largest e_v, an upper bound on the block's weights that needs no exp;
- ``--terms none``: the same structure (block maxima, a count a block), no terms: what the
  tile and its reductions cost alone.

A tile of ROWS blocks at a time, one warp a block where ROWS = num_warps; and the
program's max and first argmax, as the max pass stores them. Nothing of the verify op uses
it: it prices a change before anyone builds it.

    python bench/cost_block_terms.py [--terms exact,envelope,none]  # B=16, B=64 at V=128256; B=64 at V=32000; B=1
    python bench/cost_block_terms.py --check            # block sums against the reference (small)
"""

from __future__ import annotations

import argparse
import statistics

import torch
import triton
import triton.language as tl

import common
from specops.reference import repro_math
from specops.triton_kernels import verify as tv
from specops.triton_kernels.verify_math import INDEX_MAX, LOG2E, fixed_exp
from specops.triton_kernels.verify_rows import row_max_kernel

TERMS = {"none": 0, "exact": 1, "envelope": 2}
ENVELOPE_BITS = tl.constexpr(40)  # a block's largest entries' term is 2^40; twice a term bounds its weight


@triton.jit
def block_terms_kernel(block_max_ptr, block_sum_ptr, part_max_ptr, part_arg_ptr, rows_ptr, vocab, split_len,
                       inverse, BLOCK: tl.constexpr, ROWS: tl.constexpr, TERMS: tl.constexpr = 1):
    row = tl.program_id(0)
    split = tl.program_id(1)
    row_ptr = rows_ptr + row.to(tl.int64) * vocab
    r = tl.arange(0, ROWS)[:, None]
    c = tl.arange(0, BLOCK)[None, :]
    num_blocks = tl.cdiv(vocab, BLOCK)
    begin = split * split_len
    end = tl.minimum(split_len, vocab - begin)
    best = tl.full([ROWS, BLOCK], float("-inf"), tl.float32)
    best_index = tl.zeros([ROWS, BLOCK], tl.int32)
    offset = 0
    while offset < end:
        v = begin + offset + r * BLOCK + c
        raw = tl.load(row_ptr + v, mask=v < vocab, other=float("-inf")).to(tl.float32)
        z = tl.where(tl.abs(raw) < float("inf"), raw, float("-inf"))
        m = tl.max(z, axis=1)
        if TERMS == 1:
            m_safe = tl.where(m == float("-inf"), 0.0, m)
            terms = fixed_exp((z - m_safe[:, None]) * inverse)
        elif TERMS == 2:  # e = floor(z log2(e) / T), clamped so the -inf lanes (masked below) stay integers
            scale = inverse * LOG2E
            e = tl.maximum(tl.floor(z * scale), -(1 << 24)).to(tl.int32)
            top = tl.maximum(tl.floor(m * scale), -(1 << 24)).to(tl.int32)
            shift = tl.minimum(top[:, None] - e, ENVELOPE_BITS).to(tl.int64)
            terms = tl.full([ROWS, BLOCK], 1, tl.int64) << (tl.full([ROWS, BLOCK], ENVELOPE_BITS, tl.int64) - shift)
        else:
            terms = tl.full([ROWS, BLOCK], 1, tl.int64)
        s = tl.sum(tl.where(z == float("-inf"), 0, terms), axis=1)
        blocks = (begin + offset) // BLOCK + tl.arange(0, ROWS)
        out = row.to(tl.int64) * num_blocks + blocks
        tl.store(block_max_ptr + out, m, mask=blocks < num_blocks)
        tl.store(block_sum_ptr + out, s, mask=blocks < num_blocks)
        better = z > best
        best = tl.maximum(best, z)
        best_index = tl.where(better, v, best_index)
        offset += ROWS * BLOCK
    split_best = tl.max(tl.max(best, axis=1), axis=0)
    first = tl.min(tl.min(tl.where(best == split_best, best_index, INDEX_MAX), axis=1), axis=0)
    tl.store(part_max_ptr + row.to(tl.int64) * tl.num_programs(1) + split, split_best)
    tl.store(part_arg_ptr + row.to(tl.int64) * tl.num_programs(1) + split, first)


def block_terms(rows: torch.Tensor, block: int, warps: int, split_len: int, terms: str = "exact"):
    num_rows, vocab = rows.shape
    split_len = triton.cdiv(split_len, block * warps) * block * warps  # whole tiles a split
    num_blocks = triton.cdiv(vocab, block)
    num_splits = triton.cdiv(vocab, split_len)
    block_max = torch.empty(num_rows, num_blocks, dtype=torch.float32, device=rows.device)
    block_sum = torch.empty(num_rows, num_blocks, dtype=torch.int64, device=rows.device)
    part_max = torch.empty(num_rows, num_splits, dtype=torch.float32, device=rows.device)
    part_arg = torch.empty(num_rows, num_splits, dtype=torch.int32, device=rows.device)

    def call():
        block_terms_kernel[(num_rows, num_splits)](block_max, block_sum, part_max, part_arg, rows, vocab, split_len,
                                                   1.0, BLOCK=block, ROWS=warps, TERMS=TERMS[terms],
                                                   num_warps=warps, enable_fp_fusion=False)
        return block_max, block_sum
    return call


def shipped_max_pass(rows: torch.Tensor, batch: int):
    """row_max_kernel as the launcher runs it for ``batch`` requests of k = rows / batch - 1."""
    num_rows, vocab = rows.shape
    width = num_rows // batch
    split_len = tv.split_len_for(num_rows, vocab, rows.device)
    num_splits = triton.cdiv(vocab, split_len)
    cu = torch.arange(1, batch + 1, dtype=torch.int32, device=rows.device) * (width - 1)
    num_tokens = batch * (width - 1)
    target = rows.view(batch, width, vocab)[:, :-1].reshape(num_tokens, vocab)
    bonus = rows.view(batch, width, vocab)[:, -1].contiguous()
    temperature = torch.ones(batch, dtype=torch.float32, device=rows.device)
    part = [torch.empty(num_rows, num_splits, dtype=dt, device=rows.device)
            for dt in (torch.float32, torch.int32, torch.float32)]

    # The tests' arguments: stand-ins, never read without TESTS (as the launcher passes them).
    stand_ins = (part[0], part[1], cu, part[0], torch.zeros(batch, dtype=torch.int64, device=rows.device),
                 torch.zeros(batch, dtype=torch.int64, device=rows.device))

    def call():
        row_max_kernel[(num_rows, num_splits)](*part, part[0], target, bonus, cu, temperature, *stand_ins, num_tokens,
                                               vocab, width, split_len, ALL_GREEDY=False, BLOCK_V=tv.BLOCK_V,
                                               num_warps=tv.NUM_WARPS,
                                               maxnreg=tv.REGISTERS_PER_SM // (tv.ROW_MAX_RESIDENT * tv.NUM_WARPS * 32)
                                               // 8 * 8)
    return call, split_len


def envelope_sum(z: torch.Tensor, temperature: float) -> int:
    """The envelope's block sum in plain Python integers: sum 2^max(40 - (R - e_v), 0) over the
    finite z_v, e_v = floor(z_v (log2(e) / T)) in float32 arithmetic, R their largest."""
    scale = torch.tensor(1.4426950408889634 / temperature, dtype=torch.float32)
    finite = z[torch.isfinite(z)]
    e = [int(v) for v in torch.floor(finite * scale).tolist()]
    top = max(e, default=0)
    return sum(1 << max(ENVELOPE_BITS.value - (top - v), 0) for v in e)


def check() -> None:
    rows = torch.randn(3, 3000) * 4
    rows[1, 7] = float("-inf")
    rows[2, :1024] = float("-inf")
    block_max, block_sum = block_terms(rows, 512, 4, 2048)()
    _, envelope = block_terms(rows, 512, 4, 2048, "envelope")()
    for row in range(3):
        for b in range(triton.cdiv(3000, 512)):
            z = rows[row, b * 512:(b + 1) * 512]
            m = z.max()
            assert block_max[row, b].item() == m.item()
            assert envelope[row, b].item() == envelope_sum(z, 1.0), (row, b, envelope[row, b].item())
            if m == float("-inf"):
                assert block_sum[row, b].item() == 0
                continue
            w = repro_math.repro_exp(z - m)
            want = int(torch.floor(w.double() * 2.0 ** 40).sum().item())
            assert block_sum[row, b].item() == want, (row, b, block_sum[row, b].item(), want)
    print("block sums equal the reference's terms; envelope sums equal their integers")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true", help="the probe against the reference (interpreter, small)")
    parser.add_argument("--rounds", type=int, default=3, help="timed rounds per launch (median reported)")
    parser.add_argument("--terms", default="exact,envelope,none", help="comma-separated: " + ", ".join(TERMS))
    parser.add_argument("--tiles", default="512x4,128x8,256x8", help="comma-separated BLOCKxWARPS probe tiles")
    args = parser.parse_args()
    if args.check:
        check()
        return
    from bench_verify import graph_time_us
    device = torch.device("cuda")
    for batch, k, vocab in ((16, 4, 128256), (64, 4, 128256), (64, 4, 32000), (1, 4, 128256)):
        rows = torch.randn(batch * (k + 1), vocab, device=device) * 3
        shipped, split_len = shipped_max_pass(rows, batch)
        calls = {"shipped max pass": shipped}
        for terms in args.terms.split(","):
            for tile in args.tiles.split(","):
                block, warps = (int(x) for x in tile.split("x"))
                calls[f"{terms} {block}x{warps}"] = block_terms(rows, block, warps, split_len, terms)
        for name, call in calls.items():
            times = [graph_time_us(call, device, 100, queued=True) for _ in range(args.rounds)]
            print(f"B={batch} k={k} V={vocab} {name:22s} {statistics.median(times):7.1f} us "
                  f"({' '.join(f'{t:.1f}' for t in times)})", flush=True)


if __name__ == "__main__":
    main()
