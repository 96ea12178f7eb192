// Attention dropout's mask restated for the tests from docs/design.md's
// counter layout, sharing no code with src/ or relpos/dropout.hpp: Philox
// 4x32-10 as Salmon et al. (2011) define it (the key bumped before every round
// but the first), the counter (kp / 64 * 16 + kp % 16, qp, b * H + h, offset)
// and word kp / 16 % 4 of key position kp and query position qp (mod 2^32),
// kept when the word is at least p * 2^32 rounded down.
#pragma once

#include <array>
#include <cmath>
#include <cstdint>

#include "problem.hpp"

namespace relpos_test::oracle {

inline std::array<uint32_t, 4> philox(std::array<uint32_t, 4> ctr, std::array<uint32_t, 2> key) {
  constexpr uint64_t kM0 = 0xD2511F53, kM1 = 0xCD9E8D57;
  for (int round = 0; round < 10; ++round) {
    if (round > 0) key = {key[0] + 0x9E3779B9u, key[1] + 0xBB67AE85u};
    const uint64_t a = kM0 * ctr[0], b = kM1 * ctr[2];
    ctr = {static_cast<uint32_t>(b >> 32) ^ ctr[1] ^ key[0], static_cast<uint32_t>(b & 0xffffffffu),
           static_cast<uint32_t>(a >> 32) ^ ctr[3] ^ key[1], static_cast<uint32_t>(a & 0xffffffffu)};
  }
  return ctr;
}

// Whether (b, h, i, j) of the problem's call is kept by its dropout.
inline bool kept(const Spec& s, int64_t b, int64_t h, int64_t i, int64_t j) {
  const uint64_t kp = uint64_t(s.k_offset + j) % (uint64_t(1) << 32), qp = uint64_t(s.q_offset + i) % (uint64_t(1) << 32);
  const std::array<uint32_t, 4> ctr = {uint32_t(kp / 64 * 16 + kp % 16), uint32_t(qp),
                                       uint32_t((s.dropout.batch_offset + b) * s.H + h), s.dropout.offset};
  const std::array<uint32_t, 2> key = {uint32_t(s.dropout.seed % (uint64_t(1) << 32)), uint32_t(s.dropout.seed >> 32)};
  const double threshold = std::floor(s.dropout.p * 4294967296.0);
  return double(philox(ctr, key)[kp / 16 % 4]) >= threshold;
}

// What entry (b, h, i, j) of P is multiplied by: 1 / (1 - p) if kept, else
// 0; 1 without dropout.
inline double dropout_factor(const Spec& s, int64_t b, int64_t h, int64_t i, int64_t j) {
  if (s.dropout.p == 0) return 1.0;
  return kept(s, b, h, i, j) ? 1.0 / (1.0 - s.dropout.p) : 0.0;
}

}  // namespace relpos_test::oracle
