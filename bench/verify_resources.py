"""Compile the Triton verify kernels for sm_90 without a GPU, as the launcher launches them
for a bench shape, and print each launch's resources: programs, warps, registers a thread,
local-memory bytes (spills), shared memory, programs an SM those allow and the waves the
grid takes on 132 SMs. The launcher runs on CPU tensors planning for 132 SMs with PDL (an
H100's launches); its kernel launches are recorded, not run, then compiled with their
constexprs and options (ints equal to 1 specialised, pointers and ints divisible by 16
marked so, as Triton's launcher does). Uses the ptxas and cuobjdump bundled with Triton;
no device time. A shape as in bench/ab_verify.py (B:k:V:mode, then topkN, toppF, logprobs).

    python3 bench/verify_resources.py --shapes 64:4:128256:random:topk50:topp0.9,16:4:128256:random
"""

from __future__ import annotations

import argparse

import torch
import triton
from ab_verify import shape_call
from attention_resources import resources as kernel_resources
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from specops.triton_kernels import verify as launcher

KERNELS = ("row_max_kernel", "row_walk_kernel", "row_max_sum_kernel", "threshold_search_kernel", "screen_kernel", "fixed_sum_kernel",
           "top_p_finish_kernel", "decide_kernel", "residual_sample_kernel")
OPTIONS = ("num_warps", "num_stages", "maxnreg", "enable_fp_fusion", "launch_pdl")
POINTER_TYPES = {torch.float32: "*fp32", torch.bfloat16: "*bf16", torch.float16: "*fp16", torch.int32: "*i32",
                 torch.int64: "*i64", torch.int8: "*i8", torch.uint8: "*u8", torch.bool: "*i1"}
SMS = 132
REGISTERS_PER_SM = 65536
THREADS_PER_SM = 2048
SHARED_PER_SM = 228 * 1024


class Recorder:
    """Stands in for one kernel in the launcher's namespace: each ``kernel[grid](...)`` is
    recorded (grid, positional and keyword arguments), not run."""

    def __init__(self, name: str, fn, launches: list):
        self.name, self.fn, self.launches = name, fn, launches

    def __getitem__(self, grid):
        def launch(*args, **kwargs):
            self.launches.append((self.name, self.fn, tuple(grid), args, kwargs))
        return launch


def record_launches(shape: str) -> list:
    """The launches one verify call makes for ``shape``, planned for SMS SMs with PDL."""
    launches = []
    saved = {name: getattr(launcher, name) for name in (*KERNELS, "multiprocessor_count", "has_pdl")}
    try:
        for name in KERNELS:
            setattr(launcher, name, Recorder(name, saved[name], launches))
        launcher.multiprocessor_count = lambda device, off_gpu: SMS
        launcher.has_pdl = lambda device: True
        _label, args, logprobs = shape_call(shape, torch.device("cpu"))
        launcher.verify(*args, logprobs)
    finally:
        for name, value in saved.items():
            setattr(launcher, name, value)
    return launches


def compile_launch(fn, args: tuple, kwargs: dict):
    """``fn`` compiled for sm_90 as launched with these arguments."""
    params = {p.name: p for p in fn.params}
    values = dict(zip(fn.arg_names, args)) | {k: v for k, v in kwargs.items() if k in params}
    constants = {p.name: p.default for p in fn.params if p.is_constexpr and p.has_default}
    signature, attrs = {}, {}
    for name, value in values.items():
        index = fn.arg_names.index(name)
        if params[name].is_constexpr:
            constants[name] = value
        elif isinstance(value, torch.Tensor):
            signature[name] = POINTER_TYPES[value.dtype]
            attrs[(index,)] = [["tt.divisibility", 16]]
        elif isinstance(value, bool):
            signature[name] = "i1"
        elif isinstance(value, int):
            if value == 1 and not params[name].do_not_specialize:
                constants[name] = 1
            else:
                signature[name] = "i32" if -2**31 <= value < 2**31 else "i64"
                if value % 16 == 0 and not params[name].do_not_specialize:
                    attrs[(index,)] = [["tt.divisibility", 16]]
        else:
            signature[name] = "fp32"
    signature |= {name: "constexpr" for name in constants}
    options = {k: v for k, v in kwargs.items() if k in OPTIONS}
    return triton.compile(ASTSource(fn, signature, constants, attrs), target=GPUTarget("cuda", 90, 32),
                          options=options)


def resources(compiled, programs: int, num_warps: int) -> dict:
    """Registers, spilled (local) bytes, shared memory (attention_resources.resources'
    cuobjdump counts), programs an SM and waves."""
    usage = kernel_resources(compiled)
    registers, local, shared = usage["registers"], usage["local_bytes"], usage["shared_bytes"]
    threads = 32 * num_warps
    per_warp = (registers * 32 + 255) // 256 * 256  # registers are allocated 256 a warp
    resident = min(REGISTERS_PER_SM // (per_warp * num_warps), THREADS_PER_SM // threads, 32,
                   SHARED_PER_SM // shared if shared else 32)
    return {"registers": registers, "local_bytes": local, "shared_bytes": shared, "per_sm": resident,
            "waves": round(programs / (SMS * max(resident, 1)), 2)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--shapes", default="64:4:128256:random,16:4:128256:random,1:4:128256:random,"
                                            "64:4:128256:random:topk50:topp0.9")
    args = parser.parse_args()
    for shape in args.shapes.split(","):
        print(f"\n{shape}\n| launch | programs | warps | registers | spilled bytes | shared bytes | an SM | waves |")
        print("|---|---|---|---|---|---|---|---|")
        seen = {}
        for name, fn, grid, call_args, kwargs in record_launches(shape):
            programs = 1
            for size in grid:
                programs *= size
            values = {k: getattr(v, "value", v) for k, v in kwargs.items()}
            flags = ", ".join([("top-k" if values["MODE"] == 0 else "top-p") if "MODE" in values else ""]
                              + [f"{k}={values[k]}"
                                 for k in ("SECOND", "SEED_BINS", "MARK_BLOCKS", "LIVE_BLOCKS", "KEEP_FIRST")
                                 if values.get(k) not in (0, None, False)]).strip(", ")
            key = (name, flags, programs)
            if key in seen:
                seen[key] += 1
                continue
            seen[key] = 1
            num_warps = kwargs.get("num_warps", 4)
            report = resources(compile_launch(fn, call_args, kwargs), programs, num_warps)
            label = f"{name.removesuffix('_kernel')}" + (f" ({flags})" if flags else "")
            print(f"| {label} | {programs} | {num_warps} | " + " | ".join(str(v) for v in report.values()) + " |",
                  flush=True)
        repeated = [f"{name.removesuffix('_kernel')}" + (f" ({flags})" if flags else "") + f" x{count}"
                    for (name, flags, _programs), count in seen.items() if count > 1]
        if repeated:
            print("launched again with the same flags:", ", ".join(repeated))


if __name__ == "__main__":
    main()
