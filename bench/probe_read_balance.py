"""Can work handed out while a launch runs shorten the one-wave tail of paged decode
attention? A pure-read probe of the question, no attention math (diagnostic only).

At B=64 L=1024 decode the (sequence, KV head) programs all start at once and end 77-94 µs
later: each SM is served at its own rate, so a static grid ends with the slowest SM
(bench/NOTES.md, "where the B=64 L=1024 decode's 7% goes"). This probe reads the same
paged keys and values as paged_attention (bf16, block 16, blocks shuffled; sweep_attention's
inputs) and sums k * v per (sequence, KV head), in two forms:
- static: one program per (sequence, KV head), all of its tiles, as the attention kernel;
- dynamic: PROGRAMS programs an SM, each taking chunks of a pair's tiles from a global
  counter (one atomic a chunk) until none is left, so fast SMs take more chunks; a pair's
  chunks add to its sum by atomics. The last program out resets the counter for the next
  launch (no memset node).
Timed as trace_attention times: a CUDA graph of REPS launches, per launch, beside
specops.paged_attention at q_len 1 in the same process. Every form's sums are checked
against torch's. If the dynamic form reads no faster than the static one, the tail is not a
matter of which SM gets which work, and splitting the attention kernel's pairs cannot buy it.

    python3 bench/probe_read_balance.py --shapes 64,1024 64,4096 --out $OUT
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
import triton
import triton.language as tl
from common import copy_bandwidth_tbs
from sweep_attention import inputs
from trace_attention import REPS, captured, per_launch_us

import specops

# Registers a thread, capped so that 4 programs of 4 warps fit an SM, as the attention
# kernel's decode tile (offline sm_90: the static form takes 128 uncapped, the dynamic one 152,
# which the cap brings to 128 with a 12-byte spill).
MAX_REGISTERS = 128
NUM_Q_HEADS, NUM_KV_HEADS, HEAD_DIM = 32, 8, 128


@triton.jit
def read_pairs_kernel(
    key_ptr,  # [num_blocks, PAGE, num_kv_heads, D] bf16
    value_ptr,
    table_ptr,  # [batch, max_blocks] int32
    out_ptr,  # [batch * num_kv_heads] float32: sum of k * v over the pair's keys (added to)
    counter_ptr,  # [2] int32 (DYNAMIC): chunks handed out, programs finished; 0 between launches
    num_chunks,
    chunks_per_pair,
    max_blocks,
    num_kv_heads,
    stride_block,
    stride_token,
    TILES: tl.constexpr,  # tiles of BLOCK_N keys a chunk
    BLOCK_N: tl.constexpr,
    PAGE: tl.constexpr,
    D: tl.constexpr,
    STAGES: tl.constexpr,
    DYNAMIC: tl.constexpr,
):
    if DYNAMIC:
        chunk = tl.atomic_add(counter_ptr, 1)
    else:
        chunk = tl.program_id(0)
    cols = tl.arange(0, D)
    while chunk < num_chunks:
        pair = chunk // chunks_per_pair
        seq = pair // num_kv_heads
        head = pair - seq * num_kv_heads
        first = (chunk - pair * chunks_per_pair) * TILES
        acc = tl.zeros([BLOCK_N, D], tl.float32)
        for i in tl.range(0, TILES, num_stages=STAGES):
            keys = (first + i) * BLOCK_N + tl.arange(0, BLOCK_N)
            page = tl.load(table_ptr + seq * max_blocks + keys // PAGE)
            rows = page.to(tl.int64) * stride_block + (keys % PAGE) * stride_token + head * D
            k = tl.load(key_ptr + rows[:, None] + cols[None, :])
            v = tl.load(value_ptr + rows[:, None] + cols[None, :])
            acc += k.to(tl.float32) * v.to(tl.float32)
        tl.atomic_add(out_ptr + pair, tl.sum(tl.sum(acc, axis=1), axis=0))
        if DYNAMIC:
            chunk = tl.atomic_add(counter_ptr, 1)
        else:
            chunk = num_chunks
    if DYNAMIC:  # every program has taken its last chunk: the last one out resets the counters
        done = tl.atomic_add(counter_ptr + 1, 1)
        if done == tl.num_programs(0) - 1:
            tl.atomic_xchg(counter_ptr, 0)
            tl.atomic_xchg(counter_ptr + 1, 0)


def launcher(key_cache, value_cache, block_table, L, programs_per_sm, chunks_per_pair, block_n, stages, warps):
    """A call of one form (programs_per_sm 0: static) and its output buffer."""
    B = block_table.shape[0]
    pairs = B * NUM_KV_HEADS
    tiles = L // block_n
    if tiles % chunks_per_pair:
        raise ValueError(f"{tiles} tiles a pair do not split into {chunks_per_pair} chunks")
    out = torch.zeros(pairs, dtype=torch.float32, device=key_cache.device)
    counter = torch.zeros(2, dtype=torch.int32, device=key_cache.device)
    dynamic = programs_per_sm > 0
    sms = torch.cuda.get_device_properties(key_cache.device).multi_processor_count if key_cache.is_cuda else 4
    grid = (programs_per_sm * sms if dynamic else pairs,)

    def call():
        read_pairs_kernel[grid](key_cache, value_cache, block_table, out, counter, pairs * chunks_per_pair,
                                chunks_per_pair, block_table.shape[1], NUM_KV_HEADS, key_cache.stride(0),
                                key_cache.stride(1), TILES=tiles // chunks_per_pair, BLOCK_N=block_n,
                                PAGE=key_cache.shape[1], D=key_cache.shape[3], STAGES=stages, DYNAMIC=dynamic,
                                num_warps=warps, **({"maxnreg": MAX_REGISTERS} if key_cache.is_cuda else {}))

    return call, out


def expected_sums(key_cache, value_cache, block_table, L) -> torch.Tensor:
    keys = key_cache[block_table.long()].flatten(1, 2)[:, :L].float()  # [B, L, Hkv, D]
    values = value_cache[block_table.long()].flatten(1, 2)[:, :L].float()
    return (keys * values).sum(dim=(1, 3)).flatten()


FORMS = [  # (programs an SM (0: static), chunks a pair, BLOCK_N, stages, warps)
    (0, 1, 64, 2, 4), (0, 1, 32, 3, 4),
    (4, 1, 64, 2, 4), (4, 2, 64, 2, 4), (4, 4, 64, 2, 4), (4, 8, 64, 2, 4), (4, 16, 64, 2, 4),
    (3, 4, 64, 2, 4), (3, 8, 64, 2, 4), (4, 8, 32, 3, 4), (4, 16, 32, 3, 4), (4, 32, 32, 3, 4),
]


def probe_shape(B: int, L: int, device, copy_bw: float, forms=FORMS) -> list[dict]:
    query, key_cache, value_cache, block_table, seq_lens, cu_query_lens, scale = inputs(
        B, L, 1, NUM_Q_HEADS, NUM_KV_HEADS, HEAD_DIM, device)
    kv_bytes = 2 * B * L * NUM_KV_HEADS * HEAD_DIM * key_cache.element_size()
    floor_us = (kv_bytes + 2 * query.numel() * query.element_size()) / copy_bw / 1e6
    want = expected_sums(key_cache, value_cache, block_table, L)
    rows = []
    attention = lambda: specops.paged_attention(query, key_cache, value_cache, block_table, seq_lens,  # noqa: E731
                                                cu_query_lens, scale, validate=False, max_query_len=1)
    forms_timed = [("paged_attention (Triton, planned)", attention, None)]
    for programs_per_sm, chunks, block_n, stages, warps in forms:
        if (L // block_n) % chunks:
            continue
        call, out = launcher(key_cache, value_cache, block_table, L, programs_per_sm, chunks, block_n, stages, warps)
        label = (f"dynamic {programs_per_sm}/SM, {chunks} chunks a pair" if programs_per_sm else "static, a pair a program")
        forms_timed.append((f"{label}, N={block_n} stages={stages} warps={warps}", call, out))
    for label, call, out in forms_timed:
        if out is not None:  # two launches: the counter's reset is checked by the second
            for _ in range(2):
                out.zero_()
                call()
            torch.cuda.synchronize()
            if not torch.allclose(out, want, rtol=1e-3, atol=1e-2):
                raise AssertionError(f"{label}: sums differ from torch's (max {float((out - want).abs().max()):.3g})")
        us = per_launch_us(captured(lambda call=call: [call() for _ in range(REPS)]))
        rows.append({"B": B, "L": L, "form": label, "us": round(us, 2), "x_floor": round(us / floor_us, 3),
                     "floor_us": round(floor_us, 2)})
        print(f"B={B} L={L} {label}: {us:.1f} us, {us / floor_us:.3f}x floor ({floor_us:.1f})", flush=True)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--shapes", nargs="+", default=["64,1024"], help="B,L (decode, GQA 32/8, D 128)")
    parser.add_argument("--out", default=None, help="folder for probe-read-balance.json")
    args = parser.parse_args()
    device = torch.device("cuda")
    copy_bw = copy_bandwidth_tbs(device)
    print(f"copy {copy_bw:.3f} TB/s")
    rows = []
    for text in args.shapes:
        B, L = (int(v) for v in text.split(","))
        rows += probe_shape(B, L, device, copy_bw)
    if args.out:
        Path(args.out, "probe-read-balance.json").write_text(json.dumps({"copy_bw_tbs": copy_bw, "rows": rows},
                                                                       indent=1))


if __name__ == "__main__":
    main()
