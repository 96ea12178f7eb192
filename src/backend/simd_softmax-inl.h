// Per-target code of the softmax's loops (simd.hpp): the shifted exponentials and their
// sum, a row's maximum, the finiteness check and the softmax gradient.
// simd_softmax.cpp compiles it once per target for the library's dispatch, and
// the SIMD tests compile it again to call each target's functions directly.
// The guard is Highway's per-target idiom: foreach_target.h toggles
// HWY_TARGET_TOGGLE before each target, which lets this file in again.
#if defined(RELPOS_SIMD_SOFTMAX_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef RELPOS_SIMD_SOFTMAX_INL_H_
#undef RELPOS_SIMD_SOFTMAX_INL_H_
#else
#define RELPOS_SIMD_SOFTMAX_INL_H_
#endif

#include <cmath>
#include <cstdint>
#include <limits>

#include <hwy/highway.h>

#include "simd_common-inl.h"

HWY_BEFORE_NAMESPACE();
namespace relpos::simd::HWY_NAMESPACE {

static float ExpShiftedSum(const float* x, float shift, float* out, int64_t n) {
  const hn::ScalableTag<float> d;
  const int64_t lanes = int64_t(hn::Lanes(d));
  const auto s = hn::Set(d, shift);
  auto sum = hn::Zero(d);
  int64_t i = 0;
  const auto softmax_exp = [](auto d, auto t) {
    return hn::IfThenZeroElse(hn::Lt(t, hn::Set(d, kSoftmaxCutoff)), Exp(d, t));
  };
  for (; i + lanes <= n; i += lanes) {
    const auto e = softmax_exp(d, hn::Sub(hn::LoadU(d, x + i), s));
    hn::StoreU(e, d, out + i);
    sum = hn::Add(sum, e);
  }
  float total = hn::GetLane(hn::SumOfLanes(d, sum));
  const hn::CappedTag<float, 1> d1;  // the tail, one lane at a time: the same arithmetic
  for (; i < n; ++i) {
    const float e = hn::GetLane(softmax_exp(d1, hn::Set(d1, x[i] - shift)));
    out[i] = e;
    total += e;
  }
  return total;
}

// Highway's Max leaves a NaN lane to the target (x86 returns its second
// operand), so NaN lanes are tracked beside it: a row with a NaN has NaN as
// its maximum, and its softmax is NaN, as in exact arithmetic.
static float MaxOf(const float* x, int64_t n, float init) {
  const hn::ScalableTag<float> d;
  const int64_t lanes = int64_t(hn::Lanes(d));
  auto m = hn::Set(d, init);
  auto nan = hn::IsNaN(m);
  int64_t i = 0;
  for (; i + lanes <= n; i += lanes) {
    const auto v = hn::LoadU(d, x + i);
    m = hn::Max(m, v);
    nan = hn::Or(nan, hn::IsNaN(v));
  }
  float best = hn::AllFalse(d, nan) ? hn::GetLane(hn::MaxOfLanes(d, m)) : std::numeric_limits<float>::quiet_NaN();
  for (; i < n; ++i) best = x[i] > best || std::isnan(x[i]) ? x[i] : best;  // a NaN best stays: NaN > y is false
  return best;
}

// x * 0 is 0 for a finite x and NaN for NaN and infinity: one multiply-add
// per vector into a sum that is NaN exactly when some entry is not finite.
static bool AllFinite(const float* x, int64_t rows, int64_t n, int64_t ld) {
  const hn::ScalableTag<float> d;
  const int64_t lanes = int64_t(hn::Lanes(d));
  const auto zero = hn::Zero(d);
  auto sum = zero;
  float tail = 0.0f;
  for (int64_t r = 0; r < rows; ++r) {
    const float* row = x + r * ld;
    int64_t i = 0;
    for (; i + lanes <= n; i += lanes) sum = hn::MulAdd(hn::LoadU(d, row + i), zero, sum);
    for (; i < n; ++i) tail += row[i] * 0.0f;
  }
  return hn::AllFalse(d, hn::IsNaN(sum)) && tail == 0.0f;
}

static void SoftmaxGrad(const float* p, float* ds, float D, int64_t n) {
  ForEachLane(n, [&](auto d, int64_t i) {
    const auto pv = hn::LoadU(d, p + i);
    const auto grad = hn::Mul(pv, hn::Sub(hn::LoadU(d, ds + i), hn::Set(d, D)));
    hn::StoreU(hn::IfThenZeroElse(hn::Eq(pv, hn::Zero(d)), grad), d, ds + i);
  });
}

}  // namespace relpos::simd::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#endif  // RELPOS_SIMD_SOFTMAX_INL_H_
