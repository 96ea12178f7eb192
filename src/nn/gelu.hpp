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

#include "../backend/vexp.hpp"
#include "row_loop.hpp"

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

// x (rows, row) -> y (rows, row), written. float rows run the dispatched
// vector loop of simd.hpp (the same arithmetic per element).
template <class T>
void gelu_forward(const T* x, T* y, int64_t rows, int64_t row, int threads) {
  for_each_row(threads, rows, 16 * row, [&](int64_t r) {
    const T* xr = x + r * row;
    T* yr = y + r * row;
    if constexpr (std::is_same_v<T, float>) return simd::gelu_forward(xr, yr, row);
#pragma omp simd
    for (int64_t c = 0; c < row; ++c) {
      T cdf, pdf;
      normal_cdf_pdf(xr[c], cdf, pdf);
      yr[c] = xr[c] * cdf;
    }
  });
}

// dy (rows, row); writes dx = dy * (Phi(x) + x * phi(x)).
template <class T>
void gelu_backward(const T* x, const T* dy, T* dx, int64_t rows, int64_t row, int threads) {
  for_each_row(threads, rows, 20 * row, [&](int64_t r) {
    const T* xr = x + r * row;
    const T* dyr = dy + r * row;
    T* dxr = dx + r * row;
    if constexpr (std::is_same_v<T, float>) return simd::gelu_backward(xr, dyr, dxr, row);
#pragma omp simd
    for (int64_t c = 0; c < row; ++c) {
      T cdf, pdf;
      normal_cdf_pdf(xr[c], cdf, pdf);
      dxr[c] = dyr[c] * (cdf + xr[c] * pdf);
    }
  });
}

}  // namespace relpos::nn
