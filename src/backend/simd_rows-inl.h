// Per-target code of the element-wise row operations (simd.hpp): the attention
// tiles' epilogues, RoPE's rotation, column sums, the gradient norm's sum of
// squares and the transpose.
// simd_rows.cpp compiles it once per target for the library's dispatch, and
// the SIMD tests compile it again to call each target's functions directly.
// The guard is Highway's per-target idiom: foreach_target.h toggles
// HWY_TARGET_TOGGLE before each target, which lets this file in again.
#if defined(RELPOS_SIMD_ROWS_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef RELPOS_SIMD_ROWS_INL_H_
#undef RELPOS_SIMD_ROWS_INL_H_
#else
#define RELPOS_SIMD_ROWS_INL_H_
#endif

#include <algorithm>
#include <cstdint>

#include <hwy/highway.h>

#include "simd_common-inl.h"

HWY_BEFORE_NAMESPACE();
namespace relpos::simd::HWY_NAMESPACE {

static void Multiply(const float* a, const float* b, float* out, int64_t n) {
  ForEachLane(n, [&](auto d, int64_t i) { hn::StoreU(hn::Mul(hn::LoadU(d, a + i), hn::LoadU(d, b + i)), d, out + i); });
}

static void AddScaled(float* y, const float* x, float alpha, int64_t n) {
  ForEachLane(n, [&](auto d, int64_t i) {
    hn::StoreU(hn::MulAdd(hn::Set(d, alpha), hn::LoadU(d, x + i), hn::LoadU(d, y + i)), d, y + i);
  });
}

// y[i] += alpha x[n - 1 - i]: the block of y at i takes x's mirrored block, reversed.
static void AddScaledReversed(float* y, const float* x, float alpha, int64_t n) {
  ForEachLane(n, [&](auto d, int64_t i) {
    const auto mirrored = hn::Reverse(d, hn::LoadU(d, x + n - i - int64_t(hn::Lanes(d))));
    hn::StoreU(hn::MulAdd(hn::Set(d, alpha), mirrored, hn::LoadU(d, y + i)), d, y + i);
  });
}

static void AddConstant(float* y, float c, int64_t n) {
  ForEachLane(n, [&](auto d, int64_t i) { hn::StoreU(hn::Add(hn::LoadU(d, y + i), hn::Set(d, c)), d, y + i); });
}

static void Scale(float* y, float alpha, int64_t n) {
  ForEachLane(n, [&](auto d, int64_t i) { hn::StoreU(hn::Mul(hn::LoadU(d, y + i), hn::Set(d, alpha)), d, y + i); });
}

// sums[c] += x(r, c) for r = 0, 1, ... in order, each lane a column held in
// a register over all rows: the order of a row-by-row sum, one load per row.
template <class Load>
void AddColumnSumsOf(int64_t rows, int64_t cols, float* sums, Load load) {
  ForEachLane(cols, [&](auto d, int64_t c) {
    auto acc = hn::LoadU(d, sums + c);
    for (int64_t r = 0; r < rows; ++r) acc = hn::Add(acc, load(d, r * cols + c));
    hn::StoreU(acc, d, sums + c);
  });
}

static void AddColumnSums(const float* x, int64_t rows, int64_t cols, float* sums) {
  AddColumnSumsOf(rows, cols, sums, [&](auto d, int64_t i) { return hn::LoadU(d, x + i); });
}

static void AddColumnSumsBf16(const uint16_t* x, int64_t rows, int64_t cols, float* sums) {
  AddColumnSumsOf(rows, cols, sums, [&](auto d, int64_t i) { return LoadBf16(d, x + i); });
}

// The sum of x[i]^2 in double: lanes of doubles, then across lanes, then the
// tail in order.
static double SumOfSquares(const float* x, int64_t n) {
  const hn::ScalableTag<double> dd;
  const hn::Rebind<float, decltype(dd)> df;
  const int64_t lanes = int64_t(hn::Lanes(dd));
  auto sum = hn::Zero(dd);
  int64_t i = 0;
  for (; i + lanes <= n; i += lanes) {
    const auto v = hn::PromoteTo(dd, hn::LoadU(df, x + i));
    sum = hn::MulAdd(v, v, sum);
  }
  double total = hn::GetLane(hn::SumOfLanes(dd, sum));
  for (; i < n; ++i) total += double(x[i]) * x[i];
  return total;
}

static void RotatePairs(float* a, float* b, const float* c, const float* s, float sign, int64_t n) {
  ForEachLane(n, [&](auto d, int64_t i) {
    const auto x1 = hn::LoadU(d, a + i), x2 = hn::LoadU(d, b + i), cs = hn::LoadU(d, c + i);
    const auto sn = hn::Mul(hn::LoadU(d, s + i), hn::Set(d, sign));
    hn::StoreU(hn::Sub(hn::Mul(x1, cs), hn::Mul(x2, sn)), d, a + i);
    hn::StoreU(hn::Add(hn::Mul(x2, cs), hn::Mul(x1, sn)), d, b + i);
  });
}

// The transpose of x (rows x cols, row stride ldx) into an output (cols x
// rows, row stride ldo): by 8 x 8 blocks of 256-bit vectors where the target
// has them (AVX2, AVX-512: 24 shuffles and 16 wide loads and stores per 64
// entries, where 4 x 4 blocks take 32 and 32), by 4 x 4 blocks of 128-bit
// vectors (every x86 target has them) in the rows left, and element by element
// at the edges: put(d, v, at) puts a block's row at the output's entry at,
// put_one(at, value) one element.
template <class Put, class PutOne>
void TransposeBy(const float* x, int64_t rows, int64_t cols, int64_t ldx, int64_t ldo, [[maybe_unused]] Put put,
                 PutOne put_one) {
  // Element by element: rows [r0, r1), columns [c0, cols).
  const auto one_by_one = [&](int64_t r0, int64_t r1, int64_t c0) {
    for (int64_t c = c0; c < cols; ++c)
      for (int64_t i = r0; i < r1; ++i) put_one(c * ldo + i, x[i * ldx + c]);
  };
  int64_t r = 0;
#if HWY_TARGET <= HWY_AVX2
  const hn::FixedTag<float, 8> d8;
  const hn::Repartition<double, decltype(d8)> dd;
  // Pairs of 64-bit lanes interleaved, within each 128-bit block.
  const auto lower64 = [&](auto a, auto b) {
    return hn::BitCast(d8, hn::InterleaveLower(dd, hn::BitCast(dd, a), hn::BitCast(dd, b)));
  };
  const auto upper64 = [&](auto a, auto b) {
    return hn::BitCast(d8, hn::InterleaveUpper(dd, hn::BitCast(dd, a), hn::BitCast(dd, b)));
  };
  for (; r + 8 <= rows; r += 8) {
    int64_t c = 0;
    for (; c + 8 <= cols; c += 8) {
      const float* at = x + r * ldx + c;
      // Rows interleaved pairwise: t[2p] the lower lanes of rows 2p, 2p + 1 (per 128-bit block), t[2p + 1] the upper.
      decltype(hn::Zero(d8)) t[8];
      for (int pair = 0; pair < 4; ++pair) {
        const auto a = hn::LoadU(d8, at + 2 * pair * ldx), b = hn::LoadU(d8, at + (2 * pair + 1) * ldx);
        t[2 * pair] = hn::InterleaveLower(d8, a, b), t[2 * pair + 1] = hn::InterleaveUpper(d8, a, b);
      }
      // Column q of rows 0-3 in the lower block of u[q % 4] (q < 4) or the upper (q >= 4); rows 4-7 in u[4 + q % 4].
      const decltype(hn::Zero(d8)) u[8] = {lower64(t[0], t[2]), upper64(t[0], t[2]), lower64(t[1], t[3]),
                                           upper64(t[1], t[3]), lower64(t[4], t[6]), upper64(t[4], t[6]),
                                           lower64(t[5], t[7]), upper64(t[5], t[7])};
      for (int q = 0; q < 4; ++q) {
        put(d8, hn::ConcatLowerLower(d8, u[4 + q], u[q]), (c + q) * ldo + r);
        put(d8, hn::ConcatUpperUpper(d8, u[4 + q], u[q]), (c + 4 + q) * ldo + r);
      }
    }
    one_by_one(r, r + 8, c);
  }
#endif
#if HWY_TARGET != HWY_SCALAR  // one lane: element by element
  const hn::FixedTag<float, 4> d;
  for (; r + 4 <= rows; r += 4) {
    int64_t c = 0;
    for (; c + 4 <= cols; c += 4) {
      const auto r0 = hn::LoadU(d, x + r * ldx + c), r1 = hn::LoadU(d, x + (r + 1) * ldx + c);
      const auto r2 = hn::LoadU(d, x + (r + 2) * ldx + c), r3 = hn::LoadU(d, x + (r + 3) * ldx + c);
      const auto lo01 = hn::InterleaveLower(d, r0, r1), lo23 = hn::InterleaveLower(d, r2, r3);
      const auto hi01 = hn::InterleaveUpper(d, r0, r1), hi23 = hn::InterleaveUpper(d, r2, r3);
      put(d, hn::ConcatLowerLower(d, lo23, lo01), c * ldo + r);
      put(d, hn::ConcatUpperUpper(d, lo23, lo01), (c + 1) * ldo + r);
      put(d, hn::ConcatLowerLower(d, hi23, hi01), (c + 2) * ldo + r);
      put(d, hn::ConcatUpperUpper(d, hi23, hi01), (c + 3) * ldo + r);
    }
    one_by_one(r, r + 4, c);
  }
#endif
  one_by_one(r, rows, 0);
}

static void Transpose(const float* x, int64_t rows, int64_t cols, int64_t ldx, float* out, int64_t ldo) {
  TransposeBy(
      x, rows, cols, ldx, ldo, [&](auto d, auto v, int64_t at) { hn::StoreU(v, d, out + at); },
      [&](int64_t at, float value) { out[at] = value; });
}

static void AddTransposed(const float* x, int64_t rows, int64_t cols, int64_t ldx, float* out, int64_t ldo) {
  TransposeBy(
      x, rows, cols, ldx, ldo,
      [&](auto d, auto v, int64_t at) { hn::StoreU(hn::Add(hn::LoadU(d, out + at), v), d, out + at); },
      [&](int64_t at, float value) { out[at] += value; });
}

}  // namespace relpos::simd::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#endif  // RELPOS_SIMD_ROWS_INL_H_
