"""One model with its KV cache, run eagerly or from captured CUDA graphs.

Decode and verify steps repeat the same shapes (B sequences of q_len 1 or k + 1), so
their launches can be captured once and replayed: the attention batch is copied into
static buffers and the graph replays every kernel of the forward pass with no Python in
between. Graphs are keyed by the batch's shapes and its max_query_len hint; a batch of a
new key is captured on first use. Callers ask for a graph only for shapes that recur
(decode, verify windows); prefill and ragged batches run eagerly.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace

import torch

from specops.engine.kv_cache import AttentionBatch, KVCache
from specops.engine.model import LlamaForCausalLM

# The batch's tensors, copied into a graph's static buffers; max_query_len is a host int
# baked into the captured launches, so it is part of the graph's key instead.
_TENSOR_FIELDS = tuple(f.name for f in fields(AttentionBatch) if f.name != "max_query_len")


@dataclass
class _Graph:
    graph: torch.cuda.CUDAGraph
    inputs: AttentionBatch  # static buffers the graph reads
    logits: torch.Tensor  # static output the graph writes


class ModelRunner:
    """Runs ``model`` over attention batches against ``cache``.

    Parameters
    ----------
    model, cache : the model and its paged KV cache (same device and dtype).
    use_cuda_graphs : capture and replay batches of at most ``max_graph_tokens`` new tokens
        (CUDA only; off on the CPU, where it raises).
    """

    def __init__(self, model: LlamaForCausalLM, cache: KVCache, *, use_cuda_graphs: bool = False,
                 max_graph_tokens: int = 512):
        device = cache.key.device
        if use_cuda_graphs and device.type != "cuda":
            raise ValueError(f"use_cuda_graphs needs a CUDA cache, got device {device}")
        self.model = model
        self.cache = cache
        self.use_cuda_graphs = use_cuda_graphs
        self.max_graph_tokens = max_graph_tokens
        self._graphs: dict[tuple, _Graph] = {}
        self._pool = torch.cuda.graph_pool_handle() if use_cuda_graphs else None

    @staticmethod
    def _key(batch: AttentionBatch) -> tuple:
        return (*(tuple(getattr(batch, name).shape) for name in _TENSOR_FIELDS), batch.max_query_len)

    def __call__(self, batch: AttentionBatch, use_graph: bool = False) -> torch.Tensor:
        """Logits of ``batch.logits_indices``. Shape: ``[M, vocab]``. From a graph (``use_graph``
        and graphs on), the tensor is the graph's static output: read it before the next call
        of the same shape."""
        if not (use_graph and self.use_cuda_graphs) or batch.num_tokens > self.max_graph_tokens:
            return self.model(batch, self.cache)
        key = self._key(batch)
        entry = self._graphs.get(key)
        if entry is None:
            entry = self._graphs[key] = self._capture(batch)
        for name in _TENSOR_FIELDS:
            getattr(entry.inputs, name).copy_(getattr(batch, name), non_blocking=True)
        entry.graph.replay()
        return entry.logits

    def _capture(self, batch: AttentionBatch) -> _Graph:
        static = replace(batch, **{name: getattr(batch, name).clone() for name in _TENSOR_FIELDS})
        # Warm-up on a side stream (compiles the Triton kernels, sets up cuBLAS) before capture.
        # The cache rows it writes are those the real call writes again right after.
        # Both under model.for_cuda_graph(): the warm-up compiles what the capture records.
        with self.model.for_cuda_graph():
            stream = torch.cuda.Stream()
            stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(stream):
                for _ in range(2):
                    self.model(static, self.cache)
            torch.cuda.current_stream().wait_stream(stream)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=self._pool):
                logits = self.model(static, self.cache)
        return _Graph(graph, static, logits)

    @property
    def num_graphs(self) -> int:
        return len(self._graphs)
