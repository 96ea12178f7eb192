// Dense row-major GEMM, the backend of the unfused and fused algorithms
// (public so benchmarks can measure the rate the kernels build on):
//   C (m x n) = alpha * op(A) (m x k) * op(B) (k x n) + beta * C
// op(X) = X or X^T; leading dimensions are row strides in elements.
#pragma once

#include <cstdint>

#include "relpos/half.hpp"

namespace relpos {

enum class Trans { no, yes };

template <class T>
void gemm(Trans ta, Trans tb, int64_t m, int64_t n, int64_t k, T alpha, const T* a, int64_t lda, const T* b,
          int64_t ldb, T beta, T* c, int64_t ldc);

// The same product of bfloat16 operands, accumulated and written in float32.
// Where gemm_bf16_native() holds, a oneDNN bfloat16 matmul (about twice
// sgemm's rate); elsewhere the operands are widened and go to gemm<float>.
// Both compute the exact products (a product of two bfloat16 numbers is a
// float32) and differ only in the order of the sums.
void gemm_bf16(Trans ta, Trans tb, int64_t m, int64_t n, int64_t k, float alpha, const bfloat16* a, int64_t lda,
               const bfloat16* b, int64_t ldb, float beta, float* c, int64_t ldc);

// gemm<float> for float32 operands whose values the caller has rounded to
// bfloat16 (mixed-precision training): where gemm_bf16_native() holds, they
// are copied to bfloat16 (exactly) and go to gemm_bf16; elsewhere to
// gemm<float> as they are. Values that are not bfloat16 numbers would be
// rounded on one path and not on the other.
void gemm_bf16_valued(Trans ta, Trans tb, int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t lda,
                      const float* b, int64_t ldb, float beta, float* c, int64_t ldc);

// Whether gemm_bf16 runs bfloat16 products now: oneDNN's instruction set
// (which ONEDNN_MAX_CPU_ISA may limit) includes AVX512-BF16.
bool gemm_bf16_native();

// Whether those bfloat16 products run on matrix units (AMX; oneDNN's
// instruction set includes avx512_core_amx), several times sgemm's rate
// where AVX512-BF16 alone gives about twice.
bool gemm_bf16_matrix_units();

}  // namespace relpos
