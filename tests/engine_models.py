"""Tiny random-weight Llama checkpoints saved by transformers, for the engine tests."""

from __future__ import annotations

from pathlib import Path

import torch

VOCAB = 97  # awkward on purpose


def save_tiny_llama(folder: Path, *, seed: int, num_layers: int = 2, hidden: int = 64, num_heads: int = 4,
                    num_kv_heads: int = 2, eos_token_id: int | None = None, rope_scaling: dict | None = None,
                    tie: bool = False, max_shard_size: str | None = None) -> Path:
    """Save a random ``transformers.LlamaForCausalLM`` (head_dim 16, vocab 97) to ``folder``."""
    import transformers

    torch.manual_seed(seed)
    rope = {"rope_type": "default", "rope_theta": 10000.0} if rope_scaling is None else rope_scaling
    config = transformers.LlamaConfig(
        vocab_size=VOCAB, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=num_layers,
        num_attention_heads=num_heads, num_key_value_heads=num_kv_heads, head_dim=16, max_position_embeddings=256,
        eos_token_id=eos_token_id, bos_token_id=None, rope_parameters=rope, tie_word_embeddings=tie,
    )
    model = transformers.LlamaForCausalLM(config).eval()
    # Larger-than-default weights make the logits peaked, so greedy ties are unlikely and
    # a tiny draft agrees with its target sometimes (shared embeddings raise acceptance).
    with torch.no_grad():
        for name, param in model.named_parameters():
            if not name.endswith("norm.weight"):
                param.normal_(0.0, 0.08)
    model.save_pretrained(folder, **({"max_shard_size": max_shard_size} if max_shard_size else {}))
    return folder


def greedy_reference(folder: Path, prompt: list[int], max_new_tokens: int) -> list[int]:
    """transformers' greedy ``generate`` continuation of ``prompt`` (float32, CPU)."""
    import transformers

    model = transformers.LlamaForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    with torch.no_grad():
        out = model.generate(torch.tensor([prompt]), max_new_tokens=max_new_tokens, do_sample=False,
                             eos_token_id=None, pad_token_id=0)
    return out[0, len(prompt):].tolist()


def repetitive_prompt(seed: int, length: int) -> list[int]:
    """A prompt that repeats short phrases, so n-gram lookup finds matches."""
    g = torch.Generator().manual_seed(seed)
    phrases = [torch.randint(0, VOCAB, (4,), generator=g).tolist() for _ in range(3)]
    out: list[int] = []
    while len(out) < length:
        out += phrases[int(torch.randint(0, 3, (1,), generator=g))]
    return out[:length]
