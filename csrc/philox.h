// Philox4x32-10 (Salmon et al. 2011), host and device: the generator of the fused verify
// op, bit for bit reference/philox.py. A draw depends on its key (the request's seed) and
// counter (absolute position, purpose, index) alone.
#pragma once
#include <cstdint>

#include "token_ids.h"

namespace specops {

constexpr uint32_t kPurposeAccept = 0;  // the uniform of a draft's acceptance test
constexpr uint32_t kPurposeSample = 1;  // the 64-bit draw that samples a token at a position
constexpr uint32_t kPurposePropose = 2;  // proposals of a residual draw: block t holds proposal t

struct PhiloxWords {
  uint32_t w[4];
};

SPECOPS_HOST_DEVICE PhiloxWords philox4x32_10(uint32_t c0, uint32_t c1, uint32_t c2, uint32_t c3,
                                              uint32_t k0, uint32_t k1) {
  constexpr uint32_t kM0 = 0xD2511F53u, kM1 = 0xCD9E8D57u;
  constexpr uint32_t kW0 = 0x9E3779B9u, kW1 = 0xBB67AE85u;
  for (int round = 0; round < 10; ++round) {
    if (round > 0) {
      k0 += kW0;
      k1 += kW1;
    }
    const uint64_t p0 = static_cast<uint64_t>(kM0) * c0;
    const uint64_t p1 = static_cast<uint64_t>(kM1) * c2;
    const uint32_t hi0 = static_cast<uint32_t>(p0 >> 32), lo0 = static_cast<uint32_t>(p0);
    const uint32_t hi1 = static_cast<uint32_t>(p1 >> 32), lo1 = static_cast<uint32_t>(p1);
    const uint32_t n0 = hi1 ^ c1 ^ k0, n2 = hi0 ^ c3 ^ k1;
    c0 = n0;
    c1 = lo1;
    c2 = n2;
    c3 = lo0;
  }
  return PhiloxWords{{c0, c1, c2, c3}};
}

// The four words of stream (seed, position, purpose) at block `index`.
SPECOPS_HOST_DEVICE PhiloxWords philox_block(int64_t seed, int64_t position, uint32_t purpose,
                                             uint32_t index) {
  const uint64_t s = static_cast<uint64_t>(seed), p = static_cast<uint64_t>(position);
  return philox4x32_10(static_cast<uint32_t>(p), static_cast<uint32_t>(p >> 32), purpose, index,
                       static_cast<uint32_t>(s), static_cast<uint32_t>(s >> 32));
}

// U[0, 1) from the top 24 bits of a word (exact in float32).
SPECOPS_HOST_DEVICE float uniform_from_word(uint32_t word) {
  return static_cast<float>(word >> 8) * (1.0f / 16777216.0f);
}

}  // namespace specops
