// Attention dropout (docs/design.md, "Attention dropout"): inverted dropout on
// the attention probabilities after the softmax, each entry's keep bit a pure
// function of (seed, offset, batch row, head, query position, key position)
// drawn from Philox 4x32-10 (Salmon et al. 2011, the generator of PyTorch's
// and FlashAttention's GPU dropout). The mask is never stored: every
// algorithm, tile size, thread count, SIMD target and device (the C++ kernels
// and relpos.gpu's Triton kernels) draws the same bits where it needs them.
//
// The counter layout, written once here and in docs/design.md:
//   key      (k0, k1) = (seed mod 2^32, seed >> 32)
//   counter  c0 = (kp >> 6) * 16 + kp mod 16     kp = k_offset + j, mod 2^32
//            c1 = qp                             qp = q_offset + i, mod 2^32
//            c2 = (batch_offset + b) * H + h     H: the call's query heads
//            c3 = offset
//   word     w = (kp >> 4) mod 4 of Philox's four outputs
//   kept     iff that word >= floor(p * 2^32); a kept entry is scaled by 1 / (1 - p)
// So one counter serves four keys 16 apart, and the 16 counters of a block of
// 64 key positions give its keys in order, word by word: a vector of 16 (or 8,
// or 4) counters fills whole runs of keys without shuffles.
#pragma once

#include <cmath>
#include <cstdint>

namespace relpos {

struct AttentionDropout {
  double p = 0;            // probability of dropping an entry, in [0, 1); 0: no dropout (the call's exact path)
  uint64_t seed = 0;       // Philox's key
  uint32_t offset = 0;     // the counter's last word: a new one per call of one seed
  int64_t batch_offset = 0;  // the index of batch row 0 in the mask (a call on a slice of a larger batch)

  bool active() const { return p > 0; }
};

namespace philox {

struct Block {
  uint32_t x[4];
};

// Philox 4x32-10 of counter c under key (k0, k1): ten rounds, the key bumped
// by the Weyl constants between them.
inline Block philox4x32_10(Block c, uint32_t k0, uint32_t k1) {
  for (int round = 0; round < 10; ++round) {
    const uint64_t p0 = uint64_t(0xD2511F53u) * c.x[0], p1 = uint64_t(0xCD9E8D57u) * c.x[2];
    c = {{uint32_t(p1 >> 32) ^ c.x[1] ^ k0, uint32_t(p1), uint32_t(p0 >> 32) ^ c.x[3] ^ k1, uint32_t(p0)}};
    k0 += 0x9E3779B9u, k1 += 0xBB67AE85u;
  }
  return c;
}

// The smallest Philox word that keeps an entry at dropout probability p in [0, 1).
inline uint32_t keep_threshold(double p) { return uint32_t(std::floor(p * 4294967296.0)); }

// The first counter word of key position kp, and the output word that holds its bits.
inline uint32_t key_counter(uint32_t kp) { return ((kp >> 6) << 4) | (kp & 15u); }
inline int key_word(uint32_t kp) { return int((kp >> 4) & 3u); }

}  // namespace philox

// Whether entry (b, h, query position qp, key position kp) of a call with H
// query heads is kept: the layout above, one entry at a time (the kernels fill
// whole rows at once with the same bits: src/backend/simd.hpp's dropout_row).
inline bool dropout_keeps(const AttentionDropout& d, int64_t heads, int64_t b, int64_t h, int64_t qp, int64_t kp) {
  const uint32_t key = uint32_t(kp);
  const philox::Block c = {{philox::key_counter(key), uint32_t(qp), uint32_t((d.batch_offset + b) * heads + h),
                            d.offset}};
  const philox::Block r = philox::philox4x32_10(c, uint32_t(d.seed), uint32_t(d.seed >> 32));
  return r.x[philox::key_word(key)] >= philox::keep_threshold(d.p);
}

// What a kept entry is multiplied by: 1 / (1 - p), in double (the compute
// type rounds it once).
inline double dropout_scale(const AttentionDropout& d) { return 1.0 / (1.0 - d.p); }

// The mask of a call of B batch rows, H query heads, Lq queries from position
// q_offset and Lk keys from k_offset: keep[((b * H + h) * Lq + i) * Lk + j] =
// 1 where entry (b, h, i, j) is kept, else 0 (the kernels' bits, drawn as they
// draw them). For tests and debugging: no call stores it. Throws
// std::invalid_argument for a p outside [0, 1) or a negative size.
void dropout_mask(const AttentionDropout& d, int64_t B, int64_t H, int64_t Lq, int64_t Lk, int64_t q_offset,
                  int64_t k_offset, uint8_t* keep);

}  // namespace relpos
