// Per-target code of the conversions of simd.hpp: bfloat16 and float16 bits to
// float32 (exact) and back, rounded to nearest even as relpos/half.hpp's scalar
// conversions round, NaN kept NaN; and the split of float32 into three
// bfloat16 parts.
// simd_convert.cpp compiles it once per target for the library's dispatch, and
// the SIMD tests compile it again to call each target's functions directly.
// The guard is Highway's per-target idiom: foreach_target.h toggles
// HWY_TARGET_TOGGLE before each target, which lets this file in again.
#if defined(RELPOS_SIMD_CONVERT_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef RELPOS_SIMD_CONVERT_INL_H_
#undef RELPOS_SIMD_CONVERT_INL_H_
#else
#define RELPOS_SIMD_CONVERT_INL_H_
#endif

#include <cstdint>

#include <hwy/highway.h>

#include "relpos/half.hpp"
#include "simd_common-inl.h"

HWY_BEFORE_NAMESPACE();
namespace relpos::simd::HWY_NAMESPACE {

static void WidenBf16(const uint16_t* x, float* y, int64_t n) {
  ForEachLane(n, [&](auto d, int64_t i) { hn::StoreU(LoadBf16(d, x + i), d, y + i); });
}

// The bfloat16 bits of v's lanes, rounded to nearest even (a NaN stays a
// NaN), in the low halves of 32-bit lanes.
template <class D>
hn::Vec<hn::Rebind<uint32_t, D>> RoundedBf16Bits(D, hn::Vec<D> v) {
  const hn::Rebind<uint32_t, D> du32;
  const auto u = hn::BitCast(du32, v);
  const auto odd = hn::And(hn::ShiftRight<16>(u), hn::Set(du32, 1u));
  const auto rounded = hn::ShiftRight<16>(hn::Add(u, hn::Add(hn::Set(du32, 0x7fffu), odd)));
  const auto quiet_nan = hn::ShiftRight<16>(hn::Or(u, hn::Set(du32, 0x400000u)));
  return hn::IfThenElse(hn::RebindMask(du32, hn::Ne(v, v)), quiet_nan, rounded);
}

template <class D>
void StoreBf16Bits(D, hn::Vec<hn::Rebind<uint32_t, D>> bits, uint16_t* y) {
  const hn::Rebind<uint16_t, D> du16;
  const hn::Rebind<int32_t, D> di32;
  hn::StoreU(hn::DemoteTo(du16, hn::BitCast(di32, bits)), du16, y);
}

static void NarrowBf16(const float* x, uint16_t* y, int64_t n) {
  ForEachLane(n, [&](auto d, int64_t i) { StoreBf16Bits(d, RoundedBf16Bits(d, hn::LoadU(d, x + i)), y + i); });
}

// x as the sum of three bfloat16 numbers by truncation: each part is the top
// 16 bits of the rest of x after the parts before it. Each rest is exact in
// float32 and the last one has at most 8 significant bits, so the parts sum
// to x exactly (finite x whose rests are normal numbers). Rounding each part
// instead took three times the instructions, and the split was 15% of the
// bfloat16 forward on one AMX core.
static void SplitBf16(const float* x, uint16_t* hi, uint16_t* mid, uint16_t* lo, int64_t n) {
  ForEachLane(n, [&](auto d, int64_t i) {
    const hn::Rebind<uint32_t, decltype(d)> du32;
    const auto top_half = hn::Set(du32, 0xffff0000u);
    auto rest = hn::LoadU(d, x + i);
    for (uint16_t* part : {hi, mid, lo}) {
      const auto kept = hn::And(hn::BitCast(du32, rest), top_half);
      StoreBf16Bits(d, hn::ShiftRight<16>(kept), part + i);
      rest = hn::Sub(rest, hn::BitCast(d, kept));
    }
  });
}

// float16 through F16C where the target has it (AVX2, AVX-512); Highway's
// emulation on the others truncates when narrowing and turns infinities and
// NaNs into finite values when widening, so those targets run the scalar
// conversions.
static void WidenF16(const uint16_t* x, float* y, int64_t n) {
#if HWY_TARGET <= HWY_AVX2
  ForEachLane(n, [&](auto d, int64_t i) {
    const hn::Rebind<hwy::float16_t, decltype(d)> df16;
    hn::StoreU(hn::PromoteTo(d, hn::LoadU(df16, reinterpret_cast<const hwy::float16_t*>(x + i))), d, y + i);
  });
#else
  for (int64_t i = 0; i < n; ++i) y[i] = half_bits::float_from_f16(x[i]);
#endif
}

static void NarrowF16(const float* x, uint16_t* y, int64_t n) {
#if HWY_TARGET <= HWY_AVX2
  ForEachLane(n, [&](auto d, int64_t i) {
    const hn::Rebind<hwy::float16_t, decltype(d)> df16;
    hn::StoreU(hn::DemoteTo(df16, hn::LoadU(d, x + i)), df16, reinterpret_cast<hwy::float16_t*>(y + i));
  });
#else
  for (int64_t i = 0; i < n; ++i) y[i] = half_bits::f16_from_float(x[i]);
#endif
}

}  // namespace relpos::simd::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#endif  // RELPOS_SIMD_CONVERT_INL_H_
