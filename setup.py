"""Builds specops._C: the C++ CPU kernels always, the CUDA kernels when torch has CUDA
and nvcc is present (sm_90 unless TORCH_CUDA_ARCH_LIST says otherwise).

SPECOPS_NO_CUDA=1 forces a CPU-only build; SPECOPS_FORCE_CUDA=1 builds the CUDA kernels
even when torch cannot see a GPU (a CUDA torch on a machine without one).
"""

import glob
import os

from setuptools import setup

import torch
from torch.utils.cpp_extension import CUDA_HOME, BuildExtension, CppExtension, CUDAExtension

ROOT = os.path.dirname(os.path.abspath(__file__))


def _with_cuda() -> bool:
    if os.environ.get("SPECOPS_NO_CUDA") == "1":
        return False
    return torch.version.cuda is not None and CUDA_HOME is not None


def _extension():
    cpp_sources = sorted(glob.glob("csrc/*.cpp"))
    # No FMA contraction: the reproducible exp/log (csrc/repro_math.h) need every float
    # operation rounded on its own, as the reference does.
    cxx_flags = ["-O3", "-ffp-contract=off"]
    macros = []
    if not _with_cuda():
        return CppExtension("specops._C", cpp_sources, extra_compile_args={"cxx": cxx_flags},
                            define_macros=macros)
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
