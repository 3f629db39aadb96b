"""The Triton launchers of the verification-sampling ops, one kernel family per file:
expand.py, rejection.py, recovered.py (registered as torch.ops.specops_triton.<op> by
specops/_triton_ops.py, which validates the arguments first)."""

from .expand import expand_to_tokens
from .recovered import sample_recovered_tokens
from .rejection import rejection_greedy_sample, rejection_random_sample

__all__ = [
    "expand_to_tokens",
    "rejection_greedy_sample",
    "rejection_random_sample",
    "sample_recovered_tokens",
]
