#!/usr/bin/env bash
# Sets up a fresh machine to build and test specops: reuses an installed torch (else
# installs torch==2.13.0, the CPU wheel on developer and CI machines), installs the
# build and test dependencies (and the engine's: safetensors, tokenizers, transformers),
# and builds specops._C in place.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python3}"
pip_install() { "$PYTHON" -m pip install -q --disable-pip-version-check "$@"; }

if ! "$PYTHON" -c "import torch" 2>/dev/null; then
  pip_install "torch==2.13.0"
fi
"$PYTHON" -c "import triton" 2>/dev/null || pip_install "triton==3.6.0"
# pytest-xdist: the test command spreads the suite over the machine's cores (-n auto).
pip_install pytest "pytest-xdist==3.8.0" hypothesis scipy numpy pybind11 ninja setuptools wheel
# The engine reads checkpoints (safetensors) and tokenizers; its tests compare with transformers.
pip_install "safetensors==0.8.0" "tokenizers==0.23.2" "transformers==5.17.0"
# MAX_JOBS bounds ninja's parallel compiles (2 cores on CI).
MAX_JOBS="${MAX_JOBS:-2}" "$PYTHON" -m pip install -q --disable-pip-version-check --no-build-isolation -e .
"$PYTHON" -m specops.info
