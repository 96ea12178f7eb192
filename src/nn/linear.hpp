// Affine layer through relpos::gemm: y = x W^T + b, W stored (out, in) as in
// torch.nn.Linear.
#pragma once

#include <cstdint>
#include <type_traits>

#include "relpos/gemm.hpp"
#include "row_loop.hpp"

namespace relpos::nn {

// The layers' GEMM. Operands whose values are bfloat16 numbers (mixed-precision
// training rounds them where they are written) take bfloat16 products where
// the CPU has them (relpos::gemm_bf16_valued); the numbers are the same
// exact products either way, summed in another order.
template <class T>
void layer_gemm(bool bf16_values, Trans ta, Trans tb, int64_t m, int64_t n, int64_t k, T alpha, const T* a,
                int64_t lda, const T* b, int64_t ldb, T beta, T* c, int64_t ldc) {
  if constexpr (std::is_same_v<T, float>)
    if (bf16_values) return gemm_bf16_valued(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
  gemm<T>(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

// x (n, in), weight (out, in), bias (out) -> y (n, out), written.
// bf16_values: x and weight hold bfloat16 numbers (see layer_gemm).
template <class T>
void linear_forward(const T* x, const T* weight, const T* bias, int64_t n, int64_t in, int64_t out, T* y,
                    int threads, bool bf16_values = false) {
  layer_gemm(bf16_values, Trans::no, Trans::yes, n, out, in, T(1), x, in, weight, in, T(0), y, out);
  for_each_row(threads, n, out, [&](int64_t r) {
    T* yr = y + r * out;
    for (int64_t c = 0; c < out; ++c) yr[c] += bias[c];
  });
}

// dy (n, out); writes dx (n, in) = dy W, adds dweight (out, in) += dy^T x
// and dbias (out) += column sums of dy (parameter gradients accumulate).
// bf16_values: dy, x and weight hold bfloat16 numbers (see layer_gemm).
template <class T>
void linear_backward(const T* dy, const T* x, const T* weight, int64_t n, int64_t in, int64_t out, T* dx,
                     T* dweight, T* dbias, bool bf16_values = false) {
  layer_gemm(bf16_values, Trans::no, Trans::no, n, in, out, T(1), dy, out, weight, in, T(0), dx, in);
  layer_gemm(bf16_values, Trans::yes, Trans::no, out, in, n, T(1), dy, out, x, in, T(1), dweight, in);
  for (int64_t r = 0; r < n; ++r) {
    const T* dr = dy + r * out;
    for (int64_t c = 0; c < out; ++c) dbias[c] += dr[c];
  }
}

}  // namespace relpos::nn
