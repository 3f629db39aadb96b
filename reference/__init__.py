"""Pure-PyTorch references of every specops op (installed as specops.reference)."""

from specops.reference.sampling import (  # noqa: F401
    expand_to_tokens,
    rejection_greedy_sample,
    rejection_random_sample,
    sample_recovered_tokens,
)
