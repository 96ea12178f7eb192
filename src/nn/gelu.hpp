// GELU in its exact erf form, torch.nn.GELU()'s default:
//   gelu(x) = x * Phi(x),  Phi(x) = (1 + erf(x / sqrt 2)) / 2
// double (the gradient tests) uses std::erf. float uses Abramowitz & Stegun
// 7.1.26 for erf (absolute error below 1.5e-7, float's own resolution near 1)
// with the vectorisable exp of the attention kernels: libm's erff is a scalar
// call and made GELU a third of a training step.
#pragma once

#include <cmath>
#include <cstdint>
#include <type_traits>

#include "../backend/simd.hpp"
#include "../backend/vexp.hpp"

namespace relpos::nn {

// Phi(x) and phi(x), the standard normal distribution and density.
inline void normal_cdf_pdf(double x, double& cdf, double& pdf) {
  cdf = 0.5 * (1.0 + std::erf(x * 0.70710678118654752440));
  pdf = 0.39894228040143267794 * std::exp(-0.5 * x * x);
}

// One exponential serves both: exp(-z^2) with z = |x| / sqrt 2 is exp(-x^2 / 2).
// kFused: exp_approx's multiply-adds as on targets with FMA.
template <bool kFused = true>
inline void normal_cdf_pdf(float x, float& cdf, float& pdf) {
  const float z = std::fabs(x) * 0.70710678f;
  const float t = 1.0f / (1.0f + 0.3275911f * z);
  const float poly = t * (0.254829592f + t * (-0.284496736f + t * (1.421413741f + t * (-1.453152027f + t * 1.061405429f))));
  const float gauss = exp_approx<kFused>(-z * z);
  cdf = 0.5f + (x < 0 ? -0.5f : 0.5f) * (1.0f - poly * gauss);
  pdf = 0.39894228f * gauss;
}

// One row: y = gelu(x), and where `slope` is given, slope = gelu'(x) =
// Phi(x) + x phi(x) (slope may be x: each element is read before it is
// written). A training forward keeps the slope in place of GELU's input, so
// that the backward is one product (gelu_backward_row) and not a second
// evaluation of erf and exp. float rows run the dispatched vector loop of
// simd.hpp (the same arithmetic per element).
template <class T>
void gelu_row(const T* x, T* y, T* slope, int64_t n) {
  if constexpr (std::is_same_v<T, float>) return simd::gelu_forward(x, y, slope, n);
  for (int64_t c = 0; c < n; ++c) {
    T cdf, pdf;
    const T xc = x[c];
    normal_cdf_pdf(xc, cdf, pdf);
    y[c] = xc * cdf;
    if (slope) slope[c] = cdf + xc * pdf;
  }
}

// One row of GELU's backward: dx = dy * slope (written).
template <class T>
void gelu_backward_row(const T* slope, const T* dy, T* dx, int64_t n) {
  if constexpr (std::is_same_v<T, float>) return simd::multiply(dy, slope, dx, n);
  for (int64_t c = 0; c < n; ++c) dx[c] = dy[c] * slope[c];
}

}  // namespace relpos::nn
