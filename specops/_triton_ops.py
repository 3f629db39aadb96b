"""Registers the Triton kernels as torch.ops.specops_triton.<op> (schemas in
csrc/torch_bindings.cpp). These registrations are the Triton launchers' front door:
they validate the arguments once, then hand them to triton_kernels/ unchanged."""

from __future__ import annotations

import os

import torch

from specops import _checks


def _require_runnable(tensor: torch.Tensor) -> None:
    """Raises unless Triton runs on ``tensor``'s device (``is_cpu``: no device object or
    type string built on the calls' path)."""
    if tensor.is_cpu and os.environ.get("TRITON_INTERPRET") != "1":
        raise RuntimeError(
            "specops_triton ops run on CPU tensors only under the Triton interpreter: "
            "set TRITON_INTERPRET=1 before importing specops"
        )


def _check_verify(*args) -> None:
    """verify's checks (skipped by a replayed plan: its key is a call's that passed them)."""
    _checks.check_verify(*args[:11])
    _require_runnable(args[0])


def _check_paged_attention(query, key_cache, value_cache, block_table, seq_lens, cu_query_lens, scale,
                           sliding_window, soft_cap, return_lse, max_query_len) -> None:
    """paged_attention's checks (skipped by a replayed plan: its key is a call's that passed them)."""
    _checks.check_paged_attention(query, key_cache, value_cache, block_table, seq_lens, cu_query_lens,
                                  sliding_window, soft_cap, max_query_len)
    _require_runnable(query)


# The registered functions of the functional ops (no argument written), by op name:
# specops.ops calls them without the dispatcher where nothing stands between an eager call
# and its kernel (specops.ops._unintercepted).
DIRECT: dict = {}


def register() -> None:
    from specops.triton_kernels import sampling as kernels
    from specops.triton_kernels import attention as attention_kernels
    from specops.triton_kernels import verify as verify_kernels

    def impl(name):
        def decorate(fn):
            for device in ("CUDA", "CPU"):
                torch.library.impl(f"specops_triton::{name}", device)(fn)
            return fn

        return decorate

    def direct(fn):
        DIRECT[fn.__name__.lstrip("_")] = fn
        return fn

    @impl("expand_to_tokens")
    def _expand_to_tokens(values, cu_num_draft_tokens, num_tokens, replace_from=None, replace_to=0.0):
        _checks.check_expand_to_tokens(values, cu_num_draft_tokens, num_tokens, replace_from)
        _require_runnable(values)
        return kernels.expand_to_tokens(values, cu_num_draft_tokens, num_tokens, replace_from, replace_to)

    @impl("rejection_greedy_sample")
    def _rejection_greedy_sample(
        output_token_ids, cu_num_draft_tokens, draft_token_ids, target_argmax, bonus_token_ids, is_greedy=None
    ):
        args = (output_token_ids, cu_num_draft_tokens, draft_token_ids, target_argmax, bonus_token_ids, is_greedy)
        _checks.check_rejection_greedy_sample(*args)
        _require_runnable(output_token_ids)
        kernels.rejection_greedy_sample(*args)

    @impl("rejection_random_sample")
    def _rejection_random_sample(
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
        args = (
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
        _checks.check_rejection_random_sample(*args)
        _require_runnable(output_token_ids)
        kernels.rejection_random_sample(*args)

    @impl("sample_recovered_tokens")
    def _sample_recovered_tokens(cu_num_draft_tokens, draft_token_ids, draft_probs, target_probs, exponentials):
        args = (cu_num_draft_tokens, draft_token_ids, draft_probs, target_probs, exponentials)
        _checks.check_sample_recovered_tokens(*args)
        _require_runnable(target_probs)
        return kernels.sample_recovered_tokens(*args)

    @direct
    @impl("verify")
    def _verify(
        target_logits, bonus_logits, draft_token_ids, draft_probs, cu_num_draft_tokens, temperature, top_k, top_p,
        seeds, positions, max_spec_len, return_logprobs=False,
    ):
        return verify_kernels.verify(
            target_logits, bonus_logits, draft_token_ids, draft_probs, cu_num_draft_tokens, temperature, top_k, top_p,
            seeds, positions, max_spec_len, return_logprobs, check=_check_verify)

    @impl("reshape_and_cache")
    def _reshape_and_cache(key, value, key_cache, value_cache, slot_mapping):
        args = (key, value, key_cache, value_cache, slot_mapping)
        _checks.check_reshape_and_cache(*args)
        _require_runnable(key)
        attention_kernels.reshape_and_cache(*args)

    @direct
    @impl("paged_attention")
    def _paged_attention(query, key_cache, value_cache, block_table, seq_lens, cu_query_lens, scale,
                         sliding_window=0, soft_cap=0.0, return_lse=False, max_query_len=0):
        return attention_kernels.paged_attention(query, key_cache, value_cache, block_table, seq_lens, cu_query_lens,
                                                 scale, sliding_window, soft_cap, return_lse, max_query_len,
                                                 check=_check_paged_attention)
