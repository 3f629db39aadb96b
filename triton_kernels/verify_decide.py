"""Per-request passes of the Triton ``verify``, after the row statistics (verify_rows.py):
the acceptance decisions, then the race at the one row per request that samples a token
(the first rejected row, or the bonus row when every draft passes), split across
programs, whose last program to finish writes the sampled token.
"""

from __future__ import annotations

import triton
import triton.language as tl

from .verify_math import (
    INDEX_MAX,
    TOP_P_SCALE,
    load_logits,
    log_prob,
    philox_words,
    probs,
    race_block_words,
    race_score_bounds,
    repro_exponential,
    select_word,
    weights,
)
from .verify_rows import (
    request_params,
    row_fixed_sum,
    row_kth,
    row_max_argmax,
    row_p_min,
    slot_row,
)

RACE_BONUS = tl.constexpr(0)  # r = p
RACE_RESIDUAL = tl.constexpr(1)  # r = max(p - q, 0), q the draft probs
RACE_NGRAM = tl.constexpr(2)  # r = p without the draft token
RACE_FLOATS = tl.constexpr(6)  # race_float row: max logit, temperature, kth, z1, p_min, z2
RACE_INTS = tl.constexpr(5)  # race_int row: step (-1: no race), mode, draft (-1: none), position,
#                              and the race programs that have finished (decide_kernel zeroes it)


# Grid (batch,). Program b walks request b's steps from resume[b] (the screen emitted the
# steps before it) with the combined row statistics and exact normalisers:
# greedy: emit the argmax, stop at the first mismatch; random: the acceptance test
# u q(x) < p(x) (u from Philox, p(x) from one logit and the row's max and normalisers),
# stop at the first rejection or the bonus step. The sampled token of a random stop is left
# to the race: its parameters go to race_float/race_int.
# Bytes: one logit (and one draft prob) per step, the partials of the slots walked.
@triton.jit(do_not_specialize=["num_tokens", "vocab", "width", "num_splits", "sum_splits"])
def decide_kernel(
    out_ptr,  # [batch, width] int32
    num_accepted_ptr,  # [batch] int32
    logprobs_ptr,  # [batch, width] float32 (RETURN_LOGPROBS)
    race_float_ptr,  # [batch, RACE_FLOATS] float32
    race_int_ptr,  # [batch, RACE_INTS] int64
    resume_ptr,  # [batch] int32: first step to decide here (-1: none; verify_screen.py)
    part_max_ptr,  # [batch * width, num_splits] float32
    part_arg_ptr,  # [batch * width, num_splits] int32
    part_sum_ptr,  # [batch * width, sum_splits] int64: z1 partials
    part_sum2_ptr,  # [batch * width, sum_splits] int64: z2 partials (HAS_TOP_P)
    top_k_state_ptr, top_k_agg_ptr, top_p_state_ptr, top_p_agg_ptr,  # searches (verify_rows.py)
    target_ptr,  # [num_tokens, vocab]
    bonus_ptr,  # [batch, vocab]
    draft_ptr,  # [num_tokens] int32 | int64
    draft_probs_ptr,  # [num_tokens, vocab] float32 (HAS_DRAFT_PROBS)
    cu_ptr,  # [batch] int32
    temperature_ptr,  # [batch] float32
    top_k_ptr,  # [batch] int32
    top_p_ptr,  # [batch] float32
    seeds_ptr,  # [batch] int64
    positions_ptr,  # [batch] int64
    num_tokens,
    vocab,
    width,
    num_splits,  # of the row max and search partials
    sum_splits,  # of the normaliser partials
    HAS_DRAFT_PROBS: tl.constexpr,
    HAS_TOP_K: tl.constexpr,
    HAS_TOP_P: tl.constexpr,
    RETURN_LOGPROBS: tl.constexpr,
    BLOCK_S: tl.constexpr,
):
    b = tl.program_id(0)
    num_slots = tl.num_programs(0) * width
    temperature, uses_top_k, top_k, uses_top_p, top_p = request_params(
        b, vocab, temperature_ptr, top_k_ptr, top_p_ptr, HAS_TOP_K, HAS_TOP_P)
    greedy = temperature == 0.0
    seed = tl.load(seeds_ptr + b)
    position0 = tl.load(positions_ptr + b)
    out_row = out_ptr + b.to(tl.int64) * width
    lp_row = logprobs_ptr + b.to(tl.int64) * width
    race_int = race_int_ptr + b.to(tl.int64) * RACE_INTS
    race_float = race_float_ptr + b.to(tl.int64) * RACE_FLOATS
    tl.store(race_int, -1)
    tl.store(race_int + 4, 0)
    i = tl.load(resume_ptr + b)
    done = (i < 0).to(tl.int32)  # the screen decided the whole request
    accepted = tl.zeros([], tl.int32)
    while done == 0:
        slot = b * width + i
        row_ptr, start, count = slot_row(cu_ptr, target_ptr, bonus_ptr, b, i, num_tokens, vocab, width)
        is_bonus = i == count
        t = start + i
        max_logit, argmax = row_max_argmax(part_max_ptr, part_arg_ptr, slot, num_splits, BLOCK_S)
        no_finite = max_logit == float("-inf")
        draft = tl.load(draft_ptr + t, mask=~is_bonus, other=0).to(tl.int64)
        in_vocab = (draft >= 0) & (draft < vocab) & ~is_bonus
        token = tl.zeros([], tl.int32)
        log_p = tl.zeros([], tl.float32)
        if greedy:
            token = argmax
            if RETURN_LOGPROBS:
                z1 = row_fixed_sum(part_sum_ptr, slot, sum_splits, BLOCK_S)
                z_t = load_logits(row_ptr, token + tl.arange(0, 1), token + tl.arange(0, 1) < vocab)
                p_t = tl.math.div_rn(weights(z_t, max_logit, 1.0, float("-inf")), z1)
                log_p = tl.where(no_finite, 0.0, tl.sum(log_prob(p_t), axis=0))
            done = (is_bonus | (draft != token)).to(tl.int32)
            accepted = tl.where(done != 0, i, accepted)
        else:
            kth = tl.full([], float("-inf"), tl.float32)
            if HAS_TOP_K:
                kth = row_kth(top_k_state_ptr, top_k_agg_ptr, slot, num_slots, num_splits, uses_top_k, top_k,
                              max_logit, BLOCK_S)
            z1 = row_fixed_sum(part_sum_ptr, slot, sum_splits, BLOCK_S)
            p_min = tl.zeros([], tl.float32)
            z2 = z1
            if HAS_TOP_P:
                p_min = row_p_min(top_p_state_ptr, top_p_agg_ptr, slot, num_slots, num_splits, uses_top_p, top_p,
                                  BLOCK_S)
                z2 = tl.where(uses_top_p, row_fixed_sum(part_sum2_ptr, slot, sum_splits, BLOCK_S), z1)
            x = tl.where(in_vocab, draft, 0)
            z_x = load_logits(row_ptr, x + tl.arange(0, 1), x + tl.arange(0, 1) < vocab)
            p_x = tl.sum(probs(z_x, max_logit, temperature, kth, z1, p_min, z2), axis=0)
            p_x = tl.where(no_finite, tl.where(x == 0, 1.0, 0.0), p_x)
            q_x = 1.0
            if HAS_DRAFT_PROBS:
                q_x = tl.load(draft_probs_ptr + t.to(tl.int64) * vocab + x, mask=in_vocab, other=0.0)
            w0, _w1, _w2, _w3 = philox_words(seed, position0 + i, 0, tl.zeros([1], tl.int32))
            u = tl.sum((w0 >> 8).to(tl.float32), axis=0) * (1.0 / TOP_P_SCALE)
            if in_vocab & (q_x > 0.0) & (u * q_x < p_x):
                token = x.to(tl.int32)
                log_p = tl.sum(log_prob(p_x + tl.zeros([1], tl.float32)), axis=0)
            else:
                done = tl.full([], 1, tl.int32)
                accepted = i
                if no_finite:  # all mass on token 0: every residual and the bonus race pick 0
                    token = 0
                else:
                    mode = tl.where(is_bonus, 0, 2 - HAS_DRAFT_PROBS)
                    tl.store(race_int, i.to(tl.int64))
                    tl.store(race_int + 1, mode.to(tl.int64))
                    tl.store(race_int + 2, tl.where(in_vocab, draft, -1))
                    tl.store(race_int + 3, position0 + i)
                    tl.store(race_float, max_logit)
                    tl.store(race_float + 1, temperature)
                    tl.store(race_float + 2, kth)
                    tl.store(race_float + 3, z1)
                    tl.store(race_float + 4, p_min)
                    tl.store(race_float + 5, z2)
                    token = -1  # written by the race's combine
        tl.store(out_row + i, token.to(tl.int32))
        if RETURN_LOGPROBS:
            tl.store(lp_row + i, log_p)
        i += 1
    if i >= 0:
        tl.store(num_accepted_ptr + b, accepted.to(tl.int32))
    while (i >= 0) & (i < width):
        tl.store(out_row + i, -1)
        if RETURN_LOGPROBS:
            tl.store(lp_row + i, 0.0)
        i += 1


# Grid (batch, num_splits). Program (b, s), when request b stopped on a random row, runs
# the race argmax_v r_v / E_v over its split of that row (E_v: Exp(1) from Philox word v)
# and writes its best score and the lowest index reaching it.
# The exact score (three IEEE divisions for p, two in the reproducible Exp(1), one for the
# score) costs several times fast bounds of it (race_score_bounds: fast exp2, approximate
# divisions, no log). Two phases: the first walks the split in blocks of BLOCK_V entries
# and keeps each block's largest upper bound and the split's largest lower bound L; the
# second computes exact scores only in the blocks whose upper bound reaches L (usually the
# winner's block alone), in order. A skipped block holds no entry whose exact score
# reaches the split's best, so the result is the exhaustive race's, bit for bit.
# Blocks are [BLOCK_V / 4, 4] tiles, one row per Philox call: a thread holds its call's
# four words and their four entries, so no word moves between threads.
# The request's last program to finish (a counter in race_int) combines the partials into
# the token (and its log-probability): no separate launch.
# Bytes: the chosen row (and its draft-probs row) once over all splits, plus the few
# blocks of the second phase again (from L2); nothing for requests that do not race.
@triton.jit(do_not_specialize=["num_tokens", "width"])  # vocab % 16 == 0: vector loads
def race_kernel(
    out_ptr,  # [batch, width] int32
    logprobs_ptr,  # [batch, width] float32 (RETURN_LOGPROBS)
    part_score_ptr,  # [batch, num_splits] float32
    part_index_ptr,  # [batch, num_splits] int32
    race_float_ptr,  # [batch, RACE_FLOATS] float32
    race_int_ptr,  # [batch, RACE_INTS] int64
    target_ptr,  # [num_tokens, vocab]
    bonus_ptr,  # [batch, vocab]
    draft_probs_ptr,  # [num_tokens, vocab] float32 (mode RACE_RESIDUAL)
    cu_ptr,  # [batch] int32
    seeds_ptr,  # [batch] int64
    num_tokens,
    vocab,
    width,
    split_len,  # a multiple of BLOCK_V, at most MAX_BLOCKS blocks
    RETURN_LOGPROBS: tl.constexpr,
    BLOCK_V: tl.constexpr,
    MAX_BLOCKS: tl.constexpr,
    BLOCK_S: tl.constexpr,  # >= num_splits
):
    b = tl.program_id(0)
    split = tl.program_id(1)
    race_int = race_int_ptr + b.to(tl.int64) * RACE_INTS
    step = tl.load(race_int)
    if step >= 0:
        mode = tl.load(race_int + 1)
        draft = tl.load(race_int + 2)
        position = tl.load(race_int + 3)
        race_float = race_float_ptr + b.to(tl.int64) * RACE_FLOATS
        max_logit = tl.load(race_float)
        temperature = tl.load(race_float + 1)
        kth = tl.load(race_float + 2)
        z1 = tl.load(race_float + 3)
        p_min = tl.load(race_float + 4)
        z2 = tl.load(race_float + 5)
        seed = tl.load(seeds_ptr + b)
        row_ptr, start, _count = slot_row(cu_ptr, target_ptr, bonus_ptr, b, step.to(tl.int32), num_tokens, vocab,
                                          width)
        q_row_ptr = draft_probs_ptr + (start + step) * vocab
        is_residual = mode == RACE_RESIDUAL
        is_ngram = mode == RACE_NGRAM
        # Scalars of the bounds (approximate; race_score_bounds' margins cover them).
        log2e_over_t = tl.math.div_rn(1.4426950408889634, temperature)
        inv_z1 = tl.math.div_rn(1.0, z1)
        inv_z2 = tl.math.div_rn(1.0, z2)
        row4 = tl.arange(0, BLOCK_V // 4)
        lane = tl.arange(0, 4)[None, :]
        block_ids = tl.arange(0, MAX_BLOCKS)
        block_upper = tl.full([MAX_BLOCKS], float("-inf"), tl.float32)
        lower = tl.full([BLOCK_V // 4, 4], -1.0, tl.float32)
        v_begin = split * split_len
        num_blocks = tl.cdiv(tl.minimum(split_len, vocab - v_begin), BLOCK_V)
        j = 0
        while j < num_blocks:
            block_begin = v_begin + j * BLOCK_V
            v = block_begin + row4[:, None] * 4 + lane
            in_row = v < vocab
            z = load_logits(row_ptr, v, in_row)
            q = tl.load(q_row_ptr + v, mask=in_row & is_residual, other=0.0)  # 0: r = p - 0 = p exactly
            w0, w1, w2, w3 = race_block_words(seed, position, block_begin // 4 + row4)
            upper, low = race_score_bounds(z, q, select_word(lane, w0, w1, w2, w3), is_ngram & (v == draft),
                                           max_logit, log2e_over_t, kth, inv_z1, p_min, inv_z2)
            lower = tl.maximum(lower, tl.where(in_row, low, -1.0))
            top = tl.max(tl.max(tl.where(in_row, upper, float("-inf")), axis=1), axis=0)
            block_upper = tl.where(block_ids == j, top, block_upper)
            j += 1
        # Every exact score is >= -1, so L >= -1 keeps at least the first block.
        reach = block_upper >= tl.max(tl.max(lower, axis=1), axis=0)
        best = tl.full([BLOCK_V // 4, 4], float("-inf"), tl.float32)
        best_index = tl.zeros([BLOCK_V // 4, 4], tl.int32)
        j = tl.min(tl.where(reach, block_ids, MAX_BLOCKS), axis=0)
        while j < MAX_BLOCKS:
            block_begin = v_begin + j * BLOCK_V
            v = block_begin + row4[:, None] * 4 + lane
            in_row = v < vocab
            z = load_logits(row_ptr, v, in_row)
            q = tl.load(q_row_ptr + v, mask=in_row & is_residual, other=0.0)
            w0, w1, w2, w3 = race_block_words(seed, position, block_begin // 4 + row4)
            r = tl.where(is_ngram & (v == draft), 0.0, probs(z, max_logit, temperature, kth, z1, p_min, z2) - q)
            score = tl.where(r > 0.0, tl.math.div_rn(r, repro_exponential(select_word(lane, w0, w1, w2, w3))), -1.0)
            better = in_row & (score > best)
            best = tl.where(better, score, best)
            best_index = tl.where(better, v, best_index)
            j = tl.min(tl.where(reach & (block_ids > j), block_ids, MAX_BLOCKS), axis=0)
        split_best = tl.max(tl.max(best, axis=1), axis=0)
        first = tl.min(tl.min(tl.where(best == split_best, best_index, INDEX_MAX), axis=1), axis=0)
        out = b.to(tl.int64) * tl.num_programs(1) + split
        tl.store(part_score_ptr + out, split_best)
        tl.store(part_index_ptr + out, first)
        # The request's last program to finish combines (release/acquire on the counter
        # orders the other programs' partials before its loads).
        arrived = tl.atomic_add(race_int + 4, 1, sem="acq_rel", scope="gpu")
        if arrived == tl.num_programs(1) - 1:
            _race_result(out_ptr, logprobs_ptr, part_score_ptr, part_index_ptr, race_float, row_ptr, b, step, vocab,
                         width, tl.num_programs(1), RETURN_LOGPROBS, BLOCK_S)


@triton.jit
def _race_result(out_ptr, logprobs_ptr, part_score_ptr, part_index_ptr, race_float, row_ptr, b, step, vocab, width,
                 num_splits, RETURN_LOGPROBS: tl.constexpr, BLOCK_S: tl.constexpr):
    """Request b's race partials (highest score, ties to the lowest index) into the sampled
    token at ``step`` and its log-probability. Bytes: a few per request."""
    s = tl.arange(0, BLOCK_S)
    offset = b.to(tl.int64) * num_splits + s
    # .cg: from L2, where the other programs' partials are (L1 is not coherent).
    score = tl.load(part_score_ptr + offset, mask=s < num_splits, other=float("-inf"), cache_modifier=".cg")
    index = tl.load(part_index_ptr + offset, mask=s < num_splits, other=INDEX_MAX, cache_modifier=".cg")
    best = tl.max(score, axis=0)
    token = tl.min(tl.where(score == best, index, INDEX_MAX), axis=0)
    tl.store(out_ptr + b.to(tl.int64) * width + step, token)
    if RETURN_LOGPROBS:
        v = token + tl.arange(0, 1)
        p_t = probs(load_logits(row_ptr, v, v < vocab), tl.load(race_float), tl.load(race_float + 1),
                    tl.load(race_float + 2), tl.load(race_float + 3), tl.load(race_float + 4),
                    tl.load(race_float + 5))
        tl.store(logprobs_ptr + b.to(tl.int64) * width + step, tl.sum(log_prob(p_t), axis=0))
