"""The engine's Llama model and checkpoint loader against transformers (the peer): same
logits within dtype tolerance over paged, chunked, batched inputs, and the same greedy
continuation as ``generate``."""

from __future__ import annotations

import json

import pytest
import torch
from conftest import HAS_CUDA
from engine_models import VOCAB, greedy_reference, save_tiny_llama

from specops.engine.checkpoint import load_model
from specops.engine.config import LlamaConfig
from specops.engine.kv_cache import KVCache, SequenceChunk, build_attention_batch
from specops.engine.request import Request
from specops.engine.spec_decode import EngineConfig, SpecDecodeEngine

DEVICES = ["cpu"] + ([pytest.param("cuda", marks=pytest.mark.gpu)] if HAS_CUDA else [])
# (dtype, atol on logits): float32 differs from transformers in summation order only.
TOLERANCES = [(torch.float32, 1e-4), (torch.bfloat16, 0.15)]


@pytest.fixture(scope="module")
def target_dir(tmp_path_factory):
    return save_tiny_llama(tmp_path_factory.mktemp("target"), seed=0)


def hf_logits(folder, ids: list[int], dtype=torch.float32) -> torch.Tensor:
    import transformers

    model = transformers.LlamaForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    with torch.no_grad():
        return model(torch.tensor([ids])).logits[0].to(dtype).float()


def paged_logits(folder, sequences: list[list[int]], split: int, device: str, dtype, expand: bool) -> list:
    """Every position's logits of each sequence, run in two chunks (prefix, then the rest)
    through a shuffled block table, all sequences in one batch per chunk."""
    loaded = load_model(folder, dtype=dtype, device=device)
    block_size, max_blocks = 4, 16
    cache = KVCache(loaded.config, 64, block_size, dtype, device)
    blocks = torch.randperm(64, generator=torch.Generator().manual_seed(1)).tolist()
    tables = [blocks[i * max_blocks:(i + 1) * max_blocks] for i in range(len(sequences))]
    first = [SequenceChunk(s[:split], 0, t, split) for s, t in zip(sequences, tables)]
    rest = [SequenceChunk(s[split:], split, t, len(s) - split) for s, t in zip(sequences, tables)]
    out_first = loaded.model(build_attention_batch(first, block_size, max_blocks, device), cache).float().cpu()
    out_rest = loaded.model(build_attention_batch(rest, block_size, max_blocks, device, expand=expand), cache)
    out_rest = out_rest.float().cpu()
    result, a, b = [], 0, 0
    for s in sequences:
        result.append(torch.cat([out_first[a:a + split], out_rest[b:b + len(s) - split]]))
        a, b = a + split, b + len(s) - split
    return result


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype, atol", TOLERANCES)
@pytest.mark.parametrize("expand", [False, True], ids=["paged-verify", "batch-expansion"])
def test_logits_match_transformers(target_dir, device, dtype, atol, expand):
    if device == "cpu" and dtype is torch.bfloat16 and expand:
        pytest.skip("one bfloat16 layout on the CPU is enough")
    g = torch.Generator().manual_seed(2)
    sequences = [torch.randint(0, VOCAB, (n,), generator=g).tolist() for n in (11, 23, 7)]
    got = paged_logits(target_dir, sequences, 5, device, dtype, expand)
    for seq, logits in zip(sequences, got):
        torch.testing.assert_close(logits, hf_logits(target_dir, seq), atol=atol, rtol=0)


def test_llama3_rope_scaling_tied_embeddings_and_shards_match_transformers(tmp_path):
    rope = {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
            "high_freq_factor": 4.0, "original_max_position_embeddings": 16}
    folder = save_tiny_llama(tmp_path, seed=3, rope_scaling=rope, tie=True, num_kv_heads=1, max_shard_size="40KB")
    assert len(list(folder.glob("*.safetensors"))) > 1  # sharded checkpoints load too
    config = LlamaConfig.from_file(folder / "config.json")
    assert config.rope_scaling is not None and config.rope_scaling.factor == 8.0 and config.tie_word_embeddings
    seq = torch.randint(0, VOCAB, (40,), generator=torch.Generator().manual_seed(4)).tolist()
    [got] = paged_logits(folder, [seq], 30, "cpu", torch.float32, False)
    torch.testing.assert_close(got, hf_logits(folder, seq), atol=1e-4, rtol=0)


@pytest.mark.parametrize("device", DEVICES)
def test_greedy_continuation_matches_generate(target_dir, device):
    prompts = [[5, 6, 7, 8, 9], [1, 2, 3], list(range(10, 40)), [42]]
    expected = [greedy_reference(target_dir, p, 24) for p in prompts]
    loaded = load_model(target_dir, device=device)
    # Two at a time: the later prompts join as the first finish (continuous batching).
    engine = SpecDecodeEngine(loaded.model, EngineConfig(block_size=4, num_blocks=40, max_num_seqs=2,
                                                         max_model_len=128))
    states = engine.generate([Request(tuple(p), max_tokens=24) for p in prompts])
    assert [s.output_token_ids for s in states] == expected


def test_config_errors_name_the_field(tmp_path):
    raw = json.loads((save_tiny_llama(tmp_path, seed=0) / "config.json").read_text())
    with pytest.raises(ValueError, match="model_type"):
        LlamaConfig.from_dict({**raw, "model_type": "mistral"})
    with pytest.raises(ValueError, match="num_key_value_heads"):
        LlamaConfig.from_dict({**raw, "num_key_value_heads": 3})
    with pytest.raises(ValueError, match="rope scaling type 'yarn'"):
        LlamaConfig.from_dict({**raw, "rope_parameters": {"rope_type": "yarn", "factor": 2.0}})
    with pytest.raises(ValueError, match="attention_bias"):
        LlamaConfig.from_dict({**raw, "attention_bias": True})


def test_loader_rejects_mismatched_checkpoints(tmp_path):
    folder = save_tiny_llama(tmp_path / "a", seed=0)
    with pytest.raises(FileNotFoundError, match="config.json"):
        load_model(tmp_path / "missing")
    raw = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**raw, "num_hidden_layers": 3}))
    with pytest.raises(ValueError, match="missing .*model.layers.2"):
        load_model(folder)
