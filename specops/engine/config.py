"""The Llama architecture's hyperparameters, read from a Hugging Face ``config.json``."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch


@dataclass(frozen=True)
class RopeScaling:
    """Llama 3's frequency-dependent RoPE scaling (``rope_type: "llama3"``)."""

    factor: float
    low_freq_factor: float
    high_freq_factor: float
    original_max_position_embeddings: int

    def __post_init__(self):
        if not self.factor > 0:
            raise ValueError(f"rope_scaling.factor must be > 0, got {self.factor}")
        if not self.high_freq_factor > self.low_freq_factor:
            raise ValueError(
                f"rope_scaling.high_freq_factor ({self.high_freq_factor}) must exceed "
                f"low_freq_factor ({self.low_freq_factor})"
            )
        if self.original_max_position_embeddings < 1:
            raise ValueError("rope_scaling.original_max_position_embeddings must be >= 1")


@dataclass(frozen=True)
class LlamaConfig:
    """Hyperparameters of a Llama-architecture decoder (names as in ``config.json``)."""

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rms_norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    rope_scaling: RopeScaling | None = None
    max_position_embeddings: int = 2048
    tie_word_embeddings: bool = False
    bos_token_id: int | None = None
    eos_token_ids: tuple[int, ...] = ()

    def __post_init__(self):
        for name in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                     "num_key_value_heads", "head_dim", "max_position_embeddings"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError(
                f"num_key_value_heads ({self.num_key_value_heads}) must divide num_attention_heads "
                f"({self.num_attention_heads})"
            )
        if self.head_dim % 2:
            raise ValueError(f"head_dim must be even (RoPE rotates pairs), got {self.head_dim}")
        if not self.rms_norm_eps > 0 or not self.rope_theta > 0:
            raise ValueError("rms_norm_eps and rope_theta must be > 0")
        if any(not 0 <= t < self.vocab_size for t in self.eos_token_ids):
            raise ValueError(f"eos_token_ids {self.eos_token_ids} must lie in [0, vocab_size={self.vocab_size})")

    @property
    def num_parameters(self) -> int:
        """Weights of the model (embedding and lm_head counted once when tied)."""
        h, q, kv = self.hidden_size, self.num_attention_heads * self.head_dim, self.num_key_value_heads * self.head_dim
        layer = h * (q + 2 * kv) + q * h + 3 * h * self.intermediate_size + 2 * h
        embed = self.vocab_size * h * (1 if self.tie_word_embeddings else 2)
        return self.num_hidden_layers * layer + embed + h

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> LlamaConfig:
        """Build from the fields of a Hugging Face Llama ``config.json``; unsupported features raise."""
        architectures = raw.get("architectures") or ["LlamaForCausalLM"]
        if raw.get("model_type", "llama") != "llama" or "LlamaForCausalLM" not in architectures:
            raise ValueError(
                f"only Llama checkpoints are supported, got model_type={raw.get('model_type')!r}, "
                f"architectures={architectures}"
            )
        for flag in ("attention_bias", "mlp_bias"):
            if raw.get(flag):
                raise ValueError(f"config.json: {flag}=true is not supported")
        if raw.get("hidden_act", "silu") != "silu":
            raise ValueError(f"config.json: hidden_act must be 'silu', got {raw.get('hidden_act')!r}")
        heads = raw["num_attention_heads"]
        eos = raw.get("eos_token_id")
        eos_ids = () if eos is None else (eos,) if isinstance(eos, int) else tuple(eos)
        # transformers 5 moves rope_theta into rope_parameters; older files keep it at the top.
        rope = raw.get("rope_parameters") or raw.get("rope_scaling") or {}
        rope_theta = raw.get("rope_theta", rope.get("rope_theta", 10000.0))
        return cls(
            vocab_size=raw["vocab_size"],
            hidden_size=raw["hidden_size"],
            intermediate_size=raw["intermediate_size"],
            num_hidden_layers=raw["num_hidden_layers"],
            num_attention_heads=heads,
            num_key_value_heads=raw.get("num_key_value_heads") or heads,
            head_dim=raw.get("head_dim") or raw["hidden_size"] // heads,
            rms_norm_eps=raw.get("rms_norm_eps", 1e-5),
            rope_theta=float(rope_theta),
            rope_scaling=_rope_scaling(rope),
            max_position_embeddings=raw.get("max_position_embeddings", 2048),
            tie_word_embeddings=bool(raw.get("tie_word_embeddings", False)),
            bos_token_id=raw.get("bos_token_id"),
            eos_token_ids=eos_ids,
        )

    @classmethod
    def from_file(cls, path: str | Path) -> LlamaConfig:
        with open(path) as f:
            return cls.from_dict(json.load(f))


def _rope_scaling(rope: dict[str, Any]) -> RopeScaling | None:
    kind = rope.get("rope_type", rope.get("type", "default"))
    if kind == "default":
        return None
    if kind != "llama3":
        raise ValueError(f"rope scaling type {kind!r} is not supported (only none/'default' and 'llama3')")
    return RopeScaling(
        factor=float(rope["factor"]),
        low_freq_factor=float(rope["low_freq_factor"]),
        high_freq_factor=float(rope["high_freq_factor"]),
        original_max_position_embeddings=int(rope["original_max_position_embeddings"]),
    )


def rope_inverse_frequencies(config: LlamaConfig) -> torch.Tensor:
    """Per-pair rotation frequencies ``theta^(-2i/D)`` (float32, computed as Hugging Face
    does so logits agree), Llama-3-rescaled when asked.

    Shape: ``[head_dim // 2]``.
    """
    d = config.head_dim
    inv = 1.0 / (config.rope_theta ** (torch.arange(0, d, 2, dtype=torch.int64).float() / d))
    s = config.rope_scaling
    if s is None:
        return inv
    # Long wavelengths (low frequencies) are slowed by `factor`, short ones kept, and the
    # band between them interpolated smoothly, as Llama 3.1 was trained.
    low_wavelen = s.original_max_position_embeddings / s.low_freq_factor
    high_wavelen = s.original_max_position_embeddings / s.high_freq_factor
    wavelen = 2 * math.pi / inv
    scaled = torch.where(wavelen > low_wavelen, inv / s.factor, inv)
    smooth = (s.original_max_position_embeddings / wavelen - s.low_freq_factor) / (
        s.high_freq_factor - s.low_freq_factor
    )
    blended = (1 - smooth) * scaled / s.factor + smooth * scaled
    middle = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
    return torch.where(middle, blended, scaled)
