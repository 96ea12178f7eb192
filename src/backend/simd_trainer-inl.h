// Per-target code of the trainer's loops (simd.hpp): GELU, LayerNorm's rows and
// AdamW.
// simd_trainer.cpp compiles it once per target for the library's dispatch, and
// the SIMD tests compile it again to call each target's functions directly.
// The guard is Highway's per-target idiom: foreach_target.h toggles
// HWY_TARGET_TOGGLE before each target, which lets this file in again.
#if defined(RELPOS_SIMD_TRAINER_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef RELPOS_SIMD_TRAINER_INL_H_
#undef RELPOS_SIMD_TRAINER_INL_H_
#else
#define RELPOS_SIMD_TRAINER_INL_H_
#endif

#include <cmath>
#include <cstdint>

#include <hwy/highway.h>

#include "simd_common-inl.h"

HWY_BEFORE_NAMESPACE();
namespace relpos::simd::HWY_NAMESPACE {

// Phi(x) and phi(x) as gelu.hpp's normal_cdf_pdf(float), lane-wise.
template <class D, class V>
void NormalCdfPdf(D d, V x, V& cdf, V& pdf) {
  const V z = hn::Mul(hn::Abs(x), hn::Set(d, 0.70710678f));
  const V one = hn::Set(d, 1.0f);
  const V t = hn::Div(one, hn::Add(one, hn::Mul(hn::Set(d, 0.3275911f), z)));
  V poly = hn::Set(d, 1.061405429f);
  for (float c : {-1.453152027f, 1.421413741f, -0.284496736f, 0.254829592f})
    poly = hn::Add(hn::Set(d, c), hn::Mul(t, poly));
  poly = hn::Mul(t, poly);
  const V gauss = Exp(d, hn::Neg(hn::Mul(z, z)));
  const V half = hn::IfThenElse(hn::Lt(x, hn::Zero(d)), hn::Set(d, -0.5f), hn::Set(d, 0.5f));
  cdf = hn::Add(hn::Set(d, 0.5f), hn::Mul(half, hn::Sub(one, hn::Mul(poly, gauss))));
  pdf = hn::Mul(hn::Set(d, 0.39894228f), gauss);
}

static void GeluForward(const float* x, float* y, float* slope, int64_t n) {
  ForEachLane(n, [&](auto d, int64_t i) {
    const auto v = hn::LoadU(d, x + i);
    decltype(hn::Zero(d)) cdf, pdf;
    NormalCdfPdf(d, v, cdf, pdf);
    hn::StoreU(hn::Mul(v, cdf), d, y + i);
    if (slope) hn::StoreU(hn::Add(cdf, hn::Mul(v, pdf)), d, slope + i);
  });
}

static void LayerNormRow(const float* x, const float* gamma, const float* beta, int64_t n, float eps, float* out,
                         float* mean, float* rstd) {
  const float mu = SumOf(x, n) / float(n);
  const float var = SumOfTerms(n, [&](auto d, int64_t i) {
                      const auto centred = hn::Sub(hn::LoadU(d, x + i), hn::Set(d, mu));
                      return hn::Mul(centred, centred);
                    }) / float(n);
  const float s = 1.0f / std::sqrt(var + eps);
  ForEachLane(n, [&](auto d, int64_t i) {
    const auto xhat = hn::Mul(hn::Sub(hn::LoadU(d, x + i), hn::Set(d, mu)), hn::Set(d, s));
    hn::StoreU(hn::MulAdd(xhat, hn::LoadU(d, gamma + i), hn::LoadU(d, beta + i)), d, out + i);
  });
  *mean = mu;
  *rstd = s;
}

static void LayerNormBackwardRow(const float* dout, const float* x, const float* gamma, float mean, float rstd,
                                 int64_t n, float* dx) {
  const auto g = [&](auto d, int64_t i) { return hn::Mul(hn::LoadU(d, dout + i), hn::LoadU(d, gamma + i)); };
  const auto xhat = [&](auto d, int64_t i) {
    return hn::Mul(hn::Sub(hn::LoadU(d, x + i), hn::Set(d, mean)), hn::Set(d, rstd));
  };
  const float mean_g = SumOfTerms(n, g) / float(n);
  const float mean_gx = SumOfTerms(n, [&](auto d, int64_t i) { return hn::Mul(g(d, i), xhat(d, i)); }) / float(n);
  ForEachLane(n, [&](auto d, int64_t i) {
    const auto centred = hn::Sub(hn::Sub(g(d, i), hn::Set(d, mean_g)), hn::Mul(xhat(d, i), hn::Set(d, mean_gx)));
    hn::StoreU(hn::MulAdd(centred, hn::Set(d, rstd), hn::LoadU(d, dx + i)), d, dx + i);
  });
}

static void AdamwUpdate(float* p, const float* g, float* m, float* v, int64_t n, const AdamwStep& s) {
  ForEachLane(n, [&](auto d, int64_t i) {
    const auto gi = hn::Mul(hn::LoadU(d, g + i), hn::Set(d, s.gradient_scale));
    const auto mi = hn::Add(hn::Mul(hn::Set(d, s.beta1), hn::LoadU(d, m + i)), hn::Mul(hn::Set(d, 1 - s.beta1), gi));
    const auto vi =
        hn::Add(hn::Mul(hn::Set(d, s.beta2), hn::LoadU(d, v + i)), hn::Mul(hn::Mul(hn::Set(d, 1 - s.beta2), gi), gi));
    const auto denominator = hn::Add(hn::Mul(hn::Sqrt(vi), hn::Set(d, s.v_correction)), hn::Set(d, s.eps));
    const auto decayed = hn::Mul(hn::LoadU(d, p + i), hn::Set(d, s.decay));
    hn::StoreU(hn::Sub(decayed, hn::Div(hn::Mul(hn::Set(d, s.step_size), mi), denominator)), d, p + i);
    hn::StoreU(mi, d, m + i);
    hn::StoreU(vi, d, v + i);
  });
}

}  // namespace relpos::simd::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#endif  // RELPOS_SIMD_TRAINER_INL_H_
