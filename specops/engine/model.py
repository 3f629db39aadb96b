"""A Llama-architecture decoder whose attention runs on specops' paged KV cache ops.

The forward pass takes a ragged batch of new tokens (prefill chunks, decode tokens, or
verify windows of k + 1, all flattened to ``N`` rows): each layer writes the new keys
and values with ``reshape_and_cache`` and attends with ``paged_attention``. Parameter
names follow Hugging Face's ``LlamaForCausalLM`` so its state dict loads unchanged.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from specops import ops
from specops.engine.config import LlamaConfig, rope_inverse_frequencies
from specops.engine.kv_cache import AttentionBatch, KVCache


class RMSNorm(nn.Module):
    def __init__(self, hidden_size: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [N, H]
        # Normalised in float32 and cast back before the weight, as the checkpoints were trained.
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x32.to(x.dtype)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate pairs ``(i, i + D/2)`` of every head. Shape: x ``[N, heads, D]``, cos/sin ``[N, D]``."""
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos[:, None, :] + rotated * sin[:, None, :]


class Attention(nn.Module):
    def __init__(self, config: LlamaConfig):
        super().__init__()
        hq, hkv, d = config.num_attention_heads, config.num_key_value_heads, config.head_dim
        self.num_heads, self.num_kv_heads, self.head_dim = hq, hkv, d
        self.q_proj = nn.Linear(config.hidden_size, hq * d, bias=False)
        self.k_proj = nn.Linear(config.hidden_size, hkv * d, bias=False)
        self.v_proj = nn.Linear(config.hidden_size, hkv * d, bias=False)
        self.o_proj = nn.Linear(hq * d, config.hidden_size, bias=False)
        self.scale = d**-0.5

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, batch: AttentionBatch,
                key_cache: torch.Tensor, value_cache: torch.Tensor, validate: bool) -> torch.Tensor:
        n = x.shape[0]
        q = apply_rope(self.q_proj(x).view(n, self.num_heads, self.head_dim), cos, sin)
        k = apply_rope(self.k_proj(x).view(n, self.num_kv_heads, self.head_dim), cos, sin)
        v = self.v_proj(x).view(n, self.num_kv_heads, self.head_dim)
        ops.reshape_and_cache(k, v, key_cache, value_cache, batch.slot_mapping, validate=validate)
        out, _ = ops.paged_attention(q, key_cache, value_cache, batch.block_table, batch.seq_lens,
                                     batch.cu_query_lens, self.scale, max_query_len=batch.max_query_len,
                                     validate=validate)
        return self.o_proj(out.view(n, self.num_heads * self.head_dim))


class MLP(nn.Module):
    def __init__(self, config: LlamaConfig):
        super().__init__()
        self.gate_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.up_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.down_proj = nn.Linear(config.intermediate_size, config.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


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
        # Value checks in the ops cost a device sync each: on by default on the CPU only.
        self.validate_ops: bool | None = None

    @torch.inference_mode()
    def forward(self, batch: AttentionBatch, cache: KVCache) -> torch.Tensor:
        """Logits of the rows ``batch.logits_indices``, after writing every new token's K/V.

        Shape: returns ``[M, vocab]`` in the model's dtype.
        """
        x = self.model.embed_tokens(batch.input_ids)
        validate = self.validate_ops if self.validate_ops is not None else x.device.type == "cpu"
        cos = self.rope_cos[batch.positions].to(x.dtype)
        sin = self.rope_sin[batch.positions].to(x.dtype)
        for i, layer in enumerate(self.model.layers):
            key_cache, value_cache = cache.layer(i)
            x = x + layer.self_attn(layer.input_layernorm(x), cos, sin, batch, key_cache, value_cache, validate)
            x = x + layer.mlp(layer.post_attention_layernorm(x))
        x = self.model.norm(x[batch.logits_indices])
        return self.lm_head(x)
