"""Fake (meta) kernels of every op, for torch.compile and opcheck.

Each runs the same shape checks as the real kernels, so a bad call fails at trace time
with the message it would fail with at run time. One registration per op covers both
namespaces, torch.ops.specops and torch.ops.specops_triton: their schemas are the same.
"""

from __future__ import annotations

import torch

from specops import _checks, _value_checks
from specops.reference.checks import ATTENTION_STATS, STATS

NAMESPACES = ("specops", "specops_triton")


def _register(name: str):
    def decorate(fn):
        for namespace in NAMESPACES:
            torch.library.register_fake(f"{namespace}::{name}")(fn)
        return fn

    return decorate


@_register("expand_to_tokens")
def _expand_to_tokens_fake(values, cu_num_draft_tokens, num_tokens, replace_from=None, replace_to=0.0):
    _checks.check_expand_to_tokens(values, cu_num_draft_tokens, num_tokens, replace_from)
    return values.new_empty((num_tokens,))


@_register("rejection_greedy_sample")
def _rejection_greedy_sample_fake(
    output_token_ids, cu_num_draft_tokens, draft_token_ids, target_argmax, bonus_token_ids, is_greedy=None
):
    _checks.check_rejection_greedy_sample(
        output_token_ids, cu_num_draft_tokens, draft_token_ids, target_argmax, bonus_token_ids, is_greedy
    )


@_register("rejection_random_sample")
def _rejection_random_sample_fake(
    output_token_ids,
    cu_num_draft_tokens,
    draft_token_ids,
    draft_probs,
    target_probs,
    bonus_token_ids,
    recovered_token_ids,
    uniform_probs,
    is_greedy=None,
):
    _checks.check_rejection_random_sample(
        output_token_ids,
        cu_num_draft_tokens,
        draft_token_ids,
        draft_probs,
        target_probs,
        bonus_token_ids,
        recovered_token_ids,
        uniform_probs,
        is_greedy,
    )


@_register("sample_recovered_tokens")
def _sample_recovered_tokens_fake(cu_num_draft_tokens, draft_token_ids, draft_probs, target_probs, exponentials):
    sizes = _checks.check_sample_recovered_tokens(
        cu_num_draft_tokens, draft_token_ids, draft_probs, target_probs, exponentials
    )
    return target_probs.new_empty((sizes.num_tokens,), dtype=torch.int32)


@_register("verify")
def _verify_fake(
    target_logits,
    bonus_logits,
    draft_token_ids,
    draft_probs,
    cu_num_draft_tokens,
    temperature,
    top_k,
    top_p,
    seeds,
    positions,
    max_spec_len,
    return_logprobs=False,
):
    sizes = _checks.check_verify(
        target_logits, bonus_logits, draft_token_ids, draft_probs, cu_num_draft_tokens, temperature, top_k, top_p,
        seeds, positions, max_spec_len,
    )
    out = cu_num_draft_tokens.new_empty((sizes.batch, sizes.width))
    num_accepted = cu_num_draft_tokens.new_empty((sizes.batch,))
    logprobs = target_logits.new_empty((sizes.batch, sizes.width) if return_logprobs else (0, 0),
                                       dtype=torch.float32)
    return out, num_accepted, logprobs


# Paged attention: torch.ops.specops only (no Triton kernels yet, so no specops_triton schema).


@_register("reshape_and_cache")
def _reshape_and_cache_fake(key, value, key_cache, value_cache, slot_mapping):
    _checks.check_reshape_and_cache(key, value, key_cache, value_cache, slot_mapping)


@_register("paged_attention")
def _paged_attention_fake(
    query, key_cache, value_cache, block_table, seq_lens, cu_query_lens, scale, sliding_window=0, soft_cap=0.0,
    return_lse=False, max_query_len=0,
):
    sizes = _checks.check_paged_attention(
        query, key_cache, value_cache, block_table, seq_lens, cu_query_lens, sliding_window, soft_cap, max_query_len
    )
    out = torch.empty_like(query)
    lse = query.new_empty((sizes.num_query_tokens, sizes.num_heads) if return_lse else (0, 0), dtype=torch.float32)
    return out, lse


# The value checks' statistics: torch.ops.specops only (reference/checks.py; no Triton kernels).


@torch.library.register_fake("specops::sampling_value_stats")
def _sampling_value_stats_fake(cu_num_draft_tokens, token_ids, target_logits, bonus_logits, temperature, top_p):
    _value_checks.check_sampling_value_stats(cu_num_draft_tokens, token_ids, target_logits, bonus_logits,
                                             temperature, top_p)
    return cu_num_draft_tokens.new_empty((len(STATS),), dtype=torch.float64)


@torch.library.register_fake("specops::paged_attention_value_stats")
def _paged_attention_value_stats_fake(block_table, seq_lens, cu_query_lens, block_size, num_blocks):
    _value_checks.check_paged_attention_value_stats(block_table, seq_lens, cu_query_lens, block_size)
    return block_table.new_empty((len(ATTENTION_STATS),), dtype=torch.float64)
