// Attention dropout's multipliers of simd.hpp, dispatched. Their per-target
// code is simd_dropout-inl.h, which Highway compiles once per target here
// (foreach_target.h includes this file again for each).
#include "simd_dispatch.h"  // first: the targets to compile

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "src/backend/simd_dropout.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>

#include "simd_dropout-inl.h"

#if HWY_ONCE
namespace relpos::simd {

HWY_EXPORT(DropoutRowOf);
HWY_EXPORT(DropoutTimesOf);

void dropout_row(const DropoutRow& r, uint32_t kp0, float* z, int64_t n) {
  RELPOS_SIMD_DISPATCH(DropoutRowOf)(r, kp0, z, n);
}
void dropout_times(const DropoutRow& r, uint32_t kp0, const float* x, float* out, float* z, int64_t n) {
  RELPOS_SIMD_DISPATCH(DropoutTimesOf)(r, kp0, x, out, z, n);
}

}  // namespace relpos::simd
#endif  // HWY_ONCE
