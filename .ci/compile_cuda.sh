#!/usr/bin/env bash
# Compiles every CUDA source to an sm_90 object with nvcc against the installed torch's
# headers, so CUDA code that does not compile fails CI even on a machine without a GPU.
# With a CPU-only torch wheel, C10_CUDA_NO_CMAKE_CONFIGURE_FILE stands in for the CUDA
# configure header that wheel lacks.
set -euo pipefail
cd "$(dirname "$0")/.."
NVCC="${NVCC:-$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)}"
if [ ! -x "$NVCC" ]; then
  echo "compile_cuda: nvcc not found" >&2
  exit 1
fi
mapfile -t INCLUDES < <(python3 -c "
import sysconfig
from torch.utils.cpp_extension import include_paths
for p in include_paths() + [sysconfig.get_paths()['include']]:
    print('-I' + p)
import pybind11; print('-I' + pybind11.get_include())
")
OUT_DIR="${CUDA_OBJ_DIR:-build/cuda-objects}"
mkdir -p "$OUT_DIR"
# One nvcc a source, all at once (CI has 2 cores; the sources took ~165 s one after another),
# then each one's result in order.
compile_one() {
  local src=$1 obj=$2
  "$NVCC" -c "$src" -o "$obj" -std=c++17 -O3 -gencode=arch=compute_90,code=sm_90 \
    --expt-relaxed-constexpr -Xcompiler -fPIC -DSPECOPS_WITH_CUDA -DC10_CUDA_NO_CMAKE_CONFIGURE_FILE \
    -DTORCH_EXTENSION_NAME=_C -Icsrc "${INCLUDES[@]}" -Xptxas -v 2> "$obj.log"
}
# The CUDA sources, and the C++ sources compiled only into CUDA builds (they include cuda.h).
SOURCES=(csrc/*.cu csrc/launch_replay.cpp)
pids=()
for src in "${SOURCES[@]}"; do
  compile_one "$src" "$OUT_DIR/$(basename "${src%.*}").o" &
  pids+=($!)
done
status=0
i=0
for src in "${SOURCES[@]}"; do
  obj="$OUT_DIR/$(basename "${src%.*}").o"
  echo "nvcc $src -> $obj (sm_90)"
  if ! wait "${pids[$i]}"; then
    cat "$obj.log" >&2
    status=1
  else
    grep -E "registers|spill" "$obj.log" | sed 's/^/  /' | head -40 || true  # none for a host-only source
  fi
  i=$((i + 1))
done
exit $status
