"""Reference of the fused ``verify`` op: from target logits to emitted tokens.

One request at a time, as the algorithm reads. Every floating-point step is one float32
operation in a fixed order, the sums that normalise a distribution are exact (fixed
point), exp and log are built from IEEE operations (reference/repro_math.py) and every
random draw comes from Philox4x32-10 (reference/philox.py): so a kernel that follows the
same steps returns exactly these tokens, and a seeded request returns the same tokens in
any batch.

The processed target distribution of a random request (temperature T > 0), per row:
1. top-k (``0 < k < V``): keep tokens whose logit is >= the k-th largest (ties kept);
2. ``w_v = exp((l_v - max l) / T)`` for kept tokens, 0 otherwise;
   ``p_v = w_v / Z`` with ``Z = sum_v floor(w_v * 2^40) * 2^-40`` (an exact integer sum);
3. top-p (``top_p < 1``): keep token v when the mass of tokens strictly more probable
   than v is below top_p (ties kept together; masses in exact 2^-32 fixed point), then
   renormalise as in 2.
Greedy requests (T = 0) take the argmax of the raw logits (ties to the lowest index).

Randomness, keyed by the request's seed, with counter (absolute position, purpose, index):
- draft i of request b sits at ``positions[b] + i``; its acceptance uniform is word 0 of
  ``philox(seed, (pos, PURPOSE_ACCEPT, 0))``, 24 bits;
- a token sampled at position pos (the recovered token at the first rejection, or the
  bonus token at ``positions[b] + num_drafts``) is drawn from integer masses ``m_v`` by
  inversion: ``X`` = words 0 (low) and 1 (high) of ``philox(seed, (pos, PURPOSE_SAMPLE, 0))``
  as 64 bits, ``U = floor(X * M / 2^64)`` with ``M = sum_v m_v``, and the token is the v with
  ``C_v <= U < C_v + m_v`` (``C_v = sum_{u < v} m_u``); ``M = 0`` gives token 0. The masses are
  the normaliser's fixed point, ``floor(x_v * 2^40)`` of: the processed weights ``x = w``
  (step 2/3 below: M * 2^-40 is Z) for the bonus token; the same without the draft token at
  an n-gram rejection; ``x = max(w - q * Z, 0)`` (two float32 operations: the residual
  ``max(p - q, 0)`` scaled by Z) at a rejection with draft probs. Every token's probability
  is its mass over M within 2^-64.
- at a rejection with draft probs the residual token is first sought by proposals, which
  need no pass over the residual masses: for t = 0 .. RESIDUAL_PROPOSALS - 1, the words
  (a0, a1, a2, a3) of ``philox(seed, (pos, PURPOSE_PROPOSE, t))`` give ``X = a0 + a1 2^32``,
  which draws ``x_t`` by inversion from the normaliser's masses ``W_v = floor(w_v * 2^40)``
  (as for the bonus token), and ``Y = a2 + a3 2^32``: ``x_t`` is the token when
  ``floor(Y * W_x / 2^64) < R_x``, ``R`` the residual masses above (R <= W). The first
  accepted proposal is taken; when none is (or M_W = 0), the token is drawn from R by
  inversion as above. Rejection sampling: ``P(x_t = v, accepted) = R_v / M_W`` at every t,
  so the token's probability is ``R_v / M_R`` within 2^-60, as for the direct draw.
No (position, purpose) pair is used twice across steps: the next step starts right after
the last emitted token.

Accept ``x_i`` when ``q_i(x_i) > 0`` and ``u_i * q_i(x_i) < p_i(x_i)`` (n-gram: q = 1).
Log-probabilities (when asked) are ``log p(token)`` under the processed distribution
(greedy rows: under the temperature-1 softmax of the raw logits), 0 in padding columns.

Non-finite logits (NaN, +-inf) are documented, not trusted: specops.verify raises on them
unless ``validate=False``; the op itself treats them as -inf (probability 0), and a row
with no finite logit puts all its mass on token 0.
"""

from __future__ import annotations

import torch

from specops.reference import philox
from specops.reference.repro_math import repro_exp, repro_log

PLACEHOLDER_TOKEN_ID = -1
FIXED_SCALE_BITS = 40  # normaliser sums: floor(w * 2^40), w in [0, 1]
TOP_P_MASS_BITS = 32  # top-p masses: floor(p * 2^32)
TOP_P_BITS = 24  # top_p as floor(top_p * 2^24)
RESIDUAL_PROPOSALS = 16  # proposals of a residual draw before the pass over its masses


def _fixed_sum(w: torch.Tensor) -> torch.Tensor:
    """sum_v floor(w_v * 2^40) * 2^-40 as float32 (exact integer sum, one rounding)."""
    fixed = torch.floor(w * float(2**FIXED_SCALE_BITS)).to(torch.int64)
    return fixed.sum().to(torch.float32) * float(2.0**-FIXED_SCALE_BITS)


def _normalise(w: torch.Tensor) -> torch.Tensor:
    return w / _fixed_sum(w)


def _top_p_keep(p: torch.Tensor, top_p: float) -> torch.Tensor:
    """Tokens whose strictly-more-probable mass is below top_p, in exact fixed point."""
    mass = torch.floor(p * float(2**TOP_P_MASS_BITS)).to(torch.int64)
    total = int(mass.sum())
    # At least 1: the most probable tokens (strictly-greater mass 0) are always kept.
    threshold = max(1, int(torch.floor(torch.tensor(top_p, dtype=torch.float32) * float(2**TOP_P_BITS))))
    values, order = torch.sort(p, descending=True, stable=True)
    exclusive = torch.cumsum(mass[order], 0) - mass[order]
    # Tied values share the exclusive mass of the first of their group.
    _, counts = torch.unique_consecutive(values, return_counts=True)
    starts = torch.cumsum(counts, 0) - counts
    group_mass = torch.repeat_interleave(exclusive[starts], counts)
    keep_sorted = group_mass * (1 << TOP_P_BITS) < threshold * total
    keep = torch.empty_like(keep_sorted)
    keep[order] = keep_sorted
    return keep


def _sanitised(logits: torch.Tensor) -> torch.Tensor:
    """float32 logits with NaN and +-inf replaced by -inf: such tokens get probability 0
    (and a row with no finite logit puts all its mass on token 0)."""
    z = logits.to(torch.float32)
    return torch.where(torch.isfinite(z), z, torch.full_like(z, float("-inf")))


def processed_weights(logits: torch.Tensor, temperature: float, top_k: int, top_p: float) -> torch.Tensor:
    """The processed weights of one row (module docstring, steps 1-3), unnormalised: the
    processed distribution is ``w / Z``, ``Z = _fixed_sum(w)``. [V] float32."""
    z = _sanitised(logits)
    vocab = z.shape[0]
    if not bool(torch.isfinite(z).any()):
        return torch.nn.functional.one_hot(torch.tensor(0), vocab).to(torch.float32)
    keep = torch.ones(vocab, dtype=torch.bool)
    if 0 < top_k < vocab:
        kth = torch.topk(z, top_k).values[-1]
        keep = z >= kth
    s = (z - z.max()) / torch.tensor(temperature, dtype=torch.float32)
    w = torch.where(keep, repro_exp(s), torch.zeros_like(s))
    if top_p < 1.0:
        w = torch.where(_top_p_keep(_normalise(w), top_p), w, torch.zeros_like(w))
    return w


def processed_probs(logits: torch.Tensor, temperature: float, top_k: int, top_p: float) -> torch.Tensor:
    """The processed target distribution of one row (module docstring, steps 1-3). [V] float32."""
    return _normalise(processed_weights(logits, temperature, top_k, top_p))


def _words(seed: int, position: int, purpose: int, num_words: int) -> torch.Tensor:
    """The first num_words Philox words of stream (seed, position, purpose)."""
    blocks = torch.arange((num_words + 3) // 4, dtype=torch.int64)
    counter = philox.counters(torch.tensor(position, dtype=torch.int64), purpose, blocks)
    key = philox.keys(torch.tensor(seed, dtype=torch.int64))
    return philox.philox4x32_10(counter, key).reshape(-1)[:num_words]


def accept_uniform(seed: int, position: int) -> torch.Tensor:
    return philox.uniform_from_word(_words(seed, position, philox.PURPOSE_ACCEPT, 1)[0])


def fixed_masses(x: torch.Tensor) -> torch.Tensor:
    """floor(x * 2^40) as int64 (x in [0, 1]: exact, at most 2^40)."""
    return torch.floor(x * float(2**FIXED_SCALE_BITS)).to(torch.int64)


def sample_uniform_int(seed: int, position: int, total: int) -> int:
    """U = floor(X * total / 2^64), X the 64-bit draw of the sample at a position."""
    words = _words(seed, position, philox.PURPOSE_SAMPLE, 2)
    x = int(words[0]) | (int(words[1]) << 32)
    return (x * total) >> 64


def _mulhi64(x: int, m: int) -> int:
    return (x * m) >> 64


def kept_proposal(weights: torch.Tensor, residual: torch.Tensor, seed: int, position: int) -> tuple[int, int] | None:
    """(t, token) of the first accepted proposal of a residual draw (module docstring), t its
    index among the RESIDUAL_PROPOSALS: proposals drawn by inversion from the normaliser's
    masses ``weights`` [V], each kept with probability residual / weights at its token; None
    when none is kept (or the weights sum to 0)."""
    total = int(weights.sum())
    if total == 0:
        return None
    cumulative = torch.cumsum(weights, 0)
    words = [int(w) for w in _words(seed, position, philox.PURPOSE_PROPOSE, 4 * RESIDUAL_PROPOSALS)]
    for t in range(RESIDUAL_PROPOSALS):
        a0, a1, a2, a3 = words[4 * t : 4 * t + 4]
        u = _mulhi64(a0 | (a1 << 32), total)
        token = int(torch.searchsorted(cumulative, u, right=True))
        if _mulhi64(a2 | (a3 << 32), int(weights[token])) < int(residual[token]):
            return t, token
    return None


def propose_residual(weights: torch.Tensor, residual: torch.Tensor, seed: int, position: int) -> int | None:
    """The token of kept_proposal (None when no proposal is kept)."""
    kept = kept_proposal(weights, residual, seed, position)
    return None if kept is None else kept[1]


def sample_masses(masses: torch.Tensor, seed: int, position: int) -> int:
    """The token drawn by inversion from integer masses [V] (module docstring)."""
    total = int(masses.sum())
    if total == 0:
        return 0
    u = sample_uniform_int(seed, position, total)
    return int(torch.searchsorted(torch.cumsum(masses, 0), u, right=True))


def log_prob(p: torch.Tensor) -> float:
    """repro_log of one probability, clamped to the smallest normal float (repro_log reads
    the exponent bits, so subnormal inputs are out of its domain)."""
    return float(repro_log(torch.clamp(p.reshape(1), min=torch.finfo(torch.float32).tiny))[0])


def _greedy_request(rows, bonus_row, drafts, return_logprobs):
    tokens, logprobs = [], []
    for i in range(len(drafts) + 1):
        row = rows[i] if i < len(drafts) else bonus_row
        z = _sanitised(row)
        target = int(torch.argmax(z))
        tokens.append(target)
        if return_logprobs:
            logprobs.append(log_prob(processed_probs(z, 1.0, 0, 1.0)[target]))
        if i < len(drafts) and drafts[i] != target:
            return tokens, len(tokens) - 1, logprobs
    return tokens, len(drafts), logprobs


def _random_request(rows, bonus_row, drafts, draft_rows, params, return_logprobs):
    temperature, top_k, top_p, seed, position = params
    tokens, logprobs = [], []
    for i, x in enumerate(drafts):
        w = processed_weights(rows[i], temperature, top_k, top_p)
        p = _normalise(w)
        q = draft_rows[i] if draft_rows is not None else None
        q_x = q[x] if q is not None else torch.tensor(1.0)
        u = accept_uniform(seed, position + i)
        if bool(q_x > 0) and bool(u * q_x < p[x]):
            tokens.append(x)
            if return_logprobs:
                logprobs.append(log_prob(p[x]))
            continue
        token = None
        if q is not None:  # the residual max(p - q, 0) scaled by Z: no division
            masses = fixed_masses(torch.clamp(w - q * _fixed_sum(w), min=0))
            token = propose_residual(fixed_masses(w), masses, seed, position + i)
        else:
            masses = fixed_masses(w)
            if 0 <= x < masses.shape[0]:
                masses[x] = 0
        if token is None:
            token = sample_masses(masses, seed, position + i)
        tokens.append(token)
        if return_logprobs:
            logprobs.append(log_prob(p[token]))
        return tokens, i, logprobs
    w = processed_weights(bonus_row, temperature, top_k, top_p)
    p = _normalise(w)
    token = sample_masses(fixed_masses(w), seed, position + len(drafts))
    tokens.append(token)
    if return_logprobs:
        logprobs.append(log_prob(p[token]))
    return tokens, len(drafts), logprobs


def verify(
    target_logits: torch.Tensor,  # [num_tokens, V] float32 | bfloat16 | float16
    bonus_logits: torch.Tensor,  # [B, V], dtype of target_logits
    draft_token_ids: torch.Tensor,  # [num_tokens] int32 | int64
    draft_probs: torch.Tensor | None,  # [num_tokens, V] float32; None: n-gram drafts
    cu_num_draft_tokens: torch.Tensor,  # [B] int32
    temperature: torch.Tensor | None,  # [B] float32, 0 = greedy; None: every request greedy
    top_k: torch.Tensor | None,  # [B] int32; <= 0 or >= V: no top-k
    top_p: torch.Tensor | None,  # [B] float32; >= 1: no top-p
    seeds: torch.Tensor,  # [B] int64
    positions: torch.Tensor,  # [B] int64, absolute position of each request's first draft
    max_spec_len: int,
    return_logprobs: bool = False,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Returns ``(output_token_ids [B, max_spec_len + 1] int32 padded with -1,
    num_accepted [B] int32, logprobs [B, max_spec_len + 1] float32 or [0, 0])``."""
    batch = cu_num_draft_tokens.shape[0]
    width = max_spec_len + 1
    out = torch.full((batch, width), PLACEHOLDER_TOKEN_ID, dtype=torch.int32)
    num_accepted = torch.zeros(batch, dtype=torch.int32)
    logprobs = torch.zeros((batch, width) if return_logprobs else (0, 0), dtype=torch.float32)
    for b in range(batch):
        start = 0 if b == 0 else int(cu_num_draft_tokens[b - 1])
        end = int(cu_num_draft_tokens[b])
        rows = target_logits[start:end].cpu()
        drafts = [int(x) for x in draft_token_ids[start:end]]
        bonus_row = bonus_logits[b].cpu()
        temp = float(temperature[b]) if temperature is not None else 0.0
        if temp == 0.0:
            tokens, accepted, lps = _greedy_request(rows, bonus_row, drafts, return_logprobs)
        else:
            params = (
                temp,
                int(top_k[b]) if top_k is not None else 0,
                float(top_p[b]) if top_p is not None else 1.0,
                int(seeds[b]),
                int(positions[b]),
            )
            draft_rows = draft_probs[start:end].cpu() if draft_probs is not None else None
            tokens, accepted, lps = _random_request(rows, bonus_row, drafts, draft_rows, params, return_logprobs)
        out[b, : len(tokens)] = torch.tensor(tokens, dtype=torch.int32)
        num_accepted[b] = accepted
        if return_logprobs:
            logprobs[b, : len(lps)] = torch.tensor(lps, dtype=torch.float32)
    device = target_logits.device
    return out.to(device), num_accepted.to(device), logprobs.to(device)
