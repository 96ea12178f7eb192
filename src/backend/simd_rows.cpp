// The element-wise row operations of simd.hpp, dispatched. Their per-target code is
// simd_rows-inl.h, which Highway compiles once per target here
// (foreach_target.h includes this file again for each); each wrapper below
// calls, through RELPOS_SIMD_DISPATCH, the best target the CPU runs within
// RELPOS_SIMD.
#include "simd_dispatch.h"  // first: the targets to compile

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "src/backend/simd_rows.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>

#include "simd_rows-inl.h"

#if HWY_ONCE
namespace relpos::simd {

HWY_EXPORT(Multiply);
HWY_EXPORT(AddScaled);
HWY_EXPORT(AddScaledReversed);
HWY_EXPORT(AddConstant);
HWY_EXPORT(Scale);
HWY_EXPORT(SumOf);
HWY_EXPORT(AddColumnSums);
HWY_EXPORT(AddColumnSumsBf16);
HWY_EXPORT(SumOfSquares);
HWY_EXPORT(RotatePairs);
HWY_EXPORT(Transpose);
HWY_EXPORT(AddTransposed);

void multiply(const float* a, const float* b, float* out, int64_t n) { RELPOS_SIMD_DISPATCH(Multiply)(a, b, out, n); }
void add_scaled(float* y, const float* x, float alpha, int64_t n) { RELPOS_SIMD_DISPATCH(AddScaled)(y, x, alpha, n); }
void add_scaled_reversed(float* y, const float* x, float alpha, int64_t n) {
  RELPOS_SIMD_DISPATCH(AddScaledReversed)(y, x, alpha, n);
}
void add_constant(float* y, float c, int64_t n) { RELPOS_SIMD_DISPATCH(AddConstant)(y, c, n); }
void scale(float* y, float alpha, int64_t n) { RELPOS_SIMD_DISPATCH(Scale)(y, alpha, n); }
float sum_of(const float* x, int64_t n) { return RELPOS_SIMD_DISPATCH(SumOf)(x, n); }
void add_column_sums(const float* x, int64_t rows, int64_t cols, float* sums) {
  RELPOS_SIMD_DISPATCH(AddColumnSums)(x, rows, cols, sums);
}
void add_column_sums_bf16(const uint16_t* x, int64_t rows, int64_t cols, float* sums) {
  RELPOS_SIMD_DISPATCH(AddColumnSumsBf16)(x, rows, cols, sums);
}
double sum_of_squares(const float* x, int64_t n) { return RELPOS_SIMD_DISPATCH(SumOfSquares)(x, n); }
void rotate_pairs(float* a, float* b, const float* c, const float* s, float sign, int64_t n) {
  RELPOS_SIMD_DISPATCH(RotatePairs)(a, b, c, s, sign, n);
}
void transpose(const float* x, int64_t rows, int64_t cols, int64_t ldx, float* out, int64_t ldo) {
  RELPOS_SIMD_DISPATCH(Transpose)(x, rows, cols, ldx, out, ldo);
}
void add_transposed(const float* x, int64_t rows, int64_t cols, int64_t ldx, float* out, int64_t ldo) {
  RELPOS_SIMD_DISPATCH(AddTransposed)(x, rows, cols, ldx, out, ldo);
}

}  // namespace relpos::simd
#endif  // HWY_ONCE
