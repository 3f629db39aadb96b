"""Inputs of the fused verify op from fresh random data, and the comparisons of a kernel's
result with the reference's, shared by its tests."""

from __future__ import annotations

import torch

import specops
from specops.backend import Backend
from specops.reference.verify import processed_probs
from specops.reference.verify import verify as reference_verify


def make_inputs(num_draft_tokens, vocab, seed, *, greedy_fraction=0.3, ngram=False, dtype=torch.float32,
                id_dtype=torch.int32, with_top=True):
    g = torch.Generator().manual_seed(seed)
    batch, num_tokens = len(num_draft_tokens), sum(num_draft_tokens)
    target = torch.randn(num_tokens, vocab, generator=g) * 2
    draft_probs = torch.softmax(target + torch.randn(num_tokens, vocab, generator=g), -1)
    drafts = (torch.multinomial(draft_probs, 1, generator=g).squeeze(-1) if num_tokens
              else torch.zeros(0, dtype=torch.int64))
    temperature = torch.rand(batch, generator=g) + 0.3
    temperature[torch.rand(batch, generator=g) < greedy_fraction] = 0.0
    return dict(
        target_logits=target.to(dtype),
        bonus_logits=torch.randn(batch, vocab, generator=g).to(dtype),
        draft_token_ids=drafts.to(id_dtype),
        draft_probs=None if ngram else draft_probs,
        cu_num_draft_tokens=torch.tensor(num_draft_tokens, dtype=torch.int64).cumsum(0).to(torch.int32),
        temperature=temperature,
        top_k=torch.randint(0, vocab + 2, (batch,), generator=g).to(torch.int32) if with_top else None,
        top_p=(torch.rand(batch, generator=g) * 0.6 + 0.5) if with_top else None,
        seeds=torch.randint(-(2**62), 2**62, (batch,), generator=g),
        positions=torch.randint(0, 2**40, (batch,), generator=g),
    )


def select_requests(inputs, order):
    """The requests ``order`` of a batch, as a batch of their own."""
    counts = torch.diff(inputs["cu_num_draft_tokens"].long(), prepend=torch.zeros(1, dtype=torch.long))
    starts = torch.cumsum(counts, 0) - counts
    rows = torch.cat([torch.arange(int(starts[b]), int(starts[b] + counts[b])) for b in order]).long()
    per_request = ("bonus_logits", "temperature", "top_k", "top_p", "seeds", "positions")
    per_row = ("target_logits", "draft_token_ids", "draft_probs")
    out = {}
    for key, value in inputs.items():  # the same keys in the same order: callers pass them positionally
        if value is None:
            out[key] = None
        elif key in per_request:
            out[key] = value[order]
        elif key in per_row:
            out[key] = value[rows]
        else:  # cu_num_draft_tokens
            out[key] = counts[order].cumsum(0).int()
    return out


def rejecting_first_drafts(inputs, path):
    """Every random request's first draft made a near-certain rejection (its logit -30),
    with draft probs that send the residual token down one path of the contract:
    "proposal": q ~ 1 on the draft, so the residual is nearly p and a proposal is kept;
    "direct": q is p (processed, greedy requests at T = 1) but for 1e-3 moved onto the
    draft, so the residual mass is ~1e-3 of p's and no proposal is kept; "late": 0.15 moved,
    so a proposal is kept with probability ~0.15, often after the first round of them."""
    inputs = dict(inputs)
    counts = torch.diff(inputs["cu_num_draft_tokens"].long(), prepend=torch.zeros(1, dtype=torch.long))
    request = torch.repeat_interleave(torch.arange(len(counts)), counts)
    rows, drafts = torch.arange(len(request)), inputs["draft_token_ids"].long()
    target = inputs["target_logits"].clone()
    target[rows, drafts] = -30.0
    inputs["target_logits"] = target
    if path == "proposal":
        q = torch.full(target.shape, 1e-6)
        q[rows, drafts] = 1.0
        inputs["draft_probs"] = q / q.sum(-1, keepdim=True)
        return inputs
    top_k, top_p = inputs["top_k"], inputs["top_p"]
    q = torch.stack([
        processed_probs(target[row].float(), float(inputs["temperature"][b]) or 1.0,
                        int(top_k[b]) if top_k is not None else 0, float(top_p[b]) if top_p is not None else 1.0)
        for row, b in zip(rows.tolist(), request.tolist())]) if len(rows) else torch.zeros(target.shape)
    moved = 0.15 if path == "late" else 1e-3
    q = q * (1 - moved)
    q[rows, drafts] += moved
    inputs["draft_probs"] = q
    return inputs


def triton_tokens(inputs, device, max_spec_len, validate=True):
    """(output tokens, accepted counts) of the Triton kernel's tokens-only call, on the CPU."""
    out, accepted, _ = specops.verify(*on(inputs, device).values(), max_spec_len, False, backend=Backend.TRITON,
                                      validate=validate)
    return out.cpu(), accepted.cpu()


def on(inputs, device):
    """The inputs moved to ``device`` (None kept)."""
    return {k: (v.to(device) if v is not None else None) for k, v in inputs.items()}


def assert_matches_reference(inputs, max_spec_len, device, backend, validate=True):
    """The kernel on ``device`` returns exactly what the reference returns on the CPU."""
    expected = reference_verify(**inputs, max_spec_len=max_spec_len, return_logprobs=True)
    got = specops.verify(*on(inputs, device).values(), max_spec_len, True, backend=backend, validate=validate)
    names = ("output_token_ids", "num_accepted", "logprobs")
    for name, g, e in zip(names, got, expected):
        g = g.cpu()
        assert g.dtype == e.dtype and g.shape == e.shape, name
        assert torch.equal(g, e), f"{name} differs:\n{g}\n{e}"


def assert_tokens_match_reference(inputs, max_spec_len, device, backend, validate=True):
    """As assert_matches_reference, without log-probabilities: the path on which the Triton
    kernel settles acceptance tests from approximate normalisers (verify_screen.py)."""
    expected = reference_verify(**inputs, max_spec_len=max_spec_len)
    got = specops.verify(*on(inputs, device).values(), max_spec_len, False, backend=backend, validate=validate)
    for name, g, e in zip(("output_token_ids", "num_accepted"), got, expected):
        assert torch.equal(g.cpu(), e), f"{name} differs:\n{g}\n{e}"
