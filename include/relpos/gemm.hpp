// Dense row-major GEMM, the backend of the unfused and fused algorithms
// (public so benchmarks can measure the rate the kernels build on):
//   C (m x n) = alpha * op(A) (m x k) * op(B) (k x n) + beta * C
// op(X) = X or X^T; leading dimensions are row strides in elements.
#pragma once

#include <cstdint>

namespace relpos {

enum class Trans { no, yes };

template <class T>
void gemm(Trans ta, Trans tb, int64_t m, int64_t n, int64_t k, T alpha, const T* a, int64_t lda, const T* b,
          int64_t ldb, T beta, T* c, int64_t ldc);

}  // namespace relpos
