// The trainer's loops of simd.hpp, dispatched. Their per-target code is
// simd_trainer-inl.h, which Highway compiles once per target here
// (foreach_target.h includes this file again for each); each wrapper below
// calls, through RELPOS_SIMD_DISPATCH, the best target the CPU runs within
// RELPOS_SIMD.
#include "simd_dispatch.h"  // first: the targets to compile

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "src/backend/simd_trainer.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>

#include "simd_trainer-inl.h"

#if HWY_ONCE
namespace relpos::simd {

HWY_EXPORT(GeluForward);
HWY_EXPORT(LayerNormRow);
HWY_EXPORT(LayerNormBackwardRow);
HWY_EXPORT(AdamwUpdate);

void gelu_forward(const float* x, float* y, float* slope, int64_t n) {
  RELPOS_SIMD_DISPATCH(GeluForward)(x, y, slope, n);
}
void layer_norm_row(const float* x, const float* gamma, const float* beta, int64_t n, float eps, float* out,
                    float* mean, float* rstd) {
  RELPOS_SIMD_DISPATCH(LayerNormRow)(x, gamma, beta, n, eps, out, mean, rstd);
}
void layer_norm_backward_row(const float* dout, const float* x, const float* gamma, float mean, float rstd,
                             int64_t n, float* dx) {
  RELPOS_SIMD_DISPATCH(LayerNormBackwardRow)(dout, x, gamma, mean, rstd, n, dx);
}
void adamw_update(float* p, const float* g, float* m, float* v, int64_t n, const AdamwStep& step) {
  RELPOS_SIMD_DISPATCH(AdamwUpdate)(p, g, m, v, n, step);
}

}  // namespace relpos::simd
#endif  // HWY_ONCE
