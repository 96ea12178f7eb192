// Per-target code of the staircase micro-GEMM (simd.hpp's staircase_product): the
// small products of causal attention tiles.
// simd_staircase.cpp compiles it once per target for the library's dispatch, and
// the SIMD tests compile it again to call each target's functions directly.
// The guard is Highway's per-target idiom: foreach_target.h toggles
// HWY_TARGET_TOGGLE before each target, which lets this file in again.
#if defined(RELPOS_SIMD_STAIRCASE_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef RELPOS_SIMD_STAIRCASE_INL_H_
#undef RELPOS_SIMD_STAIRCASE_INL_H_
#else
#define RELPOS_SIMD_STAIRCASE_INL_H_
#endif

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include <hwy/highway.h>

#include "simd.hpp"

HWY_BEFORE_NAMESPACE();
namespace relpos::simd::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// Blocks of kRows rows of c by V vectors of columns in registers, A's entries
// broadcast, B's rows loaded. Targets with 32 vector registers (AVX-512) hold
// 6 x 4 accumulators, the others 6 x 2 (6 x 4 spilled on AVX2: 1.6x slower
// than sgemm at 64 x 64 x 32, measured).
constexpr int kRows = 6;
constexpr int kMaxVectors = HWY_TARGET <= HWY_AVX3 ? 4 : 2;

// Rows [0, rows) (rows <= kRows) of c's V vectors at c, over depths [p0, p1).
// Rows past `rows` compute a copy of the last one and are not stored.
template <int V, class D>
HWY_INLINE void ProductBlock(D d, int64_t rows, int64_t p0, int64_t p1, float alpha, const float* a, int64_t a_row,
                             int64_t a_col, const float* b, int64_t ldb, bool accumulate, float* c, int64_t ldc) {
  using Vec = hn::Vec<D>;
  const int64_t lanes = int64_t(hn::Lanes(d));
  Vec acc[kRows][V];
  for (int r = 0; r < kRows; ++r)
    for (int v = 0; v < V; ++v) acc[r][v] = hn::Zero(d);
  const float* a_at[kRows];
  for (int r = 0; r < kRows; ++r) a_at[r] = a + std::min<int64_t>(r, rows - 1) * a_row + p0 * a_col;
  const float* b_at = b + p0 * ldb;
  for (int64_t p = p0; p < p1; ++p, b_at += ldb) {
    Vec bv[V];
    for (int v = 0; v < V; ++v) bv[v] = hn::LoadU(d, b_at + v * lanes);
    for (int r = 0; r < kRows; ++r) {
      const Vec ar = hn::Set(d, *a_at[r]);
      a_at[r] += a_col;
      for (int v = 0; v < V; ++v) acc[r][v] = hn::MulAdd(ar, bv[v], acc[r][v]);
    }
  }
  const Vec va = hn::Set(d, alpha);
  for (int r = 0; r < rows; ++r)
    for (int v = 0; v < V; ++v) {
      float* out = c + r * ldc + v * lanes;
      const Vec x = hn::Mul(va, acc[r][v]);
      hn::StoreU(accumulate ? hn::Add(hn::LoadU(d, out), x) : x, d, out);
    }
}

// Columns [j, j + width) of the rows' block, width < one vector: B's and c's
// columns through zero-padded copies, so that no lane reads or writes past them.
template <class D>
void ProductTail(D d, int64_t rows, int64_t p0, int64_t p1, int64_t width, float alpha, const float* a, int64_t a_row,
                 int64_t a_col, const float* b, int64_t ldb, bool accumulate, float* c, int64_t ldc) {
  const int64_t lanes = int64_t(hn::Lanes(d));
  HWY_ALIGN float b_tail[kStaircaseMaxSize * hn::MaxLanes(D())];
  HWY_ALIGN float c_tail[kRows * hn::MaxLanes(D())];
  for (int64_t p = p0; p < p1; ++p) {
    std::fill_n(b_tail + p * lanes, lanes, 0.0f);
    std::copy_n(b + p * ldb, width, b_tail + p * lanes);
  }
  for (int64_t r = 0; accumulate && r < rows; ++r) {
    std::fill_n(c_tail + r * lanes, lanes, 0.0f);
    std::copy_n(c + r * ldc, width, c_tail + r * lanes);
  }
  ProductBlock<1>(d, rows, p0, p1, alpha, a, a_row, a_col, b_tail, lanes, accumulate, c_tail, lanes);
  for (int64_t r = 0; r < rows; ++r) std::copy_n(c_tail + r * lanes, width, c + r * ldc);
}

static void StaircaseProduct(const StaircaseProductArgs& x) {
  const hn::ScalableTag<float> d;
  const int64_t lanes = int64_t(hn::Lanes(d));
  const bool accumulate = x.beta != 0.0f;
  for (int64_t r0 = 0; r0 < x.m; r0 += kRows) {
    const int64_t rows = std::min<int64_t>(kRows, x.m - r0), last_visible = r0 + rows + x.delta;
    int64_t columns = x.n, p0 = 0, p1 = x.k;
    if (x.cut == Staircase::columns)  // whole vectors: the extra columns are products too
      columns = std::min(x.n, (std::max<int64_t>(last_visible, 0) + lanes - 1) / lanes * lanes);
    if (x.cut == Staircase::leading_depth) p1 = std::clamp<int64_t>(last_visible, 0, x.k);
    if (x.cut == Staircase::trailing_depth) p0 = std::clamp<int64_t>(r0 - x.delta, 0, x.k);
    const float* a = x.a + r0 * x.a_row;
    float* c = x.c + r0 * x.ldc;
    int64_t j = 0;
    const auto block = [&](auto vectors) {
      constexpr int V = decltype(vectors)::value;
      ProductBlock<V>(d, rows, p0, p1, x.alpha, a, x.a_row, x.a_col, x.b + j, x.ldb, accumulate, c + j, x.ldc);
      j += V * lanes;
    };
    while (j + kMaxVectors * lanes <= columns) block(std::integral_constant<int, kMaxVectors>());
    switch ((columns - j) / lanes) {  // whole vectors left, fewer than kMaxVectors: one block
      case 3: block(std::integral_constant<int, 3>()); break;
      case 2: block(std::integral_constant<int, 2>()); break;
      case 1: block(std::integral_constant<int, 1>()); break;
      default: break;
    }
    if (j < columns)
      ProductTail(d, rows, p0, p1, columns - j, x.alpha, a, x.a_row, x.a_col, x.b + j, x.ldb, accumulate, c + j, x.ldc);
    for (int64_t r = 0; r < rows && columns < x.n; ++r) std::fill(c + r * x.ldc + columns, c + r * x.ldc + x.n, 0.0f);
  }
}

}  // namespace relpos::simd::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#endif  // RELPOS_SIMD_STAIRCASE_INL_H_
