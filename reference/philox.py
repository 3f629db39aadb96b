"""Philox4x32-10 (Salmon et al. 2011, "Parallel random numbers: as easy as 1, 2, 3"), the
counter-based generator the fused ``verify`` op draws from, in plain torch int64 arithmetic.

Every backend implements the same function bit for bit: a draw depends only on its key
(the request's seed) and its counter (absolute token position, purpose, index), never on
what else is in the batch or which backend runs it. Words are uint32 values held in int64
tensors (torch has no uint32 arithmetic on every device).
"""

from __future__ import annotations

import torch

MASK32 = 0xFFFFFFFF
M0, M1 = 0xD2511F53, 0xCD9E8D57  # round multipliers
W0, W1 = 0x9E3779B9, 0xBB67AE85  # key schedule (Weyl) increments
ROUNDS = 10

# What a draw is for: the third counter word, so the streams of one position never meet.
PURPOSE_ACCEPT = 0  # the uniform of the acceptance test of a draft
PURPOSE_SAMPLE = 1  # the 64-bit draw that samples a token at a position
PURPOSE_PROPOSE = 2  # the proposals of a residual draw: block t holds proposal t


def _mulhilo(a: torch.Tensor, b: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(high, low) 32-bit words of the 64-bit product a * b, without int64 overflow: b is
    split into 16-bit halves so every partial product stays below 2^48."""
    b_lo, b_hi = b & 0xFFFF, b >> 16
    lo_part = a * b_lo  # < 2^48
    hi_part = a * b_hi  # < 2^48
    mid = hi_part + (lo_part >> 16)  # < 2^49
    high = mid >> 16
    low = ((mid & 0xFFFF) << 16) | (lo_part & 0xFFFF)
    return high & MASK32, low & MASK32


def philox4x32_10(counter: torch.Tensor, key: torch.Tensor) -> torch.Tensor:
    """Philox4x32 with 10 rounds.

    Shape: counter ``[..., 4]``, key ``[..., 2]`` (broadcastable), int64 holding uint32
    words; returns ``[..., 4]`` int64 holding uint32 words.
    """
    c0, c1, c2, c3 = (counter[..., i] & MASK32 for i in range(4))
    k0, k1 = key[..., 0] & MASK32, key[..., 1] & MASK32
    for round_index in range(ROUNDS):
        if round_index > 0:
            k0 = (k0 + W0) & MASK32
            k1 = (k1 + W1) & MASK32
        hi0, lo0 = _mulhilo(c0, M0)
        hi1, lo1 = _mulhilo(c2, M1)
        c0, c1, c2, c3 = hi1 ^ c1 ^ k0, lo1, hi0 ^ c3 ^ k1, lo0
    return torch.stack(torch.broadcast_tensors(c0, c1, c2, c3), dim=-1)


def split64(value: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(low, high) uint32 words of int64 values (two's complement for negatives)."""
    return value & MASK32, (value >> 32) & MASK32


def counters(position: torch.Tensor, purpose: int, index: torch.Tensor) -> torch.Tensor:
    """Counter ``(position_lo, position_hi, purpose, index)``. Shapes broadcast."""
    lo, hi = split64(position)
    lo, hi, index = torch.broadcast_tensors(lo, hi, index)
    return torch.stack([lo, hi, torch.full_like(lo, purpose), index & MASK32], dim=-1)


def keys(seed: torch.Tensor) -> torch.Tensor:
    """Key ``(seed_lo, seed_hi)`` of int64 seeds."""
    lo, hi = split64(seed)
    return torch.stack([lo, hi], dim=-1)


def uniform_from_word(word: torch.Tensor) -> torch.Tensor:
    """U[0, 1) float32 from the top 24 bits of a word: exact, so every backend agrees."""
    return (word >> 8).to(torch.float32) * (1.0 / (1 << 24))

