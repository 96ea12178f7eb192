// The per-target helpers more than one family of SIMD loops uses: the
// exponential (softmax, GELU), the lane loops and row sums, bfloat16 loads.
// Each family's simd_*-inl.h includes this after hwy/highway.h, once per
// target (in the library and in the SIMD test); the guard is Highway's per-target idiom: foreach_target.h toggles
// HWY_TARGET_TOGGLE before each target, which lets this file in again.
#if defined(RELPOS_SIMD_COMMON_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef RELPOS_SIMD_COMMON_INL_H_
#undef RELPOS_SIMD_COMMON_INL_H_
#else
#define RELPOS_SIMD_COMMON_INL_H_
#endif

#include <cstdint>
#include <limits>

#include <hwy/highway.h>

#include "simd.hpp"

HWY_BEFORE_NAMESPACE();
namespace relpos::simd::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;  // for the including files too

// exp(x) as vexp.hpp's exp_approx, lane-wise: Cody-Waite reduction by ln 2
// and a degree-6 polynomial; 0 below -87 (and for -inf), infinity above
// kExpOverflow, NaN for NaN (the clamp alone turned a NaN into -87, so a NaN
// logit became a probability of about 0). MulAdd is one fused instruction
// where the target has FMA (a 2-7% faster attention forward on AVX2 than a
// product and a sum) and a product and a sum elsewhere.
template <class D, class V>
V Exp(D d, V x) {
  const hn::RebindToSigned<D> di;
  const V xc = hn::Min(hn::Max(x, hn::Set(d, -87.0f)), hn::Set(d, 88.0f));
  const V magic = hn::Set(d, 12582912.0f);
  const V k = hn::Sub(hn::MulAdd(xc, hn::Set(d, 1.44269504f), magic), magic);
  V r = hn::NegMulAdd(k, hn::Set(d, 0.693359375f), xc);
  r = hn::NegMulAdd(k, hn::Set(d, -2.12194440e-4f), r);
  V p = hn::Set(d, 1.0f / 720);
  for (float c : {1.0f / 120, 1.0f / 24, 1.0f / 6, 0.5f, 1.0f, 1.0f}) p = hn::MulAdd(p, r, hn::Set(d, c));
  const V two_k = hn::BitCast(d, hn::ShiftLeft<23>(hn::Add(hn::ConvertTo(di, k), hn::Set(di, 127))));
  const V finite = hn::IfThenZeroElse(hn::Lt(x, hn::Set(d, -87.0f)), hn::Mul(p, two_k));
  // NaN and overflow in one test: NaN * inf stays NaN, x * inf is inf above it.
  return hn::IfThenElse(hn::Le(x, hn::Set(d, kExpOverflow)), finite,
                        hn::Mul(x, hn::Set(d, std::numeric_limits<float>::infinity())));
}

// body(d, i) for the whole vectors of [0, n), then body(d1, i) for the tail,
// one lane at a time: the same arithmetic.
template <class Body>
void ForEachLane(int64_t n, Body body) {
  const hn::ScalableTag<float> d;
  const hn::CappedTag<float, 1> d1;
  const int64_t lanes = int64_t(hn::Lanes(d));
  int64_t i = 0;
  for (; i + lanes <= n; i += lanes) body(d, i);
  for (; i < n; ++i) body(d1, i);
}

// The sum over i < n of the lanes of term(d, i): whole vectors first, added
// lane-wise and then across lanes, then the tail one lane at a time.
template <class Term>
float SumOfTerms(int64_t n, Term term) {
  const hn::ScalableTag<float> d;
  const hn::CappedTag<float, 1> d1;
  const int64_t lanes = int64_t(hn::Lanes(d));
  auto sum = hn::Zero(d);
  int64_t i = 0;
  for (; i + lanes <= n; i += lanes) sum = hn::Add(sum, term(d, i));
  float total = hn::GetLane(hn::SumOfLanes(d, sum));
  for (; i < n; ++i) total += hn::GetLane(term(d1, i));
  return total;
}

// Inline: simd_rows.cpp exports it and LayerNorm (simd_trainer-inl.h) calls it.
inline float SumOf(const float* x, int64_t n) {
  return SumOfTerms(n, [&](auto d, int64_t i) { return hn::LoadU(d, x + i); });
}

// The lanes of d from bfloat16 bits at x: the bits shifted into the high half.
template <class D>
hn::Vec<D> LoadBf16(D d, const uint16_t* x) {
  const hn::Rebind<uint16_t, D> du16;
  const hn::Rebind<uint32_t, D> du32;
  return hn::BitCast(d, hn::ShiftLeft<16>(hn::PromoteTo(du32, hn::LoadU(du16, x))));
}

}  // namespace relpos::simd::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#endif  // RELPOS_SIMD_COMMON_INL_H_
