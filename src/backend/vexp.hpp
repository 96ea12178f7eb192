// Exponentials for the softmax. float: Cody-Waite range reduction and a
// degree-6 polynomial (about 2 ulp near 0, a relative 4e-6 near -87 where
// the range reduction's error grows; exp(-inf) = 0 exactly, exp(NaN) NaN,
// infinity above simd::kExpOverflow), the
// scalar form here and its vector form in simd.hpp, dispatched at run time to
// the CPU's best target. double (tests, the oracle path) uses std::exp.
#pragma once

#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>

#include "simd.hpp"

namespace relpos {

// a * b + c rounded once (kFused: a fused multiply-add, as on CPUs with FMA)
// or twice (a product, then a sum).
template <bool kFused>
inline float multiply_add(float a, float b, float c) {
  if constexpr (kFused) return std::fma(a, b, c);
  return a * b + c;
}

// The scalar form of the vector exp; kFused as the targets with FMA (AVX2,
// AVX-512) compute it, else as those without (SSE4, scalar).
template <bool kFused = true>
inline float exp_approx(float x) {
  if (!(x <= simd::kExpOverflow)) return x * std::numeric_limits<float>::infinity();  // NaN stays NaN
  const float xc = x < -87.0f ? -87.0f : (x > 88.0f ? 88.0f : x);
  const float k = multiply_add<kFused>(xc, 1.44269504f, 12582912.0f) - 12582912.0f;  // round(x / ln 2)
  float r = multiply_add<kFused>(-k, 0.693359375f, xc);  // ln 2 split in two: exact k * hi
  r = multiply_add<kFused>(-k, -2.12194440e-4f, r);
  float p = 1.0f / 720;
  for (float c : {1.0f / 120, 1.0f / 24, 1.0f / 6, 0.5f, 1.0f, 1.0f}) p = multiply_add<kFused>(p, r, c);
  const float two_k = std::bit_cast<float>((static_cast<int32_t>(k) + 127) << 23);
  return x < -87.0f ? 0.0f : p * two_k;
}

// out[i] = exp(x[i] - shift); returns the sum of out. float: the run-time
// dispatched vector loop of simd.hpp, exp_approx in every lane, 0 where
// x[i] - shift < simd::kSoftmaxCutoff (see there); double: std::exp.
inline float exp_shifted_sum(const float* x, float shift, float* out, int64_t n) {
  return simd::exp_shifted_sum(x, shift, out, n);
}

inline double exp_shifted_sum(const double* x, double shift, double* out, int64_t n) {
  double sum = 0;
  for (int64_t i = 0; i < n; ++i) sum += (out[i] = std::exp(x[i] - shift));
  return sum;
}

inline float max_of(const float* x, int64_t n, float init) { return simd::max_of(x, n, init); }

// max(init, x[0], ..., x[n-1]), NaN if any is NaN: a NaN logit makes its row NaN.
template <class T>
T max_of(const T* x, int64_t n, T init) {
  T m = init;
  for (int64_t i = 0; i < n; ++i) m = x[i] > m || std::isnan(x[i]) ? x[i] : m;  // a NaN m stays: NaN > m is false
  return m;
}

// max(a, b), NaN if either is (std::max returns a when b is NaN).
template <class T>
T max_keeping_nan(T a, T b) {
  return b > a || std::isnan(b) ? b : a;  // a NaN a stays: b > NaN is false
}

}  // namespace relpos
