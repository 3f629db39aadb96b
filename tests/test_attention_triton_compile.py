"""The Triton paged_attention kernel compiles for sm_90 without a GPU, and its PTX holds
what the launcher relies on: the block table's entries of a program's first step prefetched
into L1 before its first asynchronous copy (split or not), and no prefetch with a sliding
window (whose first tile depends on the loaded lengths). Under TRITON_INTERPRET=1 the file
runs itself in a fresh process without the interpreter (tests/uninterpreted.py)."""

from __future__ import annotations

import pytest
import triton
from specops.triton_kernels import attention
from triton.backends.compiler import GPUTarget
from uninterpreted import INTERPRETED, rerun_without_interpreter

POINTERS = {"out_ptr": "*bf16", "lse_ptr": "*fp32", "query_ptr": "*bf16", "key_cache_ptr": "*bf16",
            "value_cache_ptr": "*bf16", "block_table_ptr": "*i32", "seq_lens_ptr": "*i32", "cu_query_lens_ptr": "*i32"}
DECODE = {"NUM_HEADS": 32, "NUM_KV_HEADS": 8, "HEAD_DIM": 128, "BLOCK_D": 128, "BLOCK_SIZE": 16, "BLOCK_M": 16,
          "BLOCK_N": 64, "ROWS": 1, "NUM_SPLITS": 1, "HAS_SOFT_CAP": False, "HAS_WINDOW": False, "WRITE_LSE": False,
          "IEEE": False, "PIPELINE": True, "PDL": False, "PREFETCH_TABLE": True}


def _ptx(**constexprs) -> str:
    fn = attention._paged_attention_kernel
    constexprs = {**DECODE, **constexprs}
    scalar = {"scale": "fp32", "soft_cap": "fp32"}
    signature = {name: "constexpr" if name in constexprs else POINTERS.get(name, scalar.get(name, "i32"))
                 for name in fn.arg_names}
    source = triton.compiler.ASTSource(fn=fn, signature=signature, constexprs=constexprs)
    kernel = triton.compile(source, target=GPUTarget("cuda", 90, 32), options={"num_warps": 4, "num_stages": 3})
    return kernel.asm["ptx"]


@pytest.mark.skipif(INTERPRETED, reason="compiled in a fresh process (test below)")
@pytest.mark.parametrize("splits", [1, 32])
def test_block_table_prefetched_before_the_first_tile(splits):
    ptx = _ptx(NUM_SPLITS=splits, BLOCK_N=128 if splits > 1 else 64)
    prefetch = ptx.find("prefetch.global.L1")
    assert prefetch >= 0, "no prefetch of the block table"
    assert prefetch < ptx.find("cp.async"), "the prefetch comes after the first tile's copies"
    assert "prefetch.global" not in _ptx(NUM_SPLITS=splits, PREFETCH_TABLE=False)


@pytest.mark.skipif(INTERPRETED, reason="compiled in a fresh process (test below)")
def test_no_prefetch_with_a_window():
    assert "prefetch.global" not in _ptx(HAS_WINDOW=True)


@pytest.mark.skipif(not INTERPRETED, reason="the compile tests above run in this process")
def test_compiles_in_a_process_without_the_interpreter():
    rerun_without_interpreter(__file__)
