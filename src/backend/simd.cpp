// Highway's dynamic dispatch: this file is compiled once per target
// (foreach_target.h), and HWY_DYNAMIC_DISPATCH calls the best compiled target
// the CPU supports. See simd.hpp.
#include "simd.hpp"

// Every target this compiler can build, also those below the build's -march
// (so that RELPOS_SIMD=sse4 runs an SSE4 variant on any machine).
#ifndef HWY_COMPILE_ALL_ATTAINABLE
#define HWY_COMPILE_ALL_ATTAINABLE
#endif

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <stdexcept>
#include <type_traits>

#include "relpos/half.hpp"

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "src/backend/simd.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>

HWY_BEFORE_NAMESPACE();
namespace relpos::simd::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// exp(x) as vexp.hpp's exp_approx, lane-wise: Cody-Waite reduction by ln 2
// and a degree-6 polynomial; 0 below -87 (and for -inf), infinity above
// kExpOverflow, NaN for NaN (the clamp alone turned a NaN into -87, so a NaN
// logit became a probability of about 0). MulAdd is one fused instruction
// where the target has FMA (a 2-7% faster attention forward on AVX2 than a
// product and a sum) and a product and a sum elsewhere.
template <class D, class V>
V Exp(D d, V x) {
  const hn::RebindToSigned<D> di;
  const V xc = hn::Min(hn::Max(x, hn::Set(d, -87.0f)), hn::Set(d, 88.0f));
  const V magic = hn::Set(d, 12582912.0f);
  const V k = hn::Sub(hn::MulAdd(xc, hn::Set(d, 1.44269504f), magic), magic);
  V r = hn::NegMulAdd(k, hn::Set(d, 0.693359375f), xc);
  r = hn::NegMulAdd(k, hn::Set(d, -2.12194440e-4f), r);
  V p = hn::Set(d, 1.0f / 720);
  for (float c : {1.0f / 120, 1.0f / 24, 1.0f / 6, 0.5f, 1.0f, 1.0f}) p = hn::MulAdd(p, r, hn::Set(d, c));
  const V two_k = hn::BitCast(d, hn::ShiftLeft<23>(hn::Add(hn::ConvertTo(di, k), hn::Set(di, 127))));
  const V finite = hn::IfThenZeroElse(hn::Lt(x, hn::Set(d, -87.0f)), hn::Mul(p, two_k));
  // NaN and overflow in one test: NaN * inf stays NaN, x * inf is inf above it.
  return hn::IfThenElse(hn::Le(x, hn::Set(d, kExpOverflow)), finite,
                        hn::Mul(x, hn::Set(d, std::numeric_limits<float>::infinity())));
}

// Phi(x) and phi(x) as gelu.hpp's normal_cdf_pdf(float), lane-wise.
template <class D, class V>
void NormalCdfPdf(D d, V x, V& cdf, V& pdf) {
  const V z = hn::Mul(hn::Abs(x), hn::Set(d, 0.70710678f));
  const V one = hn::Set(d, 1.0f);
  const V t = hn::Div(one, hn::Add(one, hn::Mul(hn::Set(d, 0.3275911f), z)));
  V poly = hn::Set(d, 1.061405429f);
  for (float c : {-1.453152027f, 1.421413741f, -0.284496736f, 0.254829592f}) poly = hn::Add(hn::Set(d, c), hn::Mul(t, poly));
  poly = hn::Mul(t, poly);
  const V gauss = Exp(d, hn::Neg(hn::Mul(z, z)));
  const V half = hn::IfThenElse(hn::Lt(x, hn::Zero(d)), hn::Set(d, -0.5f), hn::Set(d, 0.5f));
  cdf = hn::Add(hn::Set(d, 0.5f), hn::Mul(half, hn::Sub(one, hn::Mul(poly, gauss))));
  pdf = hn::Mul(hn::Set(d, 0.39894228f), gauss);
}

float ExpShiftedSum(const float* x, float shift, float* out, int64_t n) {
  const hn::ScalableTag<float> d;
  const int64_t lanes = int64_t(hn::Lanes(d));
  const auto s = hn::Set(d, shift);
  auto sum = hn::Zero(d);
  int64_t i = 0;
  const auto softmax_exp = [](auto d, auto t) {
    return hn::IfThenZeroElse(hn::Lt(t, hn::Set(d, kSoftmaxCutoff)), Exp(d, t));
  };
  for (; i + lanes <= n; i += lanes) {
    const auto e = softmax_exp(d, hn::Sub(hn::LoadU(d, x + i), s));
    hn::StoreU(e, d, out + i);
    sum = hn::Add(sum, e);
  }
  float total = hn::GetLane(hn::SumOfLanes(d, sum));
  const hn::CappedTag<float, 1> d1;  // the tail, one lane at a time: the same arithmetic
  for (; i < n; ++i) {
    const float e = hn::GetLane(softmax_exp(d1, hn::Set(d1, x[i] - shift)));
    out[i] = e;
    total += e;
  }
  return total;
}

// Highway's Max leaves a NaN lane to the target (x86 returns its second
// operand), so NaN lanes are tracked beside it: a row with a NaN has NaN as
// its maximum, and its softmax is NaN, as in exact arithmetic.
float MaxOf(const float* x, int64_t n, float init) {
  const hn::ScalableTag<float> d;
  const int64_t lanes = int64_t(hn::Lanes(d));
  auto m = hn::Set(d, init);
  auto nan = hn::IsNaN(m);
  int64_t i = 0;
  for (; i + lanes <= n; i += lanes) {
    const auto v = hn::LoadU(d, x + i);
    m = hn::Max(m, v);
    nan = hn::Or(nan, hn::IsNaN(v));
  }
  float best = hn::AllFalse(d, nan) ? hn::GetLane(hn::MaxOfLanes(d, m)) : std::numeric_limits<float>::quiet_NaN();
  for (; i < n; ++i) best = x[i] > best || std::isnan(x[i]) ? x[i] : best;  // a NaN best stays: NaN > y is false
  return best;
}

// x * 0 is 0 for a finite x and NaN for NaN and infinity: one multiply-add
// per vector into a sum that is NaN exactly when some entry is not finite.
bool AllFinite(const float* x, int64_t rows, int64_t n, int64_t ld) {
  const hn::ScalableTag<float> d;
  const int64_t lanes = int64_t(hn::Lanes(d));
  const auto zero = hn::Zero(d);
  auto sum = zero;
  float tail = 0.0f;
  for (int64_t r = 0; r < rows; ++r) {
    const float* row = x + r * ld;
    int64_t i = 0;
    for (; i + lanes <= n; i += lanes) sum = hn::MulAdd(hn::LoadU(d, row + i), zero, sum);
    for (; i < n; ++i) tail += row[i] * 0.0f;
  }
  return hn::AllFalse(d, hn::IsNaN(sum)) && tail == 0.0f;
}

template <class Body>
void ForEachLane(int64_t n, Body body) {
  const hn::ScalableTag<float> d;
  const hn::CappedTag<float, 1> d1;
  const int64_t lanes = int64_t(hn::Lanes(d));
  int64_t i = 0;
  for (; i + lanes <= n; i += lanes) body(d, i);
  for (; i < n; ++i) body(d1, i);
}

void GeluForward(const float* x, float* y, float* slope, int64_t n) {
  ForEachLane(n, [&](auto d, int64_t i) {
    const auto v = hn::LoadU(d, x + i);
    decltype(hn::Zero(d)) cdf, pdf;
    NormalCdfPdf(d, v, cdf, pdf);
    hn::StoreU(hn::Mul(v, cdf), d, y + i);
    if (slope) hn::StoreU(hn::Add(cdf, hn::Mul(v, pdf)), d, slope + i);
  });
}

void Multiply(const float* a, const float* b, float* out, int64_t n) {
  ForEachLane(n, [&](auto d, int64_t i) { hn::StoreU(hn::Mul(hn::LoadU(d, a + i), hn::LoadU(d, b + i)), d, out + i); });
}

void AddScaled(float* y, const float* x, float alpha, int64_t n) {
  ForEachLane(n, [&](auto d, int64_t i) {
    hn::StoreU(hn::MulAdd(hn::Set(d, alpha), hn::LoadU(d, x + i), hn::LoadU(d, y + i)), d, y + i);
  });
}

// y[i] += alpha x[n - 1 - i]: the block of y at i takes x's mirrored block, reversed.
void AddScaledReversed(float* y, const float* x, float alpha, int64_t n) {
  ForEachLane(n, [&](auto d, int64_t i) {
    const auto mirrored = hn::Reverse(d, hn::LoadU(d, x + n - i - int64_t(hn::Lanes(d))));
    hn::StoreU(hn::MulAdd(hn::Set(d, alpha), mirrored, hn::LoadU(d, y + i)), d, y + i);
  });
}

void AddConstant(float* y, float c, int64_t n) {
  ForEachLane(n, [&](auto d, int64_t i) { hn::StoreU(hn::Add(hn::LoadU(d, y + i), hn::Set(d, c)), d, y + i); });
}

void Scale(float* y, float alpha, int64_t n) {
  ForEachLane(n, [&](auto d, int64_t i) { hn::StoreU(hn::Mul(hn::LoadU(d, y + i), hn::Set(d, alpha)), d, y + i); });
}

// The sum over i < n of the lanes of term(d, i): whole vectors first, added
// lane-wise and then across lanes, then the tail one lane at a time.
template <class Term>
float SumOfTerms(int64_t n, Term term) {
  const hn::ScalableTag<float> d;
  const hn::CappedTag<float, 1> d1;
  const int64_t lanes = int64_t(hn::Lanes(d));
  auto sum = hn::Zero(d);
  int64_t i = 0;
  for (; i + lanes <= n; i += lanes) sum = hn::Add(sum, term(d, i));
  float total = hn::GetLane(hn::SumOfLanes(d, sum));
  for (; i < n; ++i) total += hn::GetLane(term(d1, i));
  return total;
}

float SumOf(const float* x, int64_t n) {
  return SumOfTerms(n, [&](auto d, int64_t i) { return hn::LoadU(d, x + i); });
}

// The lanes of d from bfloat16 bits at x: the bits shifted into the high half.
template <class D>
hn::Vec<D> LoadBf16(D d, const uint16_t* x) {
  const hn::Rebind<uint16_t, D> du16;
  const hn::Rebind<uint32_t, D> du32;
  return hn::BitCast(d, hn::ShiftLeft<16>(hn::PromoteTo(du32, hn::LoadU(du16, x))));
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

void AddColumnSums(const float* x, int64_t rows, int64_t cols, float* sums) {
  AddColumnSumsOf(rows, cols, sums, [&](auto d, int64_t i) { return hn::LoadU(d, x + i); });
}

void AddColumnSumsBf16(const uint16_t* x, int64_t rows, int64_t cols, float* sums) {
  AddColumnSumsOf(rows, cols, sums, [&](auto d, int64_t i) { return LoadBf16(d, x + i); });
}

// The sum of x[i]^2 in double: lanes of doubles, then across lanes, then the
// tail in order.
double SumOfSquares(const float* x, int64_t n) {
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

void SoftmaxGrad(const float* p, float* ds, float D, int64_t n) {
  ForEachLane(n, [&](auto d, int64_t i) {
    const auto pv = hn::LoadU(d, p + i);
    const auto grad = hn::Mul(pv, hn::Sub(hn::LoadU(d, ds + i), hn::Set(d, D)));
    hn::StoreU(hn::IfThenZeroElse(hn::Eq(pv, hn::Zero(d)), grad), d, ds + i);
  });
}

void RotatePairs(float* a, float* b, const float* c, const float* s, float sign, int64_t n) {
  ForEachLane(n, [&](auto d, int64_t i) {
    const auto x1 = hn::LoadU(d, a + i), x2 = hn::LoadU(d, b + i), cs = hn::LoadU(d, c + i);
    const auto sn = hn::Mul(hn::LoadU(d, s + i), hn::Set(d, sign));
    hn::StoreU(hn::Sub(hn::Mul(x1, cs), hn::Mul(x2, sn)), d, a + i);
    hn::StoreU(hn::Add(hn::Mul(x2, cs), hn::Mul(x1, sn)), d, b + i);
  });
}

void LayerNormRow(const float* x, const float* gamma, const float* beta, int64_t n, float eps, float* out,
                  float* mean, float* rstd) {
  const float mu = SumOf(x, n) / float(n);
  const float var = SumOfTerms(n, [&](auto d, int64_t i) {
                      const auto centred = hn::Sub(hn::LoadU(d, x + i), hn::Set(d, mu));
                      return hn::Mul(centred, centred);
                    }) / float(n);
  const float s = 1.0f / std::sqrt(var + eps);
  ForEachLane(n, [&](auto d, int64_t i) {
    const auto xhat = hn::Mul(hn::Sub(hn::LoadU(d, x + i), hn::Set(d, mu)), hn::Set(d, s));
    hn::StoreU(hn::MulAdd(xhat, hn::LoadU(d, gamma + i), hn::LoadU(d, beta + i)), d, out + i);
  });
  *mean = mu;
  *rstd = s;
}

void LayerNormBackwardRow(const float* dout, const float* x, const float* gamma, float mean, float rstd, int64_t n,
                          float* dx) {
  const auto g = [&](auto d, int64_t i) { return hn::Mul(hn::LoadU(d, dout + i), hn::LoadU(d, gamma + i)); };
  const auto xhat = [&](auto d, int64_t i) {
    return hn::Mul(hn::Sub(hn::LoadU(d, x + i), hn::Set(d, mean)), hn::Set(d, rstd));
  };
  const float mean_g = SumOfTerms(n, g) / float(n);
  const float mean_gx = SumOfTerms(n, [&](auto d, int64_t i) { return hn::Mul(g(d, i), xhat(d, i)); }) / float(n);
  ForEachLane(n, [&](auto d, int64_t i) {
    const auto centred = hn::Sub(hn::Sub(g(d, i), hn::Set(d, mean_g)), hn::Mul(xhat(d, i), hn::Set(d, mean_gx)));
    hn::StoreU(hn::MulAdd(centred, hn::Set(d, rstd), hn::LoadU(d, dx + i)), d, dx + i);
  });
}

void AdamwUpdate(float* p, const float* g, float* m, float* v, int64_t n, const AdamwStep& s) {
  ForEachLane(n, [&](auto d, int64_t i) {
    const auto gi = hn::Mul(hn::LoadU(d, g + i), hn::Set(d, s.gradient_scale));
    const auto mi = hn::Add(hn::Mul(hn::Set(d, s.beta1), hn::LoadU(d, m + i)), hn::Mul(hn::Set(d, 1 - s.beta1), gi));
    const auto vi =
        hn::Add(hn::Mul(hn::Set(d, s.beta2), hn::LoadU(d, v + i)), hn::Mul(hn::Mul(hn::Set(d, 1 - s.beta2), gi), gi));
    const auto denominator = hn::Add(hn::Mul(hn::Sqrt(vi), hn::Set(d, s.v_correction)), hn::Set(d, s.eps));
    const auto decayed = hn::Mul(hn::LoadU(d, p + i), hn::Set(d, s.decay));
    hn::StoreU(hn::Sub(decayed, hn::Div(hn::Mul(hn::Set(d, s.step_size), mi), denominator)), d, p + i);
    hn::StoreU(mi, d, m + i);
    hn::StoreU(vi, d, v + i);
  });
}

// bfloat16 / float16 bits to float32 (exact) and back, rounded to nearest
// even as relpos/half.hpp's scalar conversions round, NaN kept NaN.
void WidenBf16(const uint16_t* x, float* y, int64_t n) {
  ForEachLane(n, [&](auto d, int64_t i) { hn::StoreU(LoadBf16(d, x + i), d, y + i); });
}

// The bfloat16 bits of v's lanes, rounded to nearest even (a NaN stays a
// NaN), in the low halves of 32-bit lanes.
template <class D>
hn::Vec<hn::Rebind<uint32_t, D>> RoundedBf16Bits(D, hn::Vec<D> v) {
  const hn::Rebind<uint32_t, D> du32;
  const auto u = hn::BitCast(du32, v);
  const auto odd = hn::And(hn::ShiftRight<16>(u), hn::Set(du32, 1u));
  const auto rounded = hn::ShiftRight<16>(hn::Add(u, hn::Add(hn::Set(du32, 0x7fffu), odd)));
  const auto quiet_nan = hn::ShiftRight<16>(hn::Or(u, hn::Set(du32, 0x400000u)));
  return hn::IfThenElse(hn::RebindMask(du32, hn::Ne(v, v)), quiet_nan, rounded);
}

template <class D>
void StoreBf16Bits(D, hn::Vec<hn::Rebind<uint32_t, D>> bits, uint16_t* y) {
  const hn::Rebind<uint16_t, D> du16;
  const hn::Rebind<int32_t, D> di32;
  hn::StoreU(hn::DemoteTo(du16, hn::BitCast(di32, bits)), du16, y);
}

void NarrowBf16(const float* x, uint16_t* y, int64_t n) {
  ForEachLane(n, [&](auto d, int64_t i) { StoreBf16Bits(d, RoundedBf16Bits(d, hn::LoadU(d, x + i)), y + i); });
}

// x as the sum of three bfloat16 numbers by truncation: each part is the top
// 16 bits of the rest of x after the parts before it. Each rest is exact in
// float32 and the last one has at most 8 significant bits, so the parts sum
// to x exactly (finite x whose rests are normal numbers). Rounding each part
// instead took three times the instructions, and the split was 15% of the
// bfloat16 forward on one AMX core.
void SplitBf16(const float* x, uint16_t* hi, uint16_t* mid, uint16_t* lo, int64_t n) {
  ForEachLane(n, [&](auto d, int64_t i) {
    const hn::Rebind<uint32_t, decltype(d)> du32;
    const auto top_half = hn::Set(du32, 0xffff0000u);
    auto rest = hn::LoadU(d, x + i);
    for (uint16_t* part : {hi, mid, lo}) {
      const auto kept = hn::And(hn::BitCast(du32, rest), top_half);
      StoreBf16Bits(d, hn::ShiftRight<16>(kept), part + i);
      rest = hn::Sub(rest, hn::BitCast(d, kept));
    }
  });
}

// float16 through F16C where the target has it (AVX2, AVX-512); Highway's
// emulation on the others truncates when narrowing and turns infinities and
// NaNs into finite values when widening, so those targets run the scalar
// conversions.
void WidenF16(const uint16_t* x, float* y, int64_t n) {
#if HWY_TARGET <= HWY_AVX2
  ForEachLane(n, [&](auto d, int64_t i) {
    const hn::Rebind<hwy::float16_t, decltype(d)> df16;
    hn::StoreU(hn::PromoteTo(d, hn::LoadU(df16, reinterpret_cast<const hwy::float16_t*>(x + i))), d, y + i);
  });
#else
  for (int64_t i = 0; i < n; ++i) y[i] = half_bits::float_from_f16(x[i]);
#endif
}

void NarrowF16(const float* x, uint16_t* y, int64_t n) {
#if HWY_TARGET <= HWY_AVX2
  ForEachLane(n, [&](auto d, int64_t i) {
    const hn::Rebind<hwy::float16_t, decltype(d)> df16;
    hn::StoreU(hn::DemoteTo(df16, hn::LoadU(d, x + i)), df16, reinterpret_cast<hwy::float16_t*>(y + i));
  });
#else
  for (int64_t i = 0; i < n; ++i) y[i] = half_bits::f16_from_float(x[i]);
#endif
}

// The staircase product (simd.hpp): blocks of kRows rows of c by V vectors of
// columns in registers, A's entries broadcast, B's rows loaded. Targets with
// 32 vector registers (AVX-512) hold 6 x 4 accumulators, the others 6 x 2
// (6 x 4 spilled on AVX2: 1.6x slower than sgemm at 64 x 64 x 32, measured).
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

void StaircaseProduct(const StaircaseProductArgs& x) {
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

// out (cols x rows, row stride rows) = the transpose of x (rows x cols, row
// stride ldx), by 4 x 4 blocks of 128-bit vectors (every x86 target has
// them) and element by element at the edges.
void Transpose(const float* x, int64_t rows, int64_t cols, int64_t ldx, float* out) {
  int64_t r = 0;
#if HWY_TARGET != HWY_SCALAR  // one lane: element by element
  const hn::FixedTag<float, 4> d;
  for (; r + 4 <= rows; r += 4) {
    int64_t c = 0;
    for (; c + 4 <= cols; c += 4) {
      const auto r0 = hn::LoadU(d, x + r * ldx + c), r1 = hn::LoadU(d, x + (r + 1) * ldx + c);
      const auto r2 = hn::LoadU(d, x + (r + 2) * ldx + c), r3 = hn::LoadU(d, x + (r + 3) * ldx + c);
      const auto lo01 = hn::InterleaveLower(d, r0, r1), lo23 = hn::InterleaveLower(d, r2, r3);
      const auto hi01 = hn::InterleaveUpper(d, r0, r1), hi23 = hn::InterleaveUpper(d, r2, r3);
      hn::StoreU(hn::ConcatLowerLower(d, lo23, lo01), d, out + c * rows + r);
      hn::StoreU(hn::ConcatUpperUpper(d, lo23, lo01), d, out + (c + 1) * rows + r);
      hn::StoreU(hn::ConcatLowerLower(d, hi23, hi01), d, out + (c + 2) * rows + r);
      hn::StoreU(hn::ConcatUpperUpper(d, hi23, hi01), d, out + (c + 3) * rows + r);
    }
    for (; c < cols; ++c)
      for (int64_t i = r; i < r + 4; ++i) out[c * rows + i] = x[i * ldx + c];
  }
#endif
  for (; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) out[c * rows + r] = x[r * ldx + c];
}

const char* TargetName() { return hwy::TargetName(HWY_TARGET); }

}  // namespace relpos::simd::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace relpos::simd {

HWY_EXPORT(ExpShiftedSum);
HWY_EXPORT(MaxOf);
HWY_EXPORT(GeluForward);
HWY_EXPORT(Multiply);
HWY_EXPORT(AddScaled);
HWY_EXPORT(AddScaledReversed);
HWY_EXPORT(AddConstant);
HWY_EXPORT(Scale);
HWY_EXPORT(SumOf);
HWY_EXPORT(SoftmaxGrad);
HWY_EXPORT(AllFinite);
HWY_EXPORT(AddColumnSums);
HWY_EXPORT(AddColumnSumsBf16);
HWY_EXPORT(SumOfSquares);
HWY_EXPORT(RotatePairs);
HWY_EXPORT(LayerNormRow);
HWY_EXPORT(LayerNormBackwardRow);
HWY_EXPORT(AdamwUpdate);
HWY_EXPORT(WidenBf16);
HWY_EXPORT(NarrowBf16);
HWY_EXPORT(SplitBf16);
HWY_EXPORT(WidenF16);
HWY_EXPORT(NarrowF16);
HWY_EXPORT(StaircaseProduct);
HWY_EXPORT(Transpose);
HWY_EXPORT(TargetName);

namespace {

// Targets by the name RELPOS_SIMD and limit_targets take, each with the
// targets no better than it.
int64_t targets_up_to(const std::string& name) {
  struct Named {
    const char* name;
    int64_t target;
  };
  const Named order[] = {{"scalar", HWY_SCALAR | HWY_EMU128}, {"sse4", HWY_SSSE3 | HWY_SSE4},
                         {"avx2", HWY_AVX2}, {"avx512", HWY_AVX3 | HWY_AVX3_DL}};
  int64_t mask = 0;
  for (const Named& n : order) {
    mask |= n.target;
    if (name == n.name) return mask;
  }
  throw std::invalid_argument("relpos: RELPOS_SIMD: unknown target '" + name + "' (avx512, avx2, sse4, scalar)");
}

std::vector<std::string> names(int64_t targets) {
  std::vector<std::string> out;
  for (int64_t t = targets; t != 0; t &= t - 1) out.push_back(hwy::TargetName(t & -t));
  return out;
}

// Applies RELPOS_SIMD once, before the first dispatch (a throw leaves it to
// the next call). A static's initialiser, not std::call_once: every later
// call is one inlined check, and the row loops call through here per row.
void apply_environment() {
  static const bool applied = [] {
    if (const char* limit = std::getenv("RELPOS_SIMD"); limit && *limit) limit_targets(limit);
    return true;
  }();
  (void)applied;
}

}  // namespace

float exp_shifted_sum(const float* x, float shift, float* out, int64_t n) {
  apply_environment();
  return HWY_DYNAMIC_DISPATCH(ExpShiftedSum)(x, shift, out, n);
}
float max_of(const float* x, int64_t n, float init) {
  apply_environment();
  return HWY_DYNAMIC_DISPATCH(MaxOf)(x, n, init);
}
bool all_finite(const float* x, int64_t rows, int64_t n, int64_t ld) {
  apply_environment();
  return HWY_DYNAMIC_DISPATCH(AllFinite)(x, rows, n, ld);
}
void gelu_forward(const float* x, float* y, float* slope, int64_t n) {
  apply_environment();
  HWY_DYNAMIC_DISPATCH(GeluForward)(x, y, slope, n);
}
void multiply(const float* a, const float* b, float* out, int64_t n) {
  apply_environment();
  HWY_DYNAMIC_DISPATCH(Multiply)(a, b, out, n);
}

void add_scaled(float* y, const float* x, float alpha, int64_t n) {
  apply_environment();
  HWY_DYNAMIC_DISPATCH(AddScaled)(y, x, alpha, n);
}
void add_scaled_reversed(float* y, const float* x, float alpha, int64_t n) {
  apply_environment();
  HWY_DYNAMIC_DISPATCH(AddScaledReversed)(y, x, alpha, n);
}
void add_constant(float* y, float c, int64_t n) {
  apply_environment();
  HWY_DYNAMIC_DISPATCH(AddConstant)(y, c, n);
}
void scale(float* y, float alpha, int64_t n) {
  apply_environment();
  HWY_DYNAMIC_DISPATCH(Scale)(y, alpha, n);
}
float sum_of(const float* x, int64_t n) {
  apply_environment();
  return HWY_DYNAMIC_DISPATCH(SumOf)(x, n);
}
void staircase_product(const StaircaseProductArgs& args) {
  if (args.m < 0 || args.n < 0 || args.k < 0 || args.k > kStaircaseMaxSize)
    throw std::logic_error("relpos: staircase_product: depth beyond kStaircaseMaxSize");
  if (args.beta != 0.0f && (args.beta != 1.0f || args.cut == Staircase::columns))
    throw std::logic_error("relpos: staircase_product: beta must be 0, or 1 without a column cut");
  apply_environment();
  HWY_DYNAMIC_DISPATCH(StaircaseProduct)(args);
}
void transpose(const float* x, int64_t rows, int64_t cols, int64_t ldx, float* out) {
  apply_environment();
  HWY_DYNAMIC_DISPATCH(Transpose)(x, rows, cols, ldx, out);
}
void softmax_grad(const float* p, float* ds, float D, int64_t n) {
  apply_environment();
  HWY_DYNAMIC_DISPATCH(SoftmaxGrad)(p, ds, D, n);
}
void add_column_sums(const float* x, int64_t rows, int64_t cols, float* sums) {
  apply_environment();
  HWY_DYNAMIC_DISPATCH(AddColumnSums)(x, rows, cols, sums);
}
void add_column_sums_bf16(const uint16_t* x, int64_t rows, int64_t cols, float* sums) {
  apply_environment();
  HWY_DYNAMIC_DISPATCH(AddColumnSumsBf16)(x, rows, cols, sums);
}
double sum_of_squares(const float* x, int64_t n) {
  apply_environment();
  return HWY_DYNAMIC_DISPATCH(SumOfSquares)(x, n);
}
void rotate_pairs(float* a, float* b, const float* c, const float* s, float sign, int64_t n) {
  apply_environment();
  HWY_DYNAMIC_DISPATCH(RotatePairs)(a, b, c, s, sign, n);
}

void layer_norm_row(const float* x, const float* gamma, const float* beta, int64_t n, float eps, float* out,
                    float* mean, float* rstd) {
  apply_environment();
  HWY_DYNAMIC_DISPATCH(LayerNormRow)(x, gamma, beta, n, eps, out, mean, rstd);
}
void layer_norm_backward_row(const float* dout, const float* x, const float* gamma, float mean, float rstd,
                             int64_t n, float* dx) {
  apply_environment();
  HWY_DYNAMIC_DISPATCH(LayerNormBackwardRow)(dout, x, gamma, mean, rstd, n, dx);
}
void adamw_update(float* p, const float* g, float* m, float* v, int64_t n, const AdamwStep& step) {
  apply_environment();
  HWY_DYNAMIC_DISPATCH(AdamwUpdate)(p, g, m, v, n, step);
}

void widen_bf16(const uint16_t* x, float* y, int64_t n) {
  apply_environment();
  HWY_DYNAMIC_DISPATCH(WidenBf16)(x, y, n);
}
void narrow_bf16(const float* x, uint16_t* y, int64_t n) {
  apply_environment();
  HWY_DYNAMIC_DISPATCH(NarrowBf16)(x, y, n);
}
void split_bf16(const float* x, uint16_t* hi, uint16_t* mid, uint16_t* lo, int64_t n) {
  apply_environment();
  HWY_DYNAMIC_DISPATCH(SplitBf16)(x, hi, mid, lo, n);
}
void widen_f16(const uint16_t* x, float* y, int64_t n) {
  apply_environment();
  HWY_DYNAMIC_DISPATCH(WidenF16)(x, y, n);
}
void narrow_f16(const float* x, uint16_t* y, int64_t n) {
  apply_environment();
  HWY_DYNAMIC_DISPATCH(NarrowF16)(x, y, n);
}

std::string active_target() {
  apply_environment();
  return HWY_DYNAMIC_DISPATCH(TargetName)();
}
std::vector<std::string> compiled_targets() { return names(HWY_TARGETS); }
std::vector<std::string> supported_targets() { return names(hwy::SupportedTargets() & HWY_TARGETS); }

void limit_targets(const std::string& name) {
  hwy::SetSupportedTargetsForTest(0);  // back to what the CPU supports
  if (name.empty()) return;
  const int64_t allowed = targets_up_to(name) & hwy::SupportedTargets() & HWY_TARGETS;
  if (allowed == 0) throw std::invalid_argument("relpos: RELPOS_SIMD: no target up to '" + name + "' runs here");
  hwy::SetSupportedTargetsForTest(allowed);
}

}  // namespace relpos::simd
#endif  // HWY_ONCE
