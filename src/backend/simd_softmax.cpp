// The softmax's loops of simd.hpp, dispatched. Their per-target code is
// simd_softmax-inl.h, which Highway compiles once per target here
// (foreach_target.h includes this file again for each); each wrapper below
// calls, through RELPOS_SIMD_DISPATCH, the best target the CPU runs within
// RELPOS_SIMD.
#include "simd_dispatch.h"  // first: the targets to compile

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "src/backend/simd_softmax.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>

#include "simd_softmax-inl.h"

#if HWY_ONCE
namespace relpos::simd {

HWY_EXPORT(ExpShiftedSum);
HWY_EXPORT(MaxOf);
HWY_EXPORT(AllFinite);
HWY_EXPORT(SoftmaxGrad);

float exp_shifted_sum(const float* x, float shift, float* out, int64_t n) {
  return RELPOS_SIMD_DISPATCH(ExpShiftedSum)(x, shift, out, n);
}
float max_of(const float* x, int64_t n, float init) { return RELPOS_SIMD_DISPATCH(MaxOf)(x, n, init); }
bool all_finite(const float* x, int64_t rows, int64_t n, int64_t ld) {
  return RELPOS_SIMD_DISPATCH(AllFinite)(x, rows, n, ld);
}
void softmax_grad(const float* p, float* ds, float D, int64_t n) { RELPOS_SIMD_DISPATCH(SoftmaxGrad)(p, ds, D, n); }

}  // namespace relpos::simd
#endif  // HWY_ONCE
