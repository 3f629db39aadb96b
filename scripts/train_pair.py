"""Train the embedded draft/target pair: two byte-level Llama models on the Python stdlib.

The corpus is every ``.py`` file of the running Python's standard library
(``sysconfig.get_paths()["stdlib"]``, site-packages excluded), in sorted order. Two sets of
files are held out: files 0, 40, 80, ... validate (and pick, for each model, the weights of
the step that validates best: the corpus is small, ~10 MB where the stdlib ships without
its tests, and the models see it many times), files 20, 60, 100, ... give the prompts of
the acceptance measure, which thus never saw selection. Each file is
``<|bos|>`` + its UTF-8 bytes + ``<|eos|>``; token id = byte value (see byte_tokenizer.py).

Both models are ``transformers.LlamaForCausalLM`` trained from a fixed seed with AdamW,
linear warm-up then cosine decay, bf16 autocast on CUDA. A wall-clock budget per model caps
the step count (measured after the warm-up steps, before the cosine schedule is fixed), so
the whole run fits in about 4 minutes on one H100; the steps actually run are recorded, and
``--steps N --budget-s 0`` repeats a run exactly.

Output (``--out DIR``)::

    DIR/target/{config.json,model.safetensors}   Hugging Face LlamaConfig + bf16 weights
    DIR/draft/{config.json,model.safetensors}
    DIR/tokenizer.json
    DIR/train_summary.json                        corpus, steps, losses, bits/byte, acceptance

GPU run: ``python3 scripts/train_pair.py --out $OUT/pair``.
CPU smoke (seconds): ``python3 scripts/train_pair.py --smoke --out /tmp/pair``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import sys
import sysconfig
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from byte_tokenizer import BOS_ID, EOS_ID, VOCAB_SIZE, write_tokenizer
from pair_acceptance import acceptance_as_dict, measure_acceptance

VAL_EVERY = 40  # validation: files 0, 40, 80, ...; acceptance prompts: 20, 60, 100, ... (2.5% each)
MAX_BYTES = 20_000_000  # both models' saved weights together (issue 5)


@dataclass(frozen=True)
class ModelShape:
    """A Llama shape. head_dim = hidden_size / num_heads must be 64, 128 or 256 (the
    head dims specops.paged_attention serves)."""

    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    intermediate_size: int

    def __post_init__(self):
        if min(self.hidden_size, self.num_layers, self.num_heads, self.num_kv_heads, self.intermediate_size) < 1:
            raise ValueError(f"every ModelShape field must be >= 1, got {self}")
        if self.hidden_size % self.num_heads or self.num_heads % self.num_kv_heads:
            raise ValueError(f"hidden_size must divide by num_heads and num_heads by num_kv_heads, got {self}")


@dataclass(frozen=True)
class TrainConfig:
    """One model's training run."""

    steps: int
    batch_size: int
    seq_len: int
    lr: float
    warmup_steps: int
    budget_s: float  # wall-clock cap on training; 0 = run all ``steps``
    min_lr_ratio: float = 0.1
    weight_decay: float = 0.1
    grad_clip: float = 1.0
    log_every: int = 100
    eval_every: int = 250  # steps between validations (the best one's weights are kept)
    val_windows: int = 256  # seq_len-long windows of the validation stream scored at the end
    distill_weight: float = 0.0  # share of the loss that is KL(teacher || model), the rest next-token CE

    def __post_init__(self):
        if min(self.steps, self.batch_size, self.val_windows, self.eval_every, self.log_every) < 1 or self.seq_len < 2:
            raise ValueError(f"steps, batch_size, val_windows, eval_every, log_every must be >= 1 and "
                             f"seq_len >= 2, got {self}")
        if not 0 <= self.warmup_steps < self.steps:
            raise ValueError(f"warmup_steps must be in [0, steps), got {self.warmup_steps} for steps={self.steps}")
        if self.lr <= 0 or self.budget_s < 0 or not 0 <= self.min_lr_ratio <= 1:
            raise ValueError(f"lr must be > 0, budget_s >= 0, min_lr_ratio in [0, 1], got {self}")
        if self.budget_s > 0 and self.warmup_steps < 2:
            raise ValueError("a step budget (budget_s > 0) needs warmup_steps >= 2: the step time is measured "
                             f"during warm-up, got warmup_steps={self.warmup_steps}")
        if not 0 <= self.distill_weight <= 1:
            raise ValueError(f"distill_weight must be in [0, 1], got {self.distill_weight}")


TARGET = ModelShape(hidden_size=384, num_layers=6, num_heads=6, num_kv_heads=2, intermediate_size=768)
DRAFT = ModelShape(hidden_size=256, num_layers=2, num_heads=4, num_kv_heads=2, intermediate_size=512)
TARGET_TRAIN = TrainConfig(steps=4000, batch_size=64, seq_len=512, lr=2e-3, warmup_steps=200, budget_s=125)
# The draft learns partly from the target's distribution: acceptance is agreement with the
# target, not likelihood of the corpus.
DRAFT_TRAIN = TrainConfig(steps=4000, batch_size=64, seq_len=512, lr=3e-3, warmup_steps=200, budget_s=45,
                          distill_weight=0.5)
SMOKE_SHAPE = ModelShape(hidden_size=64, num_layers=1, num_heads=1, num_kv_heads=1, intermediate_size=128)
SMOKE_TRAIN = TrainConfig(steps=12, batch_size=4, seq_len=64, lr=3e-3, warmup_steps=2, budget_s=0, log_every=4,
                          val_windows=16, eval_every=4)
SMOKE_DRAFT_TRAIN = replace(SMOKE_TRAIN, distill_weight=0.5)
MAX_POSITIONS = 2048
# Acceptance measure: (prompts, prompt bytes, greedy target tokens per prompt).
EVAL = (64, 128, 64)
SMOKE_EVAL = (4, 32, 16)


def stdlib_files(limit: int | None = None) -> tuple[Path, list[Path]]:
    """The stdlib root and its non-empty ``.py`` files sorted by relative path (site-packages
    out; empty ``__init__.py`` files would only teach BOS followed by EOS)."""
    root = Path(sysconfig.get_paths()["stdlib"])
    files = []
    for folder, subfolders, names in os.walk(root):
        subfolders[:] = [s for s in subfolders if s not in ("site-packages", "dist-packages", "__pycache__")]
        files += [Path(folder) / n for n in names if n.endswith(".py") and os.path.getsize(Path(folder) / n) > 0]
    files.sort(key=lambda f: f.relative_to(root).as_posix())
    if not files:
        raise RuntimeError(f"no .py files under the stdlib folder {root}")
    return root, files[:limit]


SPLITS = ("train", "val", "heldout")


def load_corpus(files: list[Path]) -> tuple[dict[str, torch.Tensor], dict]:
    """Train, validation and held-out (acceptance) token streams, int16 (ids go to 257).

    Shape: -> {"train": [num_train_tokens], "val": [...], "heldout": [...]}.
    """
    docs: dict[str, list[bytes]] = {split: [] for split in SPLITS}
    for index, path in enumerate(files):
        split = {0: "val", VAL_EVERY // 2: "heldout"}.get(index % VAL_EVERY, "train")
        docs[split].append(path.read_bytes())
    if not docs["val"] or not docs["heldout"]:
        raise RuntimeError(f"{len(files)} files are too few to hold out validation and acceptance files")
    streams = {split: _token_stream(docs[split]) for split in SPLITS}
    info = {"files": len(files)}
    for split in SPLITS:
        info.update({f"{split}_files": len(docs[split]), f"{split}_tokens": streams[split].numel()})
    return streams, info


def _token_stream(docs: list[bytes]) -> torch.Tensor:
    """``<|bos|> doc <|eos|>`` for every doc, back to back. Shape: -> [num_tokens] int16."""
    lengths = torch.tensor([len(d) + 2 for d in docs], dtype=torch.int64)
    ends = lengths.cumsum(0)
    starts = ends - lengths
    stream = torch.empty(int(ends[-1]), dtype=torch.int16)
    is_byte = torch.ones_like(stream, dtype=torch.bool)
    is_byte[starts] = False
    is_byte[ends - 1] = False
    stream[is_byte] = torch.frombuffer(bytearray(b"".join(docs)), dtype=torch.uint8).to(torch.int16)
    stream[starts] = BOS_ID
    stream[ends - 1] = EOS_ID
    return stream


def llama_config(shape: ModelShape):
    from transformers import LlamaConfig

    return LlamaConfig(
        vocab_size=VOCAB_SIZE, hidden_size=shape.hidden_size, intermediate_size=shape.intermediate_size,
        num_hidden_layers=shape.num_layers, num_attention_heads=shape.num_heads,
        num_key_value_heads=shape.num_kv_heads, head_dim=shape.hidden_size // shape.num_heads,
        max_position_embeddings=MAX_POSITIONS, rms_norm_eps=1e-5, bos_token_id=BOS_ID, eos_token_id=EOS_ID,
        tie_word_embeddings=False, architectures=["LlamaForCausalLM"], dtype="bfloat16",
    )


def lr_at(step: int, cfg: TrainConfig, total_steps: int) -> float:
    """Linear warm-up to cfg.lr, then cosine decay to cfg.lr * min_lr_ratio at total_steps."""
    if step < cfg.warmup_steps:
        return cfg.lr * (step + 1) / cfg.warmup_steps
    progress = (step - cfg.warmup_steps) / max(1, total_steps - cfg.warmup_steps)
    return cfg.lr * (cfg.min_lr_ratio + (1 - cfg.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * min(1.0, progress))))


def random_windows(stream: torch.Tensor, cfg: TrainConfig, generator: torch.Generator) -> torch.Tensor:
    """Shape: stream [num_tokens] int16 (on device) -> [batch_size, seq_len + 1] int64."""
    starts = torch.randint(0, stream.numel() - cfg.seq_len - 1, (cfg.batch_size,), generator=generator,
                           device=stream.device)
    return stream[starts[:, None] + torch.arange(cfg.seq_len + 1, device=stream.device)].long()


def next_token_loss(model, windows: torch.Tensor, autocast: bool, teacher=None, distill_weight: float = 0.0
                    ) -> torch.Tensor:
    """Next-token cross-entropy, mixed with KL(teacher || model) when a teacher is given.

    Shape: windows [batch, seq_len + 1] int64.
    """
    with torch.autocast("cuda", dtype=torch.bfloat16, enabled=autocast):
        logits = model(input_ids=windows[:, :-1], use_cache=False).logits
    log_probs = logits.float().flatten(0, 1).log_softmax(-1)
    loss = F.nll_loss(log_probs, windows[:, 1:].flatten())
    if teacher is None or distill_weight == 0:
        return loss
    with torch.no_grad(), torch.autocast("cuda", dtype=torch.bfloat16, enabled=autocast):
        teacher_logits = teacher(input_ids=windows[:, :-1], use_cache=False).logits
    teacher_log_probs = teacher_logits.float().flatten(0, 1).log_softmax(-1)
    kl = F.kl_div(log_probs, teacher_log_probs, log_target=True, reduction="batchmean")
    return (1 - distill_weight) * loss + distill_weight * kl


@torch.no_grad()
def validate(model, val: torch.Tensor, cfg: TrainConfig, autocast: bool, teacher=None) -> tuple[float, float]:
    """(next-byte loss in bits per byte, training objective in bits) over the first
    ``cfg.val_windows`` consecutive validation windows (1 token = 1 byte)."""
    model.eval()
    num_windows = min(cfg.val_windows, (val.numel() - 1) // cfg.seq_len)
    if num_windows < 1:
        raise RuntimeError(f"the validation stream ({val.numel()} tokens) is shorter than one window")
    windows = val[: num_windows * cfg.seq_len + 1].long()
    cross_entropy, objective = [], []
    for start in range(0, num_windows, 16):
        rows = torch.stack([windows[i * cfg.seq_len: (i + 1) * cfg.seq_len + 1]
                            for i in range(start, min(num_windows, start + 16))])
        cross_entropy.append(next_token_loss(model, rows, autocast) * rows.shape[0])
        objective.append(next_token_loss(model, rows, autocast, teacher, cfg.distill_weight) * rows.shape[0]
                         if teacher is not None and cfg.distill_weight > 0 else cross_entropy[-1])
    model.train()
    return tuple((torch.stack(v).sum() / num_windows / math.log(2)).item() for v in (cross_entropy, objective))


def train_one(name: str, shape: ModelShape, cfg: TrainConfig, train: torch.Tensor, val: torch.Tensor,
              device: torch.device, seed: int, teacher=None):
    """Train one model (distilling from ``teacher`` when cfg.distill_weight > 0); returns
    it (fp32, on device) with the weights of the step whose validation objective was best,
    and its record for the summary."""
    from transformers import LlamaForCausalLM

    torch.manual_seed(seed)
    model = LlamaForCausalLM(llama_config(shape)).to(device)
    model.train()
    params = sum(p.numel() for p in model.parameters())
    decay = [p for p in model.parameters() if p.ndim >= 2]
    no_decay = [p for p in model.parameters() if p.ndim < 2]
    optimizer = torch.optim.AdamW(
        [{"params": decay, "weight_decay": cfg.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
        lr=cfg.lr, betas=(0.9, 0.95), fused=device.type == "cuda",
    )
    generator = torch.Generator(device=device).manual_seed(seed + 1)
    autocast = device.type == "cuda"
    if teacher is not None:
        teacher.eval()
    total_steps, log, val_log, start, calibrated = cfg.steps, [], [], time.perf_counter(), cfg.budget_s == 0
    best = (math.inf, 0, None)  # (validation objective, step, weights)
    calibrate_from, calibrate_at = max(1, min(10, cfg.warmup_steps // 2)), min(50, cfg.warmup_steps)
    print(f"[{name}] {params / 1e6:.2f}M params, {shape}", flush=True)
    step = 0
    while step < total_steps:
        for group in optimizer.param_groups:
            group["lr"] = lr_at(step, cfg, total_steps)
        loss = next_token_loss(model, random_windows(train, cfg, generator), autocast, teacher, cfg.distill_weight)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
        optimizer.step()
        step += 1
        if not calibrated and step in (calibrate_from, calibrate_at):
            # Cap the steps to the budget before the cosine schedule starts to depend on them;
            # the first steps (CUDA start-up) are left out of the per-step time.
            if device.type == "cuda":
                torch.cuda.synchronize()
            if step == calibrate_from:
                calibrate_start = time.perf_counter()
                continue
            per_step = (time.perf_counter() - calibrate_start) / (calibrate_at - calibrate_from)
            budget_left = cfg.budget_s - (time.perf_counter() - start)
            total_steps = max(cfg.warmup_steps + 1, min(cfg.steps, step + int(budget_left / per_step)))
            calibrated = True
            print(f"[{name}] {per_step * 1e3:.1f} ms/step -> {total_steps} steps", flush=True)
        if step % cfg.log_every == 0 or step == total_steps:
            elapsed = time.perf_counter() - start
            tokens_per_s = step * cfg.batch_size * cfg.seq_len / elapsed
            log.append({"step": step, "loss": round(loss.item(), 4), "tokens_per_s": round(tokens_per_s)})
            print(f"[{name}] step {step}/{total_steps} loss {loss.item():.4f} {tokens_per_s / 1e3:.0f}k tok/s "
                  f"lr {lr_at(step - 1, cfg, total_steps):.2e}", flush=True)
        if step % cfg.eval_every == 0 or step == total_steps:
            val_bpb, val_objective = validate(model, val, cfg, autocast, teacher)
            val_log.append({"step": step, "val_bits_per_byte": round(val_bpb, 4),
                            "val_objective_bits": round(val_objective, 4)})
            print(f"[{name}] step {step} val {val_bpb:.4f} bits/byte, objective {val_objective:.4f}", flush=True)
            if val_objective < best[0]:
                best = (val_objective, step, {k: v.detach().clone() for k, v in model.state_dict().items()})
    if device.type == "cuda":
        torch.cuda.synchronize()
    train_s = time.perf_counter() - start
    model.load_state_dict(best[2])
    best_val = next(v for v in val_log if v["step"] == best[1])
    print(f"[{name}] {train_s:.1f}s; kept step {best[1]}: val {best_val['val_bits_per_byte']:.4f} bits/byte",
          flush=True)
    record = {"params": params, "shape": asdict(shape), "train": asdict(cfg), "steps_run": total_steps,
              "train_s": round(train_s, 1), "tokens_seen": total_steps * cfg.batch_size * cfg.seq_len,
              "tokens_per_s": round(total_steps * cfg.batch_size * cfg.seq_len / train_s),
              "final_loss": log[-1]["loss"], "kept_step": best[1], "val_bits_per_byte": best_val["val_bits_per_byte"],
              "val_objective_bits": best_val["val_objective_bits"], "val_log": val_log, "log": log}
    return model, record


def save_model(model, folder: Path) -> int:
    """Write config.json (Hugging Face LlamaConfig) and bf16 model.safetensors; returns bytes."""
    from safetensors.torch import save_file

    folder.mkdir(parents=True, exist_ok=True)
    config = model.config.to_dict()
    # Older loaders read these names (transformers 5 writes dtype and rope_parameters).
    config["torch_dtype"] = "bfloat16"
    config["rope_theta"] = config.get("rope_parameters", {}).get("rope_theta", 10000.0)
    (folder / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    tensors = {k: v.detach().to(torch.bfloat16).contiguous().cpu() for k, v in model.state_dict().items()}
    save_file(tensors, folder / "model.safetensors", metadata={"format": "pt"})
    return (folder / "model.safetensors").stat().st_size


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True, help="output folder (target/, draft/, tokenizer.json)")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--steps", type=int, help="steps for each model (default: target 4000, draft 4000)")
    parser.add_argument("--budget-s", type=float, help="wall-clock cap per model in seconds; 0 = none")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--smoke", action="store_true", help="tiny models, few steps, 60 files: CPU in seconds")
    args = parser.parse_args()
    wall_start = time.perf_counter()
    device = torch.device(args.device)
    shapes = {"target": SMOKE_SHAPE if args.smoke else TARGET,
              "draft": SMOKE_SHAPE if args.smoke else DRAFT}
    trains = {"target": SMOKE_TRAIN if args.smoke else TARGET_TRAIN,
              "draft": SMOKE_DRAFT_TRAIN if args.smoke else DRAFT_TRAIN}
    for name, cfg in trains.items():
        if args.steps is not None:
            cfg = replace(cfg, steps=args.steps, warmup_steps=min(cfg.warmup_steps, max(2, args.steps // 10)))
        if args.budget_s is not None:
            cfg = replace(cfg, budget_s=args.budget_s)
        trains[name] = cfg

    root, files = stdlib_files(limit=60 if args.smoke else None)
    streams, corpus = load_corpus(files)
    corpus.update(root=str(root), python=platform.python_version(), val_every=VAL_EVERY)
    print(f"corpus: {corpus} ({time.perf_counter() - wall_start:.1f}s)", flush=True)
    train, val, heldout = (streams[split].to(device) for split in SPLITS)

    args.out.mkdir(parents=True, exist_ok=True)
    write_tokenizer(args.out / "tokenizer.json")
    records: dict[str, dict] = {}
    target, records["target"] = train_one("target", shapes["target"], trains["target"], train, val, device,
                                          args.seed)
    weight_bytes = save_model(target, args.out / "target")
    draft, records["draft"] = train_one("draft", shapes["draft"], trains["draft"], train, val, device,
                                        args.seed + 10, teacher=target)
    weight_bytes += save_model(draft, args.out / "draft")
    del target, draft
    if weight_bytes > MAX_BYTES:
        raise RuntimeError(f"saved weights take {weight_bytes} bytes, over the {MAX_BYTES} allowed")

    # Acceptance of the models as saved (bf16, reloaded by transformers, as an engine sees them).
    from transformers import LlamaForCausalLM
    from transformers.utils import logging as transformers_logging

    transformers_logging.disable_progress_bar()
    target, draft = (LlamaForCausalLM.from_pretrained(args.out / n, dtype=torch.bfloat16).to(device)
                     for n in ("target", "draft"))
    num_prompts, prompt_len, gen_len = SMOKE_EVAL if args.smoke else EVAL
    # Prompts from the held-out files (never trained on nor used to pick weights), spread out.
    stride = (heldout.numel() - prompt_len) // num_prompts
    prompts = torch.stack([heldout[i * stride: i * stride + prompt_len] for i in range(num_prompts)]).long()
    acceptance = acceptance_as_dict(measure_acceptance(target, draft, prompts, gen_len, k=4))
    print(f"acceptance: {json.dumps(acceptance)}", flush=True)

    summary = {
        "command": " ".join([os.path.basename(sys.executable)] + sys.argv),
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor() or "cpu",
        "torch": torch.__version__, "transformers": __import__("transformers").__version__, "seed": args.seed,
        "smoke": args.smoke, "vocab_size": VOCAB_SIZE, "bos_token_id": BOS_ID, "eos_token_id": EOS_ID,
        "corpus": corpus, "weight_bytes": weight_bytes, "target": records["target"], "draft": records["draft"],
        "acceptance": acceptance, "wall_s": round(time.perf_counter() - wall_start, 1),
    }
    (args.out / "train_summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    print(f"wrote {args.out} ({weight_bytes / 1e6:.1f} MB of weights) in {summary['wall_s']}s", flush=True)


if __name__ == "__main__":
    main()
