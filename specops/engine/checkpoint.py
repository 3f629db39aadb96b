"""Load a Llama-architecture checkpoint from a local Hugging Face folder: ``config.json``,
one or several ``*.safetensors`` files, and ``tokenizer.json`` when present."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from specops.engine.config import LlamaConfig
from specops.engine.model import LlamaForCausalLM, hf_tensor_names


@dataclass
class LoadedModel:
    model: LlamaForCausalLM
    config: LlamaConfig
    tokenizer: object | None  # tokenizers.Tokenizer, or None when the folder has no tokenizer.json
    path: Path


def load_state_dict(folder: Path) -> dict[str, torch.Tensor]:
    """All tensors of the folder's safetensors files (sharded checkpoints included)."""
    from safetensors.torch import load_file

    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"no *.safetensors file in {folder}")
    state: dict[str, torch.Tensor] = {}
    for file in files:
        for name, tensor in load_file(str(file)).items():
            if name in state:
                raise ValueError(f"tensor {name!r} appears in two files of {folder}")
            state[name] = tensor
    return state


def load_tokenizer(folder: Path):
    """``tokenizer.json`` of the folder, else of its parent (a draft/target pair sharing one),
    else None."""
    from tokenizers import Tokenizer

    for file in (folder / "tokenizer.json", folder.parent / "tokenizer.json"):
        if file.is_file():
            return Tokenizer.from_file(str(file))
    return None


def load_model(path: str | Path, *, dtype: torch.dtype = torch.float32,
               device: torch.device | str = "cpu") -> LoadedModel:
    """Build the model from ``path/config.json`` and fill it from ``path/*.safetensors``.

    The files hold Hugging Face names; fused parameters are concatenated from their parts
    (:func:`~specops.engine.model.hf_tensor_names`). Every tensor the model needs must be in
    the files (``lm_head.weight`` may be absent when tied) and no unknown tensor may be: a
    mismatch raises a ValueError naming the tensors.
    """
    folder = Path(path)
    if not (folder / "config.json").is_file():
        raise FileNotFoundError(f"{folder} has no config.json (expected a Hugging Face model folder)")
    config = LlamaConfig.from_file(folder / "config.json")
    with torch.device("meta"):
        model = LlamaForCausalLM(config)
    state = load_state_dict(folder)
    if config.tie_word_embeddings:
        state.pop("lm_head.weight", None)
    # Checked in Hugging Face names: the model's fused projections expand to their parts.
    parts = {n: hf_tensor_names(n) for n, _ in model.named_parameters()}
    expected = {hf for names in parts.values() for hf in names}
    missing, unexpected = expected - state.keys(), state.keys() - expected
    # Rotary tables are recomputed, never loaded; older exports carry them.
    unexpected = {n for n in unexpected if not n.endswith("rotary_emb.inv_freq")}
    if missing or unexpected:
        raise ValueError(f"checkpoint {folder} does not match the Llama config: missing {sorted(missing)[:8]}, "
                         f"unexpected {sorted(unexpected)[:8]}")
    model = LlamaForCausalLM(config)
    model.load_state_dict({n: torch.cat([state[hf] for hf in names]) if len(names) > 1 else state[names[0]]
                           for n, names in parts.items()}, strict=False)
    model = model.to(device=device, dtype=dtype).eval()
    # The rotary tables stay float32 (cast per use), as Hugging Face computes them.
    model.rope_cos = model.rope_cos.float()
    model.rope_sin = model.rope_sin.float()
    return LoadedModel(model, config, load_tokenizer(folder), folder)


def random_model(config: LlamaConfig, *, seed: int = 0, dtype: torch.dtype = torch.float32,
                 device: torch.device | str = "cpu") -> LlamaForCausalLM:
    """A model with random weights (for benchmarks at a given size): normal(0, 0.02)
    projections and embeddings, unit norms, as Llama is initialised."""
    generator = torch.Generator().manual_seed(seed)
    with torch.device(device):
        model = LlamaForCausalLM(config)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("norm.weight"):
                param.fill_(1.0)
            else:
                param.copy_(torch.randn(param.shape, generator=generator) * 0.02)
    model = model.to(dtype=dtype).eval()
    model.rope_cos = model.rope_cos.float()
    model.rope_sin = model.rope_sin.float()
    return model
