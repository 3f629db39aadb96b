// The index of every specops op: schemas for both namespaces, and the build-info module.
//
// torch.ops.specops.<op>         CUDA kernels (csrc/*.cu) and C++ CPU kernels (csrc/*_cpu.cpp)
// torch.ops.specops_triton.<op>  Triton kernels, registered from Python (specops/_triton_ops.py)
//
// Mutated arguments are marked Tensor(a!) and never returned. Shapes use B = batch,
// T = num_tokens (all draft tokens, flattened), V = vocab, S = max_spec_len.
#include <torch/extension.h>
#include <torch/library.h>

#include "build_info.h"
#ifdef SPECOPS_WITH_CUDA
#include "launch_replay.h"
#endif

namespace {

void define_sampling_schemas(torch::Library& m) {
  // values [B] float32|int32|int64, cu_num_draft_tokens [B] int32 -> [T]
  m.def(
      "expand_to_tokens(Tensor values, Tensor cu_num_draft_tokens, SymInt num_tokens, "
      "float? replace_from=None, float replace_to=0.0) -> Tensor");
  // output_token_ids [B, S + 1] int32; draft_token_ids, target_argmax [T]; bonus [B];
  // is_greedy [B] bool (None: every request is greedy)
  m.def(
      "rejection_greedy_sample(Tensor(a!) output_token_ids, Tensor cu_num_draft_tokens, "
      "Tensor draft_token_ids, Tensor target_argmax, Tensor bonus_token_ids, "
      "Tensor? is_greedy=None) -> ()");
  // draft_probs, target_probs [T, V] float32 (draft_probs None: n-gram drafts);
  // recovered_token_ids [T]; uniform_probs [T] float32; is_greedy None: none is greedy
  m.def(
      "rejection_random_sample(Tensor(a!) output_token_ids, Tensor cu_num_draft_tokens, "
      "Tensor draft_token_ids, Tensor? draft_probs, Tensor target_probs, "
      "Tensor bonus_token_ids, Tensor recovered_token_ids, Tensor uniform_probs, "
      "Tensor? is_greedy=None) -> ()");
  // exponentials [B, V] float32 Exp(1) draws -> recovered token ids [T] int32
  m.def(
      "sample_recovered_tokens(Tensor cu_num_draft_tokens, Tensor draft_token_ids, "
      "Tensor? draft_probs, Tensor target_probs, Tensor exponentials) -> Tensor");
}

// The fused verify op (C++ CPU, CUDA and Triton kernels and the reference).
// target_logits [T, V] float32|bfloat16|float16, bonus_logits [B, V], draft_token_ids [T],
// draft_probs [T, V] float32 (None: n-gram), temperature [B] float32 (0 = greedy; None: every
// request greedy), top_k [B] int32, top_p [B] float32, seeds [B] int64, positions [B] int64
// (absolute position of each request's first draft) -> output_token_ids [B, S + 1] int32,
// num_accepted [B] int32, logprobs [B, S + 1] float32 ([0, 0] unless return_logprobs)
void define_verify_schema(torch::Library& m) {
  m.def(
      "verify(Tensor target_logits, Tensor bonus_logits, Tensor draft_token_ids, Tensor? draft_probs, "
      "Tensor cu_num_draft_tokens, Tensor? temperature, Tensor? top_k, Tensor? top_p, Tensor seeds, "
      "Tensor positions, int max_spec_len, bool return_logprobs=False) -> (Tensor, Tensor, Tensor)");
}

// Paged attention (C++ CPU kernels and the reference so far; CUDA and Triton to come, so
// only torch.ops.specops has these). N = new tokens, Hq/Hkv = query/KV heads, D = head dim.
void define_attention_schemas(torch::Library& m) {
  // key, value [N, Hkv, D]; key_cache, value_cache [num_blocks, block_size, Hkv, D]
  // float32|bfloat16|float16 (key/value dtype of the caches); slot_mapping [N] int64 (-1 = skip)
  m.def(
      "reshape_and_cache(Tensor key, Tensor value, Tensor(a!) key_cache, Tensor(b!) value_cache, "
      "Tensor slot_mapping) -> ()");
  // query [Q, Hq, D]; caches as above; block_table [B, max_blocks] int32; seq_lens [B] int32;
  // cu_query_lens [B + 1] int32 -> out [Q, Hq, D] dtype of query, lse [Q, Hq] float32
  // ([0, 0] unless return_lse); sliding_window 0 = off, soft_cap 0 = off; max_query_len: the
  // longest query length if the caller knows it (0 = unknown), a tiling hint only
  m.def(
      "paged_attention(Tensor query, Tensor key_cache, Tensor value_cache, Tensor block_table, "
      "Tensor seq_lens, Tensor cu_query_lens, float scale, int sliding_window=0, float soft_cap=0.0, "
      "bool return_lse=False, int max_query_len=0) -> (Tensor, Tensor)");
}

// The statistics behind the ops' value checks (specops/_checks.py; torch.ops.specops only:
// C++ CPU and CUDA kernels, reference/checks.py). cu_num_draft_tokens [B] and token_ids
// [T] int32|int64, logits float32|bfloat16|float16, temperature and top_p [B] float32, each read
// as its flat numel -> [9] float64 (min and max draft count, cu[B - 1], min and max id, and
// flags: non-finite target / bonus logits, a temperature not >= 0, a top_p not > 0)
void define_check_schemas(torch::Library& m) {
  m.def(
      "sampling_value_stats(Tensor cu_num_draft_tokens, Tensor? token_ids, Tensor? target_logits, "
      "Tensor? bonus_logits, Tensor? temperature, Tensor? top_p) -> Tensor");
  // block_table [B, max_blocks], seq_lens [B], cu_query_lens [B + 1], int32 -> [6] float64
  // (cu_query_lens[0] and [B], the smallest query length, the smallest seq_len - query
  // length, the most blocks a sequence needs, and a flag: a used block id out of range)
  m.def(
      "paged_attention_value_stats(Tensor block_table, Tensor seq_lens, Tensor cu_query_lens, int block_size, "
      "int num_blocks) -> Tensor");
}

}  // namespace

TORCH_LIBRARY(specops, m) {
  define_sampling_schemas(m);
  define_verify_schema(m);
  define_attention_schemas(m);
  define_check_schemas(m);
}

TORCH_LIBRARY(specops_triton, m) {
  define_sampling_schemas(m);
  define_verify_schema(m);
  define_attention_schemas(m);
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "specops native extension: build information (the ops live in torch.ops.specops)";
  m.def("build_info", &specops::build_info,
        "Backends compiled in, CUDA arch list and the versions the extension was built with.");
#ifdef SPECOPS_WITH_CUDA
  specops::define_launch_replay(m);
#endif
}
