"""Bad input raises a Python exception that names the argument, on every backend,
whether called through specops.<op> or straight through torch.ops."""

from __future__ import annotations

import pytest
import torch

import specops
from conftest import backend_params
from sampling_inputs import make_batch

BACKENDS = backend_params()


def _random_call(batch, backend, **override):
    args = dict(
        output_token_ids=batch.poisoned_output(),
        cu_num_draft_tokens=batch.cu_num_draft_tokens,
        draft_token_ids=batch.draft_token_ids,
        draft_probs=batch.draft_probs,
        target_probs=batch.target_probs,
        bonus_token_ids=batch.bonus_token_ids,
        recovered_token_ids=batch.target_argmax,
        uniform_probs=batch.uniform_probs,
        is_greedy=None,
    )
    args.update(override)
    specops.rejection_random_sample(*args.values(), backend=backend)


def _recovered_call(batch, backend, **override):
    args = dict(
        cu_num_draft_tokens=batch.cu_num_draft_tokens,
        draft_token_ids=batch.draft_token_ids,
        draft_probs=batch.draft_probs,
        target_probs=batch.target_probs,
        exponentials=batch.exponentials,
    )
    args.update(override)
    return specops.sample_recovered_tokens(*args.values(), backend=backend)


def _greedy_call(batch, backend, **override):
    args = dict(
        output_token_ids=batch.poisoned_output(),
        cu_num_draft_tokens=batch.cu_num_draft_tokens,
        draft_token_ids=batch.draft_token_ids,
        target_argmax=batch.target_argmax,
        bonus_token_ids=batch.bonus_token_ids,
        is_greedy=None,
    )
    args.update(override)
    specops.rejection_greedy_sample(*args.values(), backend=backend)


def _bad_arguments(batch):
    """(call, override, exception type, words the message must contain)."""
    t, v = batch.num_tokens, batch.vocab
    dev = batch.target_probs.device
    return [
        (_random_call, dict(target_probs=batch.target_probs.double()), TypeError, "target_probs"),
        (_random_call, dict(draft_probs=batch.draft_probs.half()), TypeError, "draft_probs"),
        (_random_call, dict(uniform_probs=batch.uniform_probs.double()), TypeError, "uniform_probs"),
        (_random_call, dict(output_token_ids=batch.poisoned_output().long()), TypeError, "output_token_ids"),
        (_random_call, dict(draft_token_ids=batch.draft_token_ids.float()), TypeError, "draft_token_ids"),
        (_random_call, dict(cu_num_draft_tokens=batch.cu_num_draft_tokens.long()), TypeError, "cu_num_draft_tokens"),
        (_random_call, dict(target_probs=batch.target_probs[:, :-1]), ValueError, "target_probs"),
        (_random_call, dict(draft_probs=batch.draft_probs[:-1]), ValueError, "draft_probs"),
        (_random_call, dict(target_probs=batch.target_probs.reshape(-1)), ValueError, "target_probs"),
        (_random_call, dict(target_probs=batch.target_probs.t().contiguous().t()), ValueError, "contiguous"),
        (_random_call, dict(bonus_token_ids=batch.bonus_token_ids[:, None]), ValueError, "bonus_token_ids"),
        (_random_call, dict(is_greedy=torch.ones(batch.batch, dtype=torch.int32, device=dev)), TypeError, "is_greedy"),
        (_random_call, dict(output_token_ids=batch.poisoned_output()[:, :1]), ValueError, "max_spec_len"),
        (_random_call, dict(cu_num_draft_tokens=batch.cu_num_draft_tokens - 1), ValueError, "cu_num_draft_tokens"),
        (_random_call, dict(draft_token_ids=batch.draft_token_ids + v), ValueError, "draft_token_ids"),
        (_random_call, dict(target_probs=batch.target_probs.to("meta")), ValueError, "device"),
        (_recovered_call, dict(exponentials=batch.exponentials[:, 1:]), ValueError, "exponentials"),
        (_recovered_call, dict(exponentials=batch.exponentials.half()), TypeError, "exponentials"),
        (_recovered_call, dict(draft_token_ids=batch.draft_token_ids - v), ValueError, "draft_token_ids"),
        (_recovered_call, dict(cu_num_draft_tokens=batch.cu_num_draft_tokens.flip(0).contiguous()), ValueError,
         "cu_num_draft_tokens"),
        (_greedy_call, dict(target_argmax=batch.target_argmax[: t - 1]), ValueError, "target_argmax"),
        (_greedy_call, dict(output_token_ids=batch.poisoned_output()[:-1]), ValueError, "output_token_ids"),
        (_greedy_call, dict(output_token_ids=batch.poisoned_output()[:, :2]), ValueError, "max_spec_len"),
    ]


@pytest.mark.parametrize("device,backend", BACKENDS)
def test_bad_arguments_raise_named_errors(device, backend):
    batch = make_batch([3, 1, 4], 20, seed=2, device=device)
    for call, override, error, words in _bad_arguments(batch):
        with pytest.raises(error, match=words):
            call(batch, backend, **override)


@pytest.mark.parametrize("namespace", ["specops", "specops_triton"])
def test_torch_ops_reject_bad_shapes_without_the_python_layer(namespace):
    """Shape and dtype checks live in the launchers, not only in specops.ops."""
    if namespace == "specops_triton" and not hasattr(torch.ops.specops_triton, "sample_recovered_tokens"):
        pytest.skip("no Triton ops registered")
    op = getattr(torch.ops, namespace).sample_recovered_tokens
    batch = make_batch([2, 2], 12, seed=4)
    with pytest.raises((TypeError, RuntimeError), match="target_probs must be Float|target_probs must be torch.float32"):
        op(batch.cu_num_draft_tokens, batch.draft_token_ids, None, batch.target_probs.double(), batch.exponentials)
    with pytest.raises((ValueError, RuntimeError), match="exponentials must have shape"):
        op(batch.cu_num_draft_tokens, batch.draft_token_ids, None, batch.target_probs, batch.exponentials[:1])


def test_backend_choice_is_checked():
    batch = make_batch([1], 5, seed=0)
    with pytest.raises(ValueError, match="backend 'cuda' cannot run on cpu"):
        _recovered_call(batch, "cuda")
    with pytest.raises(ValueError):
        _recovered_call(batch, "no-such-backend")


@pytest.mark.parametrize("device,backend", BACKENDS)
def test_unvalidated_bad_values_stay_in_bounds(device, backend):
    """With validate=False, ids outside the vocab and a cu_num_draft_tokens past
    num_tokens must not read or write out of bounds (the CUDA version of this test runs
    under compute-sanitizer); the rows are then documented garbage, not a crash."""
    batch = make_batch([3, 2], 16, seed=9, device=device)
    huge = torch.tensor([100, 10**6], dtype=torch.int32, device=device)
    bad_ids = batch.draft_token_ids + 10**6
    out = batch.poisoned_output(max_spec_len=2)
    specops.rejection_random_sample(
        out, huge, bad_ids, batch.draft_probs, batch.target_probs, batch.bonus_token_ids,
        batch.target_argmax, batch.uniform_probs, backend=backend, validate=False,
    )
    specops.sample_recovered_tokens(huge, bad_ids, batch.draft_probs, batch.target_probs, batch.exponentials,
                                    backend=backend, validate=False)
    specops.rejection_greedy_sample(out, huge, bad_ids, batch.target_argmax, batch.bonus_token_ids,
                                    backend=backend, validate=False)
    specops.expand_to_tokens(batch.uniform_probs[:2].contiguous(), huge, 5, backend=backend, validate=False)
    if device == "cuda":
        torch.cuda.synchronize()
