// Row operations of the attention kernels for float and double: float runs the
// vector loops of simd.hpp, dispatched at run time to the CPU's best target
// (the portable build's own loops would be SSE2 only); double, the oracle
// and gradient-check path, plain loops.
#pragma once

#include <cmath>
#include <cstdint>
#include <type_traits>

#include "simd.hpp"

namespace relpos::rows {

// y[i] += alpha * x[i]
template <class T>
void add_scaled(T* y, const T* x, T alpha, int64_t n) {
  if constexpr (std::is_same_v<T, float>) {
    return simd::add_scaled(y, x, alpha, n);
  } else {
    for (int64_t i = 0; i < n; ++i) y[i] += alpha * x[i];
  }
}

// y[i] += alpha * x[n - 1 - i]
template <class T>
void add_scaled_reversed(T* y, const T* x, T alpha, int64_t n) {
  if constexpr (std::is_same_v<T, float>) {
    return simd::add_scaled_reversed(y, x, alpha, n);
  } else {
    for (int64_t i = 0; i < n; ++i) y[i] += alpha * x[n - 1 - i];
  }
}

// y[i] += c
template <class T>
void add_constant(T* y, T c, int64_t n) {
  if constexpr (std::is_same_v<T, float>) {
    return simd::add_constant(y, c, n);
  } else {
    for (int64_t i = 0; i < n; ++i) y[i] += c;
  }
}

// y[i] *= alpha
template <class T>
void scale(T* y, T alpha, int64_t n) {
  if constexpr (std::is_same_v<T, float>) {
    return simd::scale(y, alpha, n);
  } else {
    for (int64_t i = 0; i < n; ++i) y[i] *= alpha;
  }
}

// out[i] = a[i] * b[i]; out may be a or b
template <class T>
void multiply(const T* a, const T* b, T* out, int64_t n) {
  if constexpr (std::is_same_v<T, float>) {
    return simd::multiply(a, b, out, n);
  } else {
    for (int64_t i = 0; i < n; ++i) out[i] = a[i] * b[i];
  }
}

// x[0] + ... + x[n-1], in a fixed order
template <class T>
T sum_of(const T* x, int64_t n) {
  if constexpr (std::is_same_v<T, float>) {
    return simd::sum_of(x, n);
  } else {
    T s = 0;
    for (int64_t i = 0; i < n; ++i) s += x[i];
    return s;
  }
}

// The softmax's gradient from dP: ds[i] = p[i] * (ds[i] - D), D = dout . out;
// exactly 0 where p[i] is 0, whatever dP and D hold (a masked key's
// infinite value, a NaN row's D: neither reaches a pair the softmax gave nothing).
template <class T>
void softmax_grad(const T* p, T* ds, T D, int64_t n) {
  if constexpr (std::is_same_v<T, float>) {
    return simd::softmax_grad(p, ds, D, n);
  } else {
    for (int64_t i = 0; i < n; ++i) ds[i] = p[i] == 0 ? T(0) : p[i] * (ds[i] - D);
  }
}

// Whether the rows [0, rows) of x (n entries each, row stride ld) are all finite.
template <class T>
bool rows_finite(const T* x, int64_t rows, int64_t n, int64_t ld) {
  if constexpr (std::is_same_v<T, float>) {
    return simd::all_finite(x, rows, n, ld);
  } else {
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t i = 0; i < n; ++i)
        if (!std::isfinite(x[r * ld + i])) return false;
    return true;
  }
}

// out (cols x rows, row stride ldo) = the transpose of x (rows x cols, row
// stride ldx); strides may be negative.
template <class T>
void transpose(const T* x, int64_t rows, int64_t cols, int64_t ldx, T* out, int64_t ldo) {
  if constexpr (std::is_same_v<T, float>) {
    return simd::transpose(x, rows, cols, ldx, out, ldo);
  } else {
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = 0; c < cols; ++c) out[c * ldo + r] = x[r * ldx + c];
  }
}

// out (cols x rows, row stride ldo) += the transpose of x (rows x cols, row
// stride ldx); strides may be negative.
template <class T>
void add_transposed(const T* x, int64_t rows, int64_t cols, int64_t ldx, T* out, int64_t ldo) {
  if constexpr (std::is_same_v<T, float>) {
    return simd::add_transposed(x, rows, cols, ldx, out, ldo);
  } else {
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = 0; c < cols; ++c) out[c * ldo + r] += x[r * ldx + c];
  }
}

// (a[i], b[i]) rotated by the angle with cosine c[i] and sine sign * s[i].
template <class T>
void rotate_pairs(T* a, T* b, const T* c, const T* s, T sign, int64_t n) {
  if constexpr (std::is_same_v<T, float>) {
    return simd::rotate_pairs(a, b, c, s, sign, n);
  } else {
    for (int64_t i = 0; i < n; ++i) {
      const T x1 = a[i], x2 = b[i], sn = sign * s[i];
      a[i] = x1 * c[i] - x2 * sn;
      b[i] = x2 * c[i] + x1 * sn;
    }
  }
}

}  // namespace relpos::rows
