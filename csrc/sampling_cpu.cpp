// C++ CPU kernels of the verification-sampling ops, so every op runs on any machine.
// Same arithmetic as the CUDA kernels (float32, helpers in token_ids.h), so all backends
// agree bit for bit with reference/sampling.py given the same random draws.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
#include <limits>
#include <vector>

#include "rejection_rows.h"
#include "sampling.h"

namespace specops {
namespace {

template <typename T>
void expand_rows(const T* values, const int32_t* cu, T* out, int64_t batch, int64_t num_tokens,
                 bool replace, T replace_from, T replace_to) {
  for (int64_t b = 0; b < batch; ++b) {
    const DraftRange r = draft_range(cu, b, num_tokens, num_tokens);
    T v = values[b];
    if (replace && v == replace_from) v = replace_to;
    for (int64_t t = r.start; t < r.start + r.count; ++t) out[t] = v;
  }
}

at::Tensor expand_to_tokens_cpu(const at::Tensor& values, const at::Tensor& cu_num_draft_tokens,
                                int64_t num_tokens, std::optional<double> replace_from,
                                double replace_to) {
  const RaggedSizes s = check_expand_to_tokens(values, cu_num_draft_tokens, num_tokens, replace_from);
  // Rows no request covers (only with inconsistent cu_num_draft_tokens) stay zero.
  at::Tensor out = at::zeros({num_tokens}, values.options());
  const int32_t* cu = cu_num_draft_tokens.data_ptr<int32_t>();
  switch (values.scalar_type()) {
    case at::kFloat:
      expand_rows<float>(values.data_ptr<float>(), cu, out.data_ptr<float>(), s.batch, num_tokens,
                         replace_from.has_value(), static_cast<float>(replace_from.value_or(0.0)),
                         static_cast<float>(replace_to));
      break;
    case at::kInt:
      expand_rows<int32_t>(values.data_ptr<int32_t>(), cu, out.data_ptr<int32_t>(), s.batch,
                           num_tokens, false, 0, 0);
      break;
    default:
      expand_rows<int64_t>(values.data_ptr<int64_t>(), cu, out.data_ptr<int64_t>(), s.batch,
                           num_tokens, false, 0, 0);
  }
  return out;
}

bool owns_row(const bool* is_greedy, int64_t b, bool greedy_op) {
  return is_greedy == nullptr || is_greedy[b] == greedy_op;
}

void rejection_greedy_sample_cpu(at::Tensor& output_token_ids, const at::Tensor& cu_num_draft_tokens,
                                 const at::Tensor& draft_token_ids, const at::Tensor& target_argmax,
                                 const at::Tensor& bonus_token_ids,
                                 const std::optional<at::Tensor>& is_greedy) {
  const RaggedSizes s = check_rejection_greedy_sample(output_token_ids, cu_num_draft_tokens,
                                                      draft_token_ids, target_argmax,
                                                      bonus_token_ids, is_greedy);
  int32_t* out = output_token_ids.data_ptr<int32_t>();
  const int32_t* cu = cu_num_draft_tokens.data_ptr<int32_t>();
  const TokenIds draft = token_ids(draft_token_ids), target = token_ids(target_argmax),
                 bonus = token_ids(bonus_token_ids);
  const bool* greedy = optional_bool_ptr(is_greedy);
  at::parallel_for(0, s.batch, 64, [&](int64_t begin, int64_t end) {
    for (int64_t b = begin; b < end; ++b) {
      if (!owns_row(greedy, b, true)) continue;
      greedy_row(out + b * s.width, s.width, draft_range(cu, b, s.num_tokens, s.width - 1), draft,
                 target, bonus[b]);
    }
  });
}

void rejection_random_sample_cpu(at::Tensor& output_token_ids, const at::Tensor& cu_num_draft_tokens,
                                 const at::Tensor& draft_token_ids,
                                 const std::optional<at::Tensor>& draft_probs,
                                 const at::Tensor& target_probs, const at::Tensor& bonus_token_ids,
                                 const at::Tensor& recovered_token_ids,
                                 const at::Tensor& uniform_probs,
                                 const std::optional<at::Tensor>& is_greedy) {
  const RaggedSizes s = check_rejection_random_sample(
      output_token_ids, cu_num_draft_tokens, draft_token_ids, draft_probs, target_probs,
      bonus_token_ids, recovered_token_ids, uniform_probs, is_greedy);
  int32_t* out = output_token_ids.data_ptr<int32_t>();
  const int32_t* cu = cu_num_draft_tokens.data_ptr<int32_t>();
  const TokenIds draft = token_ids(draft_token_ids), bonus = token_ids(bonus_token_ids),
                 recovered = token_ids(recovered_token_ids);
  const float* q_probs = optional_float_ptr(draft_probs);
  const float* p_probs = target_probs.data_ptr<float>();
  const float* uniform = uniform_probs.data_ptr<float>();
  const bool* greedy = optional_bool_ptr(is_greedy);
  at::parallel_for(0, s.batch, 64, [&](int64_t begin, int64_t end) {
    for (int64_t b = begin; b < end; ++b) {
      if (!owns_row(greedy, b, false)) continue;
      random_row(out + b * s.width, s.width, draft_range(cu, b, s.num_tokens, s.width - 1), draft,
                 q_probs, p_probs, s.vocab, recovered, uniform, bonus[b]);
    }
  });
}

// The exponential race over one row; kHasDraftProbs is a template argument so the inner
// loop has no branch but the compare.
template <bool kHasDraftProbs>
int32_t race_row(const float* p, const float* q, const float* e, int64_t vocab, int64_t token) {
  float best = -std::numeric_limits<float>::infinity();
  int64_t best_index = 0;
  for (int64_t v = 0; v < vocab; ++v) {
    const float residual = kHasDraftProbs ? p[v] - q[v] : (v == token ? 0.f : p[v]);
    const float score = race_score(residual, e[v]);
    if (score > best) {  // strict: ties keep the lowest index
      best = score;
      best_index = v;
    }
  }
  return static_cast<int32_t>(best_index);
}

at::Tensor sample_recovered_tokens_cpu(const at::Tensor& cu_num_draft_tokens,
                                       const at::Tensor& draft_token_ids,
                                       const std::optional<at::Tensor>& draft_probs,
                                       const at::Tensor& target_probs,
                                       const at::Tensor& exponentials) {
  const RaggedSizes s = check_sample_recovered_tokens(cu_num_draft_tokens, draft_token_ids,
                                                      draft_probs, target_probs, exponentials);
  // Rows no request covers (only with inconsistent cu_num_draft_tokens) get 0.
  at::Tensor out = at::zeros({s.num_tokens}, cu_num_draft_tokens.options());
  int32_t* recovered = out.data_ptr<int32_t>();
  const int32_t* cu = cu_num_draft_tokens.data_ptr<int32_t>();
  const TokenIds draft = token_ids(draft_token_ids);
  const float* q_probs = optional_float_ptr(draft_probs);
  const float* p_probs = target_probs.data_ptr<float>();
  const float* expo = exponentials.data_ptr<float>();
  const int64_t vocab = s.vocab;
  // Which request owns each row, then one parallel loop over all rows.
  std::vector<int64_t> request(s.num_tokens, -1);
  for (int64_t b = 0; b < s.batch; ++b) {
    const DraftRange r = draft_range(cu, b, s.num_tokens, s.num_tokens);
    for (int64_t t = r.start; t < r.start + r.count; ++t) request[t] = b;
  }
  const int64_t grain = std::max<int64_t>(1, 32768 / std::max<int64_t>(vocab, 1));
  at::parallel_for(0, s.num_tokens, grain, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      const int64_t b = request[t];
      if (b < 0) continue;
      const float* p = p_probs + t * vocab;
      const float* e = expo + b * vocab;
      recovered[t] = q_probs != nullptr ? race_row<true>(p, q_probs + t * vocab, e, vocab, 0)
                                        : race_row<false>(p, nullptr, e, vocab, draft[t]);
    }
  });
  return out;
}

}  // namespace

TORCH_LIBRARY_IMPL(specops, CPU, m) {
  m.impl("expand_to_tokens", &expand_to_tokens_cpu);
  m.impl("rejection_greedy_sample", &rejection_greedy_sample_cpu);
  m.impl("rejection_random_sample", &rejection_random_sample_cpu);
  m.impl("sample_recovered_tokens", &sample_recovered_tokens_cpu);
}

}  // namespace specops
