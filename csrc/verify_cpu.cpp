// C++ CPU kernel of the fused verify op: from target logits to emitted tokens, one request
// per task, the same float32 steps in the same order as reference/verify.py (exact
// fixed-point normalisers, repro_math.h's exp/log, Philox draws), so it returns exactly
// the reference's tokens and log-probabilities.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstring>
#include <functional>
#include <numeric>
#include <vector>

#include "philox.h"
#include "repro_math.h"
#include "token_ids.h"
#include "verify.h"

namespace specops {
namespace {

constexpr float kFixedScale = 1099511627776.0f;  // 2^40: normaliser sums
constexpr float kMassScale = 4294967296.0f;      // 2^32: top-p masses
constexpr float kTopPScale = 16777216.0f;        // 2^24: top_p

// sum_v floor(w_v 2^40) 2^-40, rounded once to float32.
float fixed_sum(const std::vector<float>& w) {
  int64_t sum = 0;
  for (float x : w) sum += static_cast<int64_t>(std::floor(x * kFixedScale));
  return static_cast<float>(sum) * (1.0f / kFixedScale);
}

void normalise(const std::vector<float>& w, std::vector<float>& p) {
  const float z = fixed_sum(w);
  for (size_t v = 0; v < w.size(); ++v) p[v] = w[v] / z;
}

int64_t fixed_mass(float x) { return static_cast<int64_t>(std::floor(x * kFixedScale)); }

// Keep v when the mass of tokens strictly more probable than v is below top_p: when
// A(key(p_v)) 2^24 < threshold * total, A(c) the mass of the keys (float bits of p, in
// [0, 2^30)) above c. A falls as c grows, so the kept tokens are those whose key is at
// least c*, the least c that holds; c* is found 10 bits at a time from the top (three
// passes of a 1024-bucket mass histogram), not by sorting the row.
std::vector<bool> top_p_keep(const std::vector<float>& p, float top_p) {
  const size_t vocab = p.size();
  std::vector<uint32_t> keys(vocab);
  std::vector<int64_t> mass(vocab);
  int64_t total = 0;
  for (size_t v = 0; v < vocab; ++v) {
    std::memcpy(&keys[v], &p[v], sizeof(float));
    total += mass[v] = static_cast<int64_t>(std::floor(p[v] * kMassScale));
  }
  const int64_t threshold = std::max<int64_t>(1, static_cast<int64_t>(std::floor(top_p * kTopPScale)));
  const auto holds = [&](int64_t above) { return above * (int64_t{1} << 24) < threshold * total; };
  uint32_t least = 1u << 30;  // nothing holds (total 0): keep none, as the reference
  if (holds(0)) {
    uint32_t prefix = 0;  // c*'s bits above the pass's
    int64_t above = 0;    // the mass of the keys above the pass's range
    for (int shift = 20; shift >= 0; shift -= 10) {
      std::vector<int64_t> bucket_mass(1024, 0);
      for (size_t v = 0; v < vocab; ++v) {
        if ((keys[v] >> (shift + 10)) == (prefix >> (shift + 10))) bucket_mass[(keys[v] >> shift) & 1023] += mass[v];
      }
      // c* lies in the lowest bucket whose top key holds (A there: the buckets above it).
      int digit = 1023;
      while (digit > 0 && holds(above + bucket_mass[digit])) above += bucket_mass[digit--];
      prefix |= static_cast<uint32_t>(digit) << shift;
    }
    least = prefix;
  }
  std::vector<bool> keep(vocab);
  for (size_t v = 0; v < vocab; ++v) keep[v] = keys[v] >= least;
  return keep;
}

// The processed weights of one row (reference/verify.py, processed_weights) into w and
// the distribution w / Z into p.
void processed(const std::vector<float>& z, float temperature, int64_t top_k, float top_p, std::vector<float>& w,
               std::vector<float>& p) {
  const int64_t vocab = static_cast<int64_t>(z.size());
  const float max_logit = *std::max_element(z.begin(), z.end());
  if (max_logit == -INFINITY) {  // no finite logit: all mass on token 0
    std::fill(w.begin(), w.end(), 0.0f);
    w[0] = 1.0f;
    normalise(w, p);
    return;
  }
  float kth = -INFINITY;
  if (top_k > 0 && top_k < vocab) {
    std::vector<float> copy(z);
    std::nth_element(copy.begin(), copy.begin() + (top_k - 1), copy.end(), std::greater<float>());
    kth = copy[top_k - 1];
  }
  for (int64_t v = 0; v < vocab; ++v) {
    w[v] = z[v] >= kth ? repro::exp((z[v] - max_logit) / temperature) : 0.0f;
  }
  normalise(w, p);
  if (top_p < 1.0f) {
    const std::vector<bool> keep = top_p_keep(p, top_p);
    for (int64_t v = 0; v < vocab; ++v) w[v] = keep[v] ? w[v] : 0.0f;
    normalise(w, p);
  }
}

float log_prob(float p) { return repro::log(std::max(p, FLT_MIN)); }

constexpr uint32_t kResidualProposals = 16;  // reference/verify.py RESIDUAL_PROPOSALS

// floor(X m / 2^64) for the 64-bit X = lo + hi 2^32 and 0 <= m: uniform on [0, m).
int64_t draw_below(uint32_t lo, uint32_t hi, int64_t m) {
  const uint64_t x = static_cast<uint64_t>(lo) | (static_cast<uint64_t>(hi) << 32);
  return static_cast<int64_t>((static_cast<unsigned __int128>(x) * static_cast<uint64_t>(m)) >> 64);
}

// The first accepted proposal of a residual draw (reference/verify.py, propose_residual):
// proposal t draws x_t by inversion from the normaliser's masses with words 0 and 1 of
// the position's proposal block t, and keeps it when floor(Y W_x / 2^64) < R_x (Y: words
// 2 and 3). -1 when none is kept or the masses sum to 0.
int64_t propose_residual(const std::vector<int64_t>& weights, const std::vector<int64_t>& residual, int64_t seed,
                         int64_t position) {
  std::vector<int64_t> cumulative(weights.size());
  int64_t total = 0;
  for (size_t v = 0; v < weights.size(); ++v) cumulative[v] = total += weights[v];
  if (total == 0) return -1;
  for (uint32_t t = 0; t < kResidualProposals; ++t) {
    const PhiloxWords words = philox_block(seed, position, kPurposePropose, t);
    const int64_t u = draw_below(words.w[0], words.w[1], total);
    const int64_t token = std::upper_bound(cumulative.begin(), cumulative.end(), u) - cumulative.begin();
    if (draw_below(words.w[2], words.w[3], weights[token]) < residual[token]) return token;
  }
  return -1;
}

// The token drawn by inversion from integer masses at (seed, position): U = floor(X M / 2^64)
// with X the position's 64-bit sample draw, the v with C_v <= U < C_v + m_v (0 when M = 0).
int64_t sample_masses(const std::vector<int64_t>& masses, int64_t seed, int64_t position) {
  int64_t total = 0;
  for (int64_t m : masses) total += m;
  if (total == 0) return 0;
  const PhiloxWords words = philox_block(seed, position, kPurposeSample, 0);
  const int64_t u = draw_below(words.w[0], words.w[1], total);
  int64_t cumulative = 0;
  for (size_t v = 0; v < masses.size(); ++v) {
    cumulative += masses[v];
    if (cumulative > u) return static_cast<int64_t>(v);
  }
  return static_cast<int64_t>(masses.size()) - 1;  // unreachable: u < total
}

struct RequestParams {
  float temperature;
  int64_t top_k;
  float top_p;
  int64_t seed;
  int64_t position;
};

// float32 logits with NaN and +-inf replaced by -inf (probability 0; see the reference).
template <typename scalar_t>
void row_to_float(const scalar_t* row, int64_t vocab, std::vector<float>& z) {
  for (int64_t v = 0; v < vocab; ++v) {
    const float x = static_cast<float>(row[v]);
    z[v] = std::isfinite(x) ? x : -INFINITY;
  }
}

template <typename scalar_t>
void verify_request(const scalar_t* target, const scalar_t* bonus_row, TokenIds draft, const float* draft_probs,
                    DraftRange r, int64_t vocab, const RequestParams& params, int32_t* out,
                    int32_t* num_accepted, float* logprobs) {
  std::vector<float> z(vocab), w(vocab), p(vocab);
  std::vector<int64_t> masses(vocab), weight_masses(draft_probs != nullptr ? vocab : 0);
  const bool greedy = params.temperature == 0.0f;
  for (int64_t i = 0; i <= r.count; ++i) {
    const bool is_bonus = i == r.count;
    row_to_float(is_bonus ? bonus_row : target + (r.start + i) * vocab, vocab, z);
    if (greedy) {
      const int64_t target_token = std::max_element(z.begin(), z.end()) - z.begin();
      out[i] = static_cast<int32_t>(target_token);
      if (logprobs != nullptr) {
        processed(z, 1.0f, 0, 1.0f, w, p);
        logprobs[i] = log_prob(p[target_token]);
      }
      if (is_bonus || draft[r.start + i] != target_token) {
        *num_accepted = static_cast<int32_t>(i);
        return;
      }
      continue;
    }
    processed(z, params.temperature, params.top_k, params.top_p, w, p);
    const int64_t position = params.position + i;
    if (is_bonus) {
      for (int64_t v = 0; v < vocab; ++v) masses[v] = fixed_mass(w[v]);
      const int64_t token = sample_masses(masses, params.seed, position);
      out[i] = static_cast<int32_t>(token);
      if (logprobs != nullptr) logprobs[i] = log_prob(p[token]);
      *num_accepted = static_cast<int32_t>(i);
      return;
    }
    const int64_t t = r.start + i;
    const int64_t x = draft[t];
    const bool in_vocab = x >= 0 && x < vocab;
    const float* q = draft_probs != nullptr ? draft_probs + t * vocab : nullptr;
    const float u = uniform_from_word(philox_block(params.seed, position, kPurposeAccept, 0).w[0]);
    if (in_vocab && accepts(u, q != nullptr ? q[x] : 1.0f, p[x])) {
      out[i] = static_cast<int32_t>(x);
      if (logprobs != nullptr) logprobs[i] = log_prob(p[x]);
      continue;
    }
    const float z = fixed_sum(w);  // the residual max(p - q, 0) scaled by Z: no division
    for (int64_t v = 0; v < vocab; ++v) {
      masses[v] = q != nullptr ? fixed_mass(std::max(w[v] - q[v] * z, 0.0f)) : (v == x ? 0 : fixed_mass(w[v]));
    }
    int64_t token = -1;
    if (q != nullptr) {  // proposals from the normaliser's masses first
      for (int64_t v = 0; v < vocab; ++v) weight_masses[v] = fixed_mass(w[v]);
      token = propose_residual(weight_masses, masses, params.seed, position);
    }
    if (token < 0) token = sample_masses(masses, params.seed, position);
    out[i] = static_cast<int32_t>(token);
    if (logprobs != nullptr) logprobs[i] = log_prob(p[token]);
    *num_accepted = static_cast<int32_t>(i);
    return;
  }
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> verify_cpu(
    const at::Tensor& target_logits, const at::Tensor& bonus_logits, const at::Tensor& draft_token_ids,
    const std::optional<at::Tensor>& draft_probs, const at::Tensor& cu_num_draft_tokens,
    const std::optional<at::Tensor>& temperature, const std::optional<at::Tensor>& top_k,
    const std::optional<at::Tensor>& top_p, const at::Tensor& seeds, const at::Tensor& positions,
    int64_t max_spec_len, bool return_logprobs) {
  const VerifySizes s = check_verify(target_logits, bonus_logits, draft_token_ids, draft_probs,
                                     cu_num_draft_tokens, temperature, top_k, top_p, seeds, positions,
                                     max_spec_len);
  at::Tensor out = at::full({s.batch, s.width}, -1, cu_num_draft_tokens.options());
  at::Tensor num_accepted = at::zeros({s.batch}, cu_num_draft_tokens.options());
  at::Tensor logprobs = at::zeros(return_logprobs ? std::vector<int64_t>{s.batch, s.width}
                                                  : std::vector<int64_t>{0, 0},
                                  target_logits.options().dtype(at::kFloat));
  const int32_t* cu = cu_num_draft_tokens.data_ptr<int32_t>();
  const TokenIds draft{draft_token_ids.data_ptr(), draft_token_ids.scalar_type() == at::kLong};
  const float* q = draft_probs.has_value() ? draft_probs->data_ptr<float>() : nullptr;
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, target_logits.scalar_type(), "verify_cpu", [&] {
    const scalar_t* target = target_logits.data_ptr<scalar_t>();
    const scalar_t* bonus = bonus_logits.data_ptr<scalar_t>();
    at::parallel_for(0, s.batch, 1, [&](int64_t begin, int64_t end) {
      for (int64_t b = begin; b < end; ++b) {
        const RequestParams params{
            temperature.has_value() ? temperature->data_ptr<float>()[b] : 0.0f,
            top_k.has_value() ? top_k->data_ptr<int32_t>()[b] : 0,
            top_p.has_value() ? top_p->data_ptr<float>()[b] : 1.0f, seeds.data_ptr<int64_t>()[b],
            positions.data_ptr<int64_t>()[b]};
        verify_request<scalar_t>(target, bonus + b * s.vocab, draft, q,
                                 draft_range(cu, b, s.num_tokens, s.width - 1), s.vocab, params,
                                 out.data_ptr<int32_t>() + b * s.width, num_accepted.data_ptr<int32_t>() + b,
                                 return_logprobs ? logprobs.data_ptr<float>() + b * s.width : nullptr);
      }
    });
  });
  return {out, num_accepted, logprobs};
}

}  // namespace

TORCH_LIBRARY_IMPL(specops, CPU, m) { m.impl("verify", &verify_cpu); }

}  // namespace specops
