"""Triton kernels of specops (installed as specops.triton_kernels); one family per file.
Nothing here is imported until a Triton op is registered, so specops works without triton."""
