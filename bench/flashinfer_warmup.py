"""Compile (JIT) the FlashInfer kernels the benchmarks call, at tiny sizes, so a GPU session
can compile them while specops builds (scripts/gpu_check.sh runs it in the background).

The calls match bench_verify.py (sampling.softmax, chain_speculative_sampling on float32)
and bench_attention.py (decode wrapper with and without tensor cores, causal paged prefill;
GQA 32/8, head dim 128, bfloat16, block 16): FlashInfer caches a kernel per such
configuration, whatever the batch size.
"""

from __future__ import annotations

import time

import torch

# bench_attention.py's shapes, repeated: importing it would import specops, which may still
# be building when this runs.
NUM_HEADS, NUM_KV_HEADS, HEAD_DIM, BLOCK_SIZE = 32, 8, 128, 16
DTYPE = torch.bfloat16


def main() -> None:
    start = time.perf_counter()
    import flashinfer
    import flashinfer.sampling

    device = torch.device("cuda")
    B, k, V = 2, 3, 1000
    probs = flashinfer.sampling.softmax(torch.randn(B * (k + 1), V, device=device)).view(B, k + 1, V)
    draft_probs = torch.softmax(torch.randn(B, k, V, device=device), -1)
    drafts = torch.randint(0, V, (B, k), device=device, dtype=torch.int32)
    flashinfer.sampling.chain_speculative_sampling(draft_probs, drafts, probs)
    print(f"sampling kernels ready at {time.perf_counter() - start:.0f} s", flush=True)

    blocks = 2
    indptr = (torch.arange(B + 1, device=device) * blocks).to(torch.int32)
    indices = torch.arange(B * blocks, device=device, dtype=torch.int32)
    last_page_len = torch.full((B,), BLOCK_SIZE, dtype=torch.int32, device=device)
    cache = torch.randn(B * blocks, BLOCK_SIZE, NUM_KV_HEADS, HEAD_DIM, device=device, dtype=DTYPE)
    workspace = torch.empty(128 << 20, dtype=torch.uint8, device=device)
    for tensor_cores in (False, True):
        wrapper = flashinfer.BatchDecodeWithPagedKVCacheWrapper(workspace, "NHD", use_tensor_cores=tensor_cores)
        wrapper.plan(indptr, indices, last_page_len, NUM_HEADS, NUM_KV_HEADS, HEAD_DIM, BLOCK_SIZE,
                     q_data_type=DTYPE, kv_data_type=DTYPE, sm_scale=HEAD_DIM**-0.5)
        wrapper.run(torch.randn(B, NUM_HEADS, HEAD_DIM, device=device, dtype=DTYPE), (cache, cache))
        print(f"decode (tensor cores {tensor_cores}) ready at {time.perf_counter() - start:.0f} s", flush=True)
    q_len = 5
    cu_query_lens = (torch.arange(B + 1, device=device) * q_len).to(torch.int32)
    wrapper = flashinfer.BatchPrefillWithPagedKVCacheWrapper(workspace, "NHD")
    wrapper.plan(cu_query_lens, indptr, indices, last_page_len, NUM_HEADS, NUM_KV_HEADS, HEAD_DIM, BLOCK_SIZE,
                 causal=True, sm_scale=HEAD_DIM**-0.5, q_data_type=DTYPE, kv_data_type=DTYPE)
    wrapper.run(torch.randn(B * q_len, NUM_HEADS, HEAD_DIM, device=device, dtype=DTYPE), (cache, cache))
    torch.cuda.synchronize()
    print(f"prefill ready at {time.perf_counter() - start:.0f} s", flush=True)


if __name__ == "__main__":
    main()
