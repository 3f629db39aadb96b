"""How often the embedded draft agrees with the embedded target (plain torch, no specops).

Measured on held-out prompts: the target continues each prompt greedily, then both models
read prompt + continuation once (teacher forcing) and we compare, at every continuation
position, the draft's argmax with the target's token. Under greedy decoding this
comparison *is* speculative decoding: the draft's j-th proposal in a round sees the
accepted prefix plus its own earlier proposals, which equal the target's tokens exactly as
long as they matched. So walking the match vector in rounds of k gives the acceptance a
greedy spec-decode run of these prompts would see. For sampling at temperature 1 the
expected per-position acceptance is ``sum_v min(p_v, q_v)`` (Leviathan et al. 2023).

Standalone use on a saved pair (folder with target/, draft/)::

    python3 scripts/pair_acceptance.py specops/assets/pair --device cuda
"""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict, dataclass
from pathlib import Path

import torch


@dataclass(frozen=True)
class Acceptance:
    """Agreement of draft and target on the target's greedy continuations."""

    num_prompts: int
    prompt_len: int
    gen_len: int
    k: int
    greedy_match_rate: float  # P(draft argmax == target token), teacher-forced
    greedy_acceptance_rate: float  # accepted drafts / proposed drafts, rounds of k
    mean_accepted_per_round: float  # accepted drafts per verify step (bonus excluded)
    mean_tokens_per_round: float  # emitted tokens per verify step (accepted + 1)
    sampled_acceptance_rate: float  # E[sum_v min(p_v, q_v)] at temperature 1
    per_position_acceptance: list[float]  # P(a round accepts its j-th draft)


@torch.no_grad()
def greedy_continue(model, prompts: torch.Tensor, gen_len: int) -> torch.Tensor:
    """Greedy continuation without a KV cache (short sequences; nothing to get wrong).

    Shape: prompts [num_prompts, prompt_len] int64 -> [num_prompts, gen_len] int64.
    """
    seq = prompts
    for _ in range(gen_len):
        logits = model(input_ids=seq, use_cache=False).logits[:, -1]
        seq = torch.cat([seq, logits.argmax(-1, keepdim=True)], dim=1)
    return seq[:, prompts.shape[1]:]


def rounds_of_k(matches: torch.Tensor, k: int) -> tuple[int, int, int, list[int], list[int]]:
    """Walk each row's match vector in spec-decode rounds of up to k drafts.

    Shape: matches [num_prompts, gen_len] bool.
    Returns (proposed, accepted, rounds, proposed per draft position, accepted per position).
    """
    proposed = accepted = rounds = 0
    proposed_at = [0] * k
    accepted_at = [0] * k
    for row in matches.tolist():
        pos = 0
        while pos < len(row):
            num_drafts = min(k, len(row) - pos)
            run = 0
            while run < num_drafts and row[pos + run]:
                run += 1
            proposed += num_drafts
            accepted += run
            rounds += 1
            for j in range(num_drafts):
                proposed_at[j] += 1
                accepted_at[j] += int(j < run)
            pos += run + 1  # accepted drafts + the target's own token
    return proposed, accepted, rounds, proposed_at, accepted_at


@torch.no_grad()
def measure_acceptance(target, draft, prompts: torch.Tensor, gen_len: int, k: int = 4) -> Acceptance:
    """Greedy and sampled acceptance of ``draft`` against ``target`` on ``prompts``.

    Shape: prompts [num_prompts, prompt_len] int64 on the models' device.
    """
    if prompts.ndim != 2 or prompts.shape[1] < 1:
        raise ValueError(f"prompts must be [num_prompts, prompt_len >= 1], got {tuple(prompts.shape)}")
    if gen_len < 1 or k < 1:
        raise ValueError(f"gen_len and k must be >= 1, got gen_len={gen_len}, k={k}")
    target.eval()
    draft.eval()
    continuation = greedy_continue(target, prompts, gen_len)  # [n, gen_len]
    full = torch.cat([prompts, continuation], dim=1)
    # Logits at position t predict token t + 1: the rows predicting the continuation.
    rows = slice(prompts.shape[1] - 1, full.shape[1] - 1)
    target_logits = target(input_ids=full, use_cache=False).logits[:, rows].float()
    draft_logits = draft(input_ids=full, use_cache=False).logits[:, rows].float()
    matches = draft_logits.argmax(-1) == continuation
    overlap = torch.minimum(target_logits.softmax(-1), draft_logits.softmax(-1)).sum(-1)
    proposed, accepted, rounds, proposed_at, accepted_at = rounds_of_k(matches.cpu(), k)
    return Acceptance(
        num_prompts=prompts.shape[0],
        prompt_len=prompts.shape[1],
        gen_len=gen_len,
        k=k,
        greedy_match_rate=matches.float().mean().item(),
        greedy_acceptance_rate=accepted / proposed,
        mean_accepted_per_round=accepted / rounds,
        mean_tokens_per_round=(accepted + rounds) / rounds,
        sampled_acceptance_rate=overlap.mean().item(),
        per_position_acceptance=[a / p if p else 0.0 for a, p in zip(accepted_at, proposed_at)],
    )


def acceptance_as_dict(acceptance: Acceptance) -> dict:
    return asdict(acceptance)


def main() -> None:
    from transformers import LlamaForCausalLM

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("pair", type=Path, help="folder holding target/ and draft/")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--text", type=Path, required=True, help="a UTF-8 file to cut prompts from")
    parser.add_argument("--num-prompts", type=int, default=32)
    parser.add_argument("--prompt-len", type=int, default=128)
    parser.add_argument("--gen-len", type=int, default=64)
    parser.add_argument("--k", type=int, default=4)
    args = parser.parse_args()
    data = torch.tensor(list(args.text.read_bytes()), dtype=torch.int64)
    if data.numel() < args.num_prompts * args.prompt_len:
        raise ValueError(f"--text holds {data.numel()} bytes, fewer than num_prompts * prompt_len")
    prompts = data[: args.num_prompts * args.prompt_len].view(args.num_prompts, args.prompt_len).to(args.device)
    models = [
        LlamaForCausalLM.from_pretrained(args.pair / name, dtype=torch.bfloat16).to(args.device)
        for name in ("target", "draft")
    ]
    print(json.dumps(acceptance_as_dict(measure_acceptance(*models, prompts, args.gen_len, args.k)), indent=2))


if __name__ == "__main__":
    main()
