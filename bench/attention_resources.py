"""Compile the Triton paged-attention kernels for sm_90 without a GPU and print what each
planned launch costs in resources: registers a thread, shared memory, local-memory spills,
the K/V pipeline buffers, and which matrix instructions the SASS holds (HGMMA = wgmma,
HMMA = mma.sync). Uses the ptxas and cuobjdump bundled with Triton; no device time.

    python3 bench/attention_resources.py            # the ANCHORS.md shapes and a few others
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import tempfile

import triton
from specops.triton_kernels import attention as kernels
from specops.triton_kernels.attention_plan import AttentionLaunch, plan_paged_attention
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

TOOLS = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin")
SASS_COUNTS = ("HGMMA", "HMMA", "LDGSTS", "LDL", "STL")
# (Tq, B, Hq, Hkv, D, block_size, max_context): ANCHORS.md section 2, then other geometries
SHAPES = [
    (1, 1, 32, 8, 128, 16, 4096), (5, 1, 32, 8, 128, 16, 4096), (16, 16, 32, 8, 128, 16, 4096),
    (80, 16, 32, 8, 128, 16, 4096), (64, 64, 32, 8, 128, 16, 4096), (320, 64, 32, 8, 128, 16, 4096),
    (32, 32, 32, 8, 128, 16, 16384), (160, 32, 32, 8, 128, 16, 16384),
    (72, 8, 16, 1, 256, 16, 4096), (72, 8, 16, 1, 128, 16, 4096), (8, 8, 32, 2, 64, 64, 4096),
]


def _compile(fn, signature: dict, constants: dict, num_warps: int, num_stages: int = 3):
    signature = signature | {name: "constexpr" for name in constants}
    aligned = {(fn.arg_names.index(n),): [["tt.divisibility", 16]] for n, t in signature.items() if t[0] == "*"}
    source = ASTSource(fn, signature, constants, aligned)
    return triton.compile(source, target=GPUTarget("cuda", 90, 32),
                          options={"num_warps": num_warps, "num_stages": num_stages})


def compile_attention(dtype: str, hq: int, hkv: int, d: int, block_size: int, launch: AttentionLaunch):
    out = "*fp32" if launch.num_splits > 1 else f"*{dtype}"
    signature = {"out_ptr": out, "lse_ptr": "*fp32", "query_ptr": f"*{dtype}", "key_cache_ptr": f"*{dtype}",
                 "value_cache_ptr": f"*{dtype}", "block_table_ptr": "*i32", "seq_lens_ptr": "*i32",
                 "cu_query_lens_ptr": "*i32", "scale": "fp32", "soft_cap": "fp32", "sliding_window": "i32",
                 "num_blocks": "i32", "max_blocks": "i32", "num_query_tokens": "i32"}
    constants = {"NUM_HEADS": hq, "NUM_KV_HEADS": hkv, "HEAD_DIM": d, "BLOCK_D": max(16, triton.next_power_of_2(d)),
                 "BLOCK_SIZE": block_size, "BLOCK_M": launch.block_m, "BLOCK_N": launch.block_n,
                 "ROWS": launch.rows, "NUM_SPLITS": launch.num_splits, "HAS_SOFT_CAP": False, "HAS_WINDOW": False,
                 "WRITE_LSE": False, "IEEE": False, "PIPELINE": True}
    return _compile(kernels._paged_attention_kernel, signature, constants, launch.num_warps, launch.num_stages)


def resources(compiled) -> dict:
    """Registers, spills and SASS instruction counts of one compiled kernel."""
    with tempfile.NamedTemporaryFile(suffix=".cubin") as cubin:
        cubin.write(compiled.asm["cubin"])
        cubin.flush()
        usage = subprocess.run([f"{TOOLS}/cuobjdump", "-res-usage", cubin.name], capture_output=True, text=True, check=True)
        sass = subprocess.run([f"{TOOLS}/cuobjdump", "-sass", cubin.name], capture_output=True, text=True, check=True).stdout
    registers = re.search(r"REG:(\d+)", usage.stdout)
    local = re.search(r"LOCAL:(\d+)", usage.stdout)
    buffers = sorted(set(re.findall(r"memdesc<(\d+)x\d+x\d+x(?:bf16|f16)", compiled.asm["ttgir"])))
    return {"registers": int(registers.group(1)) if registers else None,
            "local_bytes": int(local.group(1)) if local else None, "shared_bytes": compiled.metadata.shared,
            "kv_buffers": "/".join(buffers) or "-", **{op: len(re.findall(rf"\b{op}\b", sass)) for op in SASS_COUNTS}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--dtype", default="bf16", choices=["bf16", "fp16"])
    args = parser.parse_args()
    header = None
    for tq, batch, hq, hkv, d, block_size, max_context in SHAPES:
        launch = plan_paged_attention(tq, batch, hq, hkv, d, max_context, 132)
        report = resources(compile_attention(args.dtype, hq, hkv, d, block_size, launch))
        shape = (f"Tq={tq} B={batch} {hq}/{hkv} D={d} bs={block_size} L<={max_context}: rows={launch.rows} "
                 f"M={launch.block_m} N={launch.block_n} splits={launch.num_splits} warps={launch.num_warps} "
                 f"stages={launch.num_stages}")
        if header is None:
            header = "  ".join(report)
            print(header)
        print("  ".join(str(v) for v in report.values()), " ", shape)


if __name__ == "__main__":
    main()
