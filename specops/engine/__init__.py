"""The minimal speculative-decoding engine (built on specops.ops only)."""

from specops.engine.rejection_sampler import RejectionSampler, SamplerOutput, SamplingParams, StepMetrics

__all__ = ["RejectionSampler", "SamplerOutput", "SamplingParams", "StepMetrics"]
