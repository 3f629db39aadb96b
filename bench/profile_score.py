"""Kernel times of the llama-1b scoring step (one target forward over B windows of k + 1
tokens at context L, replayed from its CUDA graph), by kernel, for both scorers: where the
step's time goes (bench/NOTES.md quotes these splits).

    python bench/profile_score.py                      # B=32 k=4 L=1024
    python bench/profile_score.py --steps compiled     # A/B: RoPE and silu * up through torch.compile
"""

from __future__ import annotations

import argparse

import torch

import common
import specops.engine.model as model_module
from bench_e2e import BLOCK_SIZE, LLAMA_1B
from profile_verify import call_kernel_times
from specops import ops
from specops.engine.checkpoint import random_model
from specops.engine.kv_cache import SequenceChunk, build_attention_batch
from specops.engine.scorer import ScorerKind
from specops.engine.spec_decode import EngineConfig, SpecDecodeEngine


def compiled_steps() -> model_module.ElementwiseSteps:
    """The steps before the Triton kernels: all four through torch.compile, the cache
    writes by reshape_and_cache."""
    rope_qkv = model_module._compile_step(model_module.rope_qkv)

    def rope_cache(qkv, cos, sin, num_heads, num_kv_heads, key_cache, value_cache, slot_mapping, validate):
        q, k, v = rope_qkv(qkv, cos, sin, num_heads, num_kv_heads)
        ops.reshape_and_cache(k, v, key_cache, value_cache, slot_mapping, validate=validate)
        return q

    return model_module.ElementwiseSteps(
        model_module._compile_step(model_module.rms_norm), model_module._compile_step(model_module.add_rms_norm),
        rope_cache, model_module._compile_step(model_module.silu_mul))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--k", type=int, default=4)
    parser.add_argument("--context", type=int, default=1024)
    parser.add_argument("--steps", choices=["fast", "compiled"], default="fast")
    parser.add_argument("--replays", type=int, default=20)
    parser.add_argument("--top", type=int, default=14)
    args = parser.parse_args()
    if args.steps == "compiled":
        model_module._fast_steps = compiled_steps()
    device = torch.device("cuda")
    target = random_model(LLAMA_1B, seed=0, dtype=torch.bfloat16, device=device)
    batch, k, context = args.batch, args.k, args.context
    max_len = context + k + 1
    per = -(-max_len // BLOCK_SIZE)
    config = EngineConfig(block_size=BLOCK_SIZE, num_blocks=batch * per, max_num_seqs=batch, max_model_len=max_len,
                          use_cuda_graphs=True)
    engine = SpecDecodeEngine(target, config)
    g = torch.Generator().manual_seed(0)
    blocks = torch.randperm(config.num_blocks, generator=g).tolist()
    chunks = [SequenceChunk(torch.randint(0, LLAMA_1B.vocab_size, (k + 1,), generator=g).tolist(), context,
                            blocks[b * per:(b + 1) * per], k + 1) for b in range(batch)]
    runner = engine.scorer.runner
    for kind in ScorerKind:
        attn = build_attention_batch(chunks, BLOCK_SIZE, engine.max_blocks, device,
                                     expand=kind is ScorerKind.BATCH_EXPANSION)
        fn = lambda a=attn: runner(a, use_graph=True)  # noqa: E731
        fn()
        us = common.time_us(fn, device)
        times = call_kernel_times(fn, args.replays, warmup=10)  # the runner replays its own graph
        print(f"{kind.value} B={batch} k={k} L={context} ({args.steps} steps): graph replay {us:.1f} us, "
              f"kernels {sum(times.values()):.1f} us in {len(times)} kernel names")
        for name, kernel_us in sorted(times.items(), key=lambda item: -item[1])[:args.top]:
            print(f"  {kernel_us:7.1f}  {name[:100]}")


if __name__ == "__main__":
    main()
