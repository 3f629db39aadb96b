"""Builds specops._C: the C++ CPU kernels always, the CUDA kernels when torch has CUDA
and nvcc is present (sm_90 unless TORCH_CUDA_ARCH_LIST says otherwise).

SPECOPS_NO_CUDA=1 forces a CPU-only build; SPECOPS_FORCE_CUDA=1 builds the CUDA kernels
even when torch cannot see a GPU (a CUDA torch on a machine without one).
"""

import glob
import os
import subprocess

from setuptools import setup

import torch
from torch.utils.cpp_extension import CUDA_HOME, BuildExtension, CppExtension, CUDAExtension

ROOT = os.path.dirname(os.path.abspath(__file__))


def _with_cuda() -> bool:
    if os.environ.get("SPECOPS_NO_CUDA") == "1":
        return False
    return torch.version.cuda is not None and CUDA_HOME is not None


def _shared_cxx_runtime() -> list[str]:
    """The libstdc++ this process loaded (torch's), as a linker input, where the C++
    compiler has only the static archive: a compiler that links libstdc++ statically gives
    specops._C a C++ runtime of its own beside torch's, and the two meet in every exception
    and number formatted by the extension (an H200 image's /opt/gcc g++ did this: a c10::str
    of an integer, or an error raised through pybind11, crashed the process). Empty where
    the compiler links the shared library itself, or the process holds none."""
    def links_shared(compiler: str) -> bool:
        try:
            found = subprocess.run([compiler, "-print-file-name=libstdc++.so"], capture_output=True,
                                   text=True, check=True).stdout.strip()
        except (OSError, subprocess.CalledProcessError):
            return True  # no such compiler: nothing to correct
        return os.path.isabs(found) and os.path.exists(found)

    # The build compiles with CXX and may link with CC (setuptools' linker): both are asked.
    if all(links_shared(os.environ.get(name, default)) for name, default in (("CXX", "c++"), ("CC", "cc"))):
        return []
    try:
        with open("/proc/self/maps") as maps:
            loaded = {line.split()[-1] for line in maps if "/libstdc++.so" in line}
    except OSError:
        return []
    return sorted(loaded)[:1]


def _extension():
    cpp_sources = sorted(glob.glob("csrc/*.cpp"))
    # No FMA contraction: the reproducible exp/log (csrc/repro_math.h) need every float
    # operation rounded on its own, as the reference does.
    cxx_flags = ["-O3", "-ffp-contract=off"]
    macros = []
    if not _with_cuda():
        return CppExtension("specops._C", cpp_sources, extra_compile_args={"cxx": cxx_flags},
                            extra_link_args=_shared_cxx_runtime(), define_macros=macros)
    arch_list = os.environ.setdefault("TORCH_CUDA_ARCH_LIST", "9.0")
    macros += [
        ("SPECOPS_WITH_CUDA", None),
        ("SPECOPS_CUDA_ARCH_LIST", f'"{arch_list}"'),
        ("SPECOPS_CUDA_VERSION", f'"{torch.version.cuda}"'),
    ]
    nvcc_flags = ["-O3", "-lineinfo", "--expt-relaxed-constexpr"]
    return CUDAExtension(
        "specops._C",
        cpp_sources + sorted(glob.glob("csrc/*.cu")),
        extra_compile_args={"cxx": cxx_flags, "nvcc": nvcc_flags},
        extra_link_args=_shared_cxx_runtime(),
        define_macros=macros,
    )


setup(
    packages=["specops", "specops.assets", "specops.engine", "specops.reference", "specops.triton_kernels"],
    # The embedded draft/target pair (weights, configs, tokenizer) ships with the package.
    package_data={"specops.assets": ["pair/*.json", "pair/*.md", "pair/*/*.json", "pair/*/*.safetensors"]},
    package_dir={
        "specops": "specops",
        "specops.reference": "reference",
        "specops.triton_kernels": "triton_kernels",
    },
    ext_modules=[_extension()],
    cmdclass={"build_ext": BuildExtension.with_options(use_ninja=True)},
)
