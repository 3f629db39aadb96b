"""The typed public API: one function per op, the backend picked from the tensors' device.

Every function has the argument order of its reference (specops.reference) and of its
torch ops (torch.ops.specops.<op>, torch.ops.specops_triton.<op>). ``backend=None``
picks the fastest implementation that exists for the device (CUDA kernels, then Triton,
on a GPU; C++ kernels on the CPU). ``validate=True`` also checks values (ids inside the
vocab, consistent ``cu_num_draft_tokens``): one device sync on a GPU, skipped while a
CUDA graph is being captured or torch.compile is tracing. Without it the kernels stay
memory-safe but may return garbage for bad values.
"""

from __future__ import annotations

import functools

import torch

from specops import _checks, _triton_ops, _value_checks
from specops.backend import Backend, resolve
from specops.reference import attention as reference_attention
from specops.reference import sampling as reference
from specops.reference import verify as reference_verify


def _should_validate(validate: bool, device: torch.device) -> bool:
    if not validate or torch.compiler.is_compiling():
        return False
    return not (device.type == "cuda" and torch.cuda.is_current_stream_capturing())


# Ops whose CUDA kernel is not written yet: on CUDA tensors they default to Triton.
NO_CUDA_KERNEL = (Backend.CUDA,)
# The largest vocabulary csrc/verify_cuda.cu takes (16 CTAs x a 96 KB shared-memory slice).
CUDA_VERIFY_MAX_VOCAB = 16 * 96 * 1024 // 4
# Logits (target and bonus rows x vocab) from which an eager verify call runs the Triton
# kernel by default: its GPU time, below the CUDA kernel's, then outweighs its host time
# (~40-70 µs a call replayed from a plan by specops._C.LaunchPlan, triton_kernels/launch_plan.py,
# and called without the dispatcher: the first two calls of each set of shapes take longer,
# and the host's speed varies between rounds). bench/eager_crossover.py (H200, 2026-12-03,
# 633c66d; k=4, V=128256, random; Mi = 2^20 logits; the backends in turn over 5 rounds in one
# process), CUDA µs / Triton medians: tokens only 63 / 68 at 0.6 Mi, 62 / 60 at 1.2 Mi, 62 /
# 59 at 2.4 Mi, 64 / 57 at 9.8 Mi, 67 / 46 at 20 Mi, 123 / 67 at 39 Mi; with
# log-probabilities 48 / 52 at 2.4 Mi, 39 / 44 at 4.9 Mi, 65 / 46 at 9.8 Mi, 123 / 69 at 20
# Mi; with top-k 50 and top-p 0.9 124 / 129 at 0.6 Mi, 134 / 148 at 1.2 Mi (Triton ahead in 2
# of 5 rounds), 189 / 144 at 2.4 Mi, 211 / 138 at 4.9 Mi. The CUDA kernel's time is its GPU
# time; each threshold sits between a size where the CUDA call wins or ties and one where the
# Triton call wins in 4 or 5 of the 5 rounds. All-greedy calls (temperature=None) without
# log-probabilities, where the Triton kernel runs its max pass alone, have no threshold:
# Triton won at every size measured (the same script, H200, 2026-12-03, 8709ba5; CUDA / Triton
# µs, Triton ahead in 4 or 5 of 5 rounds at each): 41 / 32 at V=32000 B=1
# (0.15 Mi), 42 / 39 at B=4 (0.6 Mi), 41 / 30 at V=128256 B=1, 41 / 31 at B=16, 58 / 45 at B=64.
TRITON_EAGER_MIN_LOGITS = 1 << 20
TRITON_EAGER_MIN_LOGITS_LOGPROBS = 8 << 20
TRITON_EAGER_MIN_LOGITS_FILTERED = 2 << 20


def triton_faster_eagerly(num_logits: int, filtered: bool, return_logprobs: bool = False,
                          all_greedy: bool = False) -> bool:
    """Whether an eager verify call over ``num_logits`` logits (with top-k or top-p when
    ``filtered``, log-probabilities when ``return_logprobs``, every request greedy by
    temperature=None when ``all_greedy``, which ignores top-k and top-p) runs faster on the
    Triton kernel than on the CUDA kernel."""
    if all_greedy and not return_logprobs:
        return True
    if filtered and not all_greedy:
        return num_logits >= TRITON_EAGER_MIN_LOGITS_FILTERED
    return num_logits >= (TRITON_EAGER_MIN_LOGITS_LOGPROBS if return_logprobs else TRITON_EAGER_MIN_LOGITS)


@torch.compiler.assume_constant_result
def _cuda_major(index: int | None) -> int:
    return _capability_major(index if index is not None else torch.cuda.current_device())


@functools.cache  # a device's capability never changes; every CUDA verify call asks
def _capability_major(index: int) -> int:
    return torch.cuda.get_device_capability(index)[0]


def _op(name: str, backend: Backend, tensors: tuple = ()):
    """The callable running op ``name`` on ``backend``: the registered op (its one overload),
    the reference function, or for a functional Triton op whose ``tensors`` (every tensor
    argument; empty where a host argument is not of its schema's Python type, which the
    dispatcher would convert) nothing intercepts (``_unintercepted``) the function the op is
    registered with, called without the dispatcher: the same function less its round trip
    into Python (~6 µs a call on the H200 host, bench/host_attention.py)."""
    if backend is Backend.REFERENCE:
        module = next(m for m in (reference, reference_verify, reference_attention) if hasattr(m, name))
        return getattr(module, name)
    if backend is Backend.TRITON:
        direct = _triton_ops.DIRECT.get(name) if tensors else None
        if direct is not None and _unintercepted(tensors):
            return direct
        return getattr(torch.ops.specops_triton, name).default
    return getattr(torch.ops.specops, name).default


def _unintercepted(tensors: tuple) -> bool:
    """Whether the dispatcher would do nothing for a call of these tensors but run its
    kernel: no tracing (torch.compile, or torch.jit.trace, which records only what reaches the
    dispatcher and hands Python traced sizes), dispatch or function mode, profiler or functorch
    transform, and plain tensors (not subclasses) none of which needs a gradient (through the
    dispatcher they would get a grad_fn that warns or raises on backward). ~1 µs: every eager
    Triton call asks."""
    if (torch.compiler.is_compiling() or _dispatch_modes() or _function_modes() or _profiling()
            or _functorch_level() is not None or _jit_tracing() is not None):
        return False
    grad = torch.is_grad_enabled()
    for t in tensors:
        if t is not None and (type(t) is not _TENSOR or (grad and t.requires_grad)):
            return False
    return True


_TENSOR = torch.Tensor
_dispatch_modes = torch._C._len_torch_dispatch_stack
_function_modes = torch._C._is_torch_function_mode_enabled
_profiling = torch._C._autograd._profiler_enabled
_functorch_level = torch._C._functorch.peek_interpreter_stack
_jit_tracing = torch._C._get_tracing_state


def expand_to_tokens(
    values: torch.Tensor,
    cu_num_draft_tokens: torch.Tensor,
    num_tokens: int,
    replace_from: float | None = None,
    replace_to: float = 0.0,
    *,
    backend: Backend | str | None = None,
    validate: bool = True,
) -> torch.Tensor:
    """Repeat each request's value once per draft token of that request.

    Parameters
    ----------
    values : per-request values (temperature, top-k, seed). Shape: ``[B]``, float32 | int32 | int64.
    cu_num_draft_tokens : inclusive cumulative draft counts. Shape: ``[B]``, int32.
    num_tokens : total draft tokens, ``cu_num_draft_tokens[-1]``.
    replace_from, replace_to : float32 values equal to ``replace_from`` become ``replace_to``.

    Returns
    -------
    Tensor of shape ``[num_tokens]``, dtype of ``values``.

    Example
    -------
    >>> cu = torch.tensor([2, 2, 5], dtype=torch.int32)
    >>> specops.expand_to_tokens(torch.tensor([0.0, 0.7, 1.0]), cu, 5, replace_from=0.0, replace_to=1.0)
    tensor([1.0000, 1.0000, 1.0000, 1.0000, 1.0000])
    """
    chosen = resolve(backend, values.device)
    if _should_validate(validate, values.device):
        _value_checks.validate_sampling_values(cu_num_draft_tokens, num_tokens, None)
    return _op("expand_to_tokens", chosen)(values, cu_num_draft_tokens, num_tokens, replace_from, replace_to)


def rejection_greedy_sample(
    output_token_ids: torch.Tensor,
    cu_num_draft_tokens: torch.Tensor,
    draft_token_ids: torch.Tensor,
    target_argmax: torch.Tensor,
    bonus_token_ids: torch.Tensor,
    is_greedy: torch.Tensor | None = None,
    *,
    backend: Backend | str | None = None,
    validate: bool = True,
) -> None:
    """Greedy verification: accept drafts while they equal the target's argmax.

    Writes, for every request it owns (``is_greedy[b]``, or all when ``is_greedy`` is
    None), the accepted drafts, then the argmax at the first mismatch or the bonus token
    when all matched, then ``-1`` padding.

    Parameters
    ----------
    output_token_ids : written in place. Shape: ``[B, max_spec_len + 1]``, int32.
    cu_num_draft_tokens : Shape: ``[B]``, int32.
    draft_token_ids : Shape: ``[num_tokens]``, int32 | int64.
    target_argmax : argmax of the target at each draft position. Shape: ``[num_tokens]``, int32 | int64.
    bonus_token_ids : Shape: ``[B]``, int32 | int64.
    is_greedy : which requests this op owns. Shape: ``[B]``, bool, or None.

    Example
    -------
    >>> out = torch.empty(2, 3, dtype=torch.int32)
    >>> cu = torch.tensor([2, 3], dtype=torch.int32)
    >>> specops.rejection_greedy_sample(out, cu, torch.tensor([5, 6, 7]), torch.tensor([5, 9, 7]),
    ...                                 torch.tensor([1, 2]))
    >>> out
    tensor([[ 5,  9, -1],
            [ 7,  2, -1]], dtype=torch.int32)
    """
    device = output_token_ids.device
    chosen = resolve(backend, device)
    if _should_validate(validate, device):
        _value_checks.validate_sampling_values(
            cu_num_draft_tokens, draft_token_ids.shape[0], output_token_ids.shape[-1] - 1
        )
    _op("rejection_greedy_sample", chosen)(
        output_token_ids, cu_num_draft_tokens, draft_token_ids, target_argmax, bonus_token_ids, is_greedy
    )


def rejection_random_sample(
    output_token_ids: torch.Tensor,
    cu_num_draft_tokens: torch.Tensor,
    draft_token_ids: torch.Tensor,
    draft_probs: torch.Tensor | None,
    target_probs: torch.Tensor,
    bonus_token_ids: torch.Tensor,
    recovered_token_ids: torch.Tensor,
    uniform_probs: torch.Tensor,
    is_greedy: torch.Tensor | None = None,
    *,
    backend: Backend | str | None = None,
    validate: bool = True,
) -> None:
    """Lossless random verification: accept ``x_i`` when ``u_i * q_i(x_i) < p_i(x_i)``.

    At the first rejection the recovered token of that position is emitted and the row
    ends; when every draft is accepted the bonus token follows. A draft probability of 0
    rejects. Rows owned by greedy requests (``is_greedy[b]``) are left untouched.

    Parameters
    ----------
    output_token_ids : written in place. Shape: ``[B, max_spec_len + 1]``, int32.
    cu_num_draft_tokens : Shape: ``[B]``, int32.
    draft_token_ids : Shape: ``[num_tokens]``, int32 | int64.
    draft_probs : the proposer's probabilities, None for n-gram drafts. Shape: ``[num_tokens, V]``, float32.
    target_probs : Shape: ``[num_tokens, V]``, float32.
    bonus_token_ids : Shape: ``[B]``, int32 | int64.
    recovered_token_ids : from :func:`sample_recovered_tokens`. Shape: ``[num_tokens]``, int32 | int64.
    uniform_probs : U[0, 1) draws. Shape: ``[num_tokens]``, float32.
    is_greedy : requests this op skips. Shape: ``[B]``, bool, or None.
    """
    device = output_token_ids.device
    chosen = resolve(backend, device)
    if _should_validate(validate, device):
        _value_checks.validate_sampling_values(
            cu_num_draft_tokens, draft_token_ids.shape[0], output_token_ids.shape[-1] - 1, draft_token_ids,
            target_probs.shape[-1],
        )
    _op("rejection_random_sample", chosen)(
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


def sample_recovered_tokens(
    cu_num_draft_tokens: torch.Tensor,
    draft_token_ids: torch.Tensor,
    draft_probs: torch.Tensor | None,
    target_probs: torch.Tensor,
    exponentials: torch.Tensor,
    *,
    backend: Backend | str | None = None,
    validate: bool = True,
) -> torch.Tensor:
    """Sample, at every draft position, from the residual ``norm(max(p - q, 0))`` by the
    exponential race ``argmax_v r_v / E_v`` (ties to the lowest index).

    Parameters
    ----------
    cu_num_draft_tokens : Shape: ``[B]``, int32.
    draft_token_ids : Shape: ``[num_tokens]``, int32 | int64.
    draft_probs : None for n-gram drafts (q one-hot on the draft). Shape: ``[num_tokens, V]``, float32.
    target_probs : Shape: ``[num_tokens, V]``, float32.
    exponentials : Exp(1) draws, one row per request. Shape: ``[B, V]``, float32.

    Returns
    -------
    Recovered token ids. Shape: ``[num_tokens]``, int32.
    """
    device = target_probs.device
    chosen = resolve(backend, device)
    if _should_validate(validate, device):
        _value_checks.validate_sampling_values(
            cu_num_draft_tokens, draft_token_ids.shape[0], None, draft_token_ids, target_probs.shape[-1]
        )
    return _op("sample_recovered_tokens", chosen)(
        cu_num_draft_tokens, draft_token_ids, draft_probs, target_probs, exponentials
    )


def verify(
    target_logits: torch.Tensor,
    bonus_logits: torch.Tensor,
    draft_token_ids: torch.Tensor,
    draft_probs: torch.Tensor | None,
    cu_num_draft_tokens: torch.Tensor,
    temperature: torch.Tensor | None,
    top_k: torch.Tensor | None,
    top_p: torch.Tensor | None,
    seeds: torch.Tensor,
    positions: torch.Tensor,
    max_spec_len: int,
    return_logprobs: bool = False,
    *,
    backend: Backend | str | None = None,
    validate: bool = True,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The fused verification step: from target logits to emitted tokens.

    Greedy (temperature 0) and random requests, with or without draft probs, in one
    call; temperature, top-k and top-p applied to the target exactly; random draws from
    Philox keyed by (seed, absolute position, purpose), so a seeded request returns the
    same tokens in any batch and on any backend. specops.reference.verify states the
    contract step by step.

    Parameters
    ----------
    target_logits : Shape: ``[num_tokens, V]``, float32 | bfloat16 | float16.
    bonus_logits : Shape: ``[B, V]``, dtype of target_logits.
    draft_token_ids : Shape: ``[num_tokens]``, int32 | int64.
    draft_probs : None for n-gram drafts. Shape: ``[num_tokens, V]``, float32.
    cu_num_draft_tokens : Shape: ``[B]``, int32.
    temperature : 0 = greedy. Shape: ``[B]``, float32. None: every request is greedy, a
        promise the caller makes from its host-side sampling parameters (the Triton
        kernel then runs only the max pass and the screen: no normaliser, decision or sampling
        launches; every backend returns what zeros would give).
    top_k : <= 0 or >= V: off. Shape: ``[B]``, int32, or None.
    top_p : >= 1: off. Shape: ``[B]``, float32, or None.
    seeds : Shape: ``[B]``, int64.
    positions : absolute position of each request's first draft token. Shape: ``[B]``, int64.
    max_spec_len : output width - 1.
    return_logprobs : also return log p(token) under the processed distribution.

    Returns
    -------
    ``(output_token_ids [B, max_spec_len + 1] int32 padded with -1, num_accepted [B]
    int32, logprobs [B, max_spec_len + 1] float32, or [0, 0] when not asked)``.

    Backends: the CUDA kernel (sm_90 or newer: it splits each row over a thread-block
    cluster; vocabularies up to 393216), the Triton kernel, the C++ CPU kernel and the
    reference. On CUDA tensors the default is the CUDA kernel (the faster one called
    eagerly on small calls: the Triton launch costs more host time), and the Triton kernel
    while a CUDA graph is being captured (replayed, it is faster: bench/NOTES.md), for
    calls of many logits (``triton_faster_eagerly``: from 1 Mi logits, 8 Mi with
    log-probabilities, 2 Mi with top-k or top-p; every all-greedy call without
    log-probabilities), for a larger vocabulary and on an older GPU.
    """
    device = target_logits.device
    # The default skips the CUDA kernel where it cannot run (vocabulary, GPU) and where
    # Triton is faster (a graph being captured, many logits); an explicit backend="cuda" is
    # not steered.
    num_logits = (target_logits.shape[0] + bonus_logits.shape[0]) * target_logits.shape[-1]
    skip_cuda = target_logits.is_cuda and (
        target_logits.shape[-1] > CUDA_VERIFY_MAX_VOCAB or _cuda_major(device.index) < 9
        or _capturing_cuda_graph()
        or triton_faster_eagerly(num_logits, top_k is not None or top_p is not None, return_logprobs,
                                 temperature is None))
    chosen = resolve(backend, device, op="verify", missing=(Backend.CUDA,) if skip_cuda and backend is None else ())
    if _should_validate(validate, device):
        _value_checks.validate_sampling_values(  # one op, one device sync
            cu_num_draft_tokens, draft_token_ids.shape[0], max_spec_len, draft_token_ids, target_logits.shape[-1],
            target_logits, bonus_logits, temperature, top_p,
        )
    # (the direct call's tensors, for a Triton call whose host values are of their schema's types)
    direct = chosen is Backend.TRITON and type(max_spec_len) is int and type(return_logprobs) is bool
    tensors = (target_logits, bonus_logits, draft_token_ids, draft_probs, cu_num_draft_tokens, temperature, top_k,
               top_p, seeds, positions) if direct else ()
    return _op("verify", chosen, tensors)(
        target_logits, bonus_logits, draft_token_ids, draft_probs, cu_num_draft_tokens, temperature, top_k, top_p,
        seeds, positions, max_spec_len, return_logprobs,
    )


def _capturing_cuda_graph() -> bool:
    """Whether this stream is capturing a CUDA graph (never asked while torch.compile traces)."""
    return not torch.compiler.is_compiling() and torch.cuda.is_current_stream_capturing()


# What the CUDA paged_attention kernel covers (csrc/attention_cuda.cu raises on the rest);
# on CUDA tensors the default backend runs the Triton kernel for anything else.
CUDA_ATTENTION_DTYPES = (torch.float16, torch.bfloat16)
CUDA_ATTENTION_HEAD_DIMS = (64, 128, 256)
CUDA_ATTENTION_MAX_GROUP = 16


def cuda_paged_attention_covers(query: torch.Tensor, key_cache: torch.Tensor) -> bool:
    """Whether the CUDA paged_attention kernel takes this dtype, head dim and GQA group.
    Malformed shapes count as covered, so that the kernel's own checks name them."""
    if query.dim() != 3 or key_cache.dim() != 4 or key_cache.shape[2] == 0:
        return True
    _, num_heads, head_dim = query.shape
    return _cuda_covers(query.dtype, head_dim, num_heads, key_cache.shape[2])


def _cuda_covers(dtype: torch.dtype, head_dim: int, num_heads: int, num_kv_heads: int) -> bool:
    """The CUDA kernel's coverage of well-formed shapes (num_kv_heads > 0)."""
    return (dtype in CUDA_ATTENTION_DTYPES and head_dim in CUDA_ATTENTION_HEAD_DIMS
            and num_heads // num_kv_heads <= CUDA_ATTENTION_MAX_GROUP)


# Bytes of keys and values a paged_attention call can address (B x max_blocks x block_size
# x Hkv x D x 2 x the element size) up to which an eager call runs the CUDA kernel by
# default: there its lower host time outweighs its GPU time. Eager Triton calls replay
# launch plans (triton_kernels/attention.py) and skip the dispatcher (_op), so their host
# time is ~20 µs on the H200 host (bench/host_attention.py), the CUDA call's ~18.
# bench/eager_attention.py (H200, 2026-12-02 at 871b1c5, bench/results/attention_eager-h200-
# 20261202.json; bf16, GQA 32/8, block 16, the backends in turn in one process, eager µs
# CUDA / Triton): D=128 decode 49.3 / 53.3 (B=1 L=4096, 16 MiB), 51.2 / 53.9 (B=4 L=4096,
# 64 MiB), 79.5 / 72.6 (B=16 L=4096, 256 MiB), 78.6 / 70.0 (B=64 L=1024), 113.1 / 116.2
# (384 MiB), 143-146 / 130-132 (512 MiB); verify (q_len 5) 50.2 / 56.1 (B=1), 60.5 / 61.2
# (B=4), 90.3 / 79.1 (B=16 L=4096), 89.7 / 77.2 (B=64 L=1024), 129.5 / 111.2 (384 MiB);
# D=64 decode 44.6 / 47.4 (B=1 L=4096, 8 MiB), 52.8 / 38.8 (B=64 L=1024, 128 MiB), 84.5 /
# 71.5 (256 MiB), verify 47.6 / 51.0 (B=32 L=1024, 64 MiB); many query rows 127.7 / 234.6
# (B=1 q_len 512, 8 MiB), 239.1 / 233.7 (B=4 q_len 128, 64 MiB), 152.8 / 133.8 (B=16 q_len
# 64 L=1024, 64 MiB). Up to 64 MiB the CUDA call wins 7 of 9 shapes and their sum (823
# against 925 µs); from 128 MiB the Triton call wins every shape but one (B=96 decode, by
# 3%). Graph capture (and torch.compile) keep the Triton kernel.
CUDA_ATTENTION_EAGER_MAX_BYTES = 64 << 20


def cuda_attention_faster_eagerly(query: torch.Tensor, key_cache: torch.Tensor, block_table: torch.Tensor) -> bool:
    """Whether an eager paged_attention call of these shapes runs faster on the CUDA kernel
    than on the Triton kernel: a covered case (``cuda_paged_attention_covers``) whose block
    table addresses at most CUDA_ATTENTION_EAGER_MAX_BYTES of keys and values."""
    if query.dim() != 3 or key_cache.dim() != 4 or block_table.dim() != 2:
        return False  # malformed: the Triton path's checks name the argument
    # (each shape read once: every eager call asks)
    _, num_heads, head_dim = query.shape
    _, block_size, num_kv_heads, kv_head_dim = key_cache.shape
    reach = block_table.numel() * block_size * num_kv_heads * kv_head_dim * 2
    return (num_kv_heads > 0 and _cuda_covers(query.dtype, head_dim, num_heads, num_kv_heads)
            and reach * key_cache.element_size() <= CUDA_ATTENTION_EAGER_MAX_BYTES)


def _cuda_attention_by_default(query, key_cache, value_cache, block_table) -> bool:
    """The eager default's choice of the CUDA kernel (sm_90+, built, the kernel's 16-byte
    alignment, shapes where it is faster eagerly); never while a graph is captured or
    torch.compile traces (no data pointers there)."""
    if not query.is_cuda or torch.compiler.is_compiling() or _capturing_cuda_graph():
        return False
    return (_cuda_major(query.get_device()) >= 9
            and all(t.data_ptr() % 16 == 0 for t in (query, key_cache, value_cache))
            and cuda_attention_faster_eagerly(query, key_cache, block_table))


def reshape_and_cache(
    key: torch.Tensor,
    value: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    *,
    backend: Backend | str | None = None,
    validate: bool = True,
) -> None:
    """Write new keys and values into their slots of the paged KV cache.

    Token ``i`` goes to block ``slot_mapping[i] // block_size``, offset
    ``slot_mapping[i] % block_size``; slot ``-1`` is padding and is skipped.

    Parameters
    ----------
    key, value : Shape: ``[N, Hkv, D]``, dtype of the caches.
    key_cache, value_cache : written in place. Shape: ``[num_blocks, block_size, Hkv, D]``,
        float32 | bfloat16 | float16.
    slot_mapping : Shape: ``[N]``, int64.

    Example
    -------
    >>> cache = torch.zeros(2, 4, 1, 8)
    >>> specops.reshape_and_cache(torch.ones(2, 1, 8), torch.ones(2, 1, 8), cache, cache.clone(),
    ...                           torch.tensor([5, -1]))
    >>> cache[1, 1].sum().item()
    8.0

    Backends: the CUDA kernel (the default on CUDA tensors), the C++ CPU kernel, the
    Triton kernel and the reference.
    """
    device = key_cache.device
    chosen = resolve(backend, device, op="reshape_and_cache")
    if _should_validate(validate, device):
        _value_checks.validate_slot_mapping(slot_mapping, key_cache.shape[0] * key_cache.shape[1])
    _op("reshape_and_cache", chosen)(key, value, key_cache, value_cache, slot_mapping)


def paged_attention(
    query: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    block_table: torch.Tensor,
    seq_lens: torch.Tensor,
    cu_query_lens: torch.Tensor,
    scale: float,
    sliding_window: int = 0,
    soft_cap: float = 0.0,
    return_lse: bool = False,
    *,
    max_query_len: int = 0,
    backend: Backend | str | None = None,
    validate: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Attention over a paged KV cache with ragged query lengths (1 for decode, k + 1 for
    verify), causal from the bottom right: sequence ``b``'s query rows are its last
    ``q_len`` positions. specops.reference.attention states the contract.

    Parameters
    ----------
    query : Shape: ``[num_query_tokens, Hq, D]``, float32 | bfloat16 | float16.
    key_cache, value_cache : Shape: ``[num_blocks, block_size, Hkv, D]``, dtype of query; Hkv divides Hq.
    block_table : Shape: ``[B, max_blocks]``, int32.
    seq_lens : keys per sequence, new tokens included. Shape: ``[B]``, int32.
    cu_query_lens : exclusive prefix of query lengths, ``cu[0] = 0``. Shape: ``[B + 1]``, int32.
    scale : multiplies ``q . k``, usually ``D ** -0.5``.
    sliding_window : 0 = off; else each query sees its last ``sliding_window`` keys.
    soft_cap : 0 = off; else logits become ``soft_cap * tanh(logits / soft_cap)``.
    return_lse : also return the natural-log log-sum-exp of the logits.
    max_query_len : performance hint: the longest query length in ``cu_query_lens`` if
        known (``k + 1`` for a verify step, 1 for decode); 0 = unknown. A wrong hint costs
        speed, never correctness. Must be >= 0.

    Returns
    -------
    ``(out [num_query_tokens, Hq, D] dtype of query, lse [num_query_tokens, Hq] float32,
    or [0, 0] when not asked)``.

    Example
    -------
    >>> cache = torch.randn(4, 16, 2, 64)
    >>> out, lse = specops.paged_attention(
    ...     torch.randn(3, 8, 64), cache, cache, torch.tensor([[2, 0], [1, 3]], dtype=torch.int32),
    ...     torch.tensor([20, 7], dtype=torch.int32), torch.tensor([0, 2, 3], dtype=torch.int32), 64 ** -0.5)
    >>> out.shape
    torch.Size([3, 8, 64])

    Backends: the Triton kernel (every case), the CUDA kernel (float16/bfloat16, head dims
    64/128/256, GQA groups up to 16, see ``cuda_paged_attention_covers``; ``backend="cuda"``
    outside that coverage raises an error naming the argument), the C++ CPU kernel and the
    reference. On CUDA tensors the default is the Triton kernel inside CUDA-graph capture
    and torch.compile (its GPU time is lower: the CUDA kernel takes 1.01-1.17x its time at
    B >= 16 and 1.34-1.48x at B=1 on the H100, bench/NOTES.md), and for eager calls the
    CUDA kernel where it covers the case and the block table addresses at most 64 MiB of
    keys and values (``cuda_attention_faster_eagerly``: its lower host time wins there),
    else the Triton kernel.
    """
    device = query.device
    prefer_cuda = backend is None and _cuda_attention_by_default(query, key_cache, value_cache, block_table)
    chosen = resolve(backend, device, op="paged_attention",
                     missing=NO_CUDA_KERNEL if backend is None and not prefer_cuda else ())
    if chosen is Backend.REFERENCE:  # the kernels check their arguments; the reference is plain PyTorch
        _checks.check_paged_attention(query, key_cache, value_cache, block_table, seq_lens, cu_query_lens,
                                      sliding_window, soft_cap, max_query_len)
    if _should_validate(validate, device):
        _value_checks.validate_paged_attention_values(
            block_table, seq_lens, cu_query_lens, query.shape[0], key_cache.shape[1], key_cache.shape[0]
        )
    # (the direct call's tensors, for a Triton call whose host values are of their schema's types:
    # others, e.g. a 0-d tensor scale, the dispatcher converts)
    direct = (chosen is Backend.TRITON and type(scale) is float and type(sliding_window) is int
              and type(soft_cap) is float and type(return_lse) is bool and type(max_query_len) is int)
    tensors = (query, key_cache, value_cache, block_table, seq_lens, cu_query_lens) if direct else ()
    return _op("paged_attention", chosen, tensors)(
        query, key_cache, value_cache, block_table, seq_lens, cu_query_lens, scale, sliding_window, soft_cap,
        return_lse, max_query_len,
    )
