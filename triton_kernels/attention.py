"""Triton kernels of the paged KV cache: reshape_and_cache and paged_attention.

First version, written for correctness (checked under the interpreter); not yet run or
tuned on a GPU, and without split-KV. paged_attention packs a sequence's query rows and
its GQA group into one tile (BLOCK_M = q_len x group rows, padded), so each KV head of a
sequence is read once whatever the query length: verify moves decode's bytes.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

ROWS_PER_TILE = 8  # query rows of one sequence per tile (k + 1 for k <= 7 in one pass)

# Grid (N, Hkv). Program (i, h) copies token i's key and value for KV head h into slot
# slot_mapping[i] (skipped when -1 or outside the cache). Bytes: 4 D elements per program.
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
        NUM_KV_HEADS=num_kv_heads, HEAD_DIM=head_dim, BLOCK_D=triton.next_power_of_2(head_dim),
    )


@triton.jit
def _tanh(x):
    t = tl.exp(-2.0 * tl.abs(x))
    y = (1.0 - t) / (1.0 + t)
    return tl.where(x < 0, -y, y)


# Grid (B, Hkv). Program (b, h) computes the attention of every query row of sequence b
# whose head maps to KV head h: tiles of ROWS query rows x GROUP heads (BLOCK_M rows,
# padded) against the sequence's cached keys, one cache block at a time, with an online
# softmax. Bytes: the sequence's K and V for head h once per ROWS query rows (once for
# decode and verify with k < 8), its query and output rows once.
@triton.jit(do_not_specialize=["num_blocks", "max_blocks", "sliding_window"])
def _paged_attention_kernel(
    out_ptr,  # [Tq, Hq, D] dtype of query
    lse_ptr,  # [Tq, Hq] float32 (written when RETURN_LSE)
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
    BLOCK_SIZE: tl.constexpr,
    BLOCK_M: tl.constexpr,
    ROWS: tl.constexpr,
    HAS_SOFT_CAP: tl.constexpr,
    HAS_WINDOW: tl.constexpr,
    RETURN_LSE: tl.constexpr,
    IEEE: tl.constexpr,
):
    GROUP: tl.constexpr = NUM_HEADS // NUM_KV_HEADS
    b = tl.program_id(0)
    h = tl.program_id(1)
    start = tl.minimum(tl.maximum(tl.load(cu_query_lens_ptr + b), 0), num_query_tokens)
    end = tl.minimum(tl.maximum(tl.load(cu_query_lens_ptr + b + 1), start), num_query_tokens)
    q_len = end - start
    seq_len = tl.minimum(tl.maximum(tl.load(seq_lens_ptr + b), 0), max_blocks * BLOCK_SIZE)
    r = tl.arange(0, BLOCK_M)
    d = tl.arange(0, HEAD_DIM)
    n = tl.arange(0, BLOCK_SIZE)
    head = h * GROUP + r % GROUP
    chunk = 0  # ROWS query rows at a time: no host-side maximum of the query lengths needed
    while chunk < q_len:
        j = chunk + r // GROUP  # query row within the sequence
        row_valid = (r // GROUP < ROWS) & (j < q_len)
        q_offsets = ((start + j).to(tl.int64) * NUM_HEADS + head)[:, None] * HEAD_DIM + d[None, :]
        q = tl.load(query_ptr + q_offsets, mask=row_valid[:, None], other=0.0)
        position = seq_len - q_len + j  # bottom-right causal: the last q_len positions
        m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
        l_i = tl.zeros([BLOCK_M], tl.float32)
        acc = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)
        blk = 0
        while blk * BLOCK_SIZE < seq_len:
            physical = tl.load(block_table_ptr + b.to(tl.int64) * max_blocks + blk)
            in_range = (physical >= 0) & (physical < num_blocks)
            physical = tl.where(in_range, physical, 0).to(tl.int64)
            key_position = blk * BLOCK_SIZE + n
            kv_valid = (key_position < seq_len) & in_range
            kv_offsets = ((physical * BLOCK_SIZE + n) * NUM_KV_HEADS + h)[:, None] * HEAD_DIM + d[None, :]
            k = tl.load(key_cache_ptr + kv_offsets, mask=kv_valid[:, None], other=0.0)
            v = tl.load(value_cache_ptr + kv_offsets, mask=kv_valid[:, None], other=0.0)
            if IEEE:
                s = tl.dot(q, tl.trans(k), input_precision="ieee")
            else:
                s = tl.dot(q, tl.trans(k))
            s = s * scale
            if HAS_SOFT_CAP:
                s = soft_cap * _tanh(s / soft_cap)
            visible = (key_position[None, :] <= position[:, None]) & kv_valid[None, :] & row_valid[:, None]
            if HAS_WINDOW:
                visible = visible & (key_position[None, :] > position[:, None] - sliding_window)
            s = tl.where(visible, s, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(s, axis=1))
            m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
            alpha = tl.exp(m_i - m_safe)
            p = tl.exp(s - m_safe[:, None])
            l_i = l_i * alpha + tl.sum(p, axis=1)
            if IEEE:
                acc = acc * alpha[:, None] + tl.dot(p, v, input_precision="ieee")
            else:
                acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
            m_i = m_new
            blk += 1
        seen = l_i > 0.0
        out = tl.where(seen[:, None], acc / tl.where(seen, l_i, 1.0)[:, None], 0.0)
        tl.store(out_ptr + q_offsets, out.to(out_ptr.dtype.element_ty), mask=row_valid[:, None])
        if RETURN_LSE:
            lse = tl.where(seen, m_i + tl.log(tl.where(seen, l_i, 1.0)), float("-inf"))
            tl.store(lse_ptr + (start + j).to(tl.int64) * NUM_HEADS + head, lse, mask=row_valid)
        chunk += ROWS

def paged_attention(query, key_cache, value_cache, block_table, seq_lens, cu_query_lens, scale,
                    sliding_window=0, soft_cap=0.0, return_lse=False):
    """Launcher; arguments already validated (specops/_checks.py); no device sync."""
    num_query_tokens, num_heads, head_dim = query.shape
    num_blocks, block_size, num_kv_heads, _ = key_cache.shape
    batch = seq_lens.shape[0]
    out = torch.empty_like(query)
    lse = torch.empty((num_query_tokens, num_heads) if return_lse else (0, 0), dtype=torch.float32,
                      device=query.device)
    if batch == 0 or num_query_tokens == 0:
        return out, lse
    block_m = max(16, triton.next_power_of_2(ROWS_PER_TILE * (num_heads // num_kv_heads)))
    _paged_attention_kernel[(batch, num_kv_heads)](
        out, lse if return_lse else out, query, key_cache, value_cache, block_table, seq_lens, cu_query_lens,
        scale, soft_cap if soft_cap > 0 else 1.0, sliding_window, num_blocks, block_table.shape[1],
        num_query_tokens,
        NUM_HEADS=num_heads, NUM_KV_HEADS=num_kv_heads, HEAD_DIM=head_dim, BLOCK_SIZE=block_size,
        BLOCK_M=block_m, ROWS=ROWS_PER_TILE, HAS_SOFT_CAP=soft_cap > 0, HAS_WINDOW=sliding_window > 0, RETURN_LSE=return_lse,
        IEEE=query.dtype == torch.float32,
    )
    return out, lse
