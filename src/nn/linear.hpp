// Affine layer through relpos::gemm: y = x W^T + b, W stored (out, in) as in
// torch.nn.Linear.
#pragma once

#include <cassert>
#include <cstdint>
#include <type_traits>

#include "../backend/simd.hpp"
#include "relpos/gemm.hpp"
#include "row_loop.hpp"

namespace relpos::nn {

// A GEMM operand of the layers: its values, and in mixed precision on a CPU
// with bfloat16 products the same values stored in bfloat16 (`narrow`). Where
// `narrow` is set the GEMM reads it and not `values`, which then may hold
// them unrounded: each tensor is narrowed once where it is written, not at
// every GEMM that reads it.
template <class T>
struct GemmOperand {
  const T* values;
  const bfloat16* narrow = nullptr;
};

// The layers' GEMM. Operands given in bfloat16 go to relpos::gemm_bf16 (both
// are, or neither). Operands whose float values are bfloat16 numbers
// (bf16_values: mixed-precision training rounded them where they were
// written) take bfloat16 products where the CPU has them
// (relpos::gemm_bf16_valued). The numbers are the same exact products either
// way, summed in another order.
template <class T>
void layer_gemm(bool bf16_values, Trans ta, Trans tb, int64_t m, int64_t n, int64_t k, T alpha, GemmOperand<T> a,
                int64_t lda, GemmOperand<T> b, int64_t ldb, T beta, T* c, int64_t ldc) {
  assert((a.narrow == nullptr) == (b.narrow == nullptr));
  if constexpr (std::is_same_v<T, float>) {
    if (a.narrow) return gemm_bf16(ta, tb, m, n, k, alpha, a.narrow, lda, b.narrow, ldb, beta, c, ldc);
    if (bf16_values) return gemm_bf16_valued(ta, tb, m, n, k, alpha, a.values, lda, b.values, ldb, beta, c, ldc);
  }
  gemm<T>(ta, tb, m, n, k, alpha, a.values, lda, b.values, ldb, beta, c, ldc);
}

// x (n, in), weight (out, in), bias (out) -> y (n, out), written; then
// then(r, y row r) on each row while it is in cache (the layer's epilogue:
// an activation, a residual sum, rounding for the next GEMM).
// bf16_values: x and weight hold bfloat16 numbers (see layer_gemm).
template <class T, class RowEpilogue>
void linear_forward(GemmOperand<T> x, GemmOperand<T> weight, const T* bias, int64_t n, int64_t in, int64_t out, T* y,
                    int threads, bool bf16_values, RowEpilogue then) {
  layer_gemm(bf16_values, Trans::no, Trans::yes, n, out, in, T(1), x, in, weight, in, T(0), y, out);
  for_each_row(threads, n, out, [&](int64_t r) {
    add_row(y + r * out, bias, out);
    then(r, y + r * out);
  });
}

// dy (n, out); writes dx (n, in) = dy W, adds dweight (out, in) += dy^T x
// and dbias (out) += column sums of dy (parameter gradients accumulate).
// bf16_values: dy, x and weight hold bfloat16 numbers (see layer_gemm).
template <class T>
void linear_backward(GemmOperand<T> dy, GemmOperand<T> x, GemmOperand<T> weight, int64_t n, int64_t in, int64_t out,
                     T* dx, T* dweight, T* dbias, bool bf16_values = false) {
  layer_gemm(bf16_values, Trans::no, Trans::no, n, in, out, T(1), dy, out, weight, in, T(0), dx, in);
  layer_gemm(bf16_values, Trans::yes, Trans::no, out, in, n, T(1), dy, out, x, in, T(1), dweight, in);
  // The bias gradient sums the values the GEMMs read (bfloat16 where they
  // read bfloat16), row after row.
  if constexpr (std::is_same_v<T, float>) {
    if (dy.narrow) return simd::add_column_sums_bf16(reinterpret_cast<const uint16_t*>(dy.narrow), n, out, dbias);
    return simd::add_column_sums(dy.values, n, out, dbias);
  }
  for (int64_t r = 0; r < n; ++r) add_row(dbias, dy.values + r * out, out);
}

}  // namespace relpos::nn
