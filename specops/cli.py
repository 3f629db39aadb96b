"""``specops generate`` (also ``python -m specops``): speculative decoding from the command line.

With no flags it runs the embedded byte-level pair (draft model proposing k = 4 tokens).
Tokens that came from accepted drafts are shown in green (``--color``), target-sampled
ones plainly; a progress line on stderr shows steps, tokens/s and acceptance.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence

import torch

from specops.engine.checkpoint import load_model
from specops.engine.outputs import IncrementalDetokenizer
from specops.engine.rejection_sampler import SamplingParams
from specops.engine.request import Request, SequenceState, TokenSource
from specops.engine.scorer import ScorerKind
from specops.engine.spec_decode import EngineConfig, ProposerKind, SpecDecodeEngine

GREEN, RESET = "\033[32m", "\033[0m"
DEFAULT_PROMPTS = ("def fibonacci(n):\n", "import os\n\n\nclass ")


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="specops generate", description=__doc__.splitlines()[0])
    parser.add_argument("--target", help="Hugging Face Llama folder (default: the embedded pair's target)")
    source = parser.add_mutually_exclusive_group()
    source.add_argument("--draft", help="draft model folder (default with no --target: the embedded draft)")
    source.add_argument("--ngram", action="store_true", help="n-gram prompt lookup instead of a draft model")
    source.add_argument("--no-spec", action="store_true", help="target alone (no speculation)")
    parser.add_argument("--k", type=int, default=4, help="drafts per step")
    parser.add_argument("--scorer", choices=[s.value for s in ScorerKind], default=ScorerKind.PAGED_VERIFY.value)
    parser.add_argument("--prompt", action="append", help="prompt text (repeat for a batch)")
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--temperature", type=float, default=0.0, help="0 = greedy")
    parser.add_argument("--top-k", type=int, default=0)
    parser.add_argument("--top-p", type=float, default=1.0)
    parser.add_argument("--seed", type=int, default=None, help="per-request seeds seed, seed+1, ...")
    parser.add_argument("--stop", action="append", default=[], help="stop string (repeatable)")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--dtype", choices=["float32", "bfloat16", "float16"], default=None,
                        help="default: bfloat16 on CUDA, float32 on the CPU")
    parser.add_argument("--cuda-graphs", action="store_true", help="replay decode/verify steps from CUDA graphs")
    parser.add_argument("--color", choices=["auto", "always", "never"], default="auto")
    return parser.parse_args(argv)


def build_engine(args: argparse.Namespace) -> tuple[SpecDecodeEngine, object]:
    target_path, draft_path = args.target, args.draft
    if target_path is None:
        from specops.assets import pair_path

        pair = pair_path()
        target_path = pair / "target"
        if draft_path is None and not args.ngram and not args.no_spec:
            draft_path = pair / "draft"
    dtype = getattr(torch, args.dtype) if args.dtype else (torch.bfloat16 if args.device.startswith("cuda")
                                                           else torch.float32)
    target = load_model(target_path, dtype=dtype, device=args.device)
    if target.tokenizer is None:
        raise SystemExit(f"{target_path} has no tokenizer.json (nor has its parent folder)")
    draft = load_model(draft_path, dtype=dtype, device=args.device).model if draft_path else None
    proposer = ProposerKind.DRAFT if draft is not None else ProposerKind.NGRAM if args.ngram else ProposerKind.NONE
    k = 0 if proposer is ProposerKind.NONE else args.k
    prompts = args.prompt or list(DEFAULT_PROMPTS)
    longest = max(len(target.tokenizer.encode(p).ids) for p in prompts) + 1
    max_len = min(target.config.max_position_embeddings, longest + args.max_tokens + k)
    block_size = 16
    config = EngineConfig(proposer=proposer, k=k, scorer=ScorerKind(args.scorer), block_size=block_size,
                          num_blocks=len(prompts) * -(-max_len // block_size), max_num_seqs=len(prompts),
                          max_model_len=max_len, use_cuda_graphs=args.cuda_graphs, seed=args.seed)
    return SpecDecodeEngine(target.model, config, draft=draft, tokenizer=target.tokenizer), target


def encode(tokenizer, config, text: str) -> tuple[int, ...]:
    ids = tokenizer.encode(text).ids
    # Models trained on <bos> + document expect it first; add it when the tokenizer did not.
    if config.bos_token_id is not None and (not ids or ids[0] != config.bos_token_id):
        ids = [config.bos_token_id, *ids]
    return tuple(ids)


def render(state: SequenceState, tokenizer, color: bool) -> str:
    """The output text, spans from accepted drafts in green."""
    detok = IncrementalDetokenizer(lambda ids: tokenizer.decode(ids, skip_special_tokens=True),
                                   state.request.prompt_token_ids)
    pieces = []
    for token, source in zip(state.output_token_ids, state.sources):
        text = detok.push(token)
        pieces.append(f"{GREEN}{text}{RESET}" if color and text and source is TokenSource.DRAFT else text)
    pieces.append(detok.flush())
    out = "".join(pieces)
    # Stop strings cut the final text; cut the rendering at the same length of plain text.
    if state.text != "".join(p.replace(GREEN, "").replace(RESET, "") for p in pieces):
        return state.text
    return out


def main(argv: Sequence[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv[1:] if argv[:1] == ["generate"] else argv)
    if args.k < 1:
        raise SystemExit("--k must be >= 1")
    engine, target = build_engine(args)
    prompts = args.prompt or list(DEFAULT_PROMPTS)
    requests = [
        Request(encode(target.tokenizer, target.config, p), max_tokens=args.max_tokens,
                sampling=SamplingParams(args.temperature, args.top_k, args.top_p,
                                        None if args.seed is None else args.seed + i),
                stop_strings=tuple(args.stop))
        for i, p in enumerate(prompts)
    ]
    start = time.perf_counter()
    tty = sys.stderr.isatty()

    def progress(e: SpecDecodeEngine) -> None:
        m = e.metrics
        done = sum(s.num_output_tokens for s in states)
        line = (f"step {m.num_steps:4d} | running {len(e.running)} | {done} tokens | "
                f"{done / (time.perf_counter() - start):7.1f} tok/s | acceptance {m.acceptance_rate:.2f}")
        print(("\r" + line) if tty else line, end="" if tty else "\n", file=sys.stderr, flush=True)

    states = [engine.add_request(r) for r in requests]
    while engine.has_unfinished:
        engine.step()
        progress(engine)
    elapsed = time.perf_counter() - start
    if tty:
        print(file=sys.stderr)
    color = args.color == "always" or (args.color == "auto" and sys.stdout.isatty())
    for prompt, state in zip(prompts, states):
        print(f"--- prompt: {prompt!r} ({state.finish_reason.value})")
        print(prompt + render(state, target.tokenizer, color))
    m = engine.metrics
    total = sum(s.num_output_tokens for s in states)
    print(f"--- {total} tokens in {elapsed:.2f} s ({total / elapsed:.1f} tok/s); proposer {engine.config.proposer.value}, "
          f"k {engine.config.k}, scorer {engine.config.scorer.value}")
    if engine.config.k:
        positions = " ".join("-" if a is None else f"{a:.2f}" for a in m.per_position_acceptance)
        print(f"--- acceptance {m.acceptance_rate:.3f}, mean accepted length {m.mean_accepted_length:.2f}, "
              f"system efficiency {m.system_efficiency:.3f}, per position [{positions}]"
              + (f"; {GREEN}green{RESET}: accepted drafts" if color else ""))


if __name__ == "__main__":
    main()
