"""Launch plan of the Triton paged_attention kernel: tile sizes, warps, pipeline depth and
the number of KV splits, from tensor shapes, the GPU's multiprocessor count and the
caller's max_query_len hint only (never from seq_lens or cu_query_lens values, which would
cost a device sync and break CUDA-graph capture).
"""

from __future__ import annotations

import dataclasses
import functools

from .launch import next_power_of_2

# Accumulator cap: BLOCK_M x BLOCK_D float32 elements of one program (64 registers a
# thread at 8 warps); a larger GQA group x query rows tile takes another pass over the keys.
MAX_TILE_ELEMENTS = 16384
MAX_ROWS = 16  # query rows of one sequence per tile: verify with k <= 15 in one pass
MIN_KEYS_PER_SPLIT = 128  # a split streams at least this many keys (one wide key tile)
MAX_SPLITS = 32
PROGRAMS_PER_MULTIPROCESSOR = 2  # split until the grid holds about this many programs per SM
ASSUMED_MULTIPROCESSORS = 132  # off a GPU (the interpreter): plan as on an H100
# Memory bandwidth an SM (GB/s) up to which a lone 32-row verify program keeps its SM's share
# of it streaming (H100 SXM: 25); faster memory (H200: 36) wants two programs an SM.
LONE_PROGRAM_MAX_GBS = 30


@dataclasses.dataclass(frozen=True)
class AttentionLaunch:
    """How one paged_attention call is tiled and split.

    rows : query rows of one sequence per tile (a sequence with more takes several passes).
    block_m : tile rows, ``rows x GQA group`` padded to a power of two >= 16.
    block_n : keys per step (may span several cache blocks).
    num_splits : programs sharing one (sequence, KV head); > 1 adds a merge kernel.
    num_warps, num_stages : Triton launch options (num_stages: software-pipelining depth).
    """

    rows: int
    block_m: int
    block_n: int
    num_splits: int
    num_warps: int = 4
    num_stages: int = 3

    def __post_init__(self) -> None:
        for name in ("rows", "block_m", "block_n", "num_splits", "num_warps", "num_stages"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"AttentionLaunch.{name} must be a positive int, got {value!r}")
        for name in ("block_m", "block_n", "num_warps"):
            value = getattr(self, name)
            if value & (value - 1):
                raise ValueError(f"AttentionLaunch.{name} must be a power of two, got {value}")
        if self.block_m < 16 or self.block_n < 16:
            raise ValueError(f"AttentionLaunch block_m and block_n must be >= 16 (tl.dot), got "
                             f"{self.block_m} and {self.block_n}")
        if self.num_splits > MAX_SPLITS:
            raise ValueError(f"AttentionLaunch.num_splits must be <= {MAX_SPLITS}, got {self.num_splits}")


def _floor_power_of_2(n: int) -> int:
    return 1 << (max(n, 1).bit_length() - 1)


@functools.lru_cache(maxsize=4096)  # a pure function of ints, called on every launch
def plan_paged_attention(
    num_query_tokens: int, batch: int, num_heads: int, num_kv_heads: int, head_dim: int, max_context: int,
    num_multiprocessors: int, rows: int | None = None, num_splits: int | None = None, max_query_len: int = 0,
    element_size: int = 2, dram_gbs_per_multiprocessor: int = 0,
) -> AttentionLaunch:
    """The launch for these shapes; ``max_context`` is ``max_blocks x block_size`` (the
    longest sequence the block table can address). ``max_query_len`` is the longest query
    length in the batch if the caller knows it (0: unknown, plan for the worst case); it
    only sizes the tile rows: a sequence with more query rows than ``rows`` takes several
    passes over its keys, so a wrong hint costs speed, never correctness. ``element_size``
    is the bytes of one cache element (the deepest pipelines fit 16-bit tiles only).
    ``dram_gbs_per_multiprocessor`` is the GPU's peak memory bandwidth over its SMs, GB/s
    (0: unknown, plan as on an H100).
    ``rows`` and ``num_splits`` override the planned values (tests force splits and
    multi-pass tiles on small shapes)."""
    group = num_heads // num_kv_heads
    block_d = max(16, next_power_of_2(head_dim))
    if rows is None:
        # The longest query length if every sequence has at least one row: 1 for a decode
        # batch, so decode tiles hold just the GQA group. A caller's hint can only tighten it.
        longest = max(1, num_query_tokens - batch + 1)
        if max_query_len > 0:
            longest = min(max_query_len, longest)
        fit = _floor_power_of_2(MAX_TILE_ELEMENTS // (block_d * group))
        rows = min(next_power_of_2(longest), MAX_ROWS, fit)
    block_m = max(16, next_power_of_2(rows * group))
    programs = batch * num_kv_heads
    # 32-row tiles at head dim 128 of a grid near one program an SM (from 70% of the SMs):
    # not split, each program an SM and a deeper pipeline of its own (bf16: 2 x 64 KB of K
    # and V in flight), no merge. H100, L=4096 verify: B=16 99.3 µs against 102.8 at 2
    # splits, B=14 90.4 against 92.7, B=12 83.3 against 84.3; at B=10 (61% of the SMs) and at
    # head dim 64 (two programs an SM) splitting wins (bench/NOTES.md). Not where an SM's
    # share of the bandwidth outruns one program: H200, B=16 82.6 µs alone, 78.3 at 2 splits.
    alone = (block_m == 32 and 64 < block_d <= 128 and element_size <= 2
             and 10 * programs >= 7 * num_multiprocessors and programs <= num_multiprocessors
             and dram_gbs_per_multiprocessor <= LONE_PROGRAM_MAX_GBS)
    if num_splits is None:
        num_splits = 1
        if programs < num_multiprocessors and not alone:
            # Rounded down: a wide tile's program holds a whole SM's shared memory, so a grid
            # just over the SM count runs an extra, mostly idle wave (H100: B=16 verify 104 µs
            # at 2 splits, 122 at 3).
            wanted = PROGRAMS_PER_MULTIPROCESSOR * num_multiprocessors // programs
            num_splits = max(1, min(wanted, max_context // MIN_KEYS_PER_SPLIT, MAX_SPLITS))
        elif (block_m == 16 and 64 < block_d <= 128 and element_size <= 2 and 4 * programs <= 5 * num_multiprocessors
              and max_context >= 2 * MIN_KEYS_PER_SPLIT):
            # 16-row decode tiles of 1-1.25 programs an SM: two splits (H100: B=18 L=16384
            # 421 µs against 463, B=20 L=4096 123 against 129; at B=24, 1.45 an SM, within
            # 1.5% either way; 32-row verify tiles lose 7-13% split: bench/NOTES.md).
            num_splits = 2
    alone = alone and num_splits == 1
    # Keys per step (H100 sweeps over the ANCHORS shapes, bench/NOTES.md): 128-key tiles, two
    # stages deep, where the tile has 32 rows (verify: 8 rows x a GQA group of 4) or the grid
    # holds at most two programs an SM (split small batches, and 16-row decode tiles of
    # B x Hkv <= 264 on an H100: B=32 L=16384 decode 711 µs against 744 with 64-key tiles,
    # B=20 unsplit 484 against 587); 64-key tiles, three deep, for 16-row decode tiles of larger
    # grids (B=40 L=4096: 232 µs against 235, B=64 L=1024: 96 against 102) and for 64-row
    # tiles. K and V tiles x stages stay <= 128 KB (bf16): wide tiles go three deep at head
    # dim <= 64 (B=32 L=1024 D=64 verify: 33.4 µs vs 38.3) and where a program has an SM to
    # itself (above).
    few = programs <= PROGRAMS_PER_MULTIPROCESSOR * num_multiprocessors  # before any split
    # Head dim <= 64 decode tiles take 128 keys over any grid, two deep beyond two programs
    # an SM (B=64 L=4096 D=64: 186.5 µs against 193.5; B=128 373.8 against 396.0; B=160
    # L=1024 123.5 against 121.8).
    small_heads = block_m == 16 and block_d <= 64
    wide = block_d <= 128 and (block_m == 32 or (block_m <= 32 and few) or small_heads)
    if wide:
        deep = alone or (block_d <= 64 and (few or block_m == 32))
        block_n, num_stages = 128, 3 if deep else 2
    elif block_d <= 128:
        block_n, num_stages = 64, 3
    elif block_m <= 32 and few and element_size <= 2:
        # Head dim 256 over a grid of at most two programs an SM: 64-key tiles three deep
        # (B=24 L=8192 decode: 546 µs against 593 with 32-key tiles; B=32 714 against 729).
        block_n, num_stages = 64, 3
    else:
        block_n, num_stages = 32, 2
    return AttentionLaunch(
        rows=rows,
        block_m=block_m,
        block_n=block_n,
        num_splits=num_splits,
        num_warps=4 if block_m * block_d <= 8192 else 8,
        num_stages=num_stages,
    )
