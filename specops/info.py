"""``python -m specops.info``: what this install of specops can run.

Prints the backends compiled into specops._C, the CUDA arch list, the torch, triton and
CUDA versions, and the GPU torch sees.
"""

from __future__ import annotations

import torch

import specops
from specops.backend import available_backends, triton_available


def collect() -> dict:
    built = specops.build_info()
    info = {
        "specops": specops.__version__,
        "compiled backends": ", ".join(built["backends"]),
        "cuda arch list": built["cuda_arch_list"] or "-",
        "built against torch": built["torch_version"],
        "built against CUDA": built["cuda_version"] or "-",
        "torch": torch.__version__,
        "torch CUDA": torch.version.cuda or "-",
        "triton": _triton_version(),
        "gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else "none seen",
        "backends for cpu tensors": ", ".join(b.value for b in available_backends(torch.device("cpu"))),
    }
    if torch.cuda.is_available():
        info["backends for cuda tensors"] = ", ".join(b.value for b in available_backends(torch.device("cuda")))
    return info


def _triton_version() -> str:
    if not triton_available():
        return "not installed"
    import triton

    return triton.__version__


def main() -> None:
    info = collect()
    width = max(len(k) for k in info)
    for key, value in info.items():
        print(f"{key:<{width}}  {value}")


if __name__ == "__main__":
    main()
