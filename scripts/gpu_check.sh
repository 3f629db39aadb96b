#!/usr/bin/env bash
# One lent-GPU session in a script: build, GPU tests, memcheck, benchmark. Logs go to
# $OUT (the device tool's output folder) or ./gpu-logs. Usage:
#   scripts/gpu_check.sh build test        # build, then the GPU tests
#   scripts/gpu_check.sh memcheck bench    # compute-sanitizer run, then the benchmark
# FlashInfer is installed from .whl/ when present (see bench/README.md).
set -uo pipefail
cd "$(dirname "$0")/.."
LOG="${OUT:-gpu-logs}"
mkdir -p "$LOG"
export PYTHONUNBUFFERED=1 HYPOTHESIS_PROFILE=ci
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null
  export PYTHONPATH=/tmp/site FLASHINFER_CUDA_ARCH_LIST=9.0
fi
status=0
for stage in "$@"; do
  echo "=== $stage"
  case "$stage" in
    build)
      nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv | tee "$LOG/gpu.txt"
      MAX_JOBS=16 python3 -m pip install -q --no-index --no-deps --no-build-isolation -e . \
        > "$LOG/build.log" 2>&1 || { tail -50 "$LOG/build.log"; exit 1; }
      python3 -m specops.info | tee "$LOG/info.txt"
      ;;
    test)
      python3 -m pytest -q -m gpu -p no:cacheprovider --durations=10 2>&1 | tee "$LOG/gpu_tests.log" | tail -25
      python3 -m pytest -q -m "not gpu" -p no:cacheprovider 2>&1 | tee "$LOG/cpu_tests.log" | tail -3
      ;;
    memcheck)
      compute-sanitizer --tool memcheck --error-exitcode 9 --print-limit 20 \
        python3 -m pytest -q -m gpu -p no:cacheprovider -k "not offsets and not hypothesis and not distribution" \
        tests/test_sampling_ops.py tests/test_sampling_errors.py tests/test_sampling_registration.py tests/test_verify_ops.py \
        > "$LOG/memcheck.log" 2>&1
      echo "memcheck exit $?" | tee -a "$LOG/memcheck.log"
      grep -E "ERROR SUMMARY|passed|failed" "$LOG/memcheck.log" | tail -5
      ;;
    bench)
      python3 bench/bench_sampling.py --out "$LOG" 2>&1 | tee "$LOG/bench_sampling.log" | tail -60
      ;;
    *) echo "unknown stage $stage"; status=1 ;;
  esac
done
exit $status
