// Per-target code of attention dropout's multipliers (simd.hpp's dropout_row):
// Philox 4x32-10 over a vector of counters, the layout of relpos/dropout.hpp.
// A block of 64 key positions is 16 counters whose four output words hold
// its keys 0-15, 16-31, 32-47 and 48-63: a vector of 16, 8 or 4 counters
// (AVX-512, AVX2, SSE4) gives whole runs of consecutive keys, word by word.
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

#if HWY_TARGET == HWY_SCALAR
// One lane holds no 64-bit product: the block counter by counter.
static void DropoutBlock(const DropoutRow& r, uint32_t block, float* z) {
  for (uint32_t lane = 0; lane < 16; ++lane) {
    const philox::Block x = philox::philox4x32_10({{(block << 4) | lane, r.c1, r.c2, r.c3}}, r.k0, r.k1);
    for (int w = 0; w < 4; ++w) z[w * 16 + lane] = x.x[w] >= r.threshold ? r.scale : 0.0f;
  }
}
#else
// (hi, lo) of a * m lane by lane: the even lanes' 64-bit products, and the
// odd lanes' moved down to even lanes first.
template <class D, class V = hn::Vec<D>>
HWY_INLINE void MulHiLo(D d, V a, V m, V& hi, V& lo) {
  const hn::Repartition<uint64_t, D> d64;
  const auto even = hn::MulEven(a, m);
  const auto odd = hn::MulEven(hn::BitCast(d, hn::ShiftRight<32>(hn::BitCast(d64, a))), m);
  hi = hn::OddEven(hn::BitCast(d, odd), hn::BitCast(d, hn::ShiftRight<32>(even)));
  lo = hn::OddEven(hn::BitCast(d, hn::ShiftLeft<32>(odd)), hn::BitCast(d, even));
}

// The 64 multipliers of key block `block` (key positions block * 64 ...),
// 16 counters a lane each, as many lanes at a time as the target has (<= 16).
static void DropoutBlock(const DropoutRow& r, uint32_t block, float* z) {
  const hn::CappedTag<uint32_t, 16> du;
  const hn::RebindToSigned<decltype(du)> di;
  const hn::Rebind<float, decltype(du)> df;
  const uint32_t lanes = uint32_t(hn::Lanes(du));
  const auto m0 = hn::Set(du, 0xD2511F53u), m1 = hn::Set(du, 0xCD9E8D57u);
  // Unsigned x >= threshold as a signed comparison of both with the top bit flipped.
  const auto sign = hn::Set(du, 0x80000000u);
  const auto below = hn::BitCast(di, hn::Xor(hn::Set(du, r.threshold), sign));
  const auto kept = hn::Set(df, r.scale);
  for (uint32_t group = 0; group < 16; group += lanes) {
    auto c0 = hn::Add(hn::Set(du, (block << 4) | group), hn::Iota(du, 0));
    auto c1 = hn::Set(du, r.c1), c2 = hn::Set(du, r.c2), c3 = hn::Set(du, r.c3);
    uint32_t k0 = r.k0, k1 = r.k1;
    for (int round = 0; round < 10; ++round) {
      hn::Vec<decltype(du)> hi0, lo0, hi1, lo1;
      MulHiLo(du, c0, m0, hi0, lo0);
      MulHiLo(du, c2, m1, hi1, lo1);
      c0 = hn::Xor(hn::Xor(hi1, c1), hn::Set(du, k0));
      c2 = hn::Xor(hn::Xor(hi0, c3), hn::Set(du, k1));
      c1 = lo1, c3 = lo0;
      k0 += 0x9E3779B9u, k1 += 0xBB67AE85u;
    }
    const hn::Vec<decltype(du)> words[4] = {c0, c1, c2, c3};
    for (int w = 0; w < 4; ++w) {
      const auto dropped = hn::Gt(below, hn::BitCast(di, hn::Xor(words[w], sign)));
      hn::StoreU(hn::IfThenZeroElse(hn::RebindMask(df, dropped), kept), df, z + w * 16 + group);
    }
  }
}
#endif

// z[jj] = the multiplier of key position kp0 + jj (mod 2^32), jj < n: whole
// blocks of 64 straight into z, a partial one through a block's buffer.
static void DropoutRowOf(const DropoutRow& r, uint32_t kp0, float* z, int64_t n) {
  HWY_ALIGN float block[64];
  for (int64_t jj = 0; jj < n;) {
    const uint32_t kp = kp0 + uint32_t(jj), first = kp & 63u;
    const int64_t count = std::min<int64_t>(64 - first, n - jj);
    if (count == 64) {
      DropoutBlock(r, kp >> 6, z + jj);
    } else {
      DropoutBlock(r, kp >> 6, block);
      std::copy_n(block + first, count, z + jj);
    }
    jj += count;
  }
}

}  // namespace relpos::simd::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#endif  // RELPOS_SIMD_DROPOUT_INL_H_
