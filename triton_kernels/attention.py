"""Triton kernels of the paged KV cache: reshape_and_cache and paged_attention.

paged_attention packs a sequence's query rows and its GQA group into one tile (BLOCK_M =
ROWS query rows x GROUP heads, padded), so each KV head of a sequence is read once for up
to ROWS query rows: verify moves decode's bytes. When the B x Hkv programs cannot fill the
GPU (the plan says when), each sequence's key range is split among NUM_SPLITS programs that
write normalised partial outputs and their LSE to a workspace; a second kernel merges them
exactly (on sm_90+ a programmatic dependent launch: scheduled as the split programs finish,
it waits for them in its first instruction). Every launch parameter (tiles, splits,
workspace size) is a function of tensor shapes (and of the caller's host-side max_query_len
hint) only, never of seq_lens or cu_query_lens values: no device sync, so a call can be
captured in a CUDA graph. A sequence with more query rows than a tile holds takes several
passes, so the tiles never depend on the true query lengths. The planning lives in
triton_kernels/attention_plan.py.
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

from . import launch_plan
from .attention_plan import ASSUMED_MULTIPROCESSORS, AttentionLaunch, plan_paged_attention
from .launch import direct_launch, dram_gbs_per_multiprocessor, has_pdl, multiprocessor_count, next_power_of_2

# Prefetch into L1 the block ids of a program's first step at its start (compiled kernels):
# one DRAM round trip off the chain lengths -> block ids -> first K/V tile (measured while
# the steps ran first tile to last; H100: B=64 L=1024 decode 97.1 -> 96.8 µs, B=128 186.3
# -> 185.6, B=32 L=1024 D=64 verify 31.9 -> 31.7; split programs: B=4 L=16384 verify 103.1
# -> 102.2, B=1 L=4096 decode 11.3 -> 11.2 queued).
PREFETCH_TABLE = True
# Warps of a split-merge program (one (query row, head) a program): one warp sums its
# [splits, head dim] tile without a shared-memory round (H100, A/B in one process, events /
# queued graph replays, µs, 4 warps -> 1: B=1 L=4096 decode 12.38 / 11.10 -> 11.90 / 10.62,
# verify 14.02 / 12.80 -> 13.73 / 12.42, B=4 L=16384 decode 97.8 -> 97.4; 2 warps between).
MERGE_WARPS = 1


# Grid (N, Hkv). Program (i, h) copies token i's key and value for KV head h into slot
# slot_mapping[i] (skipped when -1 or outside the cache). Bytes: 4 D elements per program.
@direct_launch
@triton.jit(do_not_specialize=["num_slots"])
def _reshape_and_cache_kernel(
    key_ptr,  # [N, Hkv, D]
    value_ptr,  # [N, Hkv, D]
    key_cache_ptr,  # [num_blocks, block_size, Hkv, D]
    value_cache_ptr,  # [num_blocks, block_size, Hkv, D]
    slot_mapping_ptr,  # [N] int64
    num_slots,
    NUM_KV_HEADS: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    i = tl.program_id(0)
    h = tl.program_id(1)
    slot = tl.load(slot_mapping_ptr + i)
    if (slot >= 0) & (slot < num_slots):
        d = tl.arange(0, BLOCK_D)
        mask = d < HEAD_DIM
        src = (i.to(tl.int64) * NUM_KV_HEADS + h) * HEAD_DIM + d
        dst = (slot * NUM_KV_HEADS + h) * HEAD_DIM + d  # slot = block * block_size + offset
        tl.store(key_cache_ptr + dst, tl.load(key_ptr + src, mask=mask), mask=mask)
        tl.store(value_cache_ptr + dst, tl.load(value_ptr + src, mask=mask), mask=mask)


def reshape_and_cache(key, value, key_cache, value_cache, slot_mapping) -> None:
    """Launcher; arguments already validated (specops/_checks.py)."""
    num_tokens, num_kv_heads, head_dim = key.shape
    if num_tokens == 0:
        return
    num_slots = key_cache.shape[0] * key_cache.shape[1]
    _reshape_and_cache_kernel[(num_tokens, num_kv_heads)](
        key, value, key_cache, value_cache, slot_mapping, num_slots,
        NUM_KV_HEADS=num_kv_heads, HEAD_DIM=head_dim, BLOCK_D=next_power_of_2(head_dim),
    )


LOG2E = tl.constexpr(1.4426950408889634)


@triton.jit
def _exp2(x, FAST: tl.constexpr):
    """2^x. FAST (compiled kernels): the bare MUFU.EX2 (ex2.approx.ftz), without the four
    instructions Triton's exp2 adds per element to keep subnormal results; results below
    2^-126 (weights under 1e-38 of the row max) become 0. The interpreter takes tl.exp2."""
    if FAST:
        return tl.inline_asm_elementwise("ex2.approx.ftz.f32 $0, $1;", "=r,r", [x], dtype=tl.float32,
                                         is_pure=True, pack=1)
    else:
        return tl.exp2(x)


@triton.jit
def _prefetch_l1(pointer):
    """Bring the line at ``pointer`` into L1 (a later load of it hits there); no result."""
    tl.inline_asm_elementwise("prefetch.global.L1 [$1];\n\tmov.u32 $0, 0;", "=r,l", [pointer], dtype=tl.int32,
                              is_pure=False, pack=1)


@triton.jit
def _tanh(x):
    t = tl.exp(-2.0 * tl.abs(x))
    y = (1.0 - t) / (1.0 + t)
    return tl.where(x < 0, -y, y)


@triton.jit
def _attend_tile(
    m_i, l_i, acc,  # running max in base 2 [BLOCK_M], sum [BLOCK_M], accumulator [BLOCK_M, BLOCK_D] float32
    q,  # [BLOCK_M, BLOCK_D] the tile's query rows
    position,  # [BLOCK_M] key position of each query row
    row_valid,  # [BLOCK_M]
    tile, table_row_ptr, key_cache_ptr, value_cache_ptr, h, seq_len, num_blocks, scale, soft_cap, sliding_window,
    NUM_KV_HEADS: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_SIZE: tl.constexpr,
    BLOCK_N: tl.constexpr, HAS_SOFT_CAP: tl.constexpr, HAS_WINDOW: tl.constexpr, IEEE: tl.constexpr,
    FAST_EXP2: tl.constexpr,
):
    """One online-softmax step over keys [tile * BLOCK_N, (tile + 1) * BLOCK_N), which may
    span several cache blocks: each key finds its block through the block table. Scores are
    kept in base 2 (log2(e) folded into the scale): one multiply and one exp2 a score."""
    n = tl.arange(0, BLOCK_N)
    d = tl.arange(0, BLOCK_D)
    key_position = tile * BLOCK_N + n
    kv_valid = key_position < seq_len
    physical = tl.load(table_row_ptr + key_position // BLOCK_SIZE, mask=kv_valid, other=0)
    in_range = (physical >= 0) & (physical < num_blocks)
    kv_valid = kv_valid & in_range  # unused slots and bad block ids are never read
    physical = tl.where(in_range, physical, 0).to(tl.int64)
    slot = physical * BLOCK_SIZE + key_position % BLOCK_SIZE
    kv_offsets = (slot * NUM_KV_HEADS + h)[:, None] * HEAD_DIM + d[None, :]
    kv_mask = kv_valid[:, None] & (d[None, :] < HEAD_DIM)
    k = tl.load(key_cache_ptr + kv_offsets, mask=kv_mask, other=0.0)
    v = tl.load(value_cache_ptr + kv_offsets, mask=kv_mask, other=0.0)
    if IEEE:
        s = tl.dot(q, tl.trans(k), input_precision="ieee")
    else:
        s = tl.dot(q, tl.trans(k))
    if HAS_SOFT_CAP:
        s = (soft_cap * LOG2E) * _tanh(s * (scale / soft_cap))
    else:
        s = s * (scale * LOG2E)
    # Padding rows see nothing (limit -1): one compare an element, and the per-key mask.
    row_limit = tl.where(row_valid, position, -1)  # [BLOCK_M]
    visible = (key_position[None, :] <= row_limit[:, None]) & kv_valid[None, :]
    if HAS_WINDOW:
        visible = visible & (key_position[None, :] > position[:, None] - sliding_window)
    s = tl.where(visible, s, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, axis=1))
    m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)  # a row that has seen no key yet
    alpha = _exp2(m_i - m_safe, FAST_EXP2)
    p = _exp2(s - m_safe[:, None], FAST_EXP2)
    l_i = l_i * alpha + tl.sum(p, axis=1)
    if IEEE:
        acc = acc * alpha[:, None] + tl.dot(p, v, input_precision="ieee")
    else:
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
    return m_new, l_i, acc


# Grid (B * Hkv, NUM_SPLITS), KV heads fastest: the programs of one sequence's KV heads
# start together and read the neighbouring head slices of the same cache rows (H100: 1-2%
# at the shapes of more than one wave). Program (b * Hkv + h, s) takes sequence b's query
# rows whose heads map to KV head h, ROWS rows at a time (a tile of ROWS x GROUP rows: one
# pass for q_len <= ROWS), and attends them to the s-th of NUM_SPLITS equal shares of the
# key tiles those rows can see (causal, window), BLOCK_N keys per tile, with an online
# softmax. NUM_SPLITS == 1: it writes the output (and LSE); else it writes its normalised
# partial output and its LSE (-inf when its share held no visible key) for
# _merge_splits_kernel. Bytes: the visible part of K and V of head h once per ROWS query
# rows; the query rows once; the output once (or NUM_SPLITS float32 partials).
@direct_launch
@triton.jit(do_not_specialize=["num_blocks", "max_blocks", "sliding_window", "num_query_tokens"])
def _paged_attention_kernel(
    out_ptr,  # [Tq, Hq, D] dtype of query; [NUM_SPLITS, Tq, Hq, D] float32 when NUM_SPLITS > 1
    lse_ptr,  # [Tq, Hq] float32 (written when WRITE_LSE); [NUM_SPLITS, Tq, Hq] when NUM_SPLITS > 1
    query_ptr,  # [Tq, Hq, D]
    key_cache_ptr,  # [num_blocks, BLOCK_SIZE, Hkv, D]
    value_cache_ptr,  # [num_blocks, BLOCK_SIZE, Hkv, D]
    block_table_ptr,  # [B, max_blocks] int32
    seq_lens_ptr,  # [B] int32
    cu_query_lens_ptr,  # [B + 1] int32
    scale,
    soft_cap,
    sliding_window,
    num_blocks,
    max_blocks,
    num_query_tokens,
    NUM_HEADS: tl.constexpr,
    NUM_KV_HEADS: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    ROWS: tl.constexpr,
    NUM_SPLITS: tl.constexpr,
    HAS_SOFT_CAP: tl.constexpr,
    HAS_WINDOW: tl.constexpr,
    WRITE_LSE: tl.constexpr,
    IEEE: tl.constexpr,
    PIPELINE: tl.constexpr,
    PDL: tl.constexpr = False,  # programmatic dependent launch of the merge kernel (sm_90+)
    PREFETCH_TABLE: tl.constexpr = False,
):
    GROUP: tl.constexpr = NUM_HEADS // NUM_KV_HEADS
    b = tl.program_id(0) // NUM_KV_HEADS
    h = tl.program_id(0) % NUM_KV_HEADS
    split = tl.program_id(1)
    # Clamped so that bad values (validate=False) stay in bounds.
    start = tl.minimum(tl.maximum(tl.load(cu_query_lens_ptr + b), 0), num_query_tokens)
    end = tl.minimum(tl.maximum(tl.load(cu_query_lens_ptr + b + 1), start), num_query_tokens)
    q_len = end - start
    seq_len = tl.minimum(tl.maximum(tl.load(seq_lens_ptr + b), 0), max_blocks * BLOCK_SIZE)
    table_row_ptr = block_table_ptr + b.to(tl.int64) * max_blocks
    if PREFETCH_TABLE and not HAS_WINDOW:
        # The first step's block ids while the lengths load, so that its table read hits
        # L1. The steps run from this split's last tile down; which tile that is needs the
        # length, so the guess is the sequence filling its block table row (a batch's
        # table as wide as its longest sequence; a wrong guess prefetches a line nobody
        # reads). The address needs no load.
        row_tiles = tl.cdiv(max_blocks * BLOCK_SIZE, BLOCK_N)
        first_tile = tl.minimum((split + 1) * tl.cdiv(row_tiles, NUM_SPLITS), row_tiles) - 1
        first_block = first_tile * BLOCK_N // BLOCK_SIZE
        if first_block < max_blocks:
            _prefetch_l1(table_row_ptr + first_block)
    r = tl.arange(0, BLOCK_M)
    d = tl.arange(0, BLOCK_D)
    head = h * GROUP + r % GROUP
    chunk = 0  # ROWS query rows at a time: no host-side maximum of the query lengths needed
    while chunk < q_len:
        j = chunk + r // GROUP  # query row within the sequence
        row_valid = (r // GROUP < ROWS) & (j < q_len)
        token = (start + j).to(tl.int64)
        row_offsets = token * NUM_HEADS + head  # [BLOCK_M] into [Tq, Hq]
        d_valid = d < HEAD_DIM
        q_offsets = row_offsets[:, None] * HEAD_DIM + d[None, :]
        q = tl.load(query_ptr + q_offsets, mask=row_valid[:, None] & d_valid[None, :], other=0.0)
        position = seq_len - q_len + j  # bottom-right causal: the last q_len positions
        # Keys the chunk's rows can see: up to its last row's position, from its first row's
        # window start; whole BLOCK_N tiles, shared out evenly among the splits.
        first_position = seq_len - q_len + chunk
        key_end = tl.maximum(first_position + tl.minimum(q_len - chunk, ROWS), 0)
        key_start = 0
        if HAS_WINDOW:
            key_start = tl.maximum(first_position + 1 - sliding_window, 0)
        tile_start = key_start // BLOCK_N
        num_tiles = tl.maximum(tl.cdiv(key_end, BLOCK_N) - tile_start, 0)
        tiles_per_split = tl.cdiv(num_tiles, NUM_SPLITS)
        tile_lo = tile_start + split * tiles_per_split
        tile_hi = tl.minimum(tile_lo + tiles_per_split, tile_start + num_tiles)
        # Tiles last to first: a short last tile (the keys past the last whole BLOCK_N, most
        # lengths) is the first step, its few bytes in early and its step overlapping the
        # whole tiles' copies; as the last step it would run after every copy had landed.
        # (A direction chosen at run time costs the decode tile 36 registers.)
        m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
        l_i = tl.zeros([BLOCK_M], tl.float32)
        acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
        if PIPELINE:  # compiled: a for loop, which Triton software-pipelines (num_stages)
            for step in tl.range(tile_lo, tile_hi):
                tile = tile_hi - 1 + tile_lo - step
                m_i, l_i, acc = _attend_tile(
                    m_i, l_i, acc, q, position, row_valid, tile, table_row_ptr, key_cache_ptr, value_cache_ptr,
                    h, seq_len, num_blocks, scale, soft_cap, sliding_window,
                    NUM_KV_HEADS, HEAD_DIM, BLOCK_D, BLOCK_SIZE, BLOCK_N, HAS_SOFT_CAP, HAS_WINDOW, IEEE, PIPELINE,
                )
        else:  # the interpreter cannot bound a range by loaded values
            step = tile_lo
            while step < tile_hi:
                tile = tile_hi - 1 + tile_lo - step
                m_i, l_i, acc = _attend_tile(
                    m_i, l_i, acc, q, position, row_valid, tile, table_row_ptr, key_cache_ptr, value_cache_ptr,
                    h, seq_len, num_blocks, scale, soft_cap, sliding_window,
                    NUM_KV_HEADS, HEAD_DIM, BLOCK_D, BLOCK_SIZE, BLOCK_N, HAS_SOFT_CAP, HAS_WINDOW, IEEE, PIPELINE,
                )
                step += 1
        # A row that saw no key (a split's empty share; or a row masked out entirely,
        # possible only with validate=False) gets output 0 and LSE -inf.
        seen = l_i > 0.0
        out = tl.where(seen[:, None], acc / tl.where(seen, l_i, 1.0)[:, None], 0.0)
        lse = tl.where(seen, (m_i + tl.log2(tl.where(seen, l_i, 1.0))) / LOG2E, float("-inf"))  # natural log
        out_mask = row_valid[:, None] & d_valid[None, :]
        if NUM_SPLITS == 1:
            tl.store(out_ptr + q_offsets, out.to(out_ptr.dtype.element_ty), mask=out_mask)
            if WRITE_LSE:
                tl.store(lse_ptr + row_offsets, lse, mask=row_valid)
        else:
            partial_rows = split.to(tl.int64) * num_query_tokens * NUM_HEADS + row_offsets
            tl.store(out_ptr + partial_rows[:, None] * HEAD_DIM + d[None, :], out, mask=out_mask)
            tl.store(lse_ptr + partial_rows, lse, mask=row_valid)
        chunk += ROWS
    if PDL:  # this program's partials are stored: the merge launch may be scheduled
        tl.extra.cuda.gdc_launch_dependents()


# Grid (Tq, Hq). Program (i, hq) merges the NUM_SPLITS partial outputs of query row i, head
# hq, weighting each by exp(its LSE - the largest): exact up to float32 rounding; splits
# that saw no key (LSE -inf, partial 0) weigh 0. Bytes: NUM_SPLITS float32 partials and
# LSEs in (from L2), one output row (and LSE) out.
@direct_launch
@triton.jit(do_not_specialize=["num_query_tokens"])
def _merge_splits_kernel(
    out_ptr,  # [Tq, Hq, D] dtype of query
    lse_ptr,  # [Tq, Hq] float32 (written when WRITE_LSE)
    partial_out_ptr,  # [NUM_SPLITS, Tq, Hq, D] float32
    partial_lse_ptr,  # [NUM_SPLITS, Tq, Hq] float32
    num_query_tokens,
    NUM_HEADS: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
    NUM_SPLITS: tl.constexpr,
    BLOCK_S: tl.constexpr,
    WRITE_LSE: tl.constexpr,
    PDL: tl.constexpr = False,
):
    if PDL:  # every program waits until the attention launch has finished and its writes are visible
        tl.extra.cuda.gdc_wait()
    row = tl.program_id(0).to(tl.int64) * NUM_HEADS + tl.program_id(1)
    s = tl.arange(0, BLOCK_S)
    d = tl.arange(0, BLOCK_D)
    partial_rows = s.to(tl.int64) * num_query_tokens * NUM_HEADS + row  # [BLOCK_S]
    split_lse = tl.load(partial_lse_ptr + partial_rows, mask=s < NUM_SPLITS, other=float("-inf"))
    m = tl.max(split_lse, axis=0)
    m_safe = tl.where(m == float("-inf"), 0.0, m)
    # The partials load beside the LSEs, not after them: a split that saw no key wrote 0
    # and weighs 0 (one L2 round trip less than reading only the splits of weight > 0).
    mask = (s < NUM_SPLITS)[:, None] & (d[None, :] < HEAD_DIM)
    partial = tl.load(partial_out_ptr + partial_rows[:, None] * HEAD_DIM + d[None, :], mask=mask, other=0.0)
    weight = tl.exp(split_lse - m_safe)  # 0 for splits that saw no key
    total = tl.sum(weight, axis=0)
    out = tl.sum(partial * weight[:, None], axis=0) / tl.where(total > 0.0, total, 1.0)
    tl.store(out_ptr + row * HEAD_DIM + d, out.to(out_ptr.dtype.element_ty), mask=d < HEAD_DIM)
    if WRITE_LSE:
        tl.store(lse_ptr + row, tl.where(total > 0.0, m_safe + tl.log(tl.where(total > 0.0, total, 1.0)),
                                         float("-inf")))


def launch_paged_attention(query, key_cache, value_cache, block_table, seq_lens, cu_query_lens, scale,
                           sliding_window=0, soft_cap=0.0, return_lse=False, max_query_len: int = 0, *,
                           launch: AttentionLaunch | None = None):
    """Launcher; arguments already validated (specops/_checks.py); no device sync. Its
    buffers come from launch_plan.output and launch_plan.workspace, so that eager calls
    replay from plans (``paged_attention`` below).

    ``max_query_len`` is the caller's longest query length (0: unknown), a hint for the
    plan's tile rows only: a sequence with more query rows than a tile holds is processed
    in several passes, so a wrong hint costs speed, never correctness. ``launch``
    overrides the planned tiles and splits (tests force splits on small shapes).
    """
    num_query_tokens, num_heads, head_dim = query.shape
    num_blocks, block_size, num_kv_heads, _ = key_cache.shape
    batch, max_blocks = block_table.shape
    out = launch_plan.output(query.shape, query.dtype, query.device)  # query is contiguous (checked)
    lse = launch_plan.output((num_query_tokens, num_heads) if return_lse else (0, 0), torch.float32, query.device)
    if batch == 0 or num_query_tokens == 0:
        return out, lse
    if launch is None:
        multiprocessors = multiprocessor_count(query.device, ASSUMED_MULTIPROCESSORS)
        launch = plan_paged_attention(num_query_tokens, batch, num_heads, num_kv_heads, head_dim,
                                      max_blocks * block_size, multiprocessors, max_query_len=max_query_len,
                                      element_size=key_cache.element_size(),
                                      dram_gbs_per_multiprocessor=dram_gbs_per_multiprocessor(query.device))
    group = num_heads // num_kv_heads
    if launch.rows * group > launch.block_m:  # the rows past the tile would be skipped, never written
        raise ValueError(f"launch.block_m ({launch.block_m}) must hold launch.rows ({launch.rows}) x the GQA "
                         f"group ({group})")
    splits = launch.num_splits
    if splits > 1:  # workspace sized from shapes alone: every (split, row, head) gets written
        kernel_out = launch_plan.workspace((splits, num_query_tokens, num_heads, head_dim), torch.float32,
                                           query.device)
        kernel_lse = launch_plan.workspace((splits, num_query_tokens, num_heads), torch.float32, query.device)
    else:
        kernel_out, kernel_lse = out, (lse if return_lse else out)
    block_d = max(16, next_power_of_2(head_dim))  # tl.dot needs K >= 16
    pdl = splits > 1 and has_pdl(query.device)
    _paged_attention_kernel[(batch * num_kv_heads, splits)](
        kernel_out, kernel_lse, query, key_cache, value_cache, block_table, seq_lens, cu_query_lens,
        scale, soft_cap if soft_cap > 0 else 1.0, sliding_window, num_blocks, max_blocks, num_query_tokens,
        NUM_HEADS=num_heads, NUM_KV_HEADS=num_kv_heads, HEAD_DIM=head_dim, BLOCK_D=block_d, BLOCK_SIZE=block_size,
        BLOCK_M=launch.block_m, BLOCK_N=launch.block_n, ROWS=launch.rows, NUM_SPLITS=splits,
        HAS_SOFT_CAP=soft_cap > 0, HAS_WINDOW=sliding_window > 0, WRITE_LSE=return_lse,
        IEEE=query.dtype == torch.float32, PIPELINE=os.environ.get("TRITON_INTERPRET") != "1", PDL=pdl,
        PREFETCH_TABLE=PREFETCH_TABLE and query.is_cuda,
        num_warps=launch.num_warps, num_stages=launch.num_stages,
    )
    if splits > 1:
        _merge_splits_kernel[(num_query_tokens, num_heads)](
            out, lse if return_lse else out, kernel_out, kernel_lse, num_query_tokens,
            NUM_HEADS=num_heads, HEAD_DIM=head_dim, BLOCK_D=block_d, NUM_SPLITS=splits,
            BLOCK_S=next_power_of_2(splits), WRITE_LSE=return_lse, PDL=pdl, launch_pdl=pdl,
            num_warps=MERGE_WARPS,
        )
    return out, lse


# Eager calls replayed from plans of the launches above (launch_plan.py), while this module
# and the plan's hold the attributes they were imported with. Called as
# ``paged_attention(*args, check=check)``, every argument positional (``launch`` is the
# launcher's alone).
paged_attention = launch_plan.planned(launch_paged_attention)
for _module in ("launch", "attention_plan", "attention"):
    launch_plan.track(f"{__package__}.{_module}")
