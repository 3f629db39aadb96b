"""The ops as PyTorch sees them: opcheck (schema, fake kernel, autograd registration),
torch.compile(fullgraph=True), and CUDA-graph capture and replay."""

from __future__ import annotations

import pytest
import torch

import specops
from conftest import backend_params, capture, requires_gpu
from sampling_inputs import make_batch
from specops.backend import Backend

BACKENDS = backend_params()


def _namespace(backend: Backend):
    return torch.ops.specops_triton if backend is Backend.TRITON else torch.ops.specops


def _op_calls(batch):
    """(op name, args) for every op, on one batch."""
    recovered = batch.target_argmax.to(torch.int32)
    return [
        ("expand_to_tokens", (batch.uniform_probs[: batch.batch].contiguous(), batch.cu_num_draft_tokens,
                              batch.num_tokens, 0.0, 1.0)),
        ("rejection_greedy_sample", (batch.poisoned_output(), batch.cu_num_draft_tokens, batch.draft_token_ids,
                                     batch.target_argmax, batch.bonus_token_ids, batch.is_greedy)),
        ("rejection_random_sample", (batch.poisoned_output(), batch.cu_num_draft_tokens, batch.draft_token_ids,
                                     batch.draft_probs, batch.target_probs, batch.bonus_token_ids, recovered,
                                     batch.uniform_probs, batch.is_greedy)),
        ("sample_recovered_tokens", (batch.cu_num_draft_tokens, batch.draft_token_ids, batch.draft_probs,
                                     batch.target_probs, batch.exponentials)),
    ]


@pytest.mark.parametrize("device,backend", BACKENDS)
@pytest.mark.parametrize("with_draft_probs", [True, False], ids=["draft", "ngram"])
def test_opcheck(device, backend, with_draft_probs):
    batch = make_batch([2, 0, 3], 40, seed=1, device=device, with_draft_probs=with_draft_probs,
                       greedy_fraction=0.5)
    for name, args in _op_calls(batch):
        torch.library.opcheck(getattr(_namespace(backend), name).default, args)


def _pipeline(backend):
    """One verification step from probs, through the public API."""

    def step(cu, draft_ids, draft_probs, target_probs, bonus, uniform, exponentials, is_greedy, target_argmax):
        recovered = specops.sample_recovered_tokens(cu, draft_ids, draft_probs, target_probs, exponentials,
                                                    backend=backend)
        out = torch.empty(cu.shape[0], 5, dtype=torch.int32, device=cu.device)
        specops.rejection_greedy_sample(out, cu, draft_ids, target_argmax, bonus, is_greedy, backend=backend)
        specops.rejection_random_sample(out, cu, draft_ids, draft_probs, target_probs, bonus, recovered,
                                        uniform, is_greedy, backend=backend)
        temps = specops.expand_to_tokens(uniform[: cu.shape[0]], cu, draft_ids.shape[0], 0.0, 1.0,
                                         backend=backend)
        return out, recovered, temps

    return step


def _step_args(batch):
    return (batch.cu_num_draft_tokens, batch.draft_token_ids, batch.draft_probs, batch.target_probs,
            batch.bonus_token_ids, batch.uniform_probs, batch.exponentials, batch.is_greedy,
            batch.target_argmax)


@pytest.mark.parametrize("device,backend", BACKENDS)
def test_compile_fullgraph_matches_eager(device, backend):
    torch._dynamo.reset()
    batch = make_batch([4, 1, 3], 64, seed=7, device=device, greedy_fraction=0.5)
    step = _pipeline(backend)
    expected = step(*_step_args(batch))
    compiled = torch.compile(step, fullgraph=True, backend="aot_eager" if device == "cpu" else "inductor")
    got = compiled(*_step_args(batch))
    for g, e in zip(got, expected):
        torch.testing.assert_close(g, e, rtol=0, atol=0)


@requires_gpu
@pytest.mark.gpu
@pytest.mark.parametrize("backend", [b for d, b in ((p.values[0], p.values[1]) for p in BACKENDS) if d == "cuda"])
def test_cuda_graph_replay_matches_eager(backend):
    """Capture the step with its draws drawn inside the graph; replays draw fresh numbers
    and each replay's result equals an eager run on that replay's draws."""
    batch = make_batch([4, 0, 2, 4], 32000, seed=3, device="cuda", greedy_fraction=0.5)
    args = list(_step_args(batch))
    step = _pipeline(backend)
    uniform, exponentials = args[5], args[6]

    def drawn_step():
        uniform.uniform_()
        exponentials.exponential_()
        return step(*args)

    graph, static_out = capture(drawn_step, warmups=2)
    seen = set()
    for _ in range(3):
        graph.replay()
        torch.cuda.synchronize()
        expected = step(*args)  # eager, on the draws this replay made
        for g, e in zip(static_out, expected):
            torch.testing.assert_close(g, e, rtol=0, atol=0)
        seen.add(tuple(uniform.tolist()))
    assert len(seen) == 3, "replays must draw fresh random numbers"
