// Per-target code of attention dropout's multipliers (simd.hpp's dropout_row):
// Philox 4x32-10 over a vector of counters, the layout of relpos/dropout.hpp.
// A block of 64 key positions is 16 counters whose four output words hold
// its keys 0-15, 16-31, 32-47 and 48-63: a vector of 16, 8 or 4 counters
// (AVX-512, AVX2, SSE4) gives whole runs of consecutive keys, word by word;
// two vectors' rounds run side by side.
// simd_dropout.cpp compiles it once per target for the library's dispatch,
// and tests/cpp/backend/simd_dropout_test.cpp again to call each target's
// function directly. The guard is Highway's per-target idiom (simd_rows-inl.h).
#if defined(RELPOS_SIMD_DROPOUT_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef RELPOS_SIMD_DROPOUT_INL_H_
#undef RELPOS_SIMD_DROPOUT_INL_H_
#else
#define RELPOS_SIMD_DROPOUT_INL_H_
#endif

#include <algorithm>
#include <cstdint>

#include <hwy/highway.h>

#include "relpos/dropout.hpp"
#include "simd.hpp"

HWY_BEFORE_NAMESPACE();
namespace relpos::simd::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// Key blocks wrap with the positions (mod 2^32): 2^26 blocks of 64.
constexpr uint32_t kBlockMask = (1u << 26) - 1;

// Where a run of multipliers goes, entry o of the run: z[o] = the
// multiplier, out[o] = x[o] times it; either pointer may be null.
struct DropoutSink {
  float* z = nullptr;
  const float* x = nullptr;
  float* out = nullptr;

  DropoutSink at(int64_t o) const { return {z ? z + o : nullptr, x ? x + o : nullptr, out ? out + o : nullptr}; }
  void put(int64_t o, float multiplier) const {
    if (z) z[o] = multiplier;
    if (out) out[o] = x[o] * multiplier;
  }
};

#if HWY_TARGET == HWY_SCALAR
// One lane holds no 64-bit product: counter by counter.
static void DropoutBlocks(const DropoutRow& r, uint32_t first, int64_t count, const DropoutSink& sink) {
  for (int64_t b = 0; b < count; ++b)
    for (uint32_t lane = 0; lane < 16; ++lane) {
      const uint32_t block = (first + uint32_t(b)) & kBlockMask;
      const philox::Block x = philox::philox4x32_10({{(block << 4) | lane, r.c1, r.c2, r.c3}}, r.k0, r.k1);
      for (int w = 0; w < 4; ++w) sink.put(b * 64 + w * 16 + lane, x.x[w] >= r.threshold ? r.scale : 0.0f);
    }
}
#else
// hi (lo) = the high (low) 32 bits of a * m lane by lane: the even lanes'
// 64-bit products, and the odd lanes' moved down to even lanes first.
template <class D, class V = hn::Vec<D>>
HWY_INLINE void MulHiLo(D d, V a, V m, V& hi, V& lo) {
  const hn::Repartition<uint64_t, D> d64;
  const auto even = hn::MulEven(a, m);
  const auto odd = hn::MulEven(hn::BitCast(d, hn::ShiftRight<32>(hn::BitCast(d64, a))), m);
  hi = hn::OddEven(hn::BitCast(d, odd), hn::BitCast(d, hn::ShiftRight<32>(even)));
  lo = hn::Mul(a, m);
}

// The multipliers of kChains vectors of counters, vector v0 + c of the key
// blocks from `first` (a vector of N lanes holds counters v N .. v N + N - 1
// of the blocks' 16 each, N <= 16), into the sink (64 per block). The chains
// run their rounds side by side: one chain alone waits on each round's products.
template <int kChains>
HWY_INLINE void DropoutChains(const DropoutRow& r, uint32_t first, int64_t v0, const DropoutSink& sink) {
  const hn::CappedTag<uint32_t, 16> du;
  const hn::RebindToSigned<decltype(du)> di;
  const hn::Rebind<float, decltype(du)> df;
  using V = hn::Vec<decltype(du)>;
  const int64_t lanes = int64_t(hn::Lanes(du));
  const V m0 = hn::Set(du, 0xD2511F53u), m1 = hn::Set(du, 0xCD9E8D57u);
  V c[kChains][4];
  int64_t at[kChains];  // where chain c's first key goes in the sink
  for (int n = 0; n < kChains; ++n) {
    const int64_t counter = (v0 + n) * lanes, b = counter / 16, group = counter % 16;
    const uint32_t block = (first + uint32_t(b)) & kBlockMask;
    c[n][0] = hn::Add(hn::Set(du, (block << 4) | uint32_t(group)), hn::Iota(du, 0));
    c[n][1] = hn::Set(du, r.c1), c[n][2] = hn::Set(du, r.c2), c[n][3] = hn::Set(du, r.c3);
    at[n] = b * 64 + group;
  }
  uint32_t k0 = r.k0, k1 = r.k1;
  for (int round = 0; round < 10; ++round) {
    for (int n = 0; n < kChains; ++n) {
      V hi0, lo0, hi1, lo1;
      MulHiLo(du, c[n][0], m0, hi0, lo0);
      MulHiLo(du, c[n][2], m1, hi1, lo1);
      c[n][0] = hn::Xor(hn::Xor(hi1, c[n][1]), hn::Set(du, k0));
      c[n][2] = hn::Xor(hn::Xor(hi0, c[n][3]), hn::Set(du, k1));
      c[n][1] = lo1, c[n][3] = lo0;
    }
    k0 += 0x9E3779B9u, k1 += 0xBB67AE85u;
  }
  // Unsigned word >= threshold as a signed comparison of both with the top bit flipped.
  const V sign = hn::Set(du, 0x80000000u);
  const auto below = hn::BitCast(di, hn::Xor(hn::Set(du, r.threshold), sign));
  const auto kept = hn::Set(df, r.scale);
  for (int n = 0; n < kChains; ++n)
    for (int w = 0; w < 4; ++w) {
      const auto dropped = hn::Gt(below, hn::BitCast(di, hn::Xor(c[n][w], sign)));
      const auto multiplier = hn::IfThenZeroElse(hn::RebindMask(df, dropped), kept);
      const int64_t o = at[n] + w * 16;
      if (sink.z) hn::StoreU(multiplier, df, sink.z + o);
      if (sink.out) hn::StoreU(hn::Mul(hn::LoadU(df, sink.x + o), multiplier), df, sink.out + o);
    }
}

// The multipliers of the `count` key blocks from `first` (64 keys each) into the sink.
static void DropoutBlocks(const DropoutRow& r, uint32_t first, int64_t count, const DropoutSink& sink) {
  const int64_t vectors = count * 16 / int64_t(hn::Lanes(hn::CappedTag<uint32_t, 16>()));
  int64_t v = 0;
  for (; v + 4 <= vectors; v += 4) DropoutChains<4>(r, first, v, sink);
  for (; v + 2 <= vectors; v += 2) DropoutChains<2>(r, first, v, sink);
  if (v < vectors) DropoutChains<1>(r, first, v, sink);
}
#endif

// The multipliers of key positions kp0 + jj (mod 2^32), jj < n, into the
// sink: the whole blocks of 64 straight, a partial one at either end through
// a block's buffer.
static void DropoutRunOf(const DropoutRow& r, uint32_t kp0, const DropoutSink& sink, int64_t n) {
  HWY_ALIGN float block[64];
  const auto partial = [&](uint32_t kp, int64_t jj, int64_t count) {
    DropoutBlocks(r, kp >> 6, 1, {block});
    for (int64_t i = 0; i < count; ++i) sink.put(jj + i, block[(kp & 63u) + i]);
  };
  int64_t jj = 0;
  if (const uint32_t first = kp0 & 63u; first != 0 || n < 64) {
    jj = std::min<int64_t>(64 - first, n);
    partial(kp0, 0, jj);
  }
  const int64_t whole = (n - jj) / 64;
  DropoutBlocks(r, (kp0 + uint32_t(jj)) >> 6, whole, sink.at(jj));
  jj += whole * 64;
  if (jj < n) partial(kp0 + uint32_t(jj), jj, n - jj);
}

// z[jj] = the multiplier of key position kp0 + jj; and out = x times them.
static void DropoutRowOf(const DropoutRow& r, uint32_t kp0, float* z, int64_t n) {
  DropoutRunOf(r, kp0, {z}, n);
}
static void DropoutTimesOf(const DropoutRow& r, uint32_t kp0, const float* x, float* out, float* z, int64_t n) {
  DropoutRunOf(r, kp0, {z, x, out}, n);
}

}  // namespace relpos::simd::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#endif  // RELPOS_SIMD_DROPOUT_INL_H_
