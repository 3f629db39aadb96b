"""End-to-end speculative decoding with the specops engine (bench "e2e", engine shape keys
``model proposer scorer B k``), plus the target scoring step alone (bench "score").

e2e rows: B requests decode together (greedy, EOS ignored) for a fixed number of steps
after warm-up, all B running throughout; ``tokens_per_s`` counts emitted tokens over the
timed steps (prompts excluded), ``us`` is the median step time, and the acceptance metrics
come from the same steps. Proposers: none (target alone), n-gram, draft model; scorers:
paged multi-query verify and batch expansion. Decode/verify forward passes replay CUDA
graphs (prefill runs eagerly).

score rows: one target forward over B windows of k + 1 new tokens at context L (1024 for
every B and k; also 4096 at B=32 k=4: --score-contexts), captured in a CUDA graph and
replayed (``us``: the median of SCORE_ROUNDS rounds over the two scorers in turn;
``us_eager`` beside it): the step the two scorers differ in. Target: paged verify >= 1.4x
faster than batch expansion at B=32, k=4.

Models: "pair" (the embedded byte-level target/draft, bf16; prompts are slices of this
repository's Python files) and "llama-1b" (a random-weight Llama-3.2-1B-shaped target with a
random 2-layer draft of the same vocabulary; prompts are random tokens with repeated
phrases). Its acceptance is an artefact of random weights, not a property of the engine
(a reduced-size CPU run accepted every draft of both proposers; the H100 run of
bench/results/e2e-h100-20261123.json accepted no draft-model token and ~17% of n-gram
drafts), so its rows show the engine's cost per step, not realistic acceptance.

    python3 bench/bench_e2e.py --out bench/results [--quick]
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import common
import torch

from specops.engine.checkpoint import load_model, random_model
from specops.engine.config import LlamaConfig, RopeScaling
from specops.engine.kv_cache import SequenceChunk, build_attention_batch
from specops.engine.request import Request
from specops.engine.scorer import ScorerKind
from specops.engine.spec_decode import EngineConfig, ProposerKind, SpecDecodeEngine

LLAMA_1B = LlamaConfig(vocab_size=128256, hidden_size=2048, intermediate_size=8192, num_hidden_layers=16,
                       num_attention_heads=32, num_key_value_heads=8, head_dim=64, rms_norm_eps=1e-5,
                       rope_theta=500000.0, rope_scaling=RopeScaling(32.0, 1.0, 4.0, 8192),
                       max_position_embeddings=8192, tie_word_embeddings=True)
LLAMA_1B_DRAFT = LlamaConfig(vocab_size=128256, hidden_size=512, intermediate_size=1536, num_hidden_layers=2,
                             num_attention_heads=8, num_key_value_heads=2, head_dim=64, rope_theta=500000.0,
                             max_position_embeddings=8192, tie_word_embeddings=True)
PROMPT_LEN = 256
SCORE_ROUNDS = 5
BLOCK_SIZE = 16


def load_models(name: str, device: str, dtype: torch.dtype):
    if name == "pair":
        from specops.assets import pair_path

        target = load_model(pair_path() / "target", dtype=dtype, device=device)
        draft = load_model(pair_path() / "draft", dtype=dtype, device=device)
        return target.model, draft.model
    return (random_model(LLAMA_1B, seed=0, dtype=dtype, device=device),
            random_model(LLAMA_1B_DRAFT, seed=1, dtype=dtype, device=device))


def prompts(name: str, batch: int) -> list[tuple[int, ...]]:
    g = torch.Generator().manual_seed(batch)
    if name == "pair":
        text = b"".join(p.read_bytes() for p in sorted((common.REPO_ROOT / "specops").rglob("*.py")))
        starts = torch.randint(0, len(text) - PROMPT_LEN, (batch,), generator=g).tolist()
        return [(256, *text[s:s + PROMPT_LEN - 1]) for s in starts]  # <bos> + bytes
    out = []
    for _ in range(batch):
        phrases = [torch.randint(0, LLAMA_1B.vocab_size, (8,), generator=g).tolist() for _ in range(4)]
        ids = [t for _ in range(PROMPT_LEN // 8) for t in phrases[int(torch.randint(0, 4, (1,), generator=g))]]
        out.append(tuple(ids[:PROMPT_LEN]))
    return out


def run_e2e(target, draft, name: str, proposer: ProposerKind, scorer: ScorerKind, batch: int, k: int,
            warmup_steps: int, timed_steps: int, device: str) -> dict:
    max_tokens = (warmup_steps + timed_steps + 1) * (k + 1)
    max_len = PROMPT_LEN + max_tokens + k
    config = EngineConfig(proposer=proposer, k=k, scorer=scorer, block_size=BLOCK_SIZE,
                          num_blocks=batch * -(-max_len // BLOCK_SIZE), max_num_seqs=batch, max_model_len=max_len,
                          use_cuda_graphs=device == "cuda", seed=0)
    engine = SpecDecodeEngine(target, config, draft=draft)
    for p in prompts(name, batch):
        engine.add_request(Request(p, max_tokens=max_tokens, ignore_eos=True))
    for _ in range(warmup_steps):  # prefill, then graph captures
        engine.step()
    engine.metrics = type(engine.metrics)(k)
    emitted_before = sum(s.num_output_tokens for s in engine.running)
    times = []
    torch.cuda.synchronize() if device == "cuda" else None
    start = time.perf_counter()
    for _ in range(timed_steps):
        t0 = time.perf_counter()
        engine.step()  # ends in a host read of the sampled tokens: the step is complete
        times.append((time.perf_counter() - t0) * 1e6)
    elapsed = time.perf_counter() - start
    if len(engine.running) != batch:
        raise RuntimeError("a request finished inside the timed steps: max_tokens too small")
    emitted = sum(s.num_output_tokens for s in engine.running) - emitted_before
    m = engine.metrics
    return {"bench": "e2e", "impl": f"specops-{device}", "model": name, "proposer": proposer.value,
            "scorer": scorer.value if proposer is not ProposerKind.NONE else "none", "B": batch, "k": k,
            "us": round(statistics.median(times), 1), "tokens_per_s": round(emitted / elapsed, 1),
            "acceptance_rate": round(m.acceptance_rate, 4), "mean_accepted_length": round(m.mean_accepted_length, 3),
            "system_efficiency": round(m.system_efficiency, 4),
            "per_position_acceptance": [None if x is None else round(x, 3) for x in m.per_position_acceptance]}


def run_score(target, name: str, batch: int, k: int, context: int, device: str) -> list[dict]:
    """Time one target forward over B windows of k + 1 tokens at context ``context``, both
    layouts: SCORE_ROUNDS rounds over the two in turn (``us`` is the median of the rounds,
    ``rounds_us`` each), so a drift of the machine hits both alike."""
    max_len = context + k + 1
    config = EngineConfig(block_size=BLOCK_SIZE, num_blocks=batch * -(-max_len // BLOCK_SIZE), max_num_seqs=batch,
                          max_model_len=max_len, use_cuda_graphs=device == "cuda")
    engine = SpecDecodeEngine(target, config)
    g = torch.Generator().manual_seed(0)
    blocks = torch.randperm(config.num_blocks, generator=g).tolist()  # shuffled, as a busy cache is
    per = -(-max_len // BLOCK_SIZE)
    # The K/V values do not change the work: the cache stays zeros, the windows are random tokens.
    chunks = [SequenceChunk(torch.randint(0, target.config.vocab_size, (k + 1,), generator=g).tolist(), context,
                            blocks[b * per:(b + 1) * per], k + 1) for b in range(batch)]
    runner = engine.scorer.runner
    dev = torch.device(device)
    batches = {kind: build_attention_batch(chunks, BLOCK_SIZE, engine.max_blocks, device,
                                           expand=kind is ScorerKind.BATCH_EXPANSION) for kind in ScorerKind}
    graph_rounds = {kind: [] for kind in ScorerKind}
    for _ in range(SCORE_ROUNDS if device == "cuda" else 0):
        for kind, attn in batches.items():
            graph_rounds[kind].append(common.time_us(lambda a=attn: runner(a, use_graph=True), dev))
    rows = []
    for kind, attn in batches.items():
        us_eager = common.time_us(lambda a=attn: runner(a, use_graph=False), dev, warmup=3, iters=10)
        us = statistics.median(graph_rounds[kind]) if graph_rounds[kind] else us_eager
        rows.append({"bench": "score", "impl": f"specops-{device}", "model": name, "scorer": kind.value, "B": batch,
                     "k": k, "L": context, "us": round(us, 1), "rounds_us": [round(t, 1) for t in graph_rounds[kind]],
                     "us_eager": round(us_eager, 1)})
    return rows


def plot(rows: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    e2e = [r for r in rows if r["bench"] == "e2e" and "tokens_per_s" in r]
    if not e2e:  # a scoring-only run (--no-e2e)
        plot_score(rows, path)
        return
    panels = sorted({(r["model"], r["B"]) for r in e2e})
    fig, axes = plt.subplots(len(panels), 1, figsize=(12, 3.2 * len(panels)), squeeze=False)
    for ax, (model, batch) in zip(axes[:, 0], panels):
        sub = [r for r in e2e if r["model"] == model and r["B"] == batch]
        labels = [f"{r['proposer']}\n{r['scorer']}\nk={r['k']}" if r["proposer"] != "none" else "target\nalone"
                  for r in sub]
        bars = ax.bar(range(len(sub)), [r["tokens_per_s"] for r in sub],
                      color=["gray" if r["proposer"] == "none" else "tab:blue" if r["scorer"] == "paged-verify"
                             else "tab:orange" for r in sub])
        for bar, r in zip(bars, sub):
            if r["proposer"] != "none":
                ax.annotate(f"{r['acceptance_rate']:.2f}", (bar.get_x() + bar.get_width() / 2, bar.get_height()),
                            ha="center", va="bottom", fontsize=6)
        ax.set_xticks(range(len(sub)), labels, fontsize=5)
        ax.set_ylabel("tokens/s")
        ax.set_title(f"{model}, B={batch} (blue: paged verify, orange: batch expansion; label: acceptance)",
                     fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=130)


def plot_score(rows: list[dict], path: Path) -> None:
    """The scoring-step rows: paged verify against batch expansion per (model, B, k, L)."""
    import matplotlib.pyplot as plt

    score = [r for r in rows if r["bench"] == "score" and "us" in r]
    shapes = sorted({(r["model"], r["B"], r["k"], r["L"]) for r in score})
    fig, ax = plt.subplots(figsize=(max(6, 1.6 * len(shapes)), 3.5))
    for offset, scorer, color in ((-0.2, "paged-verify", "tab:blue"), (0.2, "batch-expansion", "tab:orange")):
        us = [next((r["us"] for r in score if (r["model"], r["B"], r["k"], r["L"]) == s and r["scorer"] == scorer),
                   0.0) for s in shapes]
        ax.bar([i + offset for i in range(len(shapes))], us, width=0.4, color=color, label=scorer)
    ax.set_xticks(range(len(shapes)), [f"{m}\nB={b} k={k}\nL={L}" for m, b, k, L in shapes], fontsize=7)
    ax.set_ylabel("scoring step, µs (graph replay)")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=130)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=str(common.REPO_ROOT / "bench" / "results"))
    parser.add_argument("--quick", action="store_true", help="B 1/32, k 4, fewer steps (~3 minutes on an H100)")
    parser.add_argument("--models", default="pair,llama-1b")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--batches", default=None, help="comma-separated B (default 1,8,32; quick 1,32)")
    parser.add_argument("--ks", default=None, help="comma-separated k (default 2,4,8; quick 4)")
    parser.add_argument("--score-contexts", default="1024,4096", type=lambda v: [int(c) for c in v.split(",")],
                        help="contexts of the scoring-step rows: every B and k at 1024, B=32 k=4 at the others")
    parser.add_argument("--no-e2e", action="store_true", help="only the scoring-step rows")
    args = parser.parse_args()
    device = args.device
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    batches = [int(b) for b in (args.batches or ("1,32" if args.quick else "1,8,32")).split(",")]
    ks = [int(k) for k in (args.ks or ("4" if args.quick else "2,4,8")).split(",")]
    warmup, timed = (3, 8) if args.quick else (4, 24)
    env = common.env_stamp(torch.device(device))
    rows = []
    for name in args.models.split(","):
        target, draft = load_models(name, device, dtype)
        configs = [(ProposerKind.NONE, ScorerKind.PAGED_VERIFY, b, 0) for b in batches]
        configs += [(p, s, b, k) for p in (ProposerKind.NGRAM, ProposerKind.DRAFT) for s in ScorerKind
                    for b in batches for k in ks]
        for proposer, scorer, batch, k in ([] if args.no_e2e else configs):
            try:
                row = run_e2e(target, draft if proposer is ProposerKind.DRAFT else None, name, proposer, scorer,
                              batch, k, warmup, timed, device)
            except Exception as error:  # noqa: BLE001 -- one failing config must not lose the run: record, go on
                print(f"{name} {proposer.value} {scorer.value} B={batch} k={k}: FAILED {error!r}", flush=True)
                rows.append({"bench": "e2e", "impl": f"specops-{device}", "model": name, "proposer": proposer.value,
                             "scorer": scorer.value, "B": batch, "k": k, "note": f"failed: {error!r}"[:300]})
                continue
            rows.append(row)
            print(f"{name:9s} {row['proposer']:6s} {row['scorer']:16s} B={batch:3d} k={k} "
                  f"{row['tokens_per_s']:10.1f} tok/s  step {row['us']:9.1f} us  acc {row['acceptance_rate']:.3f}  "
                  f"eff {row['system_efficiency']:.3f}", flush=True)
        score_shapes = [(b, k, 1024) for b in ([32] if args.quick else batches) for k in ([4] if args.quick else ks)]
        # Longer contexts where the model's positions reach them (k + 1 = 5 new tokens; the pair's: 2048).
        score_shapes += [(32, 4, context) for context in args.score_contexts
                         if context != 1024 and context + 5 <= target.config.max_position_embeddings]
        for batch, k, context in score_shapes:
            try:
                paged, expanded = run_score(target, name, batch, k, context, device)
            except Exception as error:  # noqa: BLE001 -- as above
                print(f"{name} score B={batch} k={k} L={context}: FAILED {error!r}", flush=True)
                rows.append({"bench": "score", "impl": f"specops-{device}", "model": name, "B": batch, "k": k,
                             "L": context, "note": f"failed: {error!r}"[:300]})
                continue
            rows += [paged, expanded]
            print(f"{name:9s} score B={batch:3d} k={k} L={context}: paged verify {paged['us']:.1f} us, batch "
                  f"expansion {expanded['us']:.1f} us ({common.speedup(expanded['us'], paged['us'])})", flush=True)
        del target, draft
        torch.cuda.empty_cache() if device == "cuda" else None
    path = common.write_results("e2e", env, rows, args.out)
    print(f"wrote {path}")
    try:
        plot(rows, path.with_suffix(".png"))
        print(f"wrote {path.with_suffix('.png')}")
    except ImportError:
        print("matplotlib missing: no PNG")


if __name__ == "__main__":
    main()
