"""The engine's Llama model and checkpoint loader against transformers (the peer): same
logits within dtype tolerance over paged, chunked, batched inputs, and the same greedy
continuation as ``generate``."""

from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F
from conftest import HAS_CUDA
from engine_models import VOCAB, greedy_reference, save_tiny_llama

from specops.engine.checkpoint import load_model
from specops.engine.config import LlamaConfig
from specops.engine.kv_cache import KVCache, SequenceChunk, build_attention_batch
from specops.engine.model import EAGER_STEPS, rope_qkv
from specops.engine.runner import ModelRunner
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


def test_loader_names_hf_tensors_of_fused_projections(tmp_path):
    """The model fuses q/k/v and gate/up; the checkpoint and the errors keep HF's names."""
    from safetensors.torch import load_file, save_file

    folder = save_tiny_llama(tmp_path, seed=0)
    [file] = folder.glob("*.safetensors")
    state = load_file(str(file))
    loaded = load_model(folder)
    layer = loaded.model.model.layers[1]
    hf = "model.layers.1.self_attn.{}_proj.weight"
    expected = torch.cat([state[hf.format(p)] for p in "qkv"])
    assert torch.equal(layer.self_attn.qkv_proj.weight, expected)
    expected = torch.cat([state[f"model.layers.1.mlp.{p}_proj.weight"] for p in ("gate", "up")])
    assert torch.equal(layer.mlp.gate_up_proj.weight, expected)

    save_file({n: t for n, t in state.items() if n != hf.format("k")}, str(file))
    with pytest.raises(ValueError, match=r"missing \['model.layers.1.self_attn.k_proj.weight'\], unexpected \[\]"):
        load_model(folder)
    fused = {"model.layers.0.mlp.gate_up_proj.weight": layer.mlp.gate_up_proj.weight.detach()}
    save_file({**state, **fused}, str(file))
    with pytest.raises(ValueError, match=r"missing \[\], unexpected \['model.layers.0.mlp.gate_up_proj.weight'\]"):
        load_model(folder)


def old_rms_norm(x, weight, eps):
    x32 = x.float()
    x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)
    return weight * x32.to(x.dtype)


def old_apply_rope(x, cos, sin):
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos[:, None, :] + rotated * sin[:, None, :]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_eager_elementwise_steps_equal_unfused_formulas(dtype):
    """Bit for bit on the CPU: the fused steps only regroup the ops of the unfused model."""
    g = torch.Generator().manual_seed(5)
    n, hidden, intermediate, hq, hkv, d, eps = 13, 88, 136, 6, 2, 32, 1e-5

    def rand(*shape):
        return torch.randn(shape, generator=g).to(dtype)

    x, residual, weight = rand(n, hidden), rand(n, hidden), 1 + rand(hidden)
    assert torch.equal(EAGER_STEPS.rms_norm(x, weight, eps), old_rms_norm(x, weight, eps))
    normed, new_residual = EAGER_STEPS.add_rms_norm(x, residual, weight, eps)
    assert torch.equal(new_residual, residual + x)
    assert torch.equal(normed, old_rms_norm(residual + x, weight, eps))

    q, k, v = rand(n, hq * d), rand(n, hkv * d), rand(n, hkv * d)  # the three unfused projections
    angles = torch.rand(n, d // 2, generator=g) * 100
    cos, sin = torch.cat((angles, angles), -1).cos(), torch.cat((angles, angles), -1).sin()
    got = rope_qkv(torch.cat((q, k, v), -1), cos, sin, hq, hkv)
    c, s = cos.to(dtype), sin.to(dtype)
    expected = (old_apply_rope(q.view(n, hq, d), c, s), old_apply_rope(k.view(n, hkv, d), c, s), v.view(n, hkv, d))
    for got_t, expected_t in zip(got, expected):
        assert got_t.is_contiguous() and torch.equal(got_t, expected_t)

    gate, up = rand(n, intermediate), rand(n, intermediate)
    assert torch.equal(EAGER_STEPS.silu_mul(torch.cat((gate, up), -1)), F.silu(gate) * up)


def test_compiled_steps_only_where_asked(target_dir, monkeypatch):
    """Default: compiled in CUDA-graph warm-ups and captures only (eagerly called, the compiled
    steps cost more host time than they save); never on the CPU; SPECOPS_NO_COMPILE wins."""
    model = load_model(target_dir).model
    cuda, cpu = torch.device("cuda"), torch.device("cpu")  # only the type is read: no GPU needed
    monkeypatch.delenv("SPECOPS_NO_COMPILE", raising=False)
    assert model.elementwise_steps(cuda) is EAGER_STEPS
    with model.for_cuda_graph():
        assert model.elementwise_steps(cuda) is not EAGER_STEPS
        assert model.elementwise_steps(cpu) is EAGER_STEPS
    assert model.elementwise_steps(cuda) is EAGER_STEPS
    model.compile_elementwise = True
    assert model.elementwise_steps(cuda) is not EAGER_STEPS
    monkeypatch.setenv("SPECOPS_NO_COMPILE", "1")
    assert model.elementwise_steps(cuda) is EAGER_STEPS
    monkeypatch.delenv("SPECOPS_NO_COMPILE")
    model.compile_elementwise = False
    with model.for_cuda_graph():
        assert model.elementwise_steps(cuda) is EAGER_STEPS


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA GPU")
@pytest.mark.parametrize("dtype, atol", TOLERANCES)
def test_compiled_elementwise_matches_eager_on_cuda(target_dir, dtype, atol, monkeypatch):
    """Prefill eagerly, then a decode step from a captured CUDA graph (the runner warms up,
    so compilation never happens inside the capture), with compile_elementwise off and on."""
    monkeypatch.delenv("SPECOPS_NO_COMPILE", raising=False)
    loaded = load_model(target_dir, dtype=dtype, device="cuda")
    g = torch.Generator().manual_seed(6)
    sequences = [torch.randint(0, VOCAB, (n,), generator=g).tolist() for n in (11, 23, 7)]
    tables = [list(range(i * 8, (i + 1) * 8)) for i in range(len(sequences))]
    prefill = build_attention_batch([SequenceChunk(s, 0, t, 1) for s, t in zip(sequences, tables)], 4, 8, "cuda")
    decode = build_attention_batch([SequenceChunk([3], len(s), t, 1) for s, t in zip(sequences, tables)], 4, 8, "cuda")
    logits = {}
    for compiled in (False, True):
        loaded.model.compile_elementwise = compiled
        assert (loaded.model.elementwise_steps(torch.device("cuda")) is EAGER_STEPS) != compiled
        runner = ModelRunner(loaded.model, KVCache(loaded.config, 32, 4, dtype, "cuda"), use_cuda_graphs=True)
        first = runner(prefill).float().cpu()
        logits[compiled] = torch.cat([first, runner(decode, use_graph=True).float().cpu()])
        assert runner.num_graphs == 1
    torch.testing.assert_close(logits[True], logits[False], atol=atol, rtol=0)
