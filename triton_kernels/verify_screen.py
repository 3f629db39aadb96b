"""The screen of the Triton ``verify``: acceptance decisions from approximate normalisers,
so the exact fixed-point normaliser (a second pass over a row) is computed only for the
rows that need it.

Why it stays exact: p(x) = w(x) / z1 with z1 the exact fixed-point sum; the approximate
sum from the max pass (verify_rows.py: row_max_kernel) is within 1e-4 of z1, relative,
for every finite row: the exp arguments differ by a few float32 roundings of values
<= 64 in magnitude (terms further down weigh < 2^-64 each), each exp2 by <= 2 ulp, the
fixed-point truncation by <= vocab 2^-40 while z1 >= 1 (the max's weight is exactly 1),
and the float32 sums by (blocks + splits + 10) ulp. A test is settled here only when
u q(x) lies outside p'(x) (1 +- 2^-9), p' = w(x) / approximate sum: 20x that bound, so
the exact test would give the same answer. Everything else, the rejected row's race and
any row after an unsettled test, goes to the exact pass and decide_kernel.

Calls of random and greedy requests without top-k, top-p or log-probabilities settle the
same tests with the same band inside the max pass instead (verify_rows.py: row_max_kernel's
TESTS), and this launch does not run; it serves all-greedy calls, calls whose steps are all
marked (top-k, top-p, log-probabilities) and those the max pass cannot (verify.py:
MAX_PASS_TESTS).
"""

from __future__ import annotations

import triton
import triton.language as tl

from .launch import direct_launch
from .ragged import draft_range
from .verify_math import INDEX_MAX, LOG2E, acceptance_uniform, chain_launch, load_logits, weights
from .verify_slots import request_params

MARGIN = tl.constexpr(0.001953125)  # 2^-9: the screen's relative band around p'(x)


@triton.jit
def _step_stats(part_max_ptr, part_arg_ptr, part_approx_ptr, slots, reachable, num_splits, temperature,
                WITH_SUM: tl.constexpr, BLOCK_S: tl.constexpr):
    """Per step of one request: combined max logit, first argmax and approximate normaliser
    (as row_max_argmax for a vector of slots; the sums as row_max_kernel's comment says;
    WITH_SUM False: 0, as all-greedy batches need none)."""
    s = tl.arange(0, BLOCK_S)
    offset = slots.to(tl.int64)[:, None] * num_splits + s[None, :]
    mask = reachable[:, None] & (s < num_splits)[None, :]
    split_max = tl.load(part_max_ptr + offset, mask=mask, other=float("-inf"))
    split_arg = tl.load(part_arg_ptr + offset, mask=mask, other=INDEX_MAX)
    best = tl.max(split_max, axis=1)
    argmax = tl.min(tl.where(split_max == best[:, None], split_arg, INDEX_MAX), axis=1)
    approx = tl.zeros_like(best)
    if WITH_SUM:
        split_sum = tl.load(part_approx_ptr + offset, mask=mask, other=0.0)
        factor = tl.where(split_max == float("-inf"), 0.0,
                          tl.exp2((split_max - best[:, None]) * (LOG2E / temperature)))
        approx = tl.sum(split_sum * factor, axis=1)
    return best, argmax, approx


# Grid (batch,). Program b screens request b and marks the steps whose exact normaliser
# the decisions need, always a range: marked[b] = (first step, number of steps); resume[b]
# is the step decide_kernel starts from (-1: the screen emitted everything). Greedy
# requests are settled here from the argmax; requests with top-k, top-p or
# log-probabilities need every step exactly. Plain random requests: surely accepted steps
# are emitted here; the first other step (rejection, unsettled test or bonus) is marked,
# and after an unsettled test every later step too. ALL_GREEDY: the caller promised every
# request is greedy (no log-probabilities): the screen finishes the batch. Bytes: one logit
# and one draft prob per step, the partials of every step.
@direct_launch
@triton.jit(do_not_specialize=["num_tokens", "vocab", "width", "num_splits"])
def screen_kernel(
    out_ptr,  # [batch, width] int32
    num_accepted_ptr,  # [batch] int32
    marked_ptr,  # [batch, 2] int32, written
    resume_ptr,  # [batch] int32, written
    part_max_ptr,  # [batch * width, num_splits] float32
    part_arg_ptr,  # [batch * width, num_splits] int32
    part_approx_ptr,  # [batch * width, num_splits] float32
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
    num_splits,
    HAS_DRAFT_PROBS: tl.constexpr,
    HAS_TOP_K: tl.constexpr,
    HAS_TOP_P: tl.constexpr,
    RETURN_LOGPROBS: tl.constexpr,
    ALL_GREEDY: tl.constexpr,
    BLOCK_S: tl.constexpr,
    BLOCK_W: tl.constexpr,
    PDL: tl.constexpr = False,
):
    # Before the wait (PDL): the op's own inputs only (verify_math.chain_launch): the
    # request, its drafts, their logits and draft probs, the tests' uniforms. After it: the
    # max pass's partials, one round of loads.
    b = tl.program_id(0)
    if ALL_GREEDY:  # the caller's promise: no per-request parameter is read
        temperature, uses_top_k, uses_top_p = 0.0, False, False
    else:
        temperature, uses_top_k, _top_k, uses_top_p, _top_p = request_params(
            b, vocab, temperature_ptr, top_k_ptr, top_p_ptr, HAS_TOP_K, HAS_TOP_P)
    start, count = draft_range(cu_ptr, b, num_tokens, width - 1)
    out_row = out_ptr + b.to(tl.int64) * width
    steps = tl.arange(0, BLOCK_W)
    in_width = steps < width
    reachable = steps <= count
    exact_everywhere = (tl.full([], RETURN_LOGPROBS, tl.int1) | uses_top_k) | uses_top_p  # every reachable step marked
    is_draft = steps < count
    t = start + steps
    draft = tl.load(draft_ptr + t, mask=tl.where(exact_everywhere, False, is_draft), other=-1).to(tl.int64)
    tests = tl.where((temperature != 0.0) & ~exact_everywhere, is_draft, False)  # a random request's tests
    in_vocab = is_draft & (draft >= 0) & (draft < vocab)
    x = tl.where(in_vocab, draft, 0)
    z_x = load_logits(target_ptr + t.to(tl.int64) * vocab, x, in_vocab & tests)
    q_x = tl.full([BLOCK_W], 1.0, tl.float32)
    if HAS_DRAFT_PROBS:
        q_x = tl.load(draft_probs_ptr + t.to(tl.int64) * vocab + x, mask=in_vocab & tests, other=0.0)
    scaled = tl.zeros([BLOCK_W], tl.float32)
    if not ALL_GREEDY:  # no test under the all-greedy promise: no seed or position read
        seed = tl.load(seeds_ptr + b)
        position = tl.load(positions_ptr + b) + steps
        scaled = acceptance_uniform(seed, position, tl.zeros([BLOCK_W], tl.int32)) * q_x  # u q(x), as the exact test
    chain_launch(PDL)
    resume = tl.zeros([], tl.int32)
    first_marked = tl.zeros([], tl.int32)
    num_marked = tl.zeros([], tl.int32)
    if exact_everywhere:
        num_marked = (count + 1).to(tl.int32)
    else:
        # All steps at once (a few dependent loads in all, not a few per step).
        max_logit, argmax, approx = _step_stats(part_max_ptr, part_arg_ptr, part_approx_ptr, b * width + steps,
                                                reachable, num_splits, temperature, not ALL_GREEDY, BLOCK_S)
        if temperature == 0.0:
            match = is_draft & (draft == argmax)
            stop = tl.min(tl.where(match, BLOCK_W, steps), axis=0)  # first mismatch or the bonus step
            tl.store(out_row + steps, tl.where(steps <= stop, argmax, -1), mask=in_width)
            tl.store(num_accepted_ptr + b, stop)
            resume = resume - 1
        else:
            p_approx = tl.math.div_rn(weights(z_x, max_logit, temperature, float("-inf")), approx)
            # An approximate sum that cannot be right (a degenerate temperature): unsettled.
            trusted = (approx >= 1.0 - MARGIN) & (approx < float("inf"))
            lower = tl.where(trusted, p_approx * (1.0 - MARGIN), 0.0)
            upper = tl.where(trusted, p_approx * (1.0 + MARGIN), float("inf"))
            no_finite = max_logit == float("-inf")  # p = one-hot on token 0, exactly
            lower = tl.where(no_finite, tl.where(x == 0, 1.0, 0.0), lower)
            upper = tl.where(no_finite, tl.where(x == 0, 1.0, 0.0), upper)
            possible = in_vocab & (q_x > 0.0)
            stop = tl.min(tl.where(possible & (scaled < lower), BLOCK_W, steps), axis=0)
            sure_reject = ~possible | (scaled >= upper)
            unsettled = tl.sum(((steps == stop) & is_draft & ~sure_reject).to(tl.int32), axis=0) > 0
            tl.store(out_row + steps, x.to(tl.int32), mask=steps < stop)
            first_marked = stop.to(tl.int32)
            num_marked = tl.where(unsettled, count + 1 - stop, 1).to(tl.int32)
            resume = stop
    tl.store(resume_ptr + b, resume)
    tl.store(marked_ptr + b * 2, first_marked)
    tl.store(marked_ptr + b * 2 + 1, num_marked)
