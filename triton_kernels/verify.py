"""Triton kernel of the fused ``verify`` op, bit for bit reference/verify.py, launched as
row passes split across programs (verify_rows.py), a screen (verify_screen.py) and
per-request passes (verify_decide.py): all asynchronous, workspaces sized from the shapes
alone (no host sync: CUDA-graph capturable).

Launches, in order (B requests, S vocab splits, width = max_spec_len + 1, a slot is a
(request, step) pair, B * width of them; programs of unreachable slots exit at once):
1. row max, first argmax and an approximate normaliser, grid (B * width, S): every
   reachable target and bonus row once; in calls without top-k, top-p or
   log-probabilities (MAX_PASS_TESTS) it also settles the acceptance tests (the last
   program of a draft step's row stores a verdict: passes, fails or unsettled), and 3 is
   not launched;
2. top-k search (only with top_k given): 9 rounds, grid (B * width, S), top-k rows; a
   split reads its row until few enough of its entries lie in the search interval, then
   the keys it kept (verify_search.py);
3. screen, grid (B,): greedy requests finish here; plain random requests settle their
   acceptance tests from the approximate normalisers and mark the steps that need the
   exact one (the rejected or bonus step, and every later step after an unsettled test);
   with top-k, top-p or log-probabilities every reachable step is marked. Skipped for
   one request with few enough bytes of rows (UNSCREENED_MAX_BATCH, UNSCREENED_BYTES):
   every reachable step is then summed in 4 and tested exactly in 6, and on a GPU 1 and 4
   are one launch (verify_unscreened.py: a program a block, waiting for its row's max;
   the last of a row's programs tests its step exactly, and 6 starts at the first failure);
4. exact fixed-point normaliser z1, grid (B * S,): the marked steps of each request (a
   range, usually one step), or those the verdicts of 1 leave the decisions (the first
   that did not pass, the unsettled ones after it and the step that samples; the steps
   that surely pass between need none), in turn; with top-k, top-p or log-probabilities
   (every step marked) grid (width * B * S,), a step each; with top-k (seeded rows, top_k
   <= TOP_K_MARKS_MAX_K) only the blocks top-k's round 0 marked (a logit >= its low end);
5. top-p search and normaliser z2 (only with top_p given): 8 rounds + 1, top-p rows;
   after top-k both read only the blocks whose z1 block sum is not 0 (about top_k a row),
   and for top_k <= TOP_P_FINISH_KEYS one launch after round 0 finds the threshold from
   the keys round 0 kept (verify_search_finish.py): the later rounds exit at once;
6. decisions, grid (B,): the remaining acceptance tests, exactly, from the screen's stop
   (or the first step whose verdict is not a pass, a later pass taken from its verdict);
   a bonus row or n-gram rejection draws its token here, by inversion over the normaliser's
   block sums, then inside one block (verify_sample.py); a rejection with draft probs tries
   its residual proposals here (draws from the same block sums, each kept with
   probability R / W at its token);
7. with draft probs only: for the rejections no proposal settled, the residual masses'
   block sums, grid (B, S'); the last of a request's programs to finish (an atomic arrival
   count) draws the token from them in the same launch (verify_sample.py). The other
   requests' programs exit at once.
With no temperature (every request greedy) and no log-probabilities, launches 1 and 3 only.
On sm_90+ every launch after the first is a programmatic dependent launch: scheduled while
the one before finishes, each of its programs reads the op's own inputs it needs (drafts,
their logits and draft probs, per-request parameters), then waits for that launch before
reading what it wrote (verify_math.chain_launch).
Bytes, plain random requests: each reachable logit row once, plus, per request, the
sampled row once more for its exact normaliser (which needs the row max first, see
verify_rows.py), one block of it per proposal and, at a rejection with draft probs that no
proposal settled, once again with its draft-probs row for the residual masses. Greedy: each
row once. With top-k/top-p: every row's normaliser (after top-k, where marked, only about
top_k blocks of it), and per threshold the rows again for
the rounds before a split keeps its interval's keys (2 of the 9 / 8 rounds on 128k random
logits, bench/search_rounds.py under the interpreter); top-p after top-k and its normaliser
read only the blocks z1 left nonzero (about top_k of them a row).
"""

from __future__ import annotations


import torch

from . import launch_plan
from .launch import cdiv, has_pdl, multiprocessor_count, next_power_of_2
from .stream_counters import row_counters
from .verify_decide import decide_kernel
from .verify_rows import fixed_sum_kernel, row_max_kernel
from .verify_walk import row_walk_kernel
from .verify_sample import SAMPLE_FLOATS, SAMPLE_INTS, residual_sample_kernel
from .verify_screen import screen_kernel
from .verify_search import (
    AGG_COLUMNS,
    META_COLUMNS,
    TOP_K_MODE,
    TOP_K_ROUNDS,
    TOP_P_MODE,
    TOP_P_ROUNDS,
    threshold_search_kernel,
)
from .verify_search_finish import top_p_finish_kernel
from .verify_slots import PACKED_MAX_SPLITS
from .verify_unscreened import packed_departures, row_max_sum_kernel

BLOCK_V = 2048  # vocab entries per loop iteration of a row pass: 8 KB of fp32 in flight
SUM_WARPS = 4
RESIDUAL_WARPS = 8
# The exact normaliser runs about one row per request: its splits are sized from a count of
# programs per SM, floor(count * SMs / B) splits a row; the residual pass runs count * SMs
# programs shared by the few requests left to sample (verify_sample.py). The
# normaliser's count, 12, is a sweep's (6 / 9 / 12 / 16 with its (request, split) grid, which
# compiles to 64 registers a thread at 4 warps, 8 programs per SM: so 1.5 waves): against 9,
# B = 64 n-gram 85.4 -> 82.7 µs, random 93.8 -> 90.5, B = 256 345 -> 320, B = 16 33.7 ->
# 33.9 (bench/NOTES.md; a cap at 48 registers, which compiles without a spill, moved each
# shape by under 1%, both ways). The residual pass at 8 warps is capped at 64 for 4
# resident: uncapped, its draw tail takes 80, which allows 3; capped, ptxas spills at most
# one register, outside the loop: sm_90, Triton 3.6.
SUM_RESIDENT = 12
RESIDUAL_RESIDENT = 4
# At most RESIDUAL_FEW_REQUESTS requests: RESIDUAL_FEW_RESIDENT residual programs a SM. In
# most calls no request reaches the pass, and each program only reads the sample_int column
# and leaves. RESIDUAL_RESIDENT 1 against 4 at every B (H100 A/B, bench/NOTES.md, 2026-12-07):
# B=16 default drafts 30.0 -> 29.2 µs, B=16 close 36.7 -> 36.1, but B=64 close 97.1 -> 97.8
# (1-3 requests of 63 blocks each, past 132 programs), B=64 default and V=32000 within 0.2.
# The rule itself against 0 (4 a SM everywhere), H100 A/B: B=16 29.8 -> 29.1, B=16 close
# 34.6 -> 33.9, B=8 close 22.4 -> 22.0; 32 in place of 16: B=32 within 0.2 (noise).
RESIDUAL_FEW_REQUESTS = 16
RESIDUAL_FEW_RESIDENT = 1
RESIDUAL_SCAN = 1024  # requests the residual pass reads at a time to find those left to sample
REGISTERS_PER_SM = 65536
RESIDUAL_MAX_REGISTERS = REGISTERS_PER_SM // (RESIDUAL_RESIDENT * RESIDUAL_WARPS * 32)
NUM_WARPS = 8
# The max pass: PROGRAMS_PER_SM programs per SM are wanted, rounded up to whole splits, so
# one more must fit (B = 64 random: 640 programs on 132 SMs); capped at 48 registers a
# thread it issues 3 instructions more per 8 entries than uncapped (54, which allows 4).
ROW_MAX_RESIDENT = 5
# The search: each of SEARCH_WARPS * 32 threads holds one entry of a block and its 16
# candidates' counts (the tile [16, SEARCH_BLOCK_V]), SEARCH_UNROLL blocks loaded a step,
# the next step's loads issued before a step's counts. 4 warps, not 8: 164 registers a
# thread for top-p allow 3 programs an SM, not 1 (H100, bench/NOTES.md; register caps lost).
SEARCH_BLOCK_V = 128
SEARCH_WARPS = 4
SEARCH_UNROLL = 4
# A search split keeps its interval's keys once at most SEARCH_KEEP_LIMIT lie in it
# (verify_search.py), each lane in a column of SEARCH_KEPT_ROWS: 32 KB a (row, split); its
# later rounds read those, not the row. -1: never keep. 4096 keeps after the first round on
# B = 64's rows of 128256 in two splits (bench/search_rounds.py; 64 rows: a lane of 128
# holds 32 of 4096 keys on average).
SEARCH_KEEP_LIMIT = 4096
SEARCH_KEPT_ROWS = 64
# At most this many bytes of kept keys a call: past it (B = 2^20 requests of 40 entries
# wanted 128 GiB before this cap) fewer rows, the keep limit scaled with them, none below one.
SEARCH_KEPT_BYTES = 256 << 20
# Top-k's round 0 starts from a lower bound on the k-th largest logit, found in SEED_ROUNDS
# 16-ary steps over lane-group maxima that the max pass stores (verify_search.top_k_seed), so
# it keeps its interval's keys at once instead of reading its row twice. Two sets a row:
# SEED_COARSE_VALUES maxima for k up to those over SEED_DENSITY, SEED_VALUES finer ones for
# larger k (up to their count; past it the row starts unseeded). Each a power of two a
# program (over the splits' power of two). 0: from the row max alone.
SEED_VALUES = 2048
SEED_COARSE_VALUES = 512
SEED_DENSITY = 1  # coarse maxima a kept key at least (H100: coarse at 1.6 beat fine by 3%)
SEED_ROUNDS = 3  # 16-ary steps over those maxima: near the max, then two evenly spaced
# Rows of more splits start unseeded: their round-0 programs read short splits, and the
# seed's steps cost more than the pass they spare (H200: B=1, 63 splits, top-k 50 + top-p
# 160.3 -> 163.2 µs seeded; B=16, 7 splits, 370.8 -> 321.4; bench/NOTES.md).
SEED_MAX_SPLITS = 16
# Top-p after top-k: finished in one launch from round 0's kept keys (verify_search_finish.py)
# where top_k and the keys a slot kept are at most TOP_P_FINISH_KEYS; False: every round runs.
TOP_P_FINISH = True
TOP_P_FINISH_KEYS = 64
# Top-k: its round 0, where seeded and top_k <= TOP_K_MARKS_MAX_K, marks the blocks holding
# a logit >= its interval's low end, and z1 reads only those (about top_k of V / 128 a
# row); elsewhere, or False, z1 reads every block (k = 1000 of V = 128256 marks most).
TOP_K_MARKS = True
TOP_K_MARKS_MAX_K = 256
# The first normaliser's registers a thread with top-k (0: no cap). The marks' gather loop
# took it from 96 to 121, 5 programs an SM to 4, and its unmarked rows (top_k past the
# marks' limit) from 76.5 to 111.1 µs at B=64 (H100, 640 programs: one wave became 1.2;
# bench/NOTES.md).
TOP_K_SUM_MAX_REGISTERS = 96
# Its registers without top-k (0: no cap). Skipping the steps that surely pass after an
# unsettled one (verify_rows.py) took B=16 from 62 to 80 registers (6 programs an SM) and
# B=256 from 56 to 72, the other bench shapes from 61-63 to 56; capped at 56 every shape
# compiles to 56 with no spill, 9 an SM (at 64: 64 and 8); sm_90, Triton 3.6,
# bench/verify_resources.py.
SUM_MAX_REGISTERS = 56
# The second normaliser's (top-p after top-k) registers a thread (0: no cap): uncapped it
# takes 128 (4 programs an SM); capped, B=64 top-k 50 + top-p 0.9 318.8 -> 307.5 µs, at 64
# 313.8 (H100). Without top-k it takes 80 uncapped.
SECOND_SUM_MAX_REGISTERS = 96
# Top-p's search rounds' registers a thread after top-k (0: no cap): uncapped 114 (4 programs
# an SM, 1.21 waves of 640 at B=64), capped 94 without a spill. H100: B=64 top-k 50 + top-p
# 0.9 303.0 -> 287.3 µs, top-k 1000 + top-p 958.9 -> 753.5. Top-p alone stays uncapped (167
# registers, 3 an SM): capped at 96 its full-row rounds lost 1293 -> 3271 µs at B=64, and at
# 128 -> 1470 (bench/NOTES.md).
TOP_P_SEARCH_MAX_REGISTERS = 96
# Top-p alone: round 0 keeps its interval's keys (verify_search.top_p_bounds; about a third
# of a split's on the bench's rows), so one row pass instead of two, into a buffer of its own
# size: TOP_P_KEPT_ROWS rows a lane, TOP_P_KEEP_LIMIT keys a split in later rounds. H100,
# B=64 k=4 V=128256 (bench/NOTES.md): top-p 0.9 985 -> 856 µs, 0.5 963 -> 745, 0.9 at
# temperature 2 (flatter rows, lanes overflow more) 1280 -> 1085; B=16 337 -> 287. At 128
# rows B=64's lanes overflow (1015); counting over the kept keys after keeping (top-k's
# deferred form) was slower, 856 -> 1025.
TOP_P_KEEP_FIRST = True
TOP_P_KEPT_ROWS = 256
TOP_P_KEEP_LIMIT = 16384
# The searches' kept rounds issue their next KEPT_UNROLL rows' loads before counting these
# (top-p alone's round 1 waited on L1TEX for 44% of its stalls at 15% occupancy under ncu).
# H100 (bench/NOTES.md), 5 rounds against loads in turn: B=64 top-p 0.9 817 -> 786 µs, B=16
# +0.6%, B=256 +0.1%; 3 rounds: top-p 0.5 701 -> 690, top-k + top-p +1% (the run's noise ~1%).
SEARCH_KEPT_PREFETCH = True
MASS_BLOCK = 128  # vocab entries per block sum of the normaliser's masses (a power of two)
PROPOSAL_ROUND = 4  # residual proposals tried at a time: most draws end in the first round
# The same on unscreened calls (one request: its decisions are the chain's tail), where 2
# against 4 took B=1 random from 13.6 to 12.8 µs on the H200 and 13.8 to 13.1 on the H100
# (k=8 with its bonus drawn 22.9 -> 21.3), while B >= 16 lost 0.2-0.8 µs with 2 (bench/NOTES.md).
# The proposals are drawn and tried in the same order either way.
UNSCREENED_PROPOSAL_ROUND = 2
# > 0 (a power of two): the proposals find their blocks in two levels, the last prefix sum of
# each PROPOSAL_GROUP blocks, then the group's own (verify_sample._blocks_holding): about
# 2 sqrt(blocks) compares a proposal instead of every block's (1002 at V = 128256). With
# PROPOSAL_Q_TILE, against neither, H100 A/B (bench/NOTES.md, 2026-12-07): B=64 close drafts
# 97.1 -> 95.6 µs, B=16 close 36.7 -> 35.1, B=16 default 30.0 -> 29.5, the other default
# shapes within 0.2; screened calls only (B=1 13.3 -> 13.7).
PROPOSAL_GROUP = 32
# True: the kept test's draft prob of each proposal selected from its block's, loaded with
# the block's logits (without it that load is dead code, compiled away, and the draft prob
# a read from memory after the scan; the draft-probs row is not in any cache then). With
# PROPOSAL_GROUP against it alone: B=64 close 96.1 -> 95.6, B=16 close 35.3 -> 35.1.
PROPOSAL_Q_TILE = True
DECIDE_WARPS = 8
# Screened calls with draft probs of at most one request per SM: the decisions at 16 warps,
# a program an SM (their proposals' tiles are latency-bound on a program's warps). H100 A/B
# against 8 (bench/NOTES.md, queued µs): B=64 close drafts 98.2 -> 96.7, B=16 close 38.4 ->
# 36.9, B=64 V=32000 close 42.7 -> 41.4, B=64 default drafts 82.9 -> 81.9; B=256 close (two
# programs an SM at 8 warps) 301.8 -> 308.4, so more requests than SMs keep 8, and so does
# B=1 unscreened (13.4 -> 15.2 random, 11.7 -> 12.3 n-gram at 16); n-gram B=64 read 80.7 in
# two runs at 16 against 78.7 at 8 (0f1832c), so n-gram keeps 8.
DECIDE_WARPS_ONE_PER_SM = 16
# The screen, one program per request, is latency-bound: 8 warps against 4, H100 A/B
# (bench/NOTES.md): B = 1 n-gram 15.5 -> 14.9 µs, B = 16 random 32.1 -> 31.6, B = 256 291.5
# -> 290.8 (1 and 2 warps slower, 16 no better).
SCREEN_WARPS = 8
# Tokens-only calls of at most UNSCREENED_MAX_BATCH requests whose reachable rows hold at
# most UNSCREENED_BYTES of logits skip the screen: the normaliser sums every reachable row
# (from L2, just read by the max pass) and the decisions test every step exactly, one
# launch less in the chain. H100, k=4, V=128256 (bench/NOTES.md): B=1 random 16.4 -> 14.6
# µs, n-gram 14.4 -> 12.5, B=1 k=8 V=151936 21.4 -> 18.3; B=2 17.4 -> 17.8, B=4 19.4 ->
# 21.4: a second request's rows cost more than the launch saves.
UNSCREENED_MAX_BATCH = 1
UNSCREENED_BYTES = 16 << 20
# Unscreened calls: the max pass and the exact normaliser as one launch whose programs wait
# for their row's max at a counter (verify_unscreened.py). H100, queued graph replays
# (bench/NOTES.md): B=1 random 16.9 -> 16.3 µs with 3 drafts accepted, 14.8 -> 14.1 with
# none, n-gram 12.4 -> 11.8, k=8 V=151936 21.3 -> 19.8.
ONE_LAUNCH_UNSCREENED = True
# That launch's last program of each row also stores the slot's max and normaliser total
# and tests its draft exactly, so the decisions start at the first step that failed instead
# of walking the passed ones (rows of at most PACKED_MAX_SPLITS programs, V <= 129024).
# H100, queued graph replays (bench/NOTES.md): B=1 random 16.3 -> 14.5 µs with 3 drafts
# accepted, 14.8 -> 14.3 with 1, 14.0 -> 14.3 with none; n-gram 11.8 -> 12.3.
ONE_LAUNCH_VERDICTS = True
# Screened calls without top-k, top-p or log-probabilities: the max pass settles the
# acceptance tests itself (verify_rows.py: row_max_kernel's TESTS; rows of at most
# PACKED_MAX_SPLITS programs, at most COUNTER_SLOTS slots) and no screen launch runs.
MAX_PASS_TESTS = True
# With MAX_PASS_TESTS, the max pass walks each request's steps in order and reads no row
# after the first failed step (verify_walk.py): a split of a request's rows a program,
# WALK_PROGRAMS_PER_SM programs an SM over the requests (not the slots). Off by default
# until its GPU tests and A/B have run (bench/NOTES.md, session 76).
MAX_PASS_WALK = False
WALK_LOOKAHEAD = True  # the next step's first block and draft loaded before a step's wait
WALK_PROGRAMS_PER_SM = 4  # the walk's programs an SM over the requests
WALK_SUMS = True  # the walk sums the exact normalisers the decisions read (fixed_sum_kernel's, VERDICTS)
MIN_SPLIT_LEN = 2048  # fewest vocab entries worth a program of their own
PROGRAMS_PER_SM = 4
# Programmatic dependent launch of each launch after the first (sm_90+): it is scheduled
# while the one before finishes and waits once it has read the op's inputs it needs
# (verify_math.chain_launch).
PDL = True
CPU_NUM_SMS = 4  # the interpreter has no SMs; a small fixed count still exercises splits


def split_len_for(num_rows: int, vocab: int, device: torch.device, max_splits: int | None = None,
                  programs_per_sm: int | None = None) -> int:
    """Vocab entries per program of the row passes: about ``programs_per_sm``
    (PROGRAMS_PER_SM) programs per SM over ``num_rows`` rows, at least MIN_SPLIT_LEN entries
    each, whole BLOCK_V blocks (split by blocks, so B = 1 at V = 128256 gets 63 programs per
    row, not 32 of two blocks), at most ``max_splits`` a row."""
    num_blocks = cdiv(vocab, BLOCK_V)
    per_sm = PROGRAMS_PER_SM if programs_per_sm is None else programs_per_sm
    wanted = cdiv(per_sm * multiprocessor_count(device, CPU_NUM_SMS), max(num_rows, 1))
    if max_splits is not None:
        wanted = min(wanted, max_splits)
    num_splits = max(1, min(wanted, num_blocks // max(1, MIN_SPLIT_LEN // BLOCK_V)))
    return cdiv(num_blocks, num_splits) * BLOCK_V


def residual_programs(batch: int, vocab: int, device: torch.device) -> int:
    """Programs of the residual pass: RESIDUAL_RESIDENT per SM (RESIDUAL_FEW_RESIDENT for
    at most RESIDUAL_FEW_REQUESTS requests), no more than every request's every BLOCK_V
    block (verify_sample.residual_sample_kernel shares them among the requests left to
    sample)."""
    resident = RESIDUAL_FEW_RESIDENT if batch <= RESIDUAL_FEW_REQUESTS else RESIDUAL_RESIDENT
    return max(1, min(resident * multiprocessor_count(device, CPU_NUM_SMS), batch * cdiv(vocab, BLOCK_V)))


def kept_layout(num_programs: int, split_len: int, block: int, wanted_rows: int | None = None,
                wanted_limit: int | None = None) -> tuple[int, int]:
    """(rows, keep limit) of the search's kept keys for ``num_programs`` (slot, split)
    programs: ``wanted_rows`` (SEARCH_KEPT_ROWS) rows of ``block`` int32, no more than a lane
    meets in its split, fewer where SEARCH_KEPT_BYTES would be passed (the keep limit,
    ``wanted_limit`` or SEARCH_KEEP_LIMIT, scaled with them); (0, -1) where not one row fits
    or the limit is < 0: the searches read their rows every round."""
    rows = min(SEARCH_KEPT_ROWS if wanted_rows is None else wanted_rows, cdiv(split_len, block))
    keep_limit = SEARCH_KEEP_LIMIT if wanted_limit is None else wanted_limit
    fitting = SEARCH_KEPT_BYTES // (max(num_programs, 1) * block * 4)
    if fitting < rows:
        keep_limit = keep_limit * fitting // rows
        rows = fitting
    if rows < 1 or keep_limit < 0:
        return 0, -1
    return rows, keep_limit


def wave_split_len(num_rows: int, vocab: int, device: torch.device, resident: int, block: int) -> int:
    """Vocab entries per program, whole ``block``s: floor(resident * SMs / num_rows) splits
    per row (at least 1), so the grid fills one wave of ``resident`` programs per SM and
    does not spill a sliver into a second."""
    num_blocks = cdiv(vocab, block)
    num_splits = max(1, min(resident * multiprocessor_count(device, CPU_NUM_SMS) // max(num_rows, 1), num_blocks))
    return cdiv(num_blocks, num_splits) * block


def seed_bins_for(num_splits: int, block_s: int, entries: int) -> tuple[int, int]:
    """(fine, coarse) lane-group maxima a max-pass program stores for top-k's seed
    (verify_search.top_k_seed): SEED_VALUES and SEED_COARSE_VALUES a row over ``block_s`` (a
    power of two >= the splits), at most one a lane and no more than the split's ``entries``
    (so the maxima never take more memory than the logits: 2^20 requests of 40 logits once
    asked for 40 GiB of them), at least one; coarse 0 where it would be as fine (one set).
    (0, 0): no seed, without SEED_VALUES or past SEED_MAX_SPLITS splits a row."""
    if SEED_VALUES <= 0 or num_splits > SEED_MAX_SPLITS:
        return 0, 0
    fine = min(BLOCK_V, 1 << (max(entries, 1).bit_length() - 1), max(SEED_VALUES // block_s, 1))
    coarse = min(fine, max(SEED_COARSE_VALUES // block_s, 1))
    return fine, (coarse if coarse < fine else 0)


def launch_verify(
    target_logits,  # [num_tokens, vocab] float32 | bfloat16 | float16
    bonus_logits,  # [batch, vocab]
    draft_token_ids,  # [num_tokens] int32 | int64
    draft_probs,  # [num_tokens, vocab] float32, or None (n-gram)
    cu_num_draft_tokens,  # [batch] int32
    temperature,  # [batch] float32, or None (every request greedy)
    top_k,  # [batch] int32 or None
    top_p,  # [batch] float32 or None
    seeds,  # [batch] int64
    positions,  # [batch] int64
    max_spec_len,
    return_logprobs=False,
):
    """Launcher; arguments already validated (specops/_checks.py). ``verify`` replays its
    eager calls from plans (launch_plan.py): allocate through launch_plan.output and
    launch_plan.workspace."""
    batch, vocab = bonus_logits.shape
    num_tokens = target_logits.shape[0]
    width = max_spec_len + 1
    device = target_logits.device
    # No fills: the screen and the decisions write every entry of these (padding included).
    out = launch_plan.output((batch, width), torch.int32, device)
    num_accepted = launch_plan.output((batch,), torch.int32, device)
    logprobs = launch_plan.output((batch, width) if return_logprobs else (0, 0), torch.float32, device)
    if batch == 0:
        return out, num_accepted, logprobs
    # No temperature: every request greedy, which ignores top-k and top-p. Without
    # log-probabilities (which need the exact normaliser) the max pass and the screen finish.
    all_greedy = temperature is None
    if all_greedy:
        top_k = top_p = None
        if return_logprobs:
            temperature = torch.zeros(batch, dtype=torch.float32, device=device)
    greedy_only = all_greedy and not return_logprobs
    has_top_k, has_top_p = top_k is not None, top_p is not None
    num_slots = batch * width
    split_len = split_len_for(num_slots, vocab, device)
    # The exact normaliser: every reachable row with top-k/top-p/log-probabilities (the
    # search partials share its split), else about one marked row per request.
    exact_everywhere = has_top_k or has_top_p or return_logprobs
    # Few rows: no screen; every reachable row's exact normaliser, all tests exact.
    screened = (exact_everywhere or greedy_only or batch > UNSCREENED_MAX_BATCH
                or num_slots * vocab * target_logits.element_size() > UNSCREENED_BYTES)
    # Unscreened: both row passes in one launch, a block a program, where a row's programs
    # can all run at once (verify_unscreened.py): fewer than the SMs on a GPU; one under the
    # interpreter, which runs programs in turn.
    row_programs_at_once = multiprocessor_count(device, 1)
    counters = None
    if not screened and ONE_LAUNCH_UNSCREENED and cdiv(vocab, BLOCK_V) <= row_programs_at_once:
        counters = row_counters(device, num_slots)  # None: none free of a fill in this graph
    one_launch = counters is not None
    if one_launch:
        split_len = sum_split_len = BLOCK_V
    elif exact_everywhere:
        sum_split_len = split_len
    else:
        sum_rows = batch if screened else num_slots
        sum_split_len = wave_split_len(sum_rows, vocab, device, SUM_RESIDENT, BLOCK_V)
    tested = screened and not exact_everywhere and not greedy_only and bool(MAX_PASS_TESTS)
    walk = tested and bool(MAX_PASS_WALK)
    if walk:  # a request's programs wait for each other: no more than run at once (one under the interpreter)
        walk_splits = min(PACKED_MAX_SPLITS.value, multiprocessor_count(device, 1))
        split_len = split_len_for(batch, vocab, device, walk_splits, WALK_PROGRAMS_PER_SM)
    num_splits = cdiv(vocab, split_len)
    sum_splits = cdiv(vocab, sum_split_len)
    # The max pass tests the steps (its last program of a row sums the row's packed
    # partials, verify_slots.py), else the screen launch does.
    max_pass_tests = tested and num_splits <= PACKED_MAX_SPLITS.value
    if max_pass_tests:
        counters = row_counters(device, num_slots)  # None: none free of a fill in this graph
        max_pass_tests = counters is not None
    walk = walk and max_pass_tests
    walk_sums = walk and bool(WALK_SUMS)
    if walk_sums:  # the walk sums the exact normalisers over its own splits; no normaliser launch
        sum_split_len, sum_splits = split_len, num_splits
    block_s = next_power_of_2(max(num_splits, sum_splits))
    seed_bins, seed_coarse = seed_bins_for(num_splits, block_s, min(split_len, vocab)) if has_top_k else (0, 0)

    def empty(*shape, dtype):
        return launch_plan.workspace(shape, dtype, device)

    part_max = empty(num_slots, num_splits, dtype=torch.float32)
    part_bins = empty(num_slots, num_splits, seed_bins + seed_coarse, dtype=torch.float32) if seed_bins else part_max
    part_arg = empty(num_slots, num_splits, dtype=torch.int32)
    part_sum = empty(num_slots, sum_splits, dtype=torch.int64)
    mass_block = min(MASS_BLOCK, BLOCK_V)
    block_sum = empty(num_slots, cdiv(vocab, mass_block), dtype=torch.int64)
    part_sum2 = empty(num_slots, sum_splits, dtype=torch.int64) if has_top_p else part_sum

    def search_buffers(rounds):  # (lo, hi) before each round, and each round's partials
        return [empty(rounds, num_slots, 2, dtype=torch.int64),
                empty(rounds, num_slots, num_splits, AGG_COLUMNS.value, dtype=torch.int64)]

    top_k_search = search_buffers(TOP_K_ROUNDS.value) if has_top_k else [part_sum, part_sum]
    top_p_search = search_buffers(TOP_P_ROUNDS.value) if has_top_p else [part_sum, part_sum]
    # The kept keys, shared by the two searches (top-p's round 0 starts afresh).
    search_block_v = min(SEARCH_BLOCK_V, BLOCK_V)  # powers of two: divides every split
    keep_first = bool(TOP_P_KEEP_FIRST) and has_top_p and not has_top_k  # top-p alone keeps in round 0
    kept_rows, keep_limit = kept_layout(num_slots * num_splits, split_len, search_block_v,
                                        *((TOP_P_KEPT_ROWS, TOP_P_KEEP_LIMIT) if keep_first else ()))
    if (has_top_k or has_top_p) and keep_limit >= 0:
        num_kept = num_slots * num_splits
        kept = (empty(num_kept, kept_rows * search_block_v, dtype=torch.int32),
                empty(num_kept, search_block_v, dtype=torch.int32),
                empty(num_kept, META_COLUMNS.value, dtype=torch.int64))
    else:  # never read or written without keeping: stand-ins of the right dtypes
        kept = (part_arg, part_arg, part_sum)
    keeping = (kept_rows, keep_limit)
    # With top-k the normalisers read only live blocks, listed a program at a time in one
    # scratch buffer: z1 those top-k's round 0 marked (where its blocks are the normaliser's),
    # and top-p's row passes and z2 those z1 left nonzero (the search's row passes where its
    # blocks are the normaliser's).
    live_search_blocks = live_sum_blocks = mark_blocks = 0
    live_list = part_arg  # a stand-in, never read or written
    if has_top_k and search_block_v == mass_block:
        live_search_blocks = next_power_of_2(cdiv(split_len, search_block_v))
    if TOP_K_MARKS and live_search_blocks and seed_bins and sum_split_len == split_len:
        mark_blocks = live_search_blocks
    if has_top_k and (has_top_p or mark_blocks):
        live_sum_blocks = next_power_of_2(cdiv(sum_split_len, mass_block))
        live_list = empty(num_slots * max(num_splits * live_search_blocks, sum_splits * live_sum_blocks),
                          dtype=torch.int32)
    # Absent optional tensors: any tensor of the right dtype stands in (never read).
    top_k_arg = top_k if has_top_k else cu_num_draft_tokens
    top_p_arg = top_p if has_top_p else part_max
    temperature_arg = temperature if temperature is not None else part_max  # greedy_only: never read
    rows = (target_logits, bonus_logits, cu_num_draft_tokens)
    params = (temperature_arg, top_k_arg, top_p_arg)
    sizes = (num_tokens, vocab, width, split_len)
    grid = (num_slots, num_splits)
    pdl = bool(PDL) and has_pdl(device)
    # Every launch after the first: bit for bit the reference (no contracted multiply-add)
    # and, on sm_90+, chained by programmatic dependent launch.
    exact = {"enable_fp_fusion": False, "PDL": pdl, "launch_pdl": pdl}

    draft_probs_arg = draft_probs if draft_probs is not None else part_max
    # The one launch's last program of a row tests its step (rows of few enough programs).
    test_steps = one_launch and bool(ONE_LAUNCH_VERDICTS) and num_splits <= PACKED_MAX_SPLITS.value
    if one_launch:  # each slot's max, normaliser total and (draft steps) exact test too
        verdicts = (empty(num_slots, dtype=torch.int32), empty(num_slots, dtype=torch.float32),
                    empty(num_slots, dtype=torch.int64))
        row_max_sum_kernel[(num_splits, num_slots)](
            part_max, part_arg, part_sum, block_sum, counters, packed_departures(counters), *verdicts, target_logits,
            bonus_logits, draft_token_ids, draft_probs_arg, cu_num_draft_tokens, temperature_arg, seeds, positions,
            num_tokens, vocab, width, HAS_DRAFT_PROBS=draft_probs is not None, BLOCK_V=BLOCK_V,
            MASS_BLOCK=mass_block, BLOCK_S=block_s, TEST_STEPS=test_steps, num_warps=SUM_WARPS,
            enable_fp_fusion=False, PDL=pdl)  # the chain's first launch: a plain one
    elif walk:
        max_pass_verdicts = empty(num_slots, dtype=torch.int32)
        row_walk_kernel[(num_splits, batch)](
            part_max, part_arg, part_sum, block_sum, *rows, temperature_arg, counters, packed_departures(counters),
            max_pass_verdicts, draft_token_ids, draft_probs_arg, seeds, positions, num_tokens, vocab, width, split_len,
            HAS_DRAFT_PROBS=draft_probs is not None, BLOCK_V=BLOCK_V, BLOCK_W=next_power_of_2(width),
            BLOCK_S=block_s, MASS_BLOCK=mass_block, LOOKAHEAD=bool(WALK_LOOKAHEAD), SUMS=walk_sums,
            num_warps=NUM_WARPS, PDL=pdl, enable_fp_fusion=False,
            maxnreg=REGISTERS_PER_SM // (ROW_MAX_RESIDENT * NUM_WARPS * 32) // 8 * 8)
    else:
        if max_pass_tests:
            part_approx = part_max  # not written
            max_pass_verdicts = empty(num_slots, dtype=torch.int32)
            tests = (packed_departures(counters), max_pass_verdicts, draft_token_ids, draft_probs_arg, seeds, positions)
        else:
            part_approx = empty(num_slots, num_splits, dtype=torch.float32)
            tests = (part_max, part_arg, draft_token_ids, part_max, seeds, positions)  # stand-ins, never read
        row_max_kernel[grid](part_max, part_arg, part_approx, part_bins, *rows, temperature_arg, *tests, *sizes,
                             ALL_GREEDY=greedy_only, BLOCK_V=BLOCK_V, TESTS=max_pass_tests, BINS=seed_bins,
                             COARSE_BINS=seed_coarse,
                             HAS_DRAFT_PROBS=draft_probs is not None, num_warps=NUM_WARPS, PDL=pdl,
                             maxnreg=REGISTERS_PER_SM // (ROW_MAX_RESIDENT * NUM_WARPS * 32) // 8 * 8)
    flags = {"HAS_TOP_K": has_top_k, "HAS_TOP_P": has_top_p, "BLOCK_S": block_s}
    search_flags = {"BLOCK_V": search_block_v, "UNROLL": SEARCH_UNROLL, "KEPT_PREFETCH": bool(SEARCH_KEPT_PREFETCH),
                    "num_warps": SEARCH_WARPS, **flags, **exact}
    for search_round in range(TOP_K_ROUNDS.value if has_top_k else 0):
        threshold_search_kernel[grid](*top_k_search, *kept, part_max, part_arg, part_bins, *top_k_search, part_sum,
                                      block_sum, part_arg, *rows, *params, num_tokens, vocab, width, split_len,
                                      search_round, *keeping, MODE=TOP_K_MODE,
                                      SEED_BINS=seed_bins if search_round == 0 else 0, SEED_COARSE=seed_coarse,
                                      SEED_DENSITY=SEED_DENSITY, SEED_ROUNDS=SEED_ROUNDS,
                                      MARK_BLOCKS=mark_blocks if search_round == 0 else 0,
                                      MARK_MAX_K=TOP_K_MARKS_MAX_K, **search_flags)
    # Written by the screen only (unscreened: never read, the output stands in).
    screen_launch = screened and not max_pass_tests
    marked = empty(batch, 2, dtype=torch.int32) if screen_launch else out
    resume = empty(batch, dtype=torch.int32) if screen_launch else out
    request = (target_logits, bonus_logits, draft_token_ids, draft_probs_arg, cu_num_draft_tokens, *params, seeds,
               positions, num_tokens, vocab, width, num_splits)
    request_flags = {"HAS_DRAFT_PROBS": draft_probs is not None, "RETURN_LOGPROBS": return_logprobs, **flags}
    if screen_launch:
        screen_kernel[(batch,)](out, num_accepted, marked, resume, part_max, part_arg, part_approx, *request,
                                ALL_GREEDY=greedy_only, BLOCK_W=next_power_of_2(width),
                                num_warps=SCREEN_WARPS, **request_flags, **exact)
    if greedy_only:
        return out, num_accepted, logprobs
    sums = (marked, max_pass_verdicts if max_pass_tests else marked, part_max, part_arg, *top_k_search, *top_p_search)
    sum_sizes = (num_tokens, vocab, width, sum_split_len, num_splits, batch)
    # One program per (request, split) walking the request's marked steps (usually one; no
    # idle programs: B = 16 random 39.0 -> 33.7 µs, bench/NOTES.md), or with every step
    # marked one per (step, request, split).
    step_programs = 1 if screened and not exact_everywhere else width
    sum_grid = (step_programs * batch * sum_splits,)
    sum_flags = {"BLOCK_V": BLOCK_V, "MASS_BLOCK": mass_block, "MARKED": screen_launch,
                 "VERDICTS": max_pass_tests, "BLOCK_W": next_power_of_2(width), "num_warps": SUM_WARPS,
                 **flags, **exact}
    first_sum_cap = TOP_K_SUM_MAX_REGISTERS if has_top_k else SUM_MAX_REGISTERS
    first_sum_registers = {"maxnreg": first_sum_cap} if first_sum_cap else {}
    second_sum_registers = {"maxnreg": SECOND_SUM_MAX_REGISTERS} if has_top_k and SECOND_SUM_MAX_REGISTERS else {}
    top_p_search_registers = {"maxnreg": TOP_P_SEARCH_MAX_REGISTERS} if has_top_k and TOP_P_SEARCH_MAX_REGISTERS else {}
    if not one_launch and not walk_sums:
        fixed_sum_kernel[sum_grid](part_sum, block_sum, *sums, part_sum, live_list, *rows, *params, *sum_sizes,
                                   SECOND=False, LIVE_BLOCKS=live_sum_blocks if mark_blocks else 0,
                                   MARK_MAX_K=TOP_K_MARKS_MAX_K, **sum_flags, **first_sum_registers)
    if has_top_p:
        for search_round in range(TOP_P_ROUNDS.value):
            threshold_search_kernel[grid](*top_p_search, *kept, part_max, part_arg, part_bins, *top_k_search,
                                          part_sum, block_sum, live_list, *rows, *params, num_tokens, vocab, width,
                                          split_len, search_round, *keeping, MODE=TOP_P_MODE,
                                          LIVE_BLOCKS=live_search_blocks,
                                          KEEP_FIRST=keep_first and search_round == 0,
                                          **search_flags, **top_p_search_registers)
            if search_round == 0 and has_top_k and keep_limit >= 0 and bool(TOP_P_FINISH):
                # Round 0 kept every key that weighs (about top_k a row): the threshold from them.
                top_p_finish_kernel[(num_slots,)](
                    *top_p_search, *kept, empty(num_slots, TOP_P_FINISH_KEYS, dtype=torch.int32),
                    cu_num_draft_tokens, *params, num_tokens, vocab, width, num_splits, *keeping,
                    BLOCK_V=search_block_v, BLOCK_S=block_s, FINISH_KEYS=TOP_P_FINISH_KEYS, num_warps=SEARCH_WARPS,
                    **exact)
        fixed_sum_kernel[sum_grid](part_sum2, block_sum, *sums, part_sum, live_list, *rows, *params, *sum_sizes,
                                   SECOND=True, LIVE_BLOCKS=live_sum_blocks, **sum_flags, **second_sum_registers)

    sample_float = empty(batch, SAMPLE_FLOATS.value, dtype=torch.float32)
    sample_int = empty(batch, SAMPLE_INTS.value, dtype=torch.int64)
    # Zeroed by the decisions (no memset launch); a stand-in, never written, for n-gram.
    arrivals = empty(batch, dtype=torch.int32) if draft_probs is not None else resume
    decide_kernel[(batch,)](
        out, num_accepted, logprobs if return_logprobs else out, sample_float, sample_int, arrivals, block_sum,
        resume, *(verdicts if one_launch else (max_pass_verdicts if max_pass_tests else out, part_max, part_sum)),
        part_max, part_arg, part_sum, part_sum2, *top_k_search, *top_p_search, *request, sum_splits, **request_flags,
        MASS_BLOCK=mass_block,
        BLOCK_B=next_power_of_2(cdiv(vocab, mass_block)),
        PROPOSAL_ROUND=PROPOSAL_ROUND if screened else UNSCREENED_PROPOSAL_ROUND,
        # Screened calls only: B=1 (unscreened) read 13.3 µs without, 13.6-13.7 with (H100 A/B).
        PROPOSAL_GROUP=min(PROPOSAL_GROUP, next_power_of_2(cdiv(vocab, mass_block))) if screened else 0,
        PROPOSAL_Q_TILE=bool(PROPOSAL_Q_TILE) and screened,
        BLOCK_W=next_power_of_2(width), SCREENED=screen_launch,
        VERDICTS=test_steps or max_pass_tests, SLOT_STATS=test_steps,
        num_warps=(DECIDE_WARPS_ONE_PER_SM if screened and draft_probs is not None
                   and batch <= multiprocessor_count(device, CPU_NUM_SMS) else DECIDE_WARPS),
        **exact,
    )
    if draft_probs is None:  # every token drawn by the decisions
        return out, num_accepted, logprobs
    num_blocks = cdiv(vocab, BLOCK_V)
    block_mass = empty(batch, num_blocks, dtype=torch.int64)
    residual_sample_kernel[(residual_programs(batch, vocab, device),)](
        out, logprobs if return_logprobs else out, block_mass, arrivals, sample_float, sample_int, target_logits,
        bonus_logits, draft_probs, cu_num_draft_tokens, seeds, num_tokens, vocab, width, batch,
        HAS_TOP_P=has_top_p, RETURN_LOGPROBS=return_logprobs, BLOCK_V=BLOCK_V,
        BLOCK_B=next_power_of_2(num_blocks), BLOCK_R=min(next_power_of_2(batch), RESIDUAL_SCAN),
        num_warps=RESIDUAL_WARPS, maxnreg=RESIDUAL_MAX_REGISTERS, **exact,
    )
    return out, num_accepted, logprobs


# Eager calls replayed from plans of the launches above (launch_plan.py), while the
# launcher's modules hold the attributes they were imported with.
verify = launch_plan.planned(launch_verify)
for _module in ("launch", "stream_counters", "verify_math", "verify_slots", "verify_rows", "verify_unscreened", "verify_walk", "verify_search",
                "verify_search_counts", "verify_search_finish", "verify_screen", "verify_decide", "verify_sample",
                "verify"):
    launch_plan.track(f"{__package__}.{_module}")
