"""What validate=True costs an eager specops.verify and specops.paged_attention call: the
value checks alone (the ops torch.ops.specops.sampling_value_stats and
paged_attention_value_stats; for verify the torch statistics of reference/checks.py it falls
back to; with --old, a previous specops/_checks.py's checks), then the op with and without
them. Every call is followed by its sync, as an engine that reads its tokens each step
does; medians over rounds of back-to-back calls, µs. Usage (GPU):

    python bench/validate_cost.py [--old path/to/old_checks.py] [--out DIR]
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import sys
import time

import torch
from ab_verify import shape_call
from bench_attention import Batch

import common
import specops
from specops import _checks
from specops.reference import checks as reference_checks

SHAPES = ["1:4:128256:random", "64:4:128256:random", "64:4:128256:random:topk50:topp0.9"]
ATTENTION_SHAPES = [(1, 4096, 1), (64, 1024, 5), (128, 4096, 1)]  # (B, L, q_len), bench_attention's heads


def per_call_us(fn, rounds: int, calls: int) -> float:
    for _ in range(10):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(rounds):
        start = time.perf_counter()
        for _ in range(calls):
            fn()
            torch.cuda.synchronize()
        times.append((time.perf_counter() - start) / calls * 1e6)
    return statistics.median(times)


def load_old_checks(path: str):
    spec = importlib.util.spec_from_file_location("old_checks", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--old", help="a previous specops/_checks.py (its ValueCheck form)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--calls", type=int, default=100)
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    device = torch.device("cuda")
    old = load_old_checks(args.old) if args.old else None
    rows = []
    for shape in SHAPES:
        _, call, logprobs = shape_call(shape, device)
        target, bonus, draft_ids, _, cu, temperature, _, top_p, *_rest = call
        max_spec_len = call[10]
        value_args = (cu, draft_ids.shape[0], max_spec_len, draft_ids, target.shape[-1], target, bonus, temperature,
                      top_p)
        stat_args = (cu, draft_ids, target, bonus, temperature, top_p)
        forms = {
            "checks: sampling_value_stats": lambda: _checks.validate_sampling_values(*value_args),
            "checks: reference statistics": lambda: reference_checks.sampling_value_stats(*stat_args).tolist(),
            "verify, validate=False": lambda: specops.verify(*call, logprobs, validate=False),
            "verify, validate=True": lambda: specops.verify(*call, logprobs),
        }
        if old is not None:
            def old_checks():
                old.validate(old.cu_num_draft_tokens_check(cu, draft_ids.shape[0], max_spec_len),
                             old.token_ids_check(draft_ids, "draft_token_ids", target.shape[-1]),
                             old.verify_values_check(target, bonus, temperature, top_p))
            forms = {"checks: previous (--old)": old_checks, **forms}
        for name, fn in forms.items():
            us = per_call_us(fn, args.rounds, args.calls)
            rows.append({"bench": "validate", "impl": name, "shape": shape, "us": round(us, 1)})
            print(f"{shape:36s} {name:32s} {us:8.1f} us", flush=True)
    for B, L, q_len in ATTENTION_SHAPES:
        x = Batch(B, L, q_len, device, torch.bfloat16)
        call = x.specops_args()
        tables = (x.block_table, x.seq_lens, x.cu_query_lens, call[0].shape[0], x.key_cache.shape[1],
                  x.key_cache.shape[0])
        forms = {
            "checks: paged_attention_value_stats": lambda: _checks.validate_paged_attention_values(*tables),
            "paged_attention, validate=False": lambda: specops.paged_attention(*call, max_query_len=q_len,
                                                                               validate=False),
            "paged_attention, validate=True": lambda: specops.paged_attention(*call, max_query_len=q_len),
        }
        if old is not None:
            forms = {"checks: previous (--old)": lambda: old.validate_paged_attention_values(*tables), **forms}
        shape = f"B={B} L={L} q_len={q_len}"
        for name, fn in forms.items():
            us = per_call_us(fn, args.rounds, args.calls)
            rows.append({"bench": "validate", "impl": name, "shape": shape, "us": round(us, 1)})
            print(f"{shape:36s} {name:36s} {us:8.1f} us", flush=True)
    if args.out:
        env = common.env_stamp(device)
        print("wrote", common.write_results("validate", env, rows, args.out))


if __name__ == "__main__":
    main()
