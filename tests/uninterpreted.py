"""Compile tests under the interpreter: with TRITON_INTERPRET=1 (how the suite runs on CPU)
@triton.jit makes interpreted functions, which cannot be compiled, so a compile-test file
runs itself again in a fresh process without the interpreter."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"


def rerun_without_interpreter(test_file: str) -> None:
    """Run the tests of ``test_file`` in a fresh pytest process without TRITON_INTERPRET;
    fail with the end of its output if any of them fails."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    result = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", test_file],
                            check=False, env=env, cwd=Path(__file__).resolve().parents[1], capture_output=True,
                            text=True, timeout=900)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
