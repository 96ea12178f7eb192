// The conversions of simd.hpp, dispatched. Their per-target code is
// simd_convert-inl.h, which Highway compiles once per target here
// (foreach_target.h includes this file again for each); each wrapper below
// calls, through RELPOS_SIMD_DISPATCH, the best target the CPU runs within
// RELPOS_SIMD.
#include "simd_dispatch.h"  // first: the targets to compile

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "src/backend/simd_convert.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>

#include "simd_convert-inl.h"

#if HWY_ONCE
namespace relpos::simd {

HWY_EXPORT(WidenBf16);
HWY_EXPORT(NarrowBf16);
HWY_EXPORT(SplitBf16);
HWY_EXPORT(WidenF16);
HWY_EXPORT(NarrowF16);

void widen_bf16(const uint16_t* x, float* y, int64_t n) { RELPOS_SIMD_DISPATCH(WidenBf16)(x, y, n); }
void narrow_bf16(const float* x, uint16_t* y, int64_t n) { RELPOS_SIMD_DISPATCH(NarrowBf16)(x, y, n); }
void split_bf16(const float* x, uint16_t* hi, uint16_t* mid, uint16_t* lo, int64_t n) {
  RELPOS_SIMD_DISPATCH(SplitBf16)(x, hi, mid, lo, n);
}
void widen_f16(const uint16_t* x, float* y, int64_t n) { RELPOS_SIMD_DISPATCH(WidenF16)(x, y, n); }
void narrow_f16(const float* x, uint16_t* y, int64_t n) { RELPOS_SIMD_DISPATCH(NarrowF16)(x, y, n); }

}  // namespace relpos::simd
#endif  // HWY_ONCE
