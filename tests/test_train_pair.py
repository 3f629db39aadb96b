"""The pair-training script (scripts/train_pair.py) and its acceptance measure, on CPU:
the rounds walk on hand-worked match vectors, the measure on a model against itself and
against a different model (by brute force), and a smoke run whose output must load as
Hugging Face checkpoints."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from specops.assets import PAIR_DIR, pair_path, tokenizer_path

REPO = Path(__file__).resolve().parents[1]
transformers = pytest.importorskip("transformers")


def load_script(name: str):
    sys.path.insert(0, str(REPO / "scripts"))
    try:
        spec = importlib.util.spec_from_file_location(name, REPO / "scripts" / f"{name}.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module  # dataclasses look their module up there
        spec.loader.exec_module(module)
        return module
    finally:
        sys.path.remove(str(REPO / "scripts"))


acceptance = load_script("pair_acceptance")


def tiny_llama(seed: int, hidden: int = 64):
    torch.manual_seed(seed)
    config = transformers.LlamaConfig(vocab_size=258, hidden_size=hidden, intermediate_size=2 * hidden,
                                      num_hidden_layers=1, num_attention_heads=1, num_key_value_heads=1,
                                      head_dim=hidden)
    return transformers.LlamaForCausalLM(config).eval()


@pytest.mark.parametrize(
    "row, k, expected",
    [
        # all match: rounds of 4 then 3 drafts (8 tokens: 4 + bonus, 3 + bonus)
        ([1] * 8, 4, (7, 7, 2, [2, 2, 2, 1], [2, 2, 2, 1])),
        # accept 1 (+ target token), accept 4 (+ bonus), reject the last single draft
        ([1, 0, 1, 1, 1, 1, 0, 0], 4, (9, 5, 3, [3, 2, 2, 2], [2, 1, 1, 1])),
        ([0, 0, 0], 2, (5, 0, 3, [3, 2], [0, 0])),
    ],
)
def test_rounds_of_k(row, k, expected):
    assert acceptance.rounds_of_k(torch.tensor([row], dtype=torch.bool), k) == expected


def test_a_model_accepts_itself():
    model = tiny_llama(0)
    prompts = torch.randint(0, 256, (3, 8), generator=torch.Generator().manual_seed(0))
    result = acceptance.measure_acceptance(model, model, prompts, gen_len=6, k=4)
    assert result.greedy_match_rate == 1.0 and result.greedy_acceptance_rate == 1.0
    assert result.sampled_acceptance_rate == pytest.approx(1.0, abs=1e-5)
    # 6 positions: a round of 4 drafts + bonus, then 1 draft + bonus (past the window)
    assert result.mean_tokens_per_round == pytest.approx(7 / 2)


def test_match_rate_by_brute_force():
    target, draft = tiny_llama(0), tiny_llama(1)
    prompts = torch.randint(0, 256, (2, 5), generator=torch.Generator().manual_seed(1))
    result = acceptance.measure_acceptance(target, draft, prompts, gen_len=4, k=2)
    matches = []
    with torch.no_grad():
        for prompt in prompts:
            seq = prompt.tolist()
            for _ in range(4):  # draft's guess vs target's token, one position at a time
                ids = torch.tensor([seq])
                target_next = target(input_ids=ids).logits[0, -1].argmax().item()
                matches.append(draft(input_ids=ids).logits[0, -1].argmax().item() == target_next)
                seq.append(target_next)
    assert result.greedy_match_rate == pytest.approx(sum(matches) / len(matches))


def test_pair_path_names_missing_files():
    if all((PAIR_DIR / f).is_file() for f in ("target/model.safetensors", "draft/model.safetensors")):
        assert pair_path() == PAIR_DIR
    else:
        with pytest.raises(FileNotFoundError, match="train_pair.py"):
            pair_path()
    assert tokenizer_path().is_file()


def test_smoke_run_writes_loadable_pair(tmp_path):
    out = tmp_path / "pair"
    subprocess.run([sys.executable, str(REPO / "scripts" / "train_pair.py"), "--smoke", "--steps", "4",
                    "--device", "cpu", "--out", str(out)], check=True, capture_output=True, timeout=600)
    assert (out / "tokenizer.json").read_text() == tokenizer_path().read_text()
    summary = json.loads((out / "train_summary.json").read_text())
    weight_bytes = 0
    for name in ("target", "draft"):
        config = json.loads((out / name / "config.json").read_text())
        assert config["architectures"] == ["LlamaForCausalLM"] and config["torch_dtype"] == "bfloat16"
        assert (config["vocab_size"], config["bos_token_id"], config["eos_token_id"]) == (258, 256, 257)
        model = transformers.LlamaForCausalLM.from_pretrained(out / name)
        assert model.dtype == torch.bfloat16
        assert summary[name]["steps_run"] == 4 and summary[name]["params"] == model.num_parameters()
        weight_bytes += (out / name / "model.safetensors").stat().st_size
    assert summary["weight_bytes"] == weight_bytes
    assert 0 <= summary["acceptance"]["greedy_acceptance_rate"] <= 1
    assert sorted(p.name for p in out.iterdir()) == ["draft", "target", "tokenizer.json", "train_summary.json"]
