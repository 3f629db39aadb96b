"""The benchmarks' shared pieces that decide what a results file says, on CPU: the calls of a
shape timed in turn (bench/common.py) and the grouping of rows into shapes for the PNG
(bench/plot_results.py): a specops row's graph-replay fields once made it a group of its own;
the inputs' draft quality (bench_sampling.make_inputs), ab_verify's shape tags, and the
launch constants a timeline of a tagged shape runs with (bench/timeline_verify.py), the
names bench_verify --shapes picks shapes by, and trace_decide's patches of the kernels."""

from __future__ import annotations

import importlib.util
import os
import sys
import types
from pathlib import Path

import pytest
import torch

BENCH = Path(__file__).resolve().parents[1] / "bench"


def load_bench(name: str):
    sys.path.insert(0, str(BENCH))
    try:
        spec = importlib.util.spec_from_file_location(f"bench_{name}", BENCH / f"{name}.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module  # (a dataclass looks its module up there)
        spec.loader.exec_module(module)
        return module
    finally:
        sys.path.remove(str(BENCH))


common = load_bench("common")
plot_results = load_bench("plot_results")
bench_sampling = load_bench("bench_sampling")
ab_verify = load_bench("ab_verify")
timeline_verify = load_bench("timeline_verify")
bench_verify = load_bench("bench_verify")
proposal_rounds = load_bench("proposal_rounds")


def test_time_in_turns_times_every_call_once_a_round_in_turn():
    order = []
    calls = {name: (lambda name=name: order.append(name)) for name in ("a", "b", "c")}
    rounds = common.time_in_turns(calls, torch.device("cpu"), rounds=3, iters=2)
    assert list(rounds) == ["a", "b", "c"] and all(len(times) == 3 for times in rounds.values())
    assert all(t >= 0 for times in rounds.values() for t in times)
    # each series is time_us's warm-up and timed calls of one call; the series alternate
    series = [order[i] for i in range(0, len(order), 12)]
    assert len(order) == 3 * 3 * 12 and series == ["a", "b", "c"] * 3
    assert all(len(set(order[i:i + 12])) == 1 for i in range(0, len(order), 12))


def test_a_rows_measurements_do_not_make_its_own_shape():
    peer = {"bench": "verify", "impl": "flashinfer", "B": 64, "k": 4, "V": 128256, "mode": "random",
            "us": 263.0, "floor_us": 54.4, "note": "softmax + chain_speculative_sampling"}
    ours = {"bench": "verify", "impl": "specops-triton", "B": 64, "k": 4, "V": 128256, "mode": "random",
            "us": 69.7, "us_rounds": [69.1, 78.7, 69.7], "floor_us": 54.4, "us_graph": 67.7,
            "us_graph_queued": 67.4, "sm_clock_mhz": 1980, "label": "specops-triton"}
    shape = plot_results.shape_of(ours)
    assert shape == plot_results.shape_of(peer) == (("B", 64), ("k", 4), ("V", 128256), ("mode", "random"))
    assert plot_results.shape_of(ours | {"B": 16}) != shape
    attention = {"bench": "attention", "stage": "cuda-graph", "impl": "specops-cuda", "B": 1, "L": 4096, "q_len": 5,
                 "Hq": 32, "Hkv": 8, "D": 128, "block": 16, "dtype": "bf16", "us": 17.7, "us_graph_queued": 17.6,
                 "gbps": 1.0, "pct_copy_bw": 20.0, "max_err": 0.002, "sm_clock_mhz": 1980}
    assert [key for key, _ in plot_results.shape_of(attention)] == ["B", "L", "q_len", "Hq", "Hkv", "D", "block",
                                                                      "dtype"]


def test_draft_quality_changes_only_the_drafts():
    cpu = torch.device("cpu")
    torch.manual_seed(3)
    default = bench_sampling.make_inputs(4, 3, 4096, "random", cpu, for_flashinfer=False)
    torch.manual_seed(3)
    good = bench_sampling.make_inputs(4, 3, 4096, "random", cpu, for_flashinfer=False, draft_scale=1.0,
                                      draft_noise=0.1)
    # the same draws from the generator: the target rows are the same, the drafts are not
    assert torch.equal(default.logits_with_bonus, good.logits_with_bonus)
    assert not torch.equal(default.draft_probs, good.draft_probs)

    def acceptance(x):  # a step's chance to pass, sum_v min(p, q), over the rows
        return torch.minimum(x.target_probs, x.draft_probs).sum(-1).mean().item()

    assert acceptance(good) > acceptance(default) + 0.3


def test_ab_verify_shapes_take_draft_quality_and_sampling_tags():
    cpu = torch.device("cpu")
    torch.manual_seed(5)
    label, args, logprobs = ab_verify.shape_call("2:3:512:random:dscale1:dnoise0.1:topk5:logprobs", cpu)
    torch.manual_seed(5)
    expected = bench_sampling.make_inputs(2, 3, 512, "random", cpu, for_flashinfer=False, draft_scale=1.0,
                                          draft_noise=0.1)
    assert label == "2:3:512:random:dscale1:dnoise0.1:topk5:logprobs" and logprobs
    assert torch.equal(args[0], expected.target_logits) and torch.equal(args[3], expected.draft_probs)
    assert args[6].tolist() == [5, 5] and args[7] is None
    with pytest.raises(ValueError, match="dnoisy"):
        ab_verify.shape_call("2:3:512:random:dnoisy", cpu)


def test_timeline_of_a_tagged_shape_runs_the_set_constants(monkeypatch):
    """A shape with ab_verify's tags calls the Triton launcher on ab_verify's inputs, seeded
    as ab_verify's are, under --set's constants (they were once applied to the untagged
    shapes only)."""
    from specops.triton_kernels import verify as triton_verify

    monkeypatch.setattr(triton_verify, "TOP_P_KEPT_ROWS", triton_verify.TOP_P_KEPT_ROWS)  # restored after
    shapes = []
    monkeypatch.setattr(timeline_verify, "shape_call",
                        lambda shape, device: (shapes.append((shape, torch.rand(1).item())) or shape, (1, 2), True))
    seen = []
    monkeypatch.setattr(triton_verify, "verify", lambda *args: seen.append((args, triton_verify.TOP_P_KEPT_ROWS)))
    args = timeline_verify.shape_parser("", "", 1).parse_args(["--shapes", "8:3:512:random:topp0.9",
                                                               "--set", "TOP_P_KEPT_ROWS=7"])
    [(name, fn)] = list(timeline_verify.tagged_calls(args))
    fn()
    torch.manual_seed(0)
    ab_verify_first_draw = torch.rand(1).item()  # ab_verify seeds its inputs with 0 (--seed)
    assert name == ("8", "3", "512", "random:topp0.9") and shapes == [("8:3:512:random:topp0.9", ab_verify_first_draw)]
    assert seen == [((1, 2, True), 7)]


def test_bench_verify_shapes_are_named_apart_as_their_rows():
    """bench_verify --shapes names a shape B:k:V:mode with the mode its rows carry: every plain
    and filtered shape and every shape of close drafts (full and quick) gets a label of its
    own, so --shapes picks one shape each; a filtered one's label ends in the filters its
    rows' mode lists, an accepting one's in its drafts' scale and noise."""
    for plain, filtered, accepting in (
            (bench_verify.SHAPES, bench_verify.FILTERED_SHAPES, bench_verify.ACCEPTING_SHAPES),
            (bench_verify.QUICK_SHAPES, bench_verify.QUICK_FILTERED_SHAPES, bench_verify.QUICK_ACCEPTING_SHAPES)):
        shapes = [(*shape, None, None) for shape in plain] + list(filtered) + list(accepting)
        labels = [bench_verify.shape_label(*shape) for shape in shapes]
        assert len(set(labels)) == len(labels), labels
    assert bench_verify.shape_label(64, 4, 128256, "random", 50, 0.9) == "64:4:128256:random+topk50+topp0.9"
    assert bench_verify.shape_label(1, 4, 128256, "ngram", None, None) == "1:4:128256:ngram"
    assert (bench_verify.shape_label(16, 4, 128256, "random", None, None, (1.0, 0.1))
            == "16:4:128256:random+dscale1+dnoise0.1")


def test_bench_verify_rows_carry_the_drafts_accepted():
    """Every row of a bench_verify shape carries ``accepted``, the mean drafts a request
    accepted in specops' output on the shape's inputs (here the CPU kernel's, which equals the
    reference's), and close drafts accept more of them than the default ones."""
    cpu = torch.device("cpu")
    accepted = {}
    for drafts in (None, bench_verify.CLOSE_DRAFTS):
        torch.manual_seed(0)
        closeness = dict(zip(("draft_scale", "draft_noise"), drafts)) if drafts else {}
        x = bench_sampling.make_inputs(16, 3, 512, "random", cpu, for_flashinfer=False, **closeness)
        rows = bench_verify.bench_shape(x, cpu, ["cpu"], None, 1.0, 2, rounds=1, drafts=drafts)
        want = bench_verify.reference_verify(*bench_verify.verify_args(x, cpu))[1].float().mean().item()
        assert {row["impl"] for row in rows} == {"specops-cpu", "torch-eager"}
        assert all(row["accepted"] == round(want, 3) for row in rows), (rows, want)
        assert all(row["mode"] == bench_verify.row_mode("random", None, None, drafts) for row in rows)
        accepted[drafts] = want
    assert accepted[bench_verify.CLOSE_DRAFTS] > accepted[None] + 0.8, accepted


def test_proposal_rounds_count_every_residual_draw_as_the_reference_ends_it():
    """bench/proposal_rounds.py counts, for each residual draw of a call, the round of the
    proposal the reference keeps (0: none, the residual pass), as the reference's kept_proposal
    reports it; close drafts leave a smaller residual mass."""
    default = proposal_rounds.count(16, 3, 512, None)
    close = proposal_rounds.count(16, 3, 512, bench_verify.CLOSE_DRAFTS)
    for c in (default, close):
        assert sum(c["rounds"].values()) == c["residual"] > 0
        assert set(c["rounds"]) <= set(range(5))
    assert close["mass"] < default["mass"] and close["accepted"] > default["accepted"]
    assert default["rounds"].get(1, 0) >= default["residual"] // 2  # a residual mass ~0.6: mostly round 1


def test_bench_verify_shapes_picks_the_named_and_rejects_an_unknown_name():
    """--shapes keeps the named shapes in the benchmark's order, and a name that is none of
    them (a typo) is an error naming it, not a shape silently left out of the run."""
    shapes = ([(*shape, None, None, None) for shape in bench_verify.SHAPES]
              + [(*shape, None) for shape in bench_verify.FILTERED_SHAPES] + list(bench_verify.ACCEPTING_SHAPES))
    picked = bench_verify.pick_shapes(shapes, "64:4:128256:random+topp0.9,1:4:128256:ngram,"
                                              "16:4:128256:random+dscale1+dnoise0.1")
    assert [bench_verify.shape_label(*s) for s in picked] == ["1:4:128256:ngram", "64:4:128256:random+topp0.9",
                                                              "16:4:128256:random+dscale1+dnoise0.1"]
    with pytest.raises(ValueError, match="64:4:128256:randm"):
        bench_verify.pick_shapes(shapes, "1:4:128256:ngram,64:4:128256:randm")


def test_trace_decide_finds_every_anchor_in_the_kernels():
    """bench/trace_decide.py patches a copy of the kernels' sources by text: every anchor it
    replaces or stamps after is still there and the patched copy imports (a stamp placed at
    the wrong indentation fails there; drift once left it failing on the GPU only)."""
    trace_decide = load_bench("trace_decide")
    traced = trace_decide.traced_package()
    assert traced.TRACE is None and hasattr(traced, "launch_verify")


def test_trace_decide_sets_launch_constants_in_both_copies():
    """trace_decide --set (profile_verify's option) changes a launch constant in the traced
    copy and in the kernels it is checked against alike, and names an argument that is not
    one."""
    trace_decide = load_bench("trace_decide")
    first = types.SimpleNamespace(__name__="first", PROPOSAL_ROUND=4, BLOCK_V=2048)
    second = types.SimpleNamespace(__name__="second", PROPOSAL_ROUND=4, BLOCK_V=2048)
    trace_decide.apply_settings(["PROPOSAL_ROUND=16", "BLOCK_V=1024"], first, second)
    assert (first.PROPOSAL_ROUND, second.PROPOSAL_ROUND, first.BLOCK_V, second.BLOCK_V) == (16, 16, 1024, 1024)
    trace_decide.apply_settings([], first)
    assert first.PROPOSAL_ROUND == 16
    with pytest.raises(ValueError, match="PROPOSAL_RUND"):
        trace_decide.apply_settings(["PROPOSAL_RUND=8"], first)


def test_read_balance_probe_sums_every_pair_once_in_both_forms():
    """bench/probe_read_balance.py's kernel (the interpreter): static and dynamic forms sum
    k * v over each (sequence, KV head)'s keys as torch does, and a dynamic launch leaves its
    chunk counter at 0, so the next launch (a graph's next replay) hands every chunk out again
    (a counter left at the chunks' count would sum nothing the second time)."""
    if os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("a check of the probe's kernel under the Triton interpreter; the probe runs on the GPU")
    sweep_attention = load_bench("sweep_attention")
    probe = load_bench("probe_read_balance")
    _query, keys, values, table, *_ = sweep_attention.inputs(2, 64, 1, 32, 8, 128, torch.device("cpu"))
    want = probe.expected_sums(keys, values, table, 64)
    for programs_per_sm, chunks in ((0, 1), (2, 1), (3, 4)):
        call, out = probe.launcher(keys, values, table, 64, programs_per_sm, chunks, 16, 2, 4)
        for _ in range(2):
            out.zero_()
            call()
            assert torch.allclose(out, want, rtol=1e-3, atol=1e-2), (programs_per_sm, chunks, out, want)
    with pytest.raises(ValueError, match="do not split"):
        probe.launcher(keys, values, table, 64, 2, 3, 16, 2, 4)


def test_trace_attention_edits_land_in_the_static_kernel():
    """bench/trace_attention.py's traced copy of triton_kernels/attention.py: every anchor it
    edits is still there, and the timer's start, its stores and the trace argument land in
    _paged_attention_kernel itself (a helper holding its body would have no trace_ptr)."""
    trace = load_bench("trace_attention")
    module = trace.traced_module()
    source = Path(module.__file__).read_text()
    kernel = source.index("def _paged_attention_kernel(")
    end = source.index("\ndef ", kernel + 1)
    for text in ("trace_ptr,", "t_start = _now()", "tl.store(trace_ptr + slot, t_start)"):
        assert kernel < source.index(text) < end, text
    assert "(\n        kernel_out, TRACE, kernel_lse," in source


def test_bench_attention_shapes_parse_and_reject():
    bench_attention = load_bench("bench_attention")
    assert bench_attention.parse_shape("64,1024,5") == (64, 1024, 5)
    for bad in ("64,1024", "64,1024,0", "64,x,1"):
        with pytest.raises(ValueError, match="B,L,q_len"):
            bench_attention.parse_shape(bad)


def test_attention_ablations_apply_and_change_the_output():
    """bench/ablate_attention.py's variants (the interpreter): each edit finds its anchor in
    triton_kernels/attention.py once, the variant runs, and its output differs from the
    kernel's (an edit that changed nothing would time the kernel under another name); an
    unedited copy (sweep_attention --kernels) gives the kernel's output."""
    if os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("runs the variants under the Triton interpreter; the tool times them on the GPU")
    sweep_attention = load_bench("sweep_attention")
    ablate = load_bench("ablate_attention")
    args = sweep_attention.inputs(2, 40, 1, 8, 2, 32, torch.device("cpu"))  # a short last tile: the mask counts
    args = tuple(a.float() if getattr(a, "dtype", None) == torch.bfloat16 else a for a in args)  # (interpreted dots)
    want = ablate.kernels.launch_paged_attention(*args, max_query_len=1)[0].float()
    copy = sweep_attention.load_kernel_file(ablate.kernels.__file__)  # sweep_attention --kernels: an unedited copy
    assert torch.equal(copy.launch_paged_attention(*args, max_query_len=1)[0].float(), want)
    for name in ablate.ABLATIONS:
        got = ablate.ablated_module(name).launch_paged_attention(*args, max_query_len=1)[0].float()
        assert got.shape == want.shape
        assert not torch.equal(torch.nan_to_num(got), want), name
