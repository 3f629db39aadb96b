"""A Llama-architecture decoder whose attention runs on specops' paged KV cache ops.

The forward pass takes a ragged batch of new tokens (prefill chunks, decode tokens, or
verify windows of k + 1, all flattened to ``N`` rows): each layer writes the new keys
and values with ``reshape_and_cache`` and attends with ``paged_attention``.

Parameter names follow Hugging Face's ``LlamaForCausalLM`` except for two fused
projections, one GEMM each: ``self_attn.qkv_proj`` (HF's q, k, v stacked along the output
dim) and ``mlp.gate_up_proj`` (gate then up). :func:`hf_tensor_names` is the mapping the
checkpoint loader uses. Between the GEMMs, the elementwise steps (residual add + RMSNorm,
RoPE of q and k with the cache writes, silu(gate) * up) are four small pure-torch
functions; in the CUDA forwards captured into CUDA graphs three run compiled and RoPE with
the cache writes as a Triton kernel (fast_steps, LlamaForCausalLM.compile_elementwise).
"""

from __future__ import annotations

import contextlib
import functools
import os
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from specops import _value_checks, ops
from specops.engine.config import LlamaConfig, rope_inverse_frequencies
from specops.engine.kv_cache import AttentionBatch, KVCache

# Model parameter (suffix) -> the Hugging Face tensors concatenated, in order, along dim 0.
FUSED_HF_TENSORS = {
    "self_attn.qkv_proj.weight": ("self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight"),
    "mlp.gate_up_proj.weight": ("mlp.gate_proj.weight", "mlp.up_proj.weight"),
}


def hf_tensor_names(name: str) -> tuple[str, ...]:
    """The Hugging Face checkpoint tensors that make up model parameter ``name``, in the order
    they are concatenated: ``model.layers.0.mlp.gate_up_proj.weight`` -> (``...gate_proj.weight``,
    ``...up_proj.weight``); an unfused parameter maps to its own name."""
    for fused, parts in FUSED_HF_TENSORS.items():
        if name.endswith("." + fused):
            prefix = name[: -len(fused)]
            return tuple(prefix + part for part in parts)
    return (name,)


# The elementwise steps. Numerics follow Hugging Face: RMSNorm in float32, cast back, then
# times the weight; residual adds and RoPE in the model's dtype.


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """Shape: x ``[N, H]``, weight ``[H]``; returns ``[N, H]`` in x's dtype (for a weight of x's dtype)."""
    x32 = x.float()
    x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)
    return weight * x32.to(x.dtype)


def add_rms_norm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor,
                 eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """``(rms_norm(residual + x), residual + x)``. Shape: x, residual ``[N, H]``, weight ``[H]``."""
    residual = residual + x
    return rms_norm(residual, weight, eps), residual


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    # x [N, heads, D]; cos, sin [N, D] in x's dtype. Pairs (i, i + D/2) rotate together.
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos[:, None, :] + rotated * sin[:, None, :]


def rope_qkv(qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, num_heads: int,
             num_kv_heads: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Split the fused projection into heads and rotate q and k (cos/sin cast to qkv's dtype first).

    Shape: qkv ``[N, (Hq + 2 Hkv) * D]``, cos/sin ``[N, D]`` float32. Returns contiguous
    (as the attention ops require) q ``[N, Hq, D]``, k ``[N, Hkv, D]``, v ``[N, Hkv, D]``.
    """
    n, d = qkv.shape[0], cos.shape[-1]
    q, k, v = qkv.view(n, num_heads + 2 * num_kv_heads, d).split([num_heads, num_kv_heads, num_kv_heads], dim=1)
    cos, sin = cos.to(qkv.dtype), sin.to(qkv.dtype)
    return _rotate(q, cos, sin), _rotate(k, cos, sin), v.contiguous()


def rope_cache(qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, num_heads: int, num_kv_heads: int,
               key_cache: torch.Tensor, value_cache: torch.Tensor, slot_mapping: torch.Tensor,
               validate: bool) -> torch.Tensor:
    """The attention prologue: :func:`rope_qkv`, then k and v written into their cache slots
    (``ops.reshape_and_cache``, which checks its values when ``validate``). Returns q ``[N, Hq, D]``."""
    q, k, v = rope_qkv(qkv, cos, sin, num_heads, num_kv_heads)
    ops.reshape_and_cache(k, v, key_cache, value_cache, slot_mapping, validate=validate)
    return q


def silu_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """``silu(gate) * up``. Shape: gate_up ``[N, 2 I]`` (gate, then up); returns ``[N, I]``."""
    gate, up = gate_up.chunk(2, dim=-1)
    # A contiguous gate, as the unfused model had: the CPU kernel rounds a strided row's
    # tail (scalar path) differently from its vector path. Free under torch.compile.
    return F.silu(gate.contiguous()) * up


@dataclass(frozen=True)
class ElementwiseSteps:
    """The forward's elementwise steps: the functions above, or their compiled versions."""

    rms_norm: Callable
    add_rms_norm: Callable
    rope_cache: Callable
    silu_mul: Callable


EAGER_STEPS = ElementwiseSteps(rms_norm, add_rms_norm, rope_cache, silu_mul)
_fast_steps: ElementwiseSteps | None = None


def _compile_step(fn: Callable) -> Callable:
    """``fn`` through ``torch.compile`` with only the token dimension (dim 0 of every tensor of
    two or more dims) dynamic: the hidden, head and row sizes stay static, so the generated
    kernels keep vector loads (all dims dynamic: the llama-1b scoring step's elementwise
    kernels took 330 µs a forward, 197 with these). Another model size compiles another entry."""
    compiled = torch.compile(fn, fullgraph=True)

    @functools.wraps(fn)
    def step(*args):
        for arg in args:
            if isinstance(arg, torch.Tensor) and arg.dim() >= 2:
                torch._dynamo.maybe_mark_dynamic(arg, 0)
                for dim in range(1, arg.dim()):
                    torch._dynamo.mark_static(arg, dim)
        with torch._dynamo.config.patch(automatic_dynamic_shapes=False):  # head counts stay constants
            return compiled(*args)

    return step


def _triton_rope_cache(qkv, cos, sin, num_heads, num_kv_heads, key_cache, value_cache, slot_mapping, validate):
    from specops.triton_kernels.rope_cache import rope_cache as triton_rope_cache

    if validate:  # the values reshape_and_cache would check: the kernel skips a bad slot silently
        _value_checks.validate_slot_mapping(slot_mapping, key_cache.shape[0] * key_cache.shape[1])
    return triton_rope_cache(qkv, cos, sin, num_heads, num_kv_heads, key_cache, value_cache, slot_mapping)


def fast_steps() -> ElementwiseSteps:
    """The steps for CUDA forwards: the norms and silu * up through ``torch.compile`` (one or
    two fused Triton kernels each instead of up to ten eager ones; each compiles on its first
    call, so a forward must run outside any CUDA graph capture first, as ModelRunner's
    warm-up does), RoPE + cache writes as one hand-written Triton kernel
    (triton_kernels/rope_cache.py: one launch for the compiled RoPE's three kernels and
    reshape_and_cache)."""
    global _fast_steps
    if _fast_steps is None:
        _fast_steps = ElementwiseSteps(_compile_step(rms_norm), _compile_step(add_rms_norm), _triton_rope_cache,
                                       _compile_step(silu_mul))
    return _fast_steps


class RMSNorm(nn.Module):
    def __init__(self, hidden_size: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [N, H]
        return rms_norm(x, self.weight, self.eps)


class Attention(nn.Module):
    def __init__(self, config: LlamaConfig):
        super().__init__()
        hq, hkv, d = config.num_attention_heads, config.num_key_value_heads, config.head_dim
        self.num_heads, self.num_kv_heads, self.head_dim = hq, hkv, d
        self.qkv_proj = nn.Linear(config.hidden_size, (hq + 2 * hkv) * d, bias=False)
        self.o_proj = nn.Linear(hq * d, config.hidden_size, bias=False)
        self.scale = d**-0.5

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, batch: AttentionBatch,
                key_cache: torch.Tensor, value_cache: torch.Tensor, validate: bool,
                steps: ElementwiseSteps) -> torch.Tensor:
        q = steps.rope_cache(self.qkv_proj(x), cos, sin, self.num_heads, self.num_kv_heads, key_cache, value_cache,
                             batch.slot_mapping, validate)
        out, _ = ops.paged_attention(q, key_cache, value_cache, batch.block_table, batch.seq_lens,
                                     batch.cu_query_lens, self.scale, max_query_len=batch.max_query_len,
                                     validate=validate)
        return self.o_proj(out.view(x.shape[0], self.num_heads * self.head_dim))


class MLP(nn.Module):
    def __init__(self, config: LlamaConfig):
        super().__init__()
        self.gate_up_proj = nn.Linear(config.hidden_size, 2 * config.intermediate_size, bias=False)
        self.down_proj = nn.Linear(config.intermediate_size, config.hidden_size, bias=False)

    def forward(self, x: torch.Tensor, steps: ElementwiseSteps) -> torch.Tensor:
        return self.down_proj(steps.silu_mul(self.gate_up_proj(x)))


class DecoderLayer(nn.Module):
    def __init__(self, config: LlamaConfig):
        super().__init__()
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.self_attn = Attention(config)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.mlp = MLP(config)


class LlamaBody(nn.Module):
    def __init__(self, config: LlamaConfig):
        super().__init__()
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(config) for _ in range(config.num_hidden_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)


class LlamaForCausalLM(nn.Module):
    """Llama decoder + LM head over a paged KV cache.

    Two switches, settable after construction:

    - ``validate_ops``: value checks in the ops (a device sync each); None = on for the CPU only.
    - ``compile_elementwise``: run the elementwise steps between GEMMs as :func:`fast_steps`
      (torch.compile with the token dimension dynamic; RoPE + cache writes as a Triton
      kernel) on CUDA tensors (never on the CPU).
      None (default) = in the forwards ModelRunner captures into CUDA graphs (and their
      warm-ups) only: there the compiled steps cut 656 kernels to 216 a llama-1b forward,
      while called eagerly each compiled step pays guard checks on the host (add_rms_norm
      on small CPU tensors: 92 µs a call compiled, 29 eager), 64 calls a llama-1b forward.
      True = every CUDA forward, False = never; ``SPECOPS_NO_COMPILE=1`` forces eager.
      Compilation happens on the first compiled forward per dtype (seconds); the runner
      warms up twice before capture, so it never compiles inside a capture.

    Example
    -------
    >>> model = LlamaForCausalLM(config)
    >>> cache = KVCache(config, num_blocks=8, block_size=16, dtype=torch.float32, device="cpu")
    >>> batch = build_attention_batch([SequenceChunk([1, 5, 9], 0, [3], 1)], 16, 1, "cpu")
    >>> logits = model(batch, cache)  # [1, vocab]: the next token's logits after [1, 5, 9]
    """

    def __init__(self, config: LlamaConfig):
        super().__init__()
        self.config = config
        self.model = LlamaBody(config)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        if config.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight
        inv_freq = rope_inverse_frequencies(config)
        angles = torch.outer(torch.arange(config.max_position_embeddings, dtype=torch.float32), inv_freq)
        angles = torch.cat((angles, angles), dim=-1)
        self.register_buffer("rope_cos", angles.cos(), persistent=False)  # [max_positions, D] float32
        self.register_buffer("rope_sin", angles.sin(), persistent=False)
        self.validate_ops: bool | None = None
        self.compile_elementwise: bool | None = None
        self._for_cuda_graph = False

    @contextlib.contextmanager
    def for_cuda_graph(self):
        """Forwards in this block are a CUDA graph's warm-up or capture (ModelRunner): with
        ``compile_elementwise`` None, they run the compiled steps."""
        previous, self._for_cuda_graph = self._for_cuda_graph, True
        try:
            yield
        finally:
            self._for_cuda_graph = previous

    def elementwise_steps(self, device: torch.device) -> ElementwiseSteps:
        """Compiled steps for CUDA tensors unless turned off, else eager."""
        if device.type != "cuda" or self.compile_elementwise is False or os.environ.get("SPECOPS_NO_COMPILE") == "1":
            return EAGER_STEPS
        if self.compile_elementwise or self._for_cuda_graph:
            return fast_steps()
        return EAGER_STEPS

    @torch.inference_mode()
    def forward(self, batch: AttentionBatch, cache: KVCache) -> torch.Tensor:
        """Logits of the rows ``batch.logits_indices``, after writing every new token's K/V.

        Shape: returns ``[M, vocab]`` in the model's dtype.
        """
        hidden = self.model.embed_tokens(batch.input_ids)  # [N, H]
        validate = self.validate_ops if self.validate_ops is not None else hidden.device.type == "cpu"
        steps = self.elementwise_steps(hidden.device)
        cos, sin = self.rope_cos[batch.positions], self.rope_sin[batch.positions]  # [N, D] float32
        # Each layer's residual add is fused with the norm that follows it: the first layer
        # norms the embeddings, the last add is fused with the final norm.
        residual = None
        for i, layer in enumerate(self.model.layers):
            norm = layer.input_layernorm
            if residual is None:
                x, residual = steps.rms_norm(hidden, norm.weight, norm.eps), hidden
            else:
                x, residual = steps.add_rms_norm(hidden, residual, norm.weight, norm.eps)
            hidden = layer.self_attn(x, cos, sin, batch, *cache.layer(i), validate, steps)
            norm = layer.post_attention_layernorm
            x, residual = steps.add_rms_norm(hidden, residual, norm.weight, norm.eps)
            hidden = layer.mlp(x, steps)
        rows = batch.logits_indices
        x, _ = steps.add_rms_norm(hidden[rows], residual[rows], self.model.norm.weight, self.model.norm.eps)
        return self.lm_head(x)
