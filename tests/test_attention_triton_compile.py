"""The Triton paged_attention kernel compiles for sm_90 without a GPU, and its PTX holds
what the launcher relies on: the block table's first entries prefetched into L1 before the
first asynchronous copy of a whole-sequence program, and no prefetch where the first tile
is not tile 0 (splits, a sliding window). Under TRITON_INTERPRET=1 the file runs itself in
a fresh process without the interpreter (as tests/test_verify_triton_compile.py)."""

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
    signature = {name: "constexpr" if name in constexprs else POINTERS.get(name, "fp32" if name in ("scale", "soft_cap")
                                                                          else "i32")
                 for name in fn.arg_names}
    source = triton.compiler.ASTSource(fn=fn, signature=signature, constexprs=constexprs)
    return triton.compile(source, target=GPUTarget("cuda", 90, 32), options={"num_warps": 4, "num_stages": 3}).asm["ptx"]


@pytest.mark.skipif(INTERPRETED, reason="compiled in a fresh process (test below)")
def test_block_table_prefetched_before_the_first_tile():
    ptx = _ptx()
    prefetch = ptx.find("prefetch.global.L1")
    assert prefetch >= 0, "no prefetch of the block table"
    assert prefetch < ptx.find("cp.async"), "the prefetch comes after the first tile's copies"
    assert "prefetch.global" not in _ptx(PREFETCH_TABLE=False)


@pytest.mark.skipif(INTERPRETED, reason="compiled in a fresh process (test below)")
@pytest.mark.parametrize("constexprs", [{"NUM_SPLITS": 4}, {"HAS_WINDOW": True}], ids=["splits", "window"])
def test_no_prefetch_where_the_first_tile_is_not_tile_0(constexprs):
    assert "prefetch.global" not in _ptx(**constexprs)


@pytest.mark.skipif(not INTERPRETED, reason="the compile tests above run in this process")
def test_compiles_in_a_process_without_the_interpreter():
    rerun_without_interpreter(__file__)
