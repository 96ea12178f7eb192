// Exponentials for the softmax. float: Cody-Waite range reduction and a
// degree-6 polynomial (about 2 ulp near 0, a relative 4e-6 near -87 where
// the range reduction's error grows; exp(-inf) = 0 exactly), the
// scalar form here and its vector form in simd.hpp, dispatched at run time to
// the CPU's best target. double (tests, the oracle path) uses std::exp.
#pragma once

#include <bit>
#include <cmath>
#include <cstdint>

#include "simd.hpp"

namespace relpos {

inline float exp_approx(float x) {
  const float xc = x < -87.0f ? -87.0f : (x > 88.0f ? 88.0f : x);
  const float k = (xc * 1.44269504f + 12582912.0f) - 12582912.0f;  // round(x / ln 2)
  float r = xc - k * 0.693359375f;                                   // ln 2 split in two: exact k * hi
  r = r - k * -2.12194440e-4f;
  float p = 1.0f / 720;
  p = p * r + 1.0f / 120;
  p = p * r + 1.0f / 24;
  p = p * r + 1.0f / 6;
  p = p * r + 0.5f;
  p = p * r + 1.0f;
  p = p * r + 1.0f;
  const float two_k = std::bit_cast<float>((static_cast<int32_t>(k) + 127) << 23);
  return x < -87.0f ? 0.0f : p * two_k;
}

// out[i] = exp(x[i] - shift); returns the sum of out. float: the run-time
// dispatched vector loop of simd.hpp, exp_approx in every lane.
inline float exp_shifted_sum(const float* x, float shift, float* out, int64_t n) {
  return simd::exp_shifted_sum(x, shift, out, n);
}

inline double exp_shifted_sum(const double* x, double shift, double* out, int64_t n) {
  double sum = 0;
  for (int64_t i = 0; i < n; ++i) sum += (out[i] = std::exp(x[i] - shift));
  return sum;
}

inline float max_of(const float* x, int64_t n, float init) { return simd::max_of(x, n, init); }

template <class T>
T max_of(const T* x, int64_t n, T init) {
  T m = init;
#pragma omp simd reduction(max : m)
  for (int64_t i = 0; i < n; ++i) m = x[i] > m ? x[i] : m;
  return m;
}

}  // namespace relpos
