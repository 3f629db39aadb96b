"""The acceptance decisions of the Triton ``verify``, one program per request, after the
row statistics (verify_rows.py); the token a random request samples at its stop is drawn
by verify_sample.py from the parameters left here.
"""

from __future__ import annotations

import triton
import triton.language as tl

from .launch import direct_launch
from .verify_math import (
    FIXED_SCALE,
    acceptance_uniform,
    chain_launch,
    exponent_scale,
    exact_test,
    load_logits,
    log_prob,
    probs,
    weights,
)
from .ragged import draft_range
from .verify_rows import PASSES
from .verify_search import row_kth, row_p_min
from .verify_slots import request_params, row_fixed_sum, row_fixed_total, row_max_argmax, row_max_fixed_sum
from .verify_sample import SAMPLE_FLOATS, SAMPLE_INTS, draw_token, propose_residual


# Grid (batch,). Program b walks request b's steps from resume[b] (the screen emitted the
# steps before it; without SCREENED from the first step the max pass's test did not pass
# (VERDICTS: exact, verify_unscreened.py, or settled from approximate sums,
# verify_rows.py), or from step 0, every test exact) with the combined row
# statistics and exact normalisers: greedy: emit the argmax, stop at the first mismatch;
# random: the acceptance test u q(x) < p(x) (u from Philox, p(x) from one logit and the
# row's max and normalisers), stop at the first rejection or the bonus step, where a random
# request draws its token (verify_sample.draw_token) from the normaliser's block sums; at a
# rejection with draft probs it tries the residual proposals
# (verify_sample.propose_residual), and when none is kept leaves the row's parameters in
# sample_float/sample_int for the residual pass. Bytes: one logit (and one draft prob) per
# step, the partials of the slots walked, and the block sums of each random step walked.
@direct_launch
@triton.jit(do_not_specialize=["num_tokens", "vocab", "width", "num_splits", "sum_splits"])
def decide_kernel(
    out_ptr,  # [batch, width] int32
    num_accepted_ptr,  # [batch] int32
    logprobs_ptr,  # [batch, width] float32 (RETURN_LOGPROBS)
    sample_float_ptr,  # [batch, SAMPLE_FLOATS] float32
    sample_int_ptr,  # [batch, SAMPLE_INTS] int64
    arrivals_ptr,  # [batch] int32: zeroed for residual_sample_kernel (HAS_DRAFT_PROBS)
    block_sum_ptr,  # [batch * width, cdiv(vocab, MASS_BLOCK)] int64: fixed_sum_kernel's block sums
    resume_ptr,  # [batch] int32: first step to decide here (-1: none; verify_screen.py)
    verdict_ptr,  # [batch * width] int32 (VERDICTS): PASSES where the step's draft passed its test in the max pass
    slot_max_ptr,  # [batch * width] float32 (SLOT_STATS): each slot's max logit
    slot_total_ptr,  # [batch * width] int64 (SLOT_STATS): each slot's normaliser total (integer)
    part_max_ptr,  # [batch * width, num_splits] float32
    part_arg_ptr,  # [batch * width, num_splits] int32
    part_sum_ptr,  # [batch * width, sum_splits] int64: z1 partials
    part_sum2_ptr,  # [batch * width, sum_splits] int64: z2 partials (HAS_TOP_P)
    top_k_state_ptr, top_k_agg_ptr, top_p_state_ptr, top_p_agg_ptr,  # searches (verify_search.py)
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
    MASS_BLOCK: tl.constexpr,  # vocab entries per block sum
    BLOCK_B: tl.constexpr,  # a power of two >= the number of block sums (cdiv(vocab, MASS_BLOCK))
    PROPOSAL_ROUND: tl.constexpr,  # residual proposals tried at a time (divides RESIDUAL_PROPOSALS)
    BLOCK_W: tl.constexpr,  # a power of two >= width
    SCREENED: tl.constexpr = True,  # False: no screen ran, every request is walked from step 0
    VERDICTS: tl.constexpr = False,  # not SCREENED: from the first step the max pass did not pass
    SLOT_STATS: tl.constexpr = False,  # (VERDICTS) the max pass stored each slot's statistics (verify_unscreened.py)
    PROPOSAL_GROUP: tl.constexpr = 0,  # > 0: the proposals' block search in two levels (propose_residual)
    PROPOSAL_Q_TILE: tl.constexpr = False,  # the proposals' draft probs from their blocks (propose_residual)
    PDL: tl.constexpr = False,
):
    # Before the wait (PDL): the op's own inputs only (verify_math.chain_launch): every
    # step's draft, its logit and draft prob, and the acceptance test's uniform, so a step's
    # test waits on the row statistics alone.
    b = tl.program_id(0)
    num_slots = tl.num_programs(0) * width
    temperature, uses_top_k, top_k, uses_top_p, top_p = request_params(
        b, vocab, temperature_ptr, top_k_ptr, top_p_ptr, HAS_TOP_K, HAS_TOP_P)
    greedy = temperature == 0.0
    seed = tl.load(seeds_ptr + b)
    position0 = tl.load(positions_ptr + b)
    start, count = draft_range(cu_ptr, b, num_tokens, width - 1)
    steps = tl.arange(0, BLOCK_W)
    step_rows = (start + steps).to(tl.int64) * vocab
    step_drafts = tl.load(draft_ptr + start + steps, mask=steps < count, other=0).to(tl.int64)
    step_in_vocab = (steps < count) & (step_drafts >= 0) & (step_drafts < vocab)
    step_x = tl.where(step_in_vocab, step_drafts, 0)
    step_tests = tl.where(greedy, False, step_in_vocab)
    step_z = load_logits(target_ptr + step_rows, step_x, step_tests)
    step_q = tl.full([BLOCK_W], 1.0, tl.float32)
    if HAS_DRAFT_PROBS:
        step_q = tl.load(draft_probs_ptr + step_rows + step_x, mask=step_tests, other=0.0)
    step_u = acceptance_uniform(seed, position0 + steps, tl.zeros([BLOCK_W], tl.int32))
    chain_launch(PDL)
    out_row = out_ptr + b.to(tl.int64) * width
    lp_row = logprobs_ptr + b.to(tl.int64) * width
    sample_int = sample_int_ptr + b.to(tl.int64) * SAMPLE_INTS
    sample_float = sample_float_ptr + b.to(tl.int64) * SAMPLE_FLOATS
    tl.store(sample_int, -1)
    if HAS_DRAFT_PROBS:  # every request: no memset launch, and each call (graph replay) starts at 0
        tl.store(arrivals_ptr + b, 0)
    if SCREENED:
        i = tl.load(resume_ptr + b)
    elif VERDICTS:  # the max pass tested every step: emit the drafts before the first that did not pass
        verdicts = tl.load(verdict_ptr + b * width + steps, mask=steps < count, other=0)
        i = tl.min(tl.where((steps < count) & (verdicts != PASSES), steps, count), axis=0).to(tl.int32)
        tl.store(out_row + steps, step_drafts.to(tl.int32), mask=steps < i)
    else:
        i = tl.zeros([], tl.int32)
    num_mass_blocks = tl.cdiv(vocab, MASS_BLOCK)
    mass_blocks = tl.arange(0, BLOCK_B)
    done = (i < 0).to(tl.int32)  # the screen decided the whole request
    accepted = tl.zeros([], tl.int32)
    while done == 0:
        slot = b * width + i
        is_bonus = i == count
        t = start + i
        row_ptr = tl.where(is_bonus, bonus_ptr + b.to(tl.int64) * vocab, target_ptr + t.to(tl.int64) * vocab)
        at = steps == i
        token = tl.zeros([], tl.int32)
        log_p = tl.zeros([], tl.float32)
        draft = tl.sum(tl.where(at, step_drafts, 0), axis=0)
        # VERDICTS: a draft step after the first that did not pass whose verdict is a pass
        # passes (the verdicts are exact) and has no normaliser (fixed_sum_kernel sums the
        # steps the walk tests, not those); no log-probabilities with VERDICTS.
        surely = tl.zeros([], tl.int1)
        if VERDICTS:
            surely = tl.sum((at & (verdicts == PASSES)).to(tl.int32), axis=0) > 0
        # Each branch issues the step's loads before any reduction: a reduction's barriers
        # would hold back the loads after it (one L2 round trip each).
        if greedy:
            max_logit, token = row_max_argmax(part_max_ptr, part_arg_ptr, slot, num_splits, BLOCK_S)
            no_finite = max_logit == float("-inf")
            if RETURN_LOGPROBS:
                z1 = row_fixed_sum(part_sum_ptr, slot, sum_splits, BLOCK_S)
                z_t = load_logits(row_ptr, token + tl.arange(0, 1), token + tl.arange(0, 1) < vocab)
                p_t = tl.math.div_rn(weights(z_t, max_logit, 1.0, float("-inf")), z1)
                log_p = tl.where(no_finite, 0.0, tl.sum(log_prob(p_t), axis=0))
            done = (is_bonus | (draft != token)).to(tl.int32)
            accepted = tl.where(done != 0, i, accepted)
        elif surely:
            token = draft.to(tl.int32)
        else:
            # The step's block sums (fixed_sum_kernel's; garbage, never used, at a step that
            # passes), loaded before the acceptance test: a rejection's draw does not wait.
            block_sums = tl.load(block_sum_ptr + slot.to(tl.int64) * num_mass_blocks + mass_blocks,
                                 mask=mass_blocks < num_mass_blocks, other=0)
            # mass_total: the sum of the block sums a draw searches (the pass that last wrote them).
            if SLOT_STATS:  # the slot's combined statistics, stored by the max pass
                max_logit = tl.load(slot_max_ptr + slot)
                mass_total = tl.load(slot_total_ptr + slot)
                z1 = mass_total.to(tl.float32) * (1.0 / FIXED_SCALE)
            else:
                max_logit, z1, mass_total = row_max_fixed_sum(part_max_ptr, part_sum_ptr, slot, num_splits,
                                                              sum_splits, BLOCK_S)
            no_finite = max_logit == float("-inf")
            in_vocab = tl.sum((at & step_in_vocab).to(tl.int32), axis=0) > 0
            kth = tl.full([], float("-inf"), tl.float32)
            if HAS_TOP_K:
                kth = row_kth(top_k_state_ptr, top_k_agg_ptr, slot, num_slots, num_splits, uses_top_k, top_k,
                              max_logit, BLOCK_S)
            p_min = tl.zeros([], tl.float32)
            z2 = z1
            if HAS_TOP_P:
                p_min = row_p_min(top_p_state_ptr, top_p_agg_ptr, slot, num_slots, num_splits, uses_top_p, top_p,
                                  BLOCK_S)
                total2 = row_fixed_total(part_sum2_ptr, slot, sum_splits, BLOCK_S)
                z2 = tl.where(uses_top_p, total2.to(tl.float32) * (1.0 / FIXED_SCALE), z1)
                mass_total = tl.where(uses_top_p, total2, mass_total)
            x = tl.where(in_vocab, draft, 0)
            # The step's lane of the vectors loaded before the wait (the other lanes add 0).
            z_x = tl.sum(tl.where(at, step_z, 0.0), axis=0)
            q_x = tl.sum(tl.where(at, step_q, 0.0), axis=0)
            u = tl.sum(tl.where(at, step_u, 0.0), axis=0)
            passed, p_x = exact_test(z_x, q_x, u, x, in_vocab, max_logit, temperature, kth, z1, p_min, z2)
            if passed:
                token = x.to(tl.int32)
                log_p = tl.sum(log_prob(p_x + tl.zeros([1], tl.float32)), axis=0)
            else:
                done = tl.full([], 1, tl.int32)
                accepted = i
                if no_finite:  # all mass on token 0: every residual and the bonus draw pick 0
                    token = 0
                else:
                    params = (max_logit, temperature, kth, z1, p_min, z2)
                    if ~is_bonus & (HAS_DRAFT_PROBS != 0):  # proposals, else the residual masses' own pass
                        proposing = (block_sums, mass_total, row_ptr, draft_probs_ptr + t.to(tl.int64) * vocab, seed,
                                     position0 + i, vocab)
                        # One call for both forms of exp's first step (scaled_weights): the
                        # proposals' code once.
                        token = propose_residual(*proposing, max_logit, temperature, exponent_scale(temperature), kth,
                                                 z1, p_min, z2, HAS_TOP_P, MASS_BLOCK, PROPOSAL_ROUND, PROPOSAL_GROUP,
                                                 PROPOSAL_Q_TILE)
                        if token < 0:
                            tl.store(sample_int, i.to(tl.int64))
                            tl.store(sample_int + 1, position0 + i)
                            tl.store(sample_float, max_logit)
                            tl.store(sample_float + 1, temperature)
                            tl.store(sample_float + 2, kth)
                            tl.store(sample_float + 3, z1)
                            tl.store(sample_float + 4, p_min)
                            tl.store(sample_float + 5, z2)  # token -1: written by residual_sample_kernel
                    else:  # the normaliser's own terms: drawn here, from fixed_sum_kernel's block sums
                        excluded = tl.where(in_vocab, draft, -1)
                        token = draw_token(block_sums, mass_total, row_ptr, row_ptr, False, excluded, z_x,
                                           seed, position0 + i, vocab, *params, False, HAS_TOP_P, MASS_BLOCK,
                                           BLOCK_B).to(tl.int32)
                    if token >= 0:
                        z_t = load_logits(row_ptr, token + tl.arange(0, 1), token + tl.arange(0, 1) < vocab)
                        log_p = tl.sum(log_prob(probs(z_t, *params)), axis=0)
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
