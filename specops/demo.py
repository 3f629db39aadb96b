"""One speculative-decoding verification step on a toy batch, printed step by step.

Run with ``python -m specops``. Three requests, vocab 12: a draft-model request with
three drafts, a request with none this step, and a greedy request with two drafts. Shows
what each decomposed op takes and returns, then the same step through the fused verify.
"""

from __future__ import annotations

import argparse

import torch

import specops


def _show(title: str, value) -> None:
    print(f"{title:<34} {value.tolist() if isinstance(value, torch.Tensor) else value}")


def run(device: str, seed: int) -> torch.Tensor:
    g = torch.Generator(device=device).manual_seed(seed)
    vocab = 12
    num_draft_tokens = [3, 0, 2]
    batch = len(num_draft_tokens)
    cu = torch.tensor(num_draft_tokens, device=device).cumsum(0).to(torch.int32)
    num_tokens = int(cu[-1])
    temperature = torch.tensor([0.8, 1.0, 0.0], device=device)
    is_greedy = temperature == 0

    # What an engine has after one target forward pass and one proposer pass.
    target_logits = torch.randn(num_tokens, vocab, device=device, generator=g) * 2
    draft_probs = torch.softmax(target_logits + torch.randn(num_tokens, vocab, device=device, generator=g), -1)
    draft_ids = torch.multinomial(draft_probs, 1, generator=g).squeeze(-1).to(torch.int32)
    bonus = torch.randint(0, vocab, (batch,), device=device, generator=g, dtype=torch.int32)

    token_temperature = specops.expand_to_tokens(temperature, cu, num_tokens, replace_from=0.0, replace_to=1.0)
    target_probs = torch.softmax(target_logits / token_temperature[:, None], -1)
    uniform = torch.rand(num_tokens, device=device, generator=g)
    exponentials = torch.empty(batch, vocab, device=device).exponential_(generator=g)

    recovered = specops.sample_recovered_tokens(cu, draft_ids, draft_probs, target_probs, exponentials)
    out = torch.empty(batch, max(num_draft_tokens) + 1, dtype=torch.int32, device=device)
    specops.rejection_greedy_sample(out, cu, draft_ids, target_probs.argmax(-1), bonus, is_greedy)
    specops.rejection_random_sample(out, cu, draft_ids, draft_probs, target_probs, bonus, recovered, uniform,
                                    is_greedy)

    _show("device / backend", f"{device} / {specops.available_backends(torch.device(device))[0].value}")
    _show("num_draft_tokens", num_draft_tokens)
    _show("cu_num_draft_tokens", cu)
    _show("temperature per token (0 -> 1)", [round(t, 3) for t in token_temperature.tolist()])
    _show("draft_token_ids", draft_ids)
    _show("p(draft) / q(draft)", [f"{p:.3f}/{q:.3f}" for p, q in zip(
        target_probs.gather(1, draft_ids[:, None].long()).squeeze(1).tolist(),
        draft_probs.gather(1, draft_ids[:, None].long()).squeeze(1).tolist())])
    _show("uniform draws", [round(u, 3) for u in uniform.tolist()])
    _show("recovered tokens (residual race)", recovered)
    _show("bonus tokens", bonus)
    _show("output tokens (-1 = padding)", out)
    _show("emitted per request", (out != -1).sum(1))

    # The same step fused: from logits, with draws keyed by (seed, position, purpose).
    bonus_logits = torch.randn(batch, vocab, device=device, generator=g) * 2
    fused, accepted, logprobs = specops.verify(
        target_logits, bonus_logits, draft_ids, draft_probs, cu, temperature, None, None,
        torch.tensor([11, 12, 13], device=device), torch.tensor([40, 7, 19], device=device),
        max(num_draft_tokens), return_logprobs=True)
    print()
    _show("verify (fused, from logits)", fused)
    _show("accepted per request", accepted)
    _show("log p(token)", [[round(x, 3) for x in row] for row in logprobs.tolist()])
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m specops", description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    run(args.device, args.seed)


if __name__ == "__main__":
    main()
