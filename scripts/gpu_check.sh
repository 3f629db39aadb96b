#!/usr/bin/env bash
# One lent-GPU session in a script: build, GPU tests, memcheck, benchmarks. Benchmark
# results go to $OUT (the device tool's output folder) or ./gpu-logs, the logs packed
# beside them as gpu-logs.tgz. Usage:
#   scripts/gpu_check.sh build test              # build, then every GPU test
#   scripts/gpu_check.sh memcheck                # compute-sanitizer over the kernels' GPU tests
#   scripts/gpu_check.sh bench-verify bench-attention bench-e2e bench-sampling
#   scripts/gpu_check.sh build tests+memcheck bench   # what a full session runs
#   scripts/gpu_check.sh build ab-search              # the top-k/top-p searches (bench/ab_verify.py)
#   scripts/gpu_check.sh build plans                  # the plans' GPU tests, then bench/eager_attention.py
# ATTENTION_QUICK=1 / E2E_QUICK=1 run only the key shapes of those benchmarks; ATTENTION_SETTLE=each
# settles every attention impl on its own calls before its series (bench_attention.py --settle).
# GPU_RESUME=FILE (an earlier call's test_times.txt) runs only the tests it does not show passed;
# MEMCHECK_TESTS / MEMCHECK_PARALLEL pick and spread memcheck's tests (see run_memcheck).
# FlashInfer is installed from .whl/ when present (see bench/README.md); `build` also
# compiles FlashInfer's benchmark kernels in the background (bench/flashinfer_warmup.py),
# and the bench stages wait for that.
set -uo pipefail
cd "$(dirname "$0")/.."
# Benchmark results (JSON + PNG) go to RESULTS; the logs to LOG, packed at the end into
# RESULTS/gpu-logs.tgz: the device tool brings back at most 8 files from $OUT, and a full
# session writes more logs than that (the results were once left behind).
RESULTS="${OUT:-gpu-logs}"
LOG="${GPU_LOG_DIR:-/tmp/gpu-logs}"  # shared by the calls of one machine: each packs them all
mkdir -p "$RESULTS" "$LOG"
trap 'tar -czf "$RESULTS/gpu-logs.tgz" -C "$LOG" .' EXIT
export PYTHONUNBUFFERED=1 HYPOTHESIS_PROFILE=ci
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null
  export PYTHONPATH=/tmp/site FLASHINFER_CUDA_ARCH_LIST=9.0
fi
# pytest-xdist spreads the GPU tests over processes when it is installed.
# GPU_PARALLEL="-n 8" sets the processes (an H200 host's 16 cores ran -n 8 well); with
# --dist loadgroup the tests of one xdist_group run in one worker, in turn (the sampling
# full-size cases: 72 s one after another, not done in 300 s side by side; NOTES, 2026-12-03).
PARALLEL=${GPU_PARALLEL:-$(python3 -c "import xdist" 2>/dev/null && echo "-n 4" || echo "")}
case "$PARALLEL" in -n*) PARALLEL="$PARALLEL --dist loadgroup" ;; esac
# Every test marked gpu, whichever file holds it (a list of files had missed four of them).
# GPU_TESTS=... in the environment runs a subset: the whole set outlasts one 10-minute device
# call (an H200 at -n 8 ran 88% of it in ~9 min), so split it over calls, e.g.
# GPU_TESTS="tests/test_verify_*.py" then GPU_TESTS="tests/test_attention_*.py tests/test_engine_*.py ...".
GPU_TESTS=${GPU_TESTS:-tests}
WARMUP_PID=""
status=0

run_tests() {
  # Each test's time and outcome as it ends (tests/conftest.py), kept when a call's limit cuts the run.
  # GPU_RESUME=FILE (an earlier call's test_times.txt, carried in the tree) runs only the tests
  # of GPU_TESTS that FILE does not show passed: a set too long for one call resumes in the next.
  local targets
  # shellcheck disable=SC2086
  read -r -a targets <<< "$(echo $GPU_TESTS)"
  if [ -n "${GPU_RESUME:-}" ]; then
    # (an id run under --dist loadgroup ends in @group, which the collected ids lack)
    awk '$2 == "call" && $3 == "passed" {print $4}' "$GPU_RESUME" | sed 's/@[^@]*$//' | sort -u > "$LOG/resume_passed.txt"
    python3 -m pytest -q -m gpu --collect-only -p no:cacheprovider "${targets[@]}" 2>/dev/null | grep "::" \
      | grep -vxFf "$LOG/resume_passed.txt" > "$LOG/resume_todo.txt"
    mapfile -t targets < "$LOG/resume_todo.txt"
    echo "resuming: ${#targets[@]} tests left, $(wc -l < "$LOG/resume_passed.txt") passed before"
    [ ${#targets[@]} -gt 0 ] || return 0
  fi
  # shellcheck disable=SC2086
  SPECOPS_TEST_TIMES="$LOG/test_times.txt" python3 -m pytest -q -m gpu -p no:cacheprovider $PARALLEL --durations=15 \
    "${targets[@]}" > "$LOG/gpu_tests.log" 2>&1
  tail -25 "$LOG/gpu_tests.log"
}

run_memcheck() {
  # The GPU tests of the kernel files (sampling, verify, attention), CUDA and Triton (those of
  # test_verify_ops.py and the attention files took ~10 min on an H100: split the list over
  # device calls as GPU_TESTS above).
  # The caching allocator is off so that a read past any tensor's end is caught (inside a
  # pooled block it would not be); graph captures need it (no cudaMalloc while capturing), so
  # there a test is skipped where it would capture and named in a file (tests/conftest.py),
  # and those tests run in a second pass with the allocator on.
  # MEMCHECK_TESTS=... runs a subset (files or test ids; the plans' replays: tests/test_*launch_plan.py),
  # MEMCHECK_PARALLEL="-n 4" spreads it over processes; each test's time and outcome go to memcheck_times.txt.
  local tests=${MEMCHECK_TESTS:-"tests/test_sampling_ops.py tests/test_sampling_errors.py tests/test_verify_ops.py tests/test_verify_search.py
    tests/test_verify_sample.py tests/test_verify_unscreened.py tests/test_verify_max_pass_tests.py
    tests/test_attention_triton.py tests/test_attention_cuda.py tests/test_attention_ops.py
    tests/test_triton_launch_plan.py tests/test_attention_launch_plan.py"}
  # --launch-timeout: the default 10 s to attach was too short for a pass started while other
  # tests loaded the host ("No attachable process found", the pass not run; NOTES, 2026-12-03).
  local sanitizer="compute-sanitizer --tool memcheck --error-exitcode 9 --print-limit 20 --launch-timeout 300"
  local skips="$LOG/memcheck_capture_skips.txt" captures
  : > "$skips"
  # shellcheck disable=SC2086
  SPECOPS_TEST_TIMES="$LOG/memcheck_times.txt" SPECOPS_CAPTURE_SKIPS="$skips" PYTORCH_NO_CUDA_MEMORY_CACHING=1 \
    $sanitizer python3 -m pytest -q -m gpu -p no:cacheprovider ${MEMCHECK_PARALLEL:-} $tests > "$LOG/memcheck.log" 2>&1
  echo "memcheck exit $?" >> "$LOG/memcheck.log"
  mapfile -t captures < <(sort -u "$skips")
  if [ ${#captures[@]} -gt 0 ]; then
    # shellcheck disable=SC2086
    SPECOPS_TEST_TIMES="$LOG/memcheck_times.txt" $sanitizer python3 -m pytest -q -m gpu -p no:cacheprovider \
      ${MEMCHECK_PARALLEL:-} "${captures[@]}" >> "$LOG/memcheck.log" 2>&1
    echo "memcheck (the ${#captures[@]} tests that capture, allocator on) exit $?" >> "$LOG/memcheck.log"
  fi
  grep -E "ERROR SUMMARY|passed|failed|memcheck" "$LOG/memcheck.log" | tail -8
}

wait_warmup() {
  if [ -n "$WARMUP_PID" ]; then wait "$WARMUP_PID"; WARMUP_PID=""; tail -4 "$LOG/flashinfer_warmup.log"; fi
}

run_stage() {
  local stage=$1
  echo "=== $stage ($SECONDS s)"
  case "$stage" in
    build)
      nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv | tee "$LOG/gpu.txt"
      if [ -n "${PYTHONPATH:-}" ]; then
        python3 bench/flashinfer_warmup.py > "$LOG/flashinfer_warmup.log" 2>&1 &
        WARMUP_PID=$!
      fi
      MAX_JOBS=16 python3 -m pip install -q --no-index --no-deps --no-build-isolation -e . \
        > "$LOG/build.log" 2>&1 || { tail -50 "$LOG/build.log"; exit 1; }
      python3 -m specops.info | tee "$LOG/info.txt"
      ;;
    test) run_tests ;;
    memcheck) run_memcheck ;;
    tests+memcheck)  # both at once, the sanitizer being slow; but the tests beside it took 2.6x
      # their time alone on an H200 (NOTES, 2026-12-03, a cold Triton cache counted in): heavy sets alone
      run_memcheck > "$LOG/memcheck.summary" &
      run_tests
      wait $!
      cat "$LOG/memcheck.summary"
      ;;
    plans)  # the extension's C++ runtime and the eager plans (verify, attention), then their crossover
      python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_extension_build.py tests/test_triton_launch_plan.py \
        tests/test_attention_launch_plan.py > "$LOG/plans_tests.log" 2>&1
      tail -4 "$LOG/plans_tests.log"
      python3 bench/eager_attention.py --out "$RESULTS" 2>&1 | tee "$LOG/eager_attention.log" | tail -30
      ;;
    bench-verify)
      wait_warmup
      python3 bench/bench_verify.py --out "$RESULTS" 2>&1 | tee "$LOG/bench_verify.log" | tail -60
      ;;
    bench-attention)
      wait_warmup
      python3 bench/bench_attention.py --out "$RESULTS" ${ATTENTION_QUICK:+--quick} ${ATTENTION_SETTLE:+--settle "$ATTENTION_SETTLE"} 2>&1 | tee "$LOG/bench_attention.log" | tail -70
      ;;
    bench-e2e)
      python3 bench/bench_e2e.py --out "$RESULTS" ${E2E_QUICK:+--quick} 2>&1 | tee "$LOG/bench_e2e.log" | tail -60
      ;;
    bench-sampling)
      wait_warmup
      python3 bench/bench_sampling.py --out "$RESULTS" 2>&1 | tee "$LOG/bench_sampling.log" | tail -60
      ;;
    ab-search)  # the top-k/top-p searches: against .ab_base/ when there (git archive REV triton_kernels |
      # tar -x -C .ab_base, carried), their launch constants in the same process, the row passes
      (cd bench
       base=""; [ -d ../.ab_base/triton_kernels ] && base="--base ../.ab_base"
       # shellcheck disable=SC2086
       python3 ab_verify.py $base --profile 2>&1 | tee "$LOG/ab_verify.log" | tail -12
       python3 ab_verify.py --variant SEARCH_KEEP_LIMIT=-1 --variant SEARCH_UNROLL=2 --variant SEARCH_KEEP_LIMIT=1024 \
         --shapes 64:4:128256:random:topk50,64:4:128256:random:topp0.9,16:4:128256:random:topk50:topp0.9 \
         2>&1 | tee "$LOG/search_sweep.log" | tail -6
       python3 search_rounds.py 2>&1 | tee "$LOG/search_rounds.log")
      ;;
    bench)
      for b in bench-verify bench-attention bench-e2e; do run_stage "$b"; done
      ;;
    *) echo "unknown stage $stage"; status=1 ;;
  esac
}

for stage in "$@"; do run_stage "$stage"; done
exit $status
