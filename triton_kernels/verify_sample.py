"""The token a random request of the Triton ``verify`` samples at its stop (the first
rejected row, or the bonus row when every draft passes): a draw by inversion from integer
masses (reference/verify.py), in two levels: the masses' sums per vocab block (MASS_BLOCK
entries for the normaliser's masses, BLOCK_V for the residual pass's), then one program
per request finds the block holding the draw U and the token inside it (draw_token).

- bonus row, n-gram rejection: the masses are the normaliser's own terms floor(w 2^40),
  whose block sums fixed_sum_kernel stored (verify_rows.py): the decisions draw the token
  at once (verify_decide.py; n-gram: the draft's term out of its block);
- rejection with draft probs: first the proposals (propose_residual, in the decisions):
  draws from the normaliser's masses W, each kept with probability R / W at its token,
  which read one block per proposal; when none is kept, the residual masses
  R = floor(max(w - q Z, 0) 2^40), Z the normaliser, summed by residual_sample_kernel (one
  pass over the row and its draft-probs row, split across programs), whose last program to
  finish for the request draws the token in the same launch.
"""

from __future__ import annotations

import triton
import triton.language as tl

from .launch import direct_launch
from .verify_math import (
    FIXED_SCALE,
    PURPOSE_PROPOSE,
    RESIDUAL_PROPOSALS,
    chain_launch,
    exponent_scale,
    finite_logits,
    load_logits,
    log_prob,
    mulhi64,
    philox_words,
    probs,
    processed_weights,
    scaled_weights,
)
from .verify_slots import slot_row

# What the decisions leave for a rejection with draft probs (decide_kernel):
SAMPLE_FLOATS = tl.constexpr(6)  # sample_float row: max logit, temperature, kth, z1, p_min, z2
SAMPLE_INTS = tl.constexpr(2)  # sample_int row: step (-1: nothing left to sample), position


@triton.jit
def _fixed_masses(w, q, v, draft, vocab, z2, RESIDUAL: tl.constexpr):
    """The int64 masses floor(x 2^40) of entries v from their processed weights w: x = w,
    or (RESIDUAL) x = w - q Z; 0 where x <= 0, past the vocab and, n-gram, at the draft."""
    if RESIDUAL:
        w = w - q * z2  # the residual max(p - q, 0) scaled by Z: no division
    keep = (v < vocab) & (v != draft) & (w > 0.0)
    return tl.floor(tl.where(keep, w, 0.0) * FIXED_SCALE).to(tl.int64)


@triton.jit
def _masses(z, q, v, draft, vocab, max_logit, temperature, kth, z1, p_min, z2, RESIDUAL: tl.constexpr,
            MULTIPLY: tl.constexpr, HAS_TOP_P: tl.constexpr):
    """The int64 masses of entries v from their logits z (_fixed_masses).
    MULTIPLY: ``temperature`` holds log2(e) / T (verify_math.exponent_scale)."""
    w = processed_weights(z, max_logit, temperature, kth, z1, p_min, MULTIPLY, HAS_TOP_P)
    return _fixed_masses(w, q, v, draft, vocab, z2, RESIDUAL)


@triton.jit
def _sampled_row(b, step, sample_float_ptr, target_ptr, bonus_ptr, draft_probs_ptr, cu_ptr, num_tokens, vocab,
                 width):
    """What decide_kernel left for request b's rejected row at ``step``: (max logit,
    temperature, kth, z1, p_min, z2), then the logits row and its draft-probs row."""
    sample_float = sample_float_ptr + b.to(tl.int64) * SAMPLE_FLOATS
    row_ptr, start, _count = slot_row(cu_ptr, target_ptr, bonus_ptr, b, step.to(tl.int32), num_tokens, vocab, width)
    return (tl.load(sample_float), tl.load(sample_float + 1), tl.load(sample_float + 2), tl.load(sample_float + 3),
            tl.load(sample_float + 4), tl.load(sample_float + 5), row_ptr, draft_probs_ptr + (start + step) * vocab)


@triton.jit
def draw_token(block_sums, block_total, row_ptr, q_row_ptr, residual, draft, draft_z, seed, position, vocab, max_logit,
               temperature, kth, z1, p_min, z2, HAS_DRAFT_PROBS: tl.constexpr, HAS_TOP_P: tl.constexpr,
               BLOCK_V: tl.constexpr, BLOCK_B: tl.constexpr):
    """The token drawn from a row's masses, given their sums per BLOCK_V entries
    (``block_sums`` [BLOCK_B], 0 past the row's blocks, and their sum ``block_total``, which
    the callers know without a reduction here): M = the sum of the block sums
    (n-gram: less the draft's own term, draft >= 0, whose logit is ``draft_z``), U =
    floor(X M / 2^64) (X: words 0 and 1 of the position's sample draw), the block whose
    prefix range holds U, then the token whose prefix range inside that block holds it (an
    inclusive scan of the block's masses); M = 0 gives token 0. ``residual``: the masses of
    a rejection with draft probs (HAS_DRAFT_PROBS). Bytes: one block of the row (and of its
    q)."""
    params = (max_logit, temperature, kth, z1, p_min, z2)
    # The scan of the stored sums, then the draft's term out of its block's prefix sums and
    # every later one (the same integers as scanning the sums less that term; no load or
    # reduction waits on it before the scan).
    inclusive = tl.cumsum(block_sums, axis=0)
    total = block_total
    x = tl.maximum(draft, 0) + tl.arange(0, 1)
    draft_mass = tl.sum(_masses(draft_z + tl.zeros([1], tl.float32), 0.0, x, -1, vocab, *params, False, False,
                                HAS_TOP_P), axis=0)
    draft_mass = tl.where(draft >= 0, draft_mass, 0)
    inclusive -= tl.where(tl.arange(0, BLOCK_B) >= tl.maximum(draft, 0) // BLOCK_V, draft_mass, 0)
    total -= draft_mass
    w0, w1, _w2, _w3 = philox_words(seed, position, 1, tl.zeros([1], tl.int32))
    u = tl.sum(mulhi64(w0, w1, total), axis=0)  # < total
    # The block holding U: the blocks whose inclusive prefix sum is <= U come before it (a
    # prefix: masses >= 0), the mass before it is the largest such sum.
    block = tl.sum((inclusive <= u).to(tl.int32), axis=0)
    before = tl.max(tl.where(inclusive <= u, inclusive, 0), axis=0)
    v = block * BLOCK_V + tl.arange(0, BLOCK_V)
    in_row = v < vocab
    z = load_logits(row_ptr, v, in_row)
    q = tl.zeros([BLOCK_V], tl.float32)
    if HAS_DRAFT_PROBS:  # q = 0 on other rows: w - 0 * Z is w, bit for bit
        q = tl.load(q_row_ptr + v, mask=in_row & residual, other=0.0)
    m = _masses(z, q, v, draft, vocab, *params, HAS_DRAFT_PROBS, False, HAS_TOP_P)
    token = block * BLOCK_V + tl.sum((tl.cumsum(m, axis=0) + before <= u).to(tl.int32), axis=0)
    return tl.where(total == 0, 0, token)


@triton.jit
def _blocks_holding(inclusive, group_last, u, GROUP: tl.constexpr):
    """(block, mass before it) of each draw u [ROUND]: the count of the inclusive prefix
    sums ``inclusive`` [BLOCK_B] that are <= u and the largest of them (0 where none), as
    a search of GROUP prefix sums a draw: the groups of GROUP whose last prefix sum
    (``group_last``) is <= u come first (a prefix: the sums do not decrease), then the
    sums of the group after them, gathered."""
    below = group_last[None, :] <= u[:, None]
    group = tl.minimum(tl.sum(below.to(tl.int32), axis=1), group_last.numel - 1)  # < that unless u >= every sum
    before = tl.max(tl.where(below, group_last[None, :], 0), axis=1)
    index = group[:, None] * GROUP + tl.arange(0, GROUP)[None, :]
    sums = tl.reshape(tl.gather(inclusive, tl.reshape(index, [index.numel]), 0), [u.numel, GROUP])
    below = sums <= u[:, None]
    block = group * GROUP + tl.sum(below.to(tl.int32), axis=1)
    before = tl.maximum(before, tl.max(tl.where(below, sums, 0), axis=1))
    return block, before


@triton.jit
def propose_residual(block_sums, total, row_ptr, q_row_ptr, seed, position, vocab, max_logit, temperature, scale, kth,
                     z1, p_min, z2, HAS_TOP_P: tl.constexpr, MASS_BLOCK: tl.constexpr,
                     ROUND: tl.constexpr, GROUP: tl.constexpr = 0, Q_TILE: tl.constexpr = False):
    """The first kept proposal of a residual draw (reference/verify.py), -1 when none is.
    ROUND proposals at a time (most draws end in the first round), each drawn by inversion
    from the normaliser's masses W, given their sums per MASS_BLOCK entries (``block_sums``
    [BLOCK_B], fixed_sum_kernel's; 0 past the row's blocks; ``total`` their sum), and kept when
    floor(Y W_x / 2^64) < R_x. The block holding a draw U is the count of inclusive prefix
    sums <= U, the mass before it the largest such sum (two independent reductions of one
    scan, computed once for every proposal); then the entry inside the block; the chosen
    token's logit is read again (a line the block's load cached), not selected by a
    reduction.
    ``scale``: exponent_scale(temperature) (scaled_weights). GROUP > 0: the block
    search in two levels of GROUP (_blocks_holding), the same blocks. Q_TILE: each
    proposal's draft prob selected from its block's, loaded with the logits (without it
    that load is dead code, and the draft prob is a read of its own after the scan). Bytes:
    per round one block of the row per proposal, and of its draft probs with Q_TILE (loaded
    together: no load waits on the token), else one draft prob a proposal."""
    e = tl.arange(0, MASS_BLOCK)
    inclusive = tl.cumsum(block_sums, axis=0)
    if GROUP > 0:  # each group's last prefix sum, once
        group_last = tl.max(tl.reshape(inclusive, [inclusive.numel // GROUP, GROUP]), axis=1)
    token = tl.full([], -1, tl.int32)
    first = tl.where(total > 0, 0, RESIDUAL_PROPOSALS)  # M_W = 0: no proposal
    while first < RESIDUAL_PROPOSALS:
        t = first + tl.arange(0, ROUND)
        w0, w1, w2, w3 = philox_words(seed, position, PURPOSE_PROPOSE, t)
        u = mulhi64(w0, w1, total)  # [ROUND], each < total
        # The blocks whose inclusive prefix sum is <= U come first (a prefix: masses >= 0).
        if GROUP > 0:
            block, before = _blocks_holding(inclusive, group_last, u, GROUP)
        else:
            below = inclusive[None, :] <= u[:, None]
            block = tl.sum(below.to(tl.int32), axis=1)
            before = tl.max(tl.where(below, inclusive[None, :], 0), axis=1)
        v = block[:, None] * MASS_BLOCK + e[None, :]
        raw_z = tl.load(row_ptr + v, mask=v < vocab, other=float("-inf"))
        q = tl.load(q_row_ptr + v, mask=v < vocab, other=0.0)
        w = scaled_weights(finite_logits(raw_z), max_logit, temperature, scale, kth, z1, p_min, HAS_TOP_P)
        m = _fixed_masses(w, 0.0, v, -1, vocab, z2, False)
        inside = tl.sum((tl.cumsum(m, axis=1) + before[:, None] <= u[:, None]).to(tl.int32), axis=1)
        # Each proposal's token (none, inside = MASS_BLOCK, only where W_x = R_x = 0 would be).
        found = inside < MASS_BLOCK
        x = tl.where(found, block * MASS_BLOCK + inside, 0)
        z_x = load_logits(row_ptr, x, found & (x < vocab))
        if Q_TILE:  # the one entry of the block at ``inside`` (0 where none is: not found)
            q_x = tl.sum(tl.where(e[None, :] == inside[:, None], q, 0.0), axis=1)
        else:
            q_x = tl.load(q_row_ptr + x, mask=found & (x < vocab), other=0.0)
        w_x = scaled_weights(z_x, max_logit, temperature, scale, kth, z1, p_min, HAS_TOP_P)
        m_x = _fixed_masses(w_x, 0.0, x, -1, vocab, z2, False)
        residual = _fixed_masses(w_x, q_x, x, -1, vocab, z2, True)
        kept = mulhi64(w2, w3, m_x) < residual
        kept = tl.min(tl.where(kept, t, RESIDUAL_PROPOSALS), axis=0)
        token = tl.where(kept < RESIDUAL_PROPOSALS, tl.sum(tl.where(t == kept, x, 0), axis=0), -1).to(tl.int32)
        first = tl.where(kept < RESIDUAL_PROPOSALS, RESIDUAL_PROPOSALS, first + ROUND)
    return token


@triton.jit
def _waiting_requests(sample_int_ptr, batch, BLOCK_R: tl.constexpr):
    """The number of requests decide_kernel left to sample (sample_int step >= 0)."""
    waiting = tl.zeros([], tl.int32)
    first = tl.zeros([], tl.int32)
    while first < batch:
        r = first + tl.arange(0, BLOCK_R)
        step = tl.load(sample_int_ptr + r.to(tl.int64) * SAMPLE_INTS, mask=r < batch, other=-1)
        waiting += tl.sum((step >= 0).to(tl.int32), axis=0)
        first += BLOCK_R
    return waiting


@triton.jit
def _nth_waiting(sample_int_ptr, batch, nth, BLOCK_R: tl.constexpr):
    """The request left to sample whose rank among those, in request order, is ``nth``
    (from 0; < the number of them)."""
    b = tl.zeros([], tl.int32)
    seen = tl.zeros([], tl.int32)
    first = tl.zeros([], tl.int32)
    while (first < batch) & (seen <= nth):
        r = first + tl.arange(0, BLOCK_R)
        waiting = tl.load(sample_int_ptr + r.to(tl.int64) * SAMPLE_INTS, mask=r < batch, other=-1) >= 0
        rank = seen + tl.cumsum(waiting.to(tl.int32), axis=0) - 1
        b += tl.sum(tl.where(waiting & (rank == nth), r, 0), axis=0)
        seen += tl.sum(waiting.to(tl.int32), axis=0)
        first += BLOCK_R
    return b


# Grid (programs,), about RESIDUAL_RESIDENT a SM. The requests decide_kernel left to sample
# (a rejection with draft probs where no proposal was kept: sample_int) share the programs:
# with n of them each row is cut into splits = min(programs // n, its BLOCK_V blocks) (at
# least 1) of whole blocks, and program p takes the (request, split) items p, p + programs,
# ... of the n * splits, requests in request order. An item stores the residual masses' sum
# of each block of its split, then counts itself in arrivals[b] (zeroed by decide_kernel);
# the last of request b's splits to arrive draws the token from all the block sums
# (draw_token) and writes it (and its log-probability). The block sums, so the token, do
# not depend on the splits. So one rejected row is read by up to a block a program across
# the GPU, where a grid of (batch, splits) gave it programs // batch (B = 64: 8 programs of
# 8 blocks each, one after another). Bytes: the sample_int column, then those rows and
# their draft-probs rows once, the block sums and one block of both; nothing for other
# requests.
@direct_launch
@triton.jit(do_not_specialize=["num_tokens", "width", "batch"])  # vocab % 16 == 0: vector loads
def residual_sample_kernel(
    out_ptr,  # [batch, width] int32
    logprobs_ptr,  # [batch, width] float32 (RETURN_LOGPROBS)
    block_mass_ptr,  # [batch, cdiv(vocab, BLOCK_V)] int64, written
    arrivals_ptr,  # [batch] int32: 0 on entry (decide_kernel), the splits on exit where drawn
    sample_float_ptr,  # [batch, SAMPLE_FLOATS] float32
    sample_int_ptr,  # [batch, SAMPLE_INTS] int64
    target_ptr,  # [num_tokens, vocab]
    bonus_ptr,  # [batch, vocab]
    draft_probs_ptr,  # [num_tokens, vocab] float32
    cu_ptr,  # [batch] int32
    seeds_ptr,  # [batch] int64
    num_tokens,
    vocab,
    width,
    batch,
    HAS_TOP_P: tl.constexpr,
    RETURN_LOGPROBS: tl.constexpr,
    BLOCK_V: tl.constexpr,
    BLOCK_B: tl.constexpr,  # >= the number of blocks
    BLOCK_R: tl.constexpr,  # requests read at a time from sample_int (a power of two)
    PDL: tl.constexpr = False,
):
    chain_launch(PDL)
    programs = tl.num_programs(0)
    waiting = _waiting_requests(sample_int_ptr, batch, BLOCK_R)
    num_blocks = tl.cdiv(vocab, BLOCK_V)
    splits = tl.minimum(tl.maximum(programs // tl.maximum(waiting, 1), 1), num_blocks)
    split_blocks = tl.cdiv(num_blocks, splits)
    item = tl.program_id(0)
    while item < waiting * splits:
        b = _nth_waiting(sample_int_ptr, batch, item // splits, BLOCK_R)
        sample_int = sample_int_ptr + b.to(tl.int64) * SAMPLE_INTS
        step = tl.load(sample_int)
        max_logit, temperature, kth, z1, p_min, z2, row_ptr, q_row_ptr = _sampled_row(
            b, step, sample_float_ptr, target_ptr, bonus_ptr, draft_probs_ptr, cu_ptr, num_tokens, vocab, width)
        blocks = block_mass_ptr + b.to(tl.int64) * num_blocks
        params = (max_logit, temperature, kth, z1, p_min, z2)
        scale = exponent_scale(temperature)
        block = (item % splits) * split_blocks
        last_block = tl.minimum(block + split_blocks, num_blocks)
        while block < last_block:
            v = block * BLOCK_V + tl.arange(0, BLOCK_V)
            in_row = v < vocab
            z = load_logits(row_ptr, v, in_row)
            q = tl.load(q_row_ptr + v, mask=in_row, other=0.0)
            if scale > 0.0:  # T = 2^n: exp's first step by one multiply (exponent_scale)
                m = _masses(z, q, v, -1, vocab, max_logit, scale, kth, z1, p_min, z2, True, True, HAS_TOP_P)
            else:
                m = _masses(z, q, v, -1, vocab, *params, True, False, HAS_TOP_P)
            tl.store(blocks + block, tl.sum(m, axis=0))
            block += 1
        # The barrier orders every thread's stores before the arrival (one thread's atomic);
        # its release publishes them at GPU scope, and the last arrival's acquire makes every
        # split's visible to the draw.
        tl.debug_barrier()
        arrived = tl.atomic_add(arrivals_ptr + b, 1, sem="acq_rel", scope="gpu")
        if arrived == splits - 1:
            # Past L1 (.cg): other programs of this launch wrote them, and L1 is not coherent across SMs.
            j = tl.arange(0, BLOCK_B)
            block_sums = tl.load(blocks + j, mask=j < num_blocks, other=0, cache_modifier=".cg")
            token = draw_token(block_sums, tl.sum(block_sums, axis=0), row_ptr, q_row_ptr, True, -1, 0.0,
                               tl.load(seeds_ptr + b), tl.load(sample_int + 1), vocab, *params, True, HAS_TOP_P,
                               BLOCK_V, BLOCK_B)
            tl.store(out_ptr + b.to(tl.int64) * width + step, token)
            if RETURN_LOGPROBS:
                t = token + tl.arange(0, 1)
                p_t = probs(load_logits(row_ptr, t, t < vocab), *params)
                tl.store(logprobs_ptr + b.to(tl.int64) * width + step, tl.sum(log_prob(p_t), axis=0))
        item += programs
