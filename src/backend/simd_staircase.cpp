// The staircase micro-GEMM of simd.hpp, dispatched. Its per-target code is
// simd_staircase-inl.h, which Highway compiles once per target here
// (foreach_target.h includes this file again for each); each wrapper below
// calls, through RELPOS_SIMD_DISPATCH, the best target the CPU runs within
// RELPOS_SIMD.
#include "simd_dispatch.h"  // first: the targets to compile

#include <stdexcept>

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "src/backend/simd_staircase.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>

#include "simd_staircase-inl.h"

#if HWY_ONCE
namespace relpos::simd {

HWY_EXPORT(StaircaseProduct);

void staircase_product(const StaircaseProductArgs& args) {
  if (args.m < 0 || args.n < 0 || args.k < 0 || args.k > kStaircaseMaxSize)
    throw std::logic_error("relpos: staircase_product: depth beyond kStaircaseMaxSize");
  if (args.beta != 0.0f && (args.beta != 1.0f || args.cut == Staircase::columns))
    throw std::logic_error("relpos: staircase_product: beta must be 0, or 1 without a column cut");
  RELPOS_SIMD_DISPATCH(StaircaseProduct)(args);
}

}  // namespace relpos::simd
#endif  // HWY_ONCE
