"""Verification sampling: the decomposed specops ops against torch eager and FlashInfer at
the shapes of ANCHORS.md section 1.

Stages (the "stage" key of each row):
  pipeline   from ready probs. random / ngram: draw exponentials [B, V], sample_recovered_tokens,
             draw uniforms [T], rejection_random_sample. greedy: target argmax,
             rejection_greedy_sample. FlashInfer: chain_speculative_sampling ("kern").
  full       the same from fp32 target logits, softmax included (greedy takes the argmax of the
             logits: no softmax needed). FlashInfer: its softmax + chain.
  recovered  sample_recovered_tokens alone, with the GB/s it moves.

Bonus token ids are inputs of the specops and torch-eager pipelines, as in vLLM (whose
ordinary sampler draws them); FlashInfer's chain samples its own from the bonus rows.

Floors: bytes / copy bandwidth, with fp32 rows of V floats, T = B k draft positions,
d = 1 with draft probs (random) else 0:
  pipeline   4 V (T (1 + d) + 2 B)  every target row read (a token is recovered at every
             position), every draft row read, and the exponentials [B, V] written by their draw
             and read by the race; greedy: 4 V T (the argmax reads every target row).
  full       4 V (T + r B), r = 2 random, 1 ngram, 0 greedy: ANCHORS.md's floor (each logit row
             read once, plus a residual row pair per request at the first rejection) less its
             B bonus rows, which no specops row here reads.
  recovered  4 V (T (1 + d) + B) + 8 T: what the op reads and writes (probs and exponentials
             once, draft ids in, tokens out); also reported as GB/s and % of copy bandwidth.
"""

from __future__ import annotations

import argparse
import functools
import os
from dataclasses import dataclass

import torch

import common
import specops
from specops.reference import sampling as reference

MODES = ("greedy", "random", "ngram")
LOGIT_SCALE = 3.0  # top prob ~0.1-0.2 at V = 128256, like an LLM's next-token distribution
# The draft logits: DRAFT_SCALE x the target's plus DRAFT_NOISE x LOGIT_SCALE of Gaussian
# noise. A step's acceptance, sum_x min(p, q) (32 rows at V = 128256, CPU): 0.35 at these;
# scale 1 with noise 0.1 0.88, with 0.05 0.94 (better drafts, a smaller residual mass).
DRAFT_SCALE = 0.8
DRAFT_NOISE = 0.6
VLLM_KERN_LABEL = "vLLM kern (ANCHORS.md, not measured here)"

# (B, k, V, mode) -> vLLM kern µs on an H100, from ANCHORS.md section 1.
VLLM_KERN_US = {
    (1, 4, 128256, "greedy"): 50,
    (1, 4, 128256, "random"): 172,
    (1, 4, 128256, "ngram"): 116,
    (16, 4, 128256, "random"): 244,
    (64, 4, 128256, "greedy"): 80,
    (64, 4, 128256, "random"): 261,
    (64, 4, 128256, "ngram"): 195,
    (256, 4, 128256, "random"): 890,
    (64, 8, 151936, "random"): 670,
    (64, 4, 32000, "random"): 304,
}
SHAPES = list(VLLM_KERN_US)
QUICK_SHAPES = [(1, 4, 4096, mode) for mode in MODES] + [(8, 3, 5000, mode) for mode in MODES]


@dataclass
class Inputs:
    mode: str
    cu_num_draft_tokens: torch.Tensor  # [B] int32, k drafts per request
    draft_token_ids: torch.Tensor  # [T] int32, sampled from the draft probs
    draft_probs: torch.Tensor | None  # [T, V] float32; None for ngram and greedy
    target_logits: torch.Tensor  # [T, V] float32
    target_probs: torch.Tensor  # [T, V] float32
    bonus_token_ids: torch.Tensor  # [B] int32
    logits_with_bonus: torch.Tensor  # [B, k + 1, V] float32, FlashInfer's layout
    probs_with_bonus: torch.Tensor  # [B, k + 1, V] float32
    flashinfer_draft_probs: torch.Tensor | None  # [B, k, V]; one-hot on the drafts for ngram

    @property
    def shape(self) -> tuple[int, int, int]:
        B, k_plus_1, V = self.logits_with_bonus.shape
        return B, k_plus_1 - 1, V


def make_inputs(B: int, k: int, V: int, mode: str, device: torch.device, for_flashinfer: bool,
                draft_scale: float = DRAFT_SCALE, draft_noise: float = DRAFT_NOISE) -> Inputs:
    """Fresh random logits; draft logits correlated with the target's so acceptance varies
    (DRAFT_SCALE, DRAFT_NOISE; the same draws from the generator at any value)."""
    logits_with_bonus = torch.randn(B, k + 1, V, device=device) * LOGIT_SCALE
    probs_with_bonus = torch.softmax(logits_with_bonus, dim=-1)
    target_logits = logits_with_bonus[:, :k].reshape(B * k, V)
    draft_logits = draft_scale * target_logits + draft_noise * LOGIT_SCALE * torch.randn_like(target_logits)
    draft_probs = torch.softmax(draft_logits, dim=-1)
    del draft_logits
    draft_token_ids = torch.multinomial(draft_probs, 1).view(-1).int()
    bonus_probs = probs_with_bonus[:, k]
    bonus = bonus_probs.argmax(-1) if mode == "greedy" else torch.multinomial(bonus_probs, 1).view(-1)
    flashinfer_draft_probs = None
    if for_flashinfer and mode == "random":
        flashinfer_draft_probs = draft_probs.view(B, k, V)
    elif for_flashinfer and mode == "ngram":  # FlashInfer has no n-gram mode: q one-hot on the draft
        one_hot = torch.zeros(B, k, V, device=device)
        flashinfer_draft_probs = one_hot.scatter_(2, draft_token_ids.view(B, k, 1).long(), 1.0)
    return Inputs(
        mode=mode,
        cu_num_draft_tokens=torch.arange(1, B + 1, dtype=torch.int32, device=device) * k,
        draft_token_ids=draft_token_ids,
        draft_probs=draft_probs if mode == "random" else None,
        target_logits=target_logits,
        target_probs=probs_with_bonus[:, :k].reshape(B * k, V),
        bonus_token_ids=bonus.int(),
        logits_with_bonus=logits_with_bonus,
        probs_with_bonus=probs_with_bonus,
        flashinfer_draft_probs=flashinfer_draft_probs,
    )


def draw(x: Inputs) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """The pipeline's random draws: exponentials [B, V] and uniforms [T] (none for greedy)."""
    if x.mode == "greedy":
        return None, None
    B, k, V = x.shape
    device = x.target_probs.device
    return torch.empty(B, V, device=device).exponential_(), torch.rand(B * k, device=device)


def full_input(x: Inputs) -> torch.Tensor:
    """What the full stage computes from the logits before verifying: the target probs
    (random, ngram) or the logits themselves (greedy: their argmax is the probs')."""
    return x.target_logits if x.mode == "greedy" else torch.softmax(x.target_logits, dim=-1)


def specops_pipeline(backend: str):
    def run(x: Inputs, target_probs, exponentials, uniforms) -> torch.Tensor:  # -> [B, k + 1] int32
        B, k, V = x.shape
        out = torch.empty(B, k + 1, dtype=torch.int32, device=target_probs.device)
        cu, ids, bonus = x.cu_num_draft_tokens, x.draft_token_ids, x.bonus_token_ids
        if x.mode == "greedy":
            argmax = target_probs.argmax(-1)
            specops.rejection_greedy_sample(out, cu, ids, argmax, bonus, backend=backend, validate=False)
            return out
        recovered = specops.sample_recovered_tokens(
            cu, ids, x.draft_probs, target_probs, exponentials, backend=backend, validate=False
        )
        specops.rejection_random_sample(
            out, cu, ids, x.draft_probs, target_probs, bonus, recovered, uniforms, backend=backend, validate=False
        )
        return out

    return run


# torch eager: the same pipeline vectorised over the batch (k drafts for every request).


def torch_recovered(x: Inputs, target_probs, exponentials) -> torch.Tensor:  # -> [T] int32
    B, k, V = x.shape
    if x.draft_probs is None:
        residual = target_probs.scatter(1, x.draft_token_ids.long()[:, None], 0.0)
    else:
        residual = (target_probs - x.draft_probs).clamp_min_(0)
    residual = residual.view(B, k, V)
    scores = torch.where(residual > 0, residual / exponentials[:, None, :], -1.0)
    return scores.view(B * k, V).argmax(-1).int()


def emit(accepted, accepted_tokens, stop_tokens, bonus) -> torch.Tensor:
    """Rows of accepted drafts, then the stop token at the first rejection (bonus when none),
    then -1. accepted, accepted_tokens, stop_tokens: [B, k]; bonus: [B]."""
    B, k = accepted.shape
    accepted_count = accepted.int().cumprod(1).sum(1, keepdim=True)  # [B, 1]
    position = torch.arange(k + 1, device=accepted.device)
    accepted_tokens = torch.cat([accepted_tokens, bonus[:, None]], 1)
    stop_tokens = torch.cat([stop_tokens, bonus[:, None]], 1)
    out = torch.where(position == accepted_count, stop_tokens, -1)
    return torch.where(position < accepted_count, accepted_tokens, out).int()


def torch_pipeline(x: Inputs, target_probs, exponentials, uniforms) -> torch.Tensor:  # -> [B, k + 1] int32
    B, k, V = x.shape
    ids = x.draft_token_ids.long()
    if x.mode == "greedy":
        argmax = target_probs.argmax(-1).view(B, k)
        return emit(ids.view(B, k) == argmax, ids.view(B, k), argmax, x.bonus_token_ids)
    recovered = torch_recovered(x, target_probs, exponentials)
    p = target_probs.gather(1, ids[:, None]).view(B, k)
    q = torch.ones_like(p) if x.draft_probs is None else x.draft_probs.gather(1, ids[:, None]).view(B, k)
    accepted = (q > 0) & (uniforms.view(B, k) * q < p)
    return emit(accepted, ids.view(B, k), recovered.view(B, k), x.bonus_token_ids)


@functools.cache
def flashinfer_generator(device: torch.device) -> torch.Generator:
    """The generator FlashInfer's sampling calls draw from here. Without one it builds a new
    CUDA generator each call, which CUDA-graph capture refuses ("Cannot construct a new
    CUDAGeneratorImpl during CUDA graph capture"); this one, made by the first (eager) call,
    lets its calls be captured (they read its seed and offset on the host: a replay draws the
    capture's numbers again)."""
    return torch.Generator(device=device)


def flashinfer_pipeline(flashinfer, from_logits: bool):
    def run(x: Inputs) -> torch.Tensor:
        B, k, V = x.shape
        probs = x.probs_with_bonus
        if from_logits:
            probs = flashinfer.sampling.softmax(x.logits_with_bonus.view(-1, V)).view(B, k + 1, V)
        out, _, _ = flashinfer.sampling.chain_speculative_sampling(
            x.flashinfer_draft_probs, x.draft_token_ids.view(B, k), probs,
            generator=flashinfer_generator(probs.device),
        )
        return out

    return run


def floor_bytes(x: Inputs, stage: str) -> int:
    """The formulas of the module docstring."""
    B, k, V = x.shape
    T, with_draft = B * k, int(x.draft_probs is not None)
    if stage == "recovered":
        return 4 * V * (T * (1 + with_draft) + B) + 8 * T
    if x.mode == "greedy":
        return 4 * V * T
    if stage == "pipeline":
        return 4 * V * (T * (1 + with_draft) + 2 * B)
    return 4 * V * (T + (2 if x.mode == "random" else 1) * B)


def import_flashinfer():
    try:
        import flashinfer.sampling

        print(f"FlashInfer {flashinfer.__version__} imported")
        return flashinfer
    except Exception as error:  # any failure to import means "run without it"
        print(f"\n*** FlashInfer does not import ({type(error).__name__}: {error}): no FlashInfer rows ***\n")
        return None


class Runner:
    """Checks each implementation against the reference (same draws) once, then times it."""

    def __init__(self, device: torch.device, copy_bw_tbs: float, iters: int):
        self.device, self.copy_bw_tbs, self.iters = device, copy_bw_tbs, iters
        self.rows: list[dict] = []

    def measure(self, x: Inputs, stage: str, impl: str, timed, check=None, want=None, note: str = "") -> None:
        B, k, V = x.shape
        try:
            if check is not None and not torch.equal(check().cpu(), want.cpu()):
                print(f"*** MISMATCH: {impl} {stage} B={B} k={k} V={V} {x.mode} differs from the reference")
                note = "output differs from the reference; " + note
            us = common.time_us(timed, self.device, iters=self.iters)
        except Exception as error:  # kernels still being written: report, keep benchmarking the rest
            print(f"skipped {impl} {stage} B={B} k={k} V={V} {x.mode}: {type(error).__name__}: {error}")
            return
        nbytes = floor_bytes(x, stage)
        row = {"bench": "sampling", "stage": stage, "impl": impl, "B": B, "k": k, "V": V, "mode": x.mode}
        row |= {"us": round(us, 2), "floor_us": round(nbytes / self.copy_bw_tbs / 1e6, 2)}
        if stage == "recovered":
            gbps = nbytes / us / 1e3
            row |= {"gbps": round(gbps, 1), "pct_copy_bw": round(gbps / self.copy_bw_tbs / 10, 1)}
        if note:
            row["note"] = note.strip("; ")
        self.rows.append(row)

    def bench_shape(self, x: Inputs, backends: list[str], flashinfer) -> None:
        exponentials, uniforms = draw(x)  # fixed draws for the checks; timed calls draw their own
        reference_pipeline = specops_pipeline("reference")
        want = reference_pipeline(x, x.target_probs, exponentials, uniforms)
        want_full = reference_pipeline(x, full_input(x), exponentials, uniforms)
        pipelines = {f"specops-{b}": specops_pipeline(b) for b in backends} | {"torch-eager": torch_pipeline}
        for impl, run in pipelines.items():
            self.measure(x, "pipeline", impl, timed=lambda: run(x, x.target_probs, *draw(x)),
                         check=lambda: run(x, x.target_probs, exponentials, uniforms), want=want)
            if impl in (f"specops-{backends[0]}", "torch-eager"):
                self.measure(x, "full", impl, timed=lambda: run(x, full_input(x), *draw(x)),
                             check=lambda: run(x, full_input(x), exponentials, uniforms), want=want_full)
        if flashinfer is not None and x.mode != "greedy":  # FlashInfer has no greedy mode
            note = "own RNG, not checked; samples its own bonus token"
            if x.mode == "ngram":
                note += "; one-hot draft probs [B, k, V] built outside the timed region"
            kern = functools.partial(flashinfer_pipeline(flashinfer, from_logits=False), x)
            self.measure(x, "pipeline", "flashinfer", kern, note=note)
            note += "; softmax: flashinfer.sampling.softmax over [B, k + 1, V]"
            full = functools.partial(flashinfer_pipeline(flashinfer, from_logits=True), x)
            self.measure(x, "full", "flashinfer", full, note=note)
        if x.mode == "greedy":
            return
        args = (x.cu_num_draft_tokens, x.draft_token_ids, x.draft_probs, x.target_probs, exponentials)
        want = reference.sample_recovered_tokens(*args)
        for backend in backends:
            recover = functools.partial(specops.sample_recovered_tokens, *args, backend=backend, validate=False)
            self.measure(x, "recovered", f"specops-{backend}", timed=recover, check=recover, want=want)
        recover = functools.partial(torch_recovered, x, x.target_probs, exponentials)
        self.measure(x, "recovered", "torch-eager", timed=recover, check=recover, want=want)


def print_summary(rows: list[dict], gpu: str) -> None:
    """The ANCHORS.md targets for the decomposed ops."""
    for row in rows:
        if not row["impl"].startswith("specops"):
            continue
        where = f"{row['impl']} {row['stage']} B={row['B']} k={row['k']} V={row['V']} {row['mode']}"
        if row["stage"] == "recovered":
            print(f"{where}: {row['pct_copy_bw']}% of copy bw (target >= 80%)")
        vllm = VLLM_KERN_US.get((row["B"], row["k"], row["V"], row["mode"]))
        if row["stage"] == "pipeline" and row["B"] == 64 and vllm:
            print(f"{where}: {vllm / row['us']:.2f}x faster than {VLLM_KERN_LABEL} (target >= 2x)")
    if common.gpu_slug(gpu) != "h100":
        print(f"note: the {VLLM_KERN_LABEL} figures were taken on an H100; this run is on {gpu}")


def main() -> None:
    parser = argparse.ArgumentParser(description="Verification-sampling benchmark (see the module docstring).")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--quick", action="store_true", help="small shapes (smoke runs)")
    parser.add_argument("--out", default=str(common.REPO_ROOT / "bench" / "results"))
    parser.add_argument("--no-flashinfer", action="store_true")
    parser.add_argument("--iters", type=int, default=50)
    args = parser.parse_args()

    device = torch.device(args.device)
    torch.manual_seed(0)
    env = common.env_stamp(device)
    print(env)
    if device.type == "cuda":
        backends = ["cuda", "triton"]
    else:
        backends = ["cpu"] + (["triton"] if os.environ.get("TRITON_INTERPRET") == "1" else [])
        if backends == ["cpu"]:
            print("specops-triton skipped: set TRITON_INTERPRET=1 to run it on the CPU")
    flashinfer = None if args.no_flashinfer or device.type != "cuda" else import_flashinfer()
    runner = Runner(device, env["copy_bw_tbs"], args.iters)
    for B, k, V, mode in QUICK_SHAPES if args.quick else SHAPES:
        torch.manual_seed(0)  # each shape's data whatever the shapes before it drew (bench_verify.py)
        runner.bench_shape(make_inputs(B, k, V, mode, device, flashinfer is not None), backends, flashinfer)
        if device.type == "cuda":
            torch.cuda.empty_cache()

    def vllm_kern(row):
        return VLLM_KERN_US.get((row["B"], row["k"], row["V"], row["mode"])) if row["stage"] == "pipeline" else None

    print()
    peers = ("torch-eager", "flashinfer")
    common.print_table(runner.rows, ("stage", "B", "k", "V", "mode"), peers, {VLLM_KERN_LABEL: vllm_kern})
    print()
    print_summary(runner.rows, env["gpu"])
    path = common.write_results("sampling", env, runner.rows, args.out)
    print(f"wrote {path}")
    try:
        import plot_results

        print(f"wrote {plot_results.plot([path])}")
    except ImportError as error:
        print(f"no plot ({error})")


if __name__ == "__main__":
    main()
