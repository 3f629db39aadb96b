"""The Triton verify kernels compile for sm_90 without a GPU, and the PTX of every kernel
whose arithmetic must match the reference bit for bit has no fused multiply-add but exp's
polynomial steps and no approximate division (reference/repro_math.py: one rounded float32
operation per step).
row_max_kernel and screen_kernel divide approximately on purpose: their sums are
approximate by design (triton_kernels/verify_screen.py says why that stays exact; so do
row_max_kernel's tests, verify_rows.py).
Under TRITON_INTERPRET=1 (how the suite runs on CPU) @triton.jit makes interpreted
functions, which cannot be compiled: the file then runs itself in a fresh process without
the interpreter."""

from __future__ import annotations

import re
import struct
import subprocess
import tempfile
from pathlib import Path

import pytest
import triton
import triton.language as tl
from specops.reference.repro_math import EXP2_COEFFICIENTS
from specops.triton_kernels import (verify_decide, verify_rows, verify_sample, verify_screen, verify_search,
                                    verify_unscreened)
from triton.backends.compiler import GPUTarget
from uninterpreted import INTERPRETED, rerun_without_interpreter

ROW_POINTERS = {"target_ptr": "*bf16", "bonus_ptr": "*bf16", "cu_ptr": "*i32", "part_arg_ptr": "*i32",
                "draft_ptr": "*i64", "top_k_ptr": "*i32", "seeds_ptr": "*i64", "positions_ptr": "*i64",
                "out_ptr": "*i32", "num_accepted_ptr": "*i32", "marked_ptr": "*i32", "resume_ptr": "*i32",
                "sample_int_ptr": "*i64", "arrivals_ptr": "*i32", "counters_ptr": "*i32", "verdict_ptr": "*i32",
                "slot_total_ptr": "*i64", "packed_ptr": "*i64",
                "kept_ptr": "*i32", "kept_lanes_ptr": "*i32", "kept_meta_ptr": "*i64", "live_list_ptr": "*i32"}
INT_POINTER_SUFFIXES = ("state_ptr", "agg_ptr", "sum_ptr", "sum2_ptr", "mass_ptr")
SCALARS = {"num_tokens", "vocab", "width", "split_len", "row_splits", "search_round", "num_splits", "sum_splits",
           "batch", "kept_rows", "keep_limit"}
FLAGS = {"HAS_DRAFT_PROBS": True, "HAS_TOP_K": True, "HAS_TOP_P": True, "RETURN_LOGPROBS": True, "BLOCK_S": 64,
         "BLOCK_W": 8, "BLOCK_V": 2048, "BLOCK_B": 64, "BLOCK_R": 64, "MASS_BLOCK": 128, "PROPOSAL_ROUND": 4,
         "UNROLL": 4, "PDL": False}

CASES = [
    ("row_max", verify_rows.row_max_kernel, {"ALL_GREEDY": False, "BLOCK_V": 2048}, True),
    ("row_max, all greedy", verify_rows.row_max_kernel, {"ALL_GREEDY": True, "BLOCK_V": 2048}, True),
    ("row_max, tests", verify_rows.row_max_kernel, {"ALL_GREEDY": False, "BLOCK_V": 2048, "TESTS": True}, True),
    ("row_max, seed bins", verify_rows.row_max_kernel,
     {"ALL_GREEDY": False, "BLOCK_V": 2048, "BINS": 256, "COARSE_BINS": 64}, True),
    ("screen", verify_screen.screen_kernel, {"ALL_GREEDY": False}, True),
    ("screen, all greedy", verify_screen.screen_kernel, {"ALL_GREEDY": True, "RETURN_LOGPROBS": False}, True),
    ("top-k search", verify_search.threshold_search_kernel, {"MODE": 0, "BLOCK_V": 256}, False),
    ("top-k search, seeded", verify_search.threshold_search_kernel, {"MODE": 0, "BLOCK_V": 256, "SEED_BINS": 32},
     False),
    ("top-k search, seeded, two sets", verify_search.threshold_search_kernel,
     {"MODE": 0, "BLOCK_V": 256, "SEED_BINS": 128, "SEED_COARSE": 32}, False),
    ("top-p search", verify_search.threshold_search_kernel, {"MODE": 1, "BLOCK_V": 256}, False),
    ("top-p search, kept rows ahead", verify_search.threshold_search_kernel,
     {"MODE": 1, "BLOCK_V": 128, "KEPT_PREFETCH": True}, False),
    ("fixed sum", verify_rows.fixed_sum_kernel, {"SECOND": False, "BLOCK_V": 2048}, False),
    ("fixed sum, top-p", verify_rows.fixed_sum_kernel, {"SECOND": True, "BLOCK_V": 2048}, False),
    ("fixed sum, unscreened", verify_rows.fixed_sum_kernel, {"SECOND": False, "BLOCK_V": 2048, "MARKED": False},
     False),
    ("fixed sum, verdicts", verify_rows.fixed_sum_kernel, {"SECOND": False, "BLOCK_V": 2048, "MARKED": False,
                                                           "VERDICTS": True, "HAS_TOP_K": False, "HAS_TOP_P": False},
     False),
    ("decide", verify_decide.decide_kernel, {}, False),
    ("residual sample", verify_sample.residual_sample_kernel, {}, False),
    ("residual sample, no logprobs", verify_sample.residual_sample_kernel, {"RETURN_LOGPROBS": False}, False),
    ("decide, no draft probs", verify_decide.decide_kernel, {"HAS_DRAFT_PROBS": False}, False),
    ("decide, grouped proposals", verify_decide.decide_kernel, {"PROPOSAL_GROUP": 32, "BLOCK_B": 1024}, False),
    ("decide, grouped proposals, draft probs from the tile", verify_decide.decide_kernel,
     {"PROPOSAL_GROUP": 32, "BLOCK_B": 1024, "PROPOSAL_Q_TILE": True}, False),
    ("row max and sum, unscreened", verify_unscreened.row_max_sum_kernel, {}, False),
    ("decide, unscreened", verify_decide.decide_kernel, {"SCREENED": False, "HAS_TOP_K": False, "HAS_TOP_P": False,
                                                          "RETURN_LOGPROBS": False}, False),
    ("decide, verdicts", verify_decide.decide_kernel, {"SCREENED": False, "VERDICTS": True, "SLOT_STATS": True,
                                                       "HAS_TOP_K": False, "HAS_TOP_P": False,
                                                       "RETURN_LOGPROBS": False}, False),
    ("decide, max pass verdicts", verify_decide.decide_kernel, {"SCREENED": False, "VERDICTS": True,
                                                                "HAS_TOP_K": False, "HAS_TOP_P": False,
                                                                "RETURN_LOGPROBS": False}, False),
]


def _signature(fn, constexprs: dict) -> dict:
    signature = {}
    for name in fn.arg_names:
        if name in constexprs:
            signature[name] = "constexpr"
        elif name in SCALARS:
            signature[name] = "i32"
        elif name in ROW_POINTERS:
            signature[name] = ROW_POINTERS[name]
        elif name.endswith(INT_POINTER_SUFFIXES):
            signature[name] = "*i64"
        else:
            signature[name] = "*fp32"
    return signature


def _ptx(fn, constexprs: dict, **options) -> str:
    # Flags not given take the kernel's defaults (a constexpr left out would otherwise be
    # typed as a pointer).
    defaults = {p.name: p.default for p in fn.params if p.is_constexpr and p.has_default}
    constexprs = {**defaults, **{k: v for k, v in FLAGS.items() if k in fn.arg_names}, **constexprs}
    source = triton.compiler.ASTSource(fn=fn, signature=_signature(fn, constexprs), constexprs=constexprs)
    kernel = triton.compile(source, target=GPUTarget("cuda", 90, 32),
                            options={"enable_fp_fusion": False, "num_warps": 8, **options})
    return kernel.asm["ptx"]


@pytest.mark.skipif(INTERPRETED, reason="compiled in a fresh process (test below)")
@pytest.mark.parametrize("name,fn,constexprs,approximate", CASES, ids=[c[0] for c in CASES])
def test_compiles_for_sm90_with_exact_arithmetic(name, fn, constexprs, approximate):
    ptx = _ptx(fn, constexprs)
    # The only fused multiply-adds are exp's Horner steps (verify_math._exp2_fraction), each adding
    # one of its coefficients, the seven in equal numbers: any other is a contracted one.
    addends = [line.split(",")[-1].strip() for line in re.findall(r"\bfma\.rn\.f32\s+([^;]*);", ptx)]
    steps = {f"0f{struct.unpack('<I', struct.pack('<f', c))[0]:08X}" for c in EXP2_COEFFICIENTS[1:]}
    assert set(addends) <= steps, f"{name}: a contracted multiply-add ({sorted(set(addends) - steps)[:3]})"
    assert all(addends.count(c) == addends.count(min(steps)) for c in steps), f"{name}: a partial exp polynomial"
    if not approximate:
        assert not re.search(r"div\.(full|approx)\.f32", ptx), f"{name}: an approximate division"
    if name in ("decide", "decide, no draft probs", "fixed sum", "residual sample"):
        assert re.search(r"div\.rn\.f32", ptx), f"{name}: its exact steps must divide with div.rn"


# The op's own inputs: written before the chain's first launch, readable at any time.
OP_INPUTS = {"target_ptr", "bonus_ptr", "draft_ptr", "draft_probs_ptr", "cu_ptr", "temperature_ptr", "top_k_ptr",
             "top_p_ptr", "seeds_ptr", "positions_ptr"}


def _reads_before_wait_from(ptx: str, fn, constexprs: dict) -> list[str]:
    """The global loads ahead of griddepcontrol.wait whose address derives from a pointer
    argument other than the op's inputs (a buffer some launch of the chain writes): the
    PTX registers loaded from those parameters, and every register computed from one,
    followed in program order up to the wait."""
    params = [name for name in fn.arg_names if name not in constexprs]
    chained = {f"{fn.__name__}_param_{i}" for i, name in enumerate(params)
               if name.endswith("_ptr") and name not in OP_INPUTS}
    tainted, reads = set(), []
    for line in ptx[:ptx.find("griddepcontrol.wait")].splitlines():
        words = re.findall(r"%\w+|\b\w+_param_\d+\b", line)
        if not words or not re.match(r"\s*(@%\w+\s+)?[a-z]", line):
            continue
        sources = set(words[1:])
        if re.search(r"\bld\.global", line) and sources & tainted:
            reads.append(line.strip())
        if sources & (tainted | chained):
            tainted.add(words[0])
    return reads


@pytest.mark.skipif(INTERPRETED, reason="compiled in a fresh process (test below)")
@pytest.mark.parametrize("name,fn,constexprs,approximate", CASES, ids=[c[0] for c in CASES])
def test_chained_launch_waits_before_reading_the_chain(name, fn, constexprs, approximate):
    """PDL=True (verify.py on sm_90+): every launch after the max pass waits for the one
    before (griddepcontrol.wait) before it reads anything a launch of the chain writes
    (the op's inputs may be read ahead of it), and lets the next be scheduled; the max
    pass, launched plainly, only lets the next be scheduled."""
    flags = {**{k: v for k, v in FLAGS.items() if k in fn.arg_names}, **constexprs, "PDL": True}
    ptx = _ptx(fn, {**constexprs, "PDL": True})
    assert "griddepcontrol.launch_dependents" in ptx, f"{name}: the next launch is never released"
    if fn in (verify_rows.row_max_kernel, verify_unscreened.row_max_sum_kernel):  # the chain's first launch
        assert "griddepcontrol.wait" not in ptx
        return
    assert "griddepcontrol.wait" in ptx, f"{name}: no wait for the launch before"
    early = _reads_before_wait_from(ptx, fn, flags)
    assert not early, f"{name}: reads a chain buffer before the wait: {early}"
    assert "griddepcontrol" not in _ptx(fn, constexprs), f"{name}: PDL code without PDL=True"


@triton.jit
def _reads_early(out_ptr, part_max_ptr, seeds_ptr, PDL: tl.constexpr):
    seed = tl.load(seeds_ptr)
    early = tl.load(part_max_ptr + 1)
    tl.extra.cuda.gdc_wait()
    tl.store(out_ptr, early + seed.to(tl.float32))


@pytest.mark.skipif(INTERPRETED, reason="compiled in a fresh process (test below)")
def test_the_read_tracker_sees_a_chain_read():
    """The tracker above flags a load from a non-input pointer ahead of the wait (a kernel
    written for the purpose), and not one from an input."""
    early = _reads_before_wait_from(_ptx(_reads_early, {"PDL": True}), _reads_early, {"PDL": True})
    assert len(early) == 1


@pytest.mark.skipif(INTERPRETED, reason="compiled in a fresh process (test below)")
def test_residual_draw_follows_every_programs_block_sums():
    """residual_sample_kernel, as launched (verify.py): the block sums stored, a CTA barrier,
    one acq_rel atomic at GPU scope (the arrival), then the block sums read past L1 (.cg);
    and the register cap that keeps RESIDUAL_RESIDENT programs per SM."""
    from specops.triton_kernels import verify

    ptx = _ptx(verify_sample.residual_sample_kernel, {}, num_warps=verify.RESIDUAL_WARPS,
               maxnreg=verify.RESIDUAL_MAX_REGISTERS)
    arrivals = [m.start() for m in re.finditer(r"atom\.global\.gpu\.acq_rel\.add\.u32", ptx)]
    assert len(arrivals) == 1, "one arrival per program"
    before, after = ptx[:arrivals[0]], ptx[arrivals[0]:]
    assert before.rfind("bar.sync") > before.rfind("st.global"), "no barrier between the stores and the arrival"
    assert "ld.global.cg" in after, "the block sums are not read past L1"
    assert re.search(rf"\.maxnreg {verify.RESIDUAL_MAX_REGISTERS}\b", ptx)


@pytest.mark.skipif(INTERPRETED, reason="compiled in a fresh process (test below)")
def test_one_launch_sums_after_its_rows_max():
    """row_max_sum_kernel, as launched (verify.py, 4 warps): the max partials stored, a CTA
    barrier, one release arrival at GPU scope, then a loop of acquire reads of the count,
    then the row's max partials read past L1 (.cg), and the exact masses after them; then
    one relaxed 64-bit atomic add a program (its normaliser partial and its departure,
    packed), whose last adder resets the counters; without TEST_STEPS a 32-bit departure."""
    from specops.triton_kernels import verify

    ptx = _ptx(verify_unscreened.row_max_sum_kernel, {}, num_warps=verify.SUM_WARPS)
    arrival = [m.start() for m in re.finditer(r"atom\.global\.gpu\.release\.add\.u32", ptx)]
    assert len(arrival) == 1, "one arrival per program"
    before, after = ptx[:arrival[0]], ptx[arrival[0]:]
    assert before.rfind("bar.sync") > before.rfind("st.global"), "no barrier between the stores and the arrival"
    # Triton emits the add of 0 as an acquire load.
    polls = [m.start() for m in re.finditer(r"(atom|ld)\.global\.gpu\.acquire\.", after)]
    assert polls, "no acquire of the row's count"
    assert re.search(r"ld\.global\.cg", after[polls[0]:]), "the row's max partials are not read past L1"
    assert re.search(r"div\.rn\.f32", after), "the masses at any temperature divide with div.rn"
    departures = re.findall(r"atom\.global\.gpu\.\w+\.add\.u(32|64)", after[polls[0]:])
    assert departures == ["64"], f"one packed departure a program, found {departures}"
    assert "exch.b64" in after, "the last to leave does not reset the packed departures"
    plain = _ptx(verify_unscreened.row_max_sum_kernel, {"TEST_STEPS": False}, num_warps=verify.SUM_WARPS)
    assert re.findall(r"atom\.global\.gpu\.relaxed\.add\.u(32|64)", plain) == ["32"]


@pytest.mark.skipif(INTERPRETED, reason="compiled in a fresh process (test below)")
def test_max_pass_tests_leave_without_waiting():
    """row_max_kernel with TESTS, as launched (verify.py): a program leaves by one relaxed
    64-bit atomic add (its test's partial and its departure, packed) and the row's last
    resets the word with one exchange; no acquire, release or fence: the max pass never
    waits for another program. Without TESTS no atomic at all."""
    from specops.triton_kernels import verify

    options = {"num_warps": verify.NUM_WARPS, "maxnreg": 48}
    ptx = _ptx(verify_rows.row_max_kernel, {"ALL_GREEDY": False, "BLOCK_V": 2048, "TESTS": True}, **options)
    assert re.findall(r"atom\.global\.gpu\.(\w+)\.add\.u(32|64)", ptx) == [("relaxed", "64")]
    assert len(re.findall(r"atom\.global\.gpu\.relaxed\.exch\.b64", ptx)) == 1
    assert not re.search(r"\b(acquire|release|acq_rel)\b|membar|fence", ptx)
    plain = _ptx(verify_rows.row_max_kernel, {"ALL_GREEDY": False, "BLOCK_V": 2048}, **options)
    assert "atom." not in plain


def _ptxas_usage(ptx: str) -> tuple[int, int]:
    """(registers a thread, spilled bytes stored and loaded) ptxas reports for sm_90a."""
    with tempfile.TemporaryDirectory() as folder:
        source = Path(folder) / "kernel.ptx"
        source.write_text(ptx)
        log = subprocess.run([triton.knobs.nvidia.ptxas.path, "-v", "--fmad=false", "--gpu-name=sm_90a", str(source),
                              "-o", str(Path(folder) / "kernel.o")], capture_output=True, text=True, check=True).stderr
    spilled = sum(int(b) for b in re.findall(r"(\d+) bytes spill (?:stores|loads)", log))
    return int(re.search(r"Used (\d+) registers", log).group(1)), spilled


def _capped_launches():
    """(name, kernel, constexprs, warps, cap) of each launch the launcher caps with top-k."""
    from specops.triton_kernels import verify

    live = {"LIVE_BLOCKS": 512, "BLOCK_S": 16}
    sums = {"BLOCK_V": 2048, "MARK_MAX_K": verify.TOP_K_MARKS_MAX_K, **live}
    return {
        "first": (verify_rows.fixed_sum_kernel, {"SECOND": False, **sums}, verify.SUM_WARPS,
                  verify.TOP_K_SUM_MAX_REGISTERS),
        "second": (verify_rows.fixed_sum_kernel, {"SECOND": True, **sums}, verify.SUM_WARPS,
                   verify.SECOND_SUM_MAX_REGISTERS),
        "top-p search": (verify_search.threshold_search_kernel,
                         {"MODE": 1, "BLOCK_V": verify.SEARCH_BLOCK_V, "UNROLL": verify.SEARCH_UNROLL, **live},
                         verify.SEARCH_WARPS, verify.TOP_P_SEARCH_MAX_REGISTERS),
    }


@pytest.mark.skipif(INTERPRETED, reason="compiled in a fresh process (test below)")
@pytest.mark.parametrize("launch", ["first", "second", "top-p search"])
def test_launches_with_top_k_fit_their_register_cap(launch):
    """The normalisers and top-p's search rounds with top-k and live blocks, as launched
    (verify.py, 4 warps): past the cap uncapped (114 to 128 registers: 4 programs an SM),
    within it capped, and without a spill (each cap was measured without one,
    bench/NOTES.md: a spill would be a new cost)."""
    kernel, constexprs, warps, cap = _capped_launches()[launch]
    uncapped = _ptxas_usage(_ptx(kernel, constexprs, num_warps=warps))
    capped = _ptxas_usage(_ptx(kernel, constexprs, num_warps=warps, maxnreg=cap))
    assert uncapped[0] > cap, f"uncapped {uncapped[0]} registers: the cap no longer binds"
    assert capped[0] <= cap and capped[1] == 0, f"capped: {capped[0]} registers, {capped[1]} bytes spilled"


@pytest.mark.skipif(INTERPRETED, reason="compiled in a fresh process (test below)")
def test_the_normaliser_without_top_k_fits_its_register_cap():
    """The first normaliser after the max pass's verdicts, as launched without top-k
    (verify.SUM_MAX_REGISTERS, 4 warps): within the cap and without a spill, so 9 programs
    an SM (uncapped the bench shapes took 56-80 registers, bench/NOTES.md)."""
    from specops.triton_kernels import verify

    constexprs = {"SECOND": False, "BLOCK_V": 2048, "MARKED": False, "VERDICTS": True, "HAS_TOP_K": False,
                  "HAS_TOP_P": False, "BLOCK_S": 16}
    registers, spilled = _ptxas_usage(_ptx(verify_rows.fixed_sum_kernel, constexprs, num_warps=verify.SUM_WARPS,
                                           maxnreg=verify.SUM_MAX_REGISTERS))
    assert verify.SUM_MAX_REGISTERS and registers <= verify.SUM_MAX_REGISTERS and spilled == 0, (registers, spilled)


@pytest.mark.skipif(not INTERPRETED, reason="the compile tests above run in this process")
def test_compiles_in_a_process_without_the_interpreter():
    rerun_without_interpreter(__file__)
