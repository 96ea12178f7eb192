// Layer normalisation over the last dimension, as torch.nn.LayerNorm (biased
// variance, eps inside the square root).
#pragma once

#include <cmath>
#include <cstdint>
#include <type_traits>

#include "../backend/simd.hpp"
#include "row_loop.hpp"

namespace relpos::nn {

constexpr double kLayerNormEps = 1e-5;

// x (n, width), gamma, beta (width) -> out (n, width); saves mean, rstd (n)
// for backward. float rows run in the SIMD layer (sums in float32 lanes);
// double rows sum sequentially in double.
template <class T>
void layer_norm_forward(const T* x, const T* gamma, const T* beta, int64_t n, int64_t width, T* out, T* mean,
                        T* rstd, int threads) {
  for_each_row(threads, n, width, [&](int64_t r) {
    const T* xr = x + r * width;
    if constexpr (std::is_same_v<T, float>)
      return simd::layer_norm_row(xr, gamma, beta, width, float(kLayerNormEps), out + r * width, mean + r, rstd + r);
    double sum = 0;
    for (int64_t c = 0; c < width; ++c) sum += xr[c];
    const double mu = sum / width;
    double sq = 0;
    for (int64_t c = 0; c < width; ++c) sq += (xr[c] - mu) * (xr[c] - mu);
    const double inv = 1.0 / std::sqrt(sq / width + kLayerNormEps);
    mean[r] = static_cast<T>(mu);
    rstd[r] = static_cast<T>(inv);
    const T m = mean[r], s = rstd[r];
    T* o = out + r * width;
    for (int64_t c = 0; c < width; ++c) o[c] = (xr[c] - m) * s * gamma[c] + beta[c];
  });
}

// dout (n, width); adds dx (n, width), dgamma, dbeta (width).
//   dx = rstd * (g - mean(g) - xhat * mean(g * xhat)),  g = dout * gamma
template <class T>
void layer_norm_backward(const T* dout, const T* x, const T* gamma, const T* mean, const T* rstd, int64_t n,
                         int64_t width, T* dx, T* dgamma, T* dbeta, int threads) {
  for_each_row(threads, n, 4 * width, [&](int64_t r) {
    const T* xr = x + r * width;
    const T* dr = dout + r * width;
    const T m = mean[r], s = rstd[r];
    if constexpr (std::is_same_v<T, float>)
      return simd::layer_norm_backward_row(dr, xr, gamma, m, s, width, dx + r * width);
    T sum_g = 0, sum_gx = 0;
    for (int64_t c = 0; c < width; ++c) {
      const T g = dr[c] * gamma[c];
      sum_g += g;
      sum_gx += g * (xr[c] - m) * s;
    }
    const T mean_g = sum_g / width, mean_gx = sum_gx / width;
    T* dxr = dx + r * width;
    for (int64_t c = 0; c < width; ++c) {
      const T xhat = (xr[c] - m) * s;
      dxr[c] += s * (dr[c] * gamma[c] - mean_g - xhat * mean_gx);
    }
  });
  // Column sums stay serial: a fixed summation order, and width-long vector loops.
  for (int64_t r = 0; r < n; ++r) {
    const T* xr = x + r * width;
    const T* dr = dout + r * width;
    const T m = mean[r], s = rstd[r];
    for (int64_t c = 0; c < width; ++c) {
      dgamma[c] += dr[c] * (xr[c] - m) * s;
      dbeta[c] += dr[c];
    }
  }
}

}  // namespace relpos::nn
