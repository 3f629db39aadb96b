"""Pure-PyTorch references of ``sampling_value_stats`` and ``paged_attention_value_stats``:
the numbers the ops' value checks decide on (specops/_checks.py), which the C++ CPU and
CUDA kernels (csrc/value_stats_*.cpp/.cu) compute in one pass over each tensor.

``sampling_value_stats`` reads each tensor as its flat numel, on whatever device it is (so
a caller whose arguments sit on different devices still gets its statistics, one
``.item()`` each); the result is float64 on the device of ``cu_num_draft_tokens``, in the
slots of ``STATS``. ``paged_attention_value_stats`` returns the slots of
``ATTENTION_STATS`` on the block table's device.
"""

from __future__ import annotations

import torch

# The result's slots (csrc/value_stats.h, enum ValueStat).
STATS = (
    "min_count",  # smallest draft count: cu[0] and each step cu[b] - cu[b - 1]
    "max_count",  # largest draft count
    "last_cu",  # cu[B - 1], 0 when B = 0
    "min_id",  # smallest token id
    "max_id",  # largest token id
    "target_non_finite",  # 1 if target_logits holds NaN or +-inf
    "bonus_non_finite",  # 1 if bonus_logits does
    "bad_temperature",  # 1 if some temperature is not >= 0 (NaN included)
    "bad_top_p",  # 1 if some top_p is not > 0 (NaN included)
)
# What a min or max slot holds when there is nothing to take it over (no request, no id).
EMPTY_MIN, EMPTY_MAX = 2**63 - 1, -(2**63)


def _min_max(values: torch.Tensor) -> tuple[int, int]:
    if values.numel() == 0:
        return EMPTY_MIN, EMPTY_MAX
    lo, hi = torch.aminmax(values.reshape(-1).long())
    return int(lo.item()), int(hi.item())


def _any(t: torch.Tensor | None, bad) -> float:
    return float(t is not None and bool(bad(t).any().item()))


def sampling_value_stats(
    cu_num_draft_tokens: torch.Tensor,  # [B] int32 | int64
    token_ids: torch.Tensor | None,  # [T] int32 | int64
    target_logits: torch.Tensor | None,  # [T, V] float32 | bfloat16 | float16
    bonus_logits: torch.Tensor | None,  # [B, V]
    temperature: torch.Tensor | None,  # [B] float32
    top_p: torch.Tensor | None,  # [B] float32
) -> torch.Tensor:  # [9] float64
    cu = cu_num_draft_tokens.reshape(-1).long()
    counts = torch.diff(cu, prepend=cu.new_zeros(1))  # cu[0], cu[1] - cu[0], ...
    min_count, max_count = _min_max(counts)
    last_cu = int(cu[-1].item()) if cu.numel() else 0
    min_id, max_id = _min_max(token_ids) if token_ids is not None else (EMPTY_MIN, EMPTY_MAX)
    stats = [
        min_count, max_count, last_cu, min_id, max_id,
        _any(target_logits, lambda z: ~torch.isfinite(z)),
        _any(bonus_logits, lambda z: ~torch.isfinite(z)),
        _any(temperature, lambda t: ~(t >= 0)),
        _any(top_p, lambda p: ~(p > 0)),
    ]
    return torch.tensor([float(s) for s in stats], dtype=torch.float64, device=cu_num_draft_tokens.device)


# paged_attention_value_stats's slots (csrc/value_stats.h, enum AttentionStat).
ATTENTION_STATS = (
    "first_query_cu",  # cu_query_lens[0]
    "last_query_cu",  # cu_query_lens[B]
    "min_query_len",  # smallest cu_query_lens[b + 1] - cu_query_lens[b]
    "min_slack",  # smallest seq_lens[b] - query length b
    "most_blocks",  # largest ceil(max(seq_lens[b], 0) / block_size)
    "bad_block_id",  # 1 if a block id a sequence uses is outside [0, num_blocks)
)


def paged_attention_value_stats(
    block_table: torch.Tensor,  # [B, max_blocks] int32
    seq_lens: torch.Tensor,  # [B] int32
    cu_query_lens: torch.Tensor,  # [B + 1] int32
    block_size: int,
    num_blocks: int,
) -> torch.Tensor:  # [6] float64
    """Sequence b uses the first ceil(max(seq_lens[b], 0) / block_size) entries of its
    block-table row (at most max_blocks of them)."""
    batch, max_blocks = block_table.shape
    min_query_len = min_slack = EMPTY_MIN
    most_blocks, bad_block_id = EMPTY_MAX, False
    for b in range(batch):
        query_len = int(cu_query_lens[b + 1]) - int(cu_query_lens[b])
        seq_len = int(seq_lens[b])
        used = -(-seq_len // block_size) if seq_len > 0 else 0
        min_query_len = min(min_query_len, query_len)
        min_slack = min(min_slack, seq_len - query_len)
        most_blocks = max(most_blocks, used)
        ids = block_table[b, :min(used, max_blocks)].long()
        bad_block_id = bad_block_id or bool(((ids < 0) | (ids >= num_blocks)).any())
    stats = [int(cu_query_lens[0]), int(cu_query_lens[batch]), min_query_len, min_slack, most_blocks, bad_block_id]
    return torch.tensor([float(s) for s in stats], dtype=torch.float64, device=block_table.device)
