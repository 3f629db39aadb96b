"""specops: kernels for lossless speculative decoding, as PyTorch custom ops.

Importing specops registers torch.ops.specops.* (CUDA and C++ CPU kernels),
torch.ops.specops_triton.* (Triton kernels, when triton is installed) and their fake
kernels, and exposes the typed API below.
"""

import torch  # noqa: F401  (loads libtorch before the extension)

from specops import _C  # noqa: F401  (registers torch.ops.specops and specops_triton schemas)
from specops import fake  # noqa: F401  (registers the fake kernels)
from specops._native import build_info
from specops.backend import Backend, available_backends
from specops.ops import (
    expand_to_tokens,
    paged_attention,
    rejection_greedy_sample,
    rejection_random_sample,
    reshape_and_cache,
    sample_recovered_tokens,
    verify,
)

from specops.backend import triton_available as _triton_available

if _triton_available():
    from specops import _triton_ops

    _triton_ops.register()

__all__ = [
    "Backend",
    "available_backends",
    "build_info",
    "expand_to_tokens",
    "paged_attention",
    "rejection_greedy_sample",
    "rejection_random_sample",
    "reshape_and_cache",
    "sample_recovered_tokens",
    "verify",
]
__version__ = "0.1.0"
