"""Triton kernel of the engine's attention prologue: RoPE of q and k from the fused qkv
projection, q written out, k and v written straight into their paged-cache slots. One
launch in place of three (RoPE, the contiguous copy of v, reshape_and_cache).

Numerics are the eager formula's (specops/engine/model.py, rope_qkv), op by op: cos and
sin cast to qkv's dtype, then x * cos and rotate(x) * sin each rounded to that dtype, then
their sum rounded; so the output equals the eager path's bit for bit in every dtype.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .launch import direct_launch, next_power_of_2


@triton.jit
def _round_to(x, DTYPE: tl.constexpr):
    """float32 ``x`` rounded to nearest (ties to even) in DTYPE, returned as float32 (finite
    x). By hand for bfloat16: the interpreter's float32 -> bfloat16 cast truncates where the
    GPU's rounds to nearest even."""
    if DTYPE == tl.bfloat16:
        bits = x.to(tl.uint32, bitcast=True)
        bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
        return bits.to(tl.float32, bitcast=True)
    else:
        return x.to(DTYPE).to(tl.float32)


@triton.jit
def _rotate_half(x1, x2, c1, c2, s1, s2, DTYPE: tl.constexpr):
    """Both halves of x * cos + rotate(x) * sin, rotate(x) = (-x2, x1), each product and
    the sum rounded to DTYPE as the eager ops are (float32 in, float32 out)."""
    out1 = _round_to(_round_to(x1 * c1, DTYPE) + _round_to(-x2 * s1, DTYPE), DTYPE)
    out2 = _round_to(_round_to(x2 * c2, DTYPE) + _round_to(x1 * s2, DTYPE), DTYPE)
    return out1.to(DTYPE), out2.to(DTYPE)  # exact: already DTYPE values


# Grid (N, 2). Program (i, 0) rotates token i's q heads into q; program (i, 1) rotates its
# k heads and stores k and v in slot slot_mapping[i] of the caches (skipped when -1 or
# outside the cache). Bytes: the token's qkv row read once, q, k, v written once.
@direct_launch
@triton.jit(do_not_specialize=["num_slots"])
def rope_cache_kernel(
    q_ptr,  # [N, Hq, D], written
    key_cache_ptr,  # [num_blocks, block_size, Hkv, D], written at the token's slot
    value_cache_ptr,  # [num_blocks, block_size, Hkv, D]
    qkv_ptr,  # [N, (Hq + 2 Hkv) D], rows contiguous
    qkv_stride,  # elements between qkv rows
    cos_ptr,  # [N, D] float32, contiguous
    sin_ptr,  # [N, D] float32
    slot_mapping_ptr,  # [N] int64
    num_slots,
    NUM_HEADS: tl.constexpr,
    NUM_KV_HEADS: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_HQ: tl.constexpr,  # next powers of two of the head counts and of D / 2
    BLOCK_HKV: tl.constexpr,
    BLOCK_HALF: tl.constexpr,
):
    i = tl.program_id(0).to(tl.int64)
    DTYPE: tl.constexpr = q_ptr.dtype.element_ty
    HALF: tl.constexpr = HEAD_DIM // 2
    d = tl.arange(0, BLOCK_HALF)
    d_ok = d < HALF
    cos_row, sin_row = cos_ptr + i * HEAD_DIM, sin_ptr + i * HEAD_DIM
    # cos and sin in qkv's dtype first, as the eager formula casts them.
    c1 = _round_to(tl.load(cos_row + d, mask=d_ok), DTYPE)[None, :]
    c2 = _round_to(tl.load(cos_row + HALF + d, mask=d_ok), DTYPE)[None, :]
    s1 = _round_to(tl.load(sin_row + d, mask=d_ok), DTYPE)[None, :]
    s2 = _round_to(tl.load(sin_row + HALF + d, mask=d_ok), DTYPE)[None, :]
    row = qkv_ptr + i * qkv_stride
    if tl.program_id(1) == 0:  # the q heads
        hq = tl.arange(0, BLOCK_HQ)[:, None]
        q_mask = (hq < NUM_HEADS) & d_ok[None, :]
        q_src = row + hq * HEAD_DIM + d[None, :]
        x1 = tl.load(q_src, mask=q_mask).to(tl.float32)
        x2 = tl.load(q_src + HALF, mask=q_mask).to(tl.float32)
        out1, out2 = _rotate_half(x1, x2, c1, c2, s1, s2, DTYPE)
        q_dst = q_ptr + (i * NUM_HEADS + hq) * HEAD_DIM + d[None, :]
        tl.store(q_dst, out1, mask=q_mask)
        tl.store(q_dst + HALF, out2, mask=q_mask)
    else:  # the k and v heads, into the caches
        slot = tl.load(slot_mapping_ptr + i)
        if (slot >= 0) & (slot < num_slots):
            hk = tl.arange(0, BLOCK_HKV)[:, None]
            kv_mask = (hk < NUM_KV_HEADS) & d_ok[None, :]
            k_src = row + (NUM_HEADS + hk) * HEAD_DIM + d[None, :]
            k1 = tl.load(k_src, mask=kv_mask).to(tl.float32)
            k2 = tl.load(k_src + HALF, mask=kv_mask).to(tl.float32)
            rotated1, rotated2 = _rotate_half(k1, k2, c1, c2, s1, s2, DTYPE)
            cache_offset = (slot * NUM_KV_HEADS + hk) * HEAD_DIM + d[None, :]  # slot = block * block_size + offset
            tl.store(key_cache_ptr + cache_offset, rotated1, mask=kv_mask)
            tl.store(key_cache_ptr + cache_offset + HALF, rotated2, mask=kv_mask)
            v_src = k_src + NUM_KV_HEADS * HEAD_DIM  # v: copied unrotated, in two halves like k
            tl.store(value_cache_ptr + cache_offset, tl.load(v_src, mask=kv_mask), mask=kv_mask)
            tl.store(value_cache_ptr + cache_offset + HALF, tl.load(v_src + HALF, mask=kv_mask), mask=kv_mask)


def rope_cache(qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, num_heads: int, num_kv_heads: int,
               key_cache: torch.Tensor, value_cache: torch.Tensor, slot_mapping: torch.Tensor) -> torch.Tensor:
    """RoPE of q and k from ``qkv`` ``[N, (Hq + 2 Hkv) D]`` (rows contiguous) with ``cos``/``sin``
    ``[N, D]`` float32; k and v written into slot ``slot_mapping[i]`` of the caches
    ``[num_blocks, block_size, Hkv, D]`` (qkv's dtype; -1 = padding, skipped). Returns q
    ``[N, Hq, D]``. The engine's own inputs: shapes and dtypes are checked, values are not."""
    n, d = qkv.shape[0], cos.shape[-1]
    if (qkv.shape[1] != (num_heads + 2 * num_kv_heads) * d or qkv.stride(1) != 1 or d % 2
            or cos.shape != (n, d) or sin.shape != (n, d) or cos.dtype != torch.float32 or sin.dtype != torch.float32
            or not (cos.is_contiguous() and sin.is_contiguous())):
        raise ValueError(f"rope_cache: qkv {tuple(qkv.shape)} and cos/sin {tuple(cos.shape)} do not match "
                         f"{num_heads} + 2 x {num_kv_heads} heads of an even head dim (cos/sin float32, contiguous)")
    if (key_cache.shape != value_cache.shape or key_cache.shape[2:] != (num_kv_heads, d)
            or key_cache.dtype != qkv.dtype or value_cache.dtype != qkv.dtype
            or not (key_cache.is_contiguous() and value_cache.is_contiguous())):
        raise ValueError(f"rope_cache: key_cache {tuple(key_cache.shape)} / value_cache {tuple(value_cache.shape)} "
                         f"must be contiguous [num_blocks, block_size, {num_kv_heads}, {d}] {qkv.dtype}")
    if slot_mapping.shape != (n,) or slot_mapping.dtype != torch.int64:
        raise ValueError(f"rope_cache: slot_mapping must be [{n}] int64, got {tuple(slot_mapping.shape)} "
                         f"{slot_mapping.dtype}")
    q = torch.empty((n, num_heads, d), dtype=qkv.dtype, device=qkv.device)
    if n == 0:
        return q
    rope_cache_kernel[(n, 2)](
        q, key_cache, value_cache, qkv, qkv.stride(0), cos, sin, slot_mapping,
        key_cache.shape[0] * key_cache.shape[1], NUM_HEADS=num_heads, NUM_KV_HEADS=num_kv_heads, HEAD_DIM=d,
        BLOCK_HQ=next_power_of_2(num_heads), BLOCK_HKV=next_power_of_2(num_kv_heads),
        BLOCK_HALF=next_power_of_2(d // 2), num_warps=4, enable_fp_fusion=False,
    )
    return q
