// The SIMD loops of simd.hpp on every target this machine can run, each
// checked against a double-precision formula and against the scalar form of
// the same arithmetic (vexp.hpp's exp_approx, gelu.hpp's normal_cdf_pdf), bit
// for bit: with fused multiply-adds on the targets with FMA (AVX2, AVX-512),
// with a rounded product and sum on the others.
//
// The families' per-target code (src/backend/simd_*-inl.h) is compiled here
// once per target too (foreach_target.h includes this file again for each),
// and the checks call each target's functions directly, by a table of them per
// target (SimdOps): none of them changes which target the library dispatches
// to. One test runs the same checks on the library's own functions under
// RELPOS_SIMD's limits: it changes the dispatch, and sets it back.
#include "../../../src/backend/simd_dispatch.h"  // first: every attainable target, as the library compiles

#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <random>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "../../../src/backend/simd.hpp"
#include "../../../src/backend/vexp.hpp"
#include "../../../src/nn/gelu.hpp"
#include "relpos/half.hpp"

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "backend/simd_test.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>

#include "../../../src/backend/simd_convert-inl.h"
#include "../../../src/backend/simd_rows-inl.h"
#include "../../../src/backend/simd_softmax-inl.h"
#include "../../../src/backend/simd_staircase-inl.h"
#include "../../../src/backend/simd_trainer-inl.h"

#ifndef RELPOS_TEST_SIMD_OPS_
#define RELPOS_TEST_SIMD_OPS_
namespace relpos_test {

// One target's functions of simd.hpp, by simd.hpp's names.
struct SimdOps {
  const char* target;
  bool fused;  // a multiply-add is one rounding (the target has FMA)
  float (*exp_shifted_sum)(const float*, float, float*, int64_t);
  float (*max_of)(const float*, int64_t, float);
  bool (*all_finite)(const float*, int64_t, int64_t, int64_t);
  void (*softmax_grad)(const float*, float*, float, int64_t);
  void (*add_scaled)(float*, const float*, float, int64_t);
  void (*add_scaled_reversed)(float*, const float*, float, int64_t);
  void (*add_constant)(float*, float, int64_t);
  void (*scale)(float*, float, int64_t);
  float (*sum_of)(const float*, int64_t);
  void (*multiply)(const float*, const float*, float*, int64_t);
  void (*rotate_pairs)(float*, float*, const float*, const float*, float, int64_t);
  void (*add_column_sums)(const float*, int64_t, int64_t, float*);
  void (*add_column_sums_bf16)(const uint16_t*, int64_t, int64_t, float*);
  double (*sum_of_squares)(const float*, int64_t);
  void (*transpose)(const float*, int64_t, int64_t, int64_t, float*, int64_t);
  void (*add_transposed)(const float*, int64_t, int64_t, int64_t, float*, int64_t);
  void (*staircase_product)(const relpos::simd::StaircaseProductArgs&);
  void (*gelu_forward)(const float*, float*, float*, int64_t);
  void (*layer_norm_row)(const float*, const float*, const float*, int64_t, float, float*, float*, float*);
  void (*layer_norm_backward_row)(const float*, const float*, const float*, float, float, int64_t, float*);
  void (*adamw_update)(float*, const float*, float*, float*, int64_t, const relpos::simd::AdamwStep&);
  void (*widen_bf16)(const uint16_t*, float*, int64_t);
  void (*narrow_bf16)(const float*, uint16_t*, int64_t);
  void (*split_bf16)(const float*, uint16_t*, uint16_t*, uint16_t*, int64_t);
  void (*widen_f16)(const uint16_t*, float*, int64_t);
  void (*narrow_f16)(const float*, uint16_t*, int64_t);
};

}  // namespace relpos_test
#endif  // RELPOS_TEST_SIMD_OPS_

HWY_BEFORE_NAMESPACE();
namespace relpos_test::HWY_NAMESPACE {

SimdOps TargetOps() {
  namespace s = relpos::simd::HWY_NAMESPACE;
  return {.target = hwy::TargetName(HWY_TARGET),
          .fused = HWY_NATIVE_FMA != 0,
          .exp_shifted_sum = &s::ExpShiftedSum,
          .max_of = &s::MaxOf,
          .all_finite = &s::AllFinite,
          .softmax_grad = &s::SoftmaxGrad,
          .add_scaled = &s::AddScaled,
          .add_scaled_reversed = &s::AddScaledReversed,
          .add_constant = &s::AddConstant,
          .scale = &s::Scale,
          .sum_of = &s::SumOf,
          .multiply = &s::Multiply,
          .rotate_pairs = &s::RotatePairs,
          .add_column_sums = &s::AddColumnSums,
          .add_column_sums_bf16 = &s::AddColumnSumsBf16,
          .sum_of_squares = &s::SumOfSquares,
          .transpose = &s::Transpose,
          .add_transposed = &s::AddTransposed,
          .staircase_product = &s::StaircaseProduct,
          .gelu_forward = &s::GeluForward,
          .layer_norm_row = &s::LayerNormRow,
          .layer_norm_backward_row = &s::LayerNormBackwardRow,
          .adamw_update = &s::AdamwUpdate,
          .widen_bf16 = &s::WidenBf16,
          .narrow_bf16 = &s::NarrowBf16,
          .split_bf16 = &s::SplitBf16,
          .widen_f16 = &s::WidenF16,
          .narrow_f16 = &s::NarrowF16};
}

}  // namespace relpos_test::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace relpos_test {

HWY_EXPORT(TargetOps);

namespace {

using relpos::simd::active_target;
using relpos::simd::limit_targets;

// The Highway target names each RELPOS_SIMD name may run as.
bool runs_as(const std::string& name, const std::string& target) {
  if (name == "avx512") return target.rfind("AVX3", 0) == 0;
  if (name == "avx2") return target == "AVX2";
  if (name == "sse4") return target == "SSE4" || target == "SSSE3";
  return target == "EMU128" || target == "SCALAR";
}

std::vector<float> random_row(int64_t n, float lo, float hi, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> u(lo, hi);
  std::vector<float> x(static_cast<size_t>(n));
  for (float& v : x) v = u(rng);
  return x;
}

// The row operations of the attention epilogues against their scalar
// formulas: element-wise ones bit for bit, the row sum within rounding.
template <bool kFused>
void check_row_ops(const SimdOps& ops, int64_t n) {
  const std::vector<float> x = random_row(n, -3.0f, 3.0f, uint64_t(n) + 300);
  const std::vector<float> y0 = random_row(n, -3.0f, 3.0f, uint64_t(n) + 400);
  const std::vector<float> c = random_row(n, -1.0f, 1.0f, uint64_t(n) + 500);
  const std::vector<float> sn = random_row(n, -1.0f, 1.0f, uint64_t(n) + 600);
  std::vector<float> y = y0, z = y0, a = x, b = y0, mirrored = y0;
  ops.add_scaled(y.data(), x.data(), 0.7f, n);
  ops.add_scaled_reversed(mirrored.data(), x.data(), -0.3f, n);
  ops.add_constant(z.data(), -1.25f, n);
  ops.rotate_pairs(a.data(), b.data(), c.data(), sn.data(), -1.0f, n);
  double exact_sum = 0;
  for (int64_t i = 0; i < n; ++i) {
    EXPECT_EQ(y[i], relpos::multiply_add<kFused>(0.7f, x[i], y0[i])) << i;
    EXPECT_EQ(mirrored[i], relpos::multiply_add<kFused>(-0.3f, x[n - 1 - i], y0[i])) << i;
    EXPECT_EQ(z[i], y0[i] + -1.25f) << i;
    const float s = -1.0f * sn[i];
    EXPECT_EQ(a[i], x[i] * c[i] - y0[i] * s) << i;
    EXPECT_EQ(b[i], y0[i] * c[i] + x[i] * s) << i;
    exact_sum += double(x[i]);
  }
  EXPECT_NEAR(ops.sum_of(x.data(), n), exact_sum, 1e-6 * double(n));
  ops.scale(z.data(), 0.5f, n);
  ops.softmax_grad(x.data(), y.data(), 0.3f, n);
  for (int64_t i = 0; i < n; ++i) {
    EXPECT_EQ(z[i], (y0[i] + -1.25f) * 0.5f) << i;
    EXPECT_EQ(y[i], x[i] * (relpos::multiply_add<kFused>(0.7f, x[i], y0[i]) - 0.3f)) << i;
  }
}

// Column sums (the bias gradients) bit for bit against adding row after row,
// from float32 rows and from bfloat16 rows; the sum of squares (the gradient
// norm) against double arithmetic.
void check_reductions(const SimdOps& ops, int64_t n) {
  const int64_t rows = 5;
  const std::vector<float> x = random_row(rows * n, -3.0f, 3.0f, uint64_t(n) + 1500);
  const std::vector<float> start = random_row(n, -1.0f, 1.0f, uint64_t(n) + 1600);
  std::vector<uint16_t> narrow(static_cast<size_t>(rows * n));
  ops.narrow_bf16(x.data(), narrow.data(), rows * n);
  std::vector<float> sums = start, sums_bf16 = start, expected = start, expected_bf16 = start;
  ops.add_column_sums(x.data(), rows, n, sums.data());
  ops.add_column_sums_bf16(narrow.data(), rows, n, sums_bf16.data());
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < n; ++c) {
      expected[c] += x[r * n + c];
      expected_bf16[c] += relpos::half_bits::float_from_bf16(narrow[r * n + c]);
    }
  EXPECT_EQ(sums, expected);
  EXPECT_EQ(sums_bf16, expected_bf16);
  double squares = 0;
  for (float v : x) squares += double(v) * v;
  EXPECT_NEAR(ops.sum_of_squares(x.data(), rows * n), squares, 1e-14 * squares);
}

// The AdamW update against its scalar expression, bit for bit on every target
// (no fused multiply-add: the trainer's results must not depend on the CPU).
void check_adamw(const SimdOps& ops, int64_t n) {
  const std::vector<float> g = random_row(n, -2.0f, 2.0f, uint64_t(n) + 700);
  const std::vector<float> p0 = random_row(n, -1.0f, 1.0f, uint64_t(n) + 800);
  const std::vector<float> m0 = random_row(n, -0.1f, 0.1f, uint64_t(n) + 900);
  std::vector<float> v0 = random_row(n, 0.0f, 0.01f, uint64_t(n) + 1000);
  v0[0] = 0.0f;  // a parameter that never had a gradient
  const relpos::simd::AdamwStep s{0.9f, 0.99f, 3e-3f, 1.7f, 1e-8f, 0.9997f, 0.37f};
  std::vector<float> p = p0, m = m0, v = v0;
  ops.adamw_update(p.data(), g.data(), m.data(), v.data(), n, s);
  for (int64_t i = 0; i < n; ++i) {
    const float gi = g[i] * s.gradient_scale;
    const float mi = s.beta1 * m0[i] + (1 - s.beta1) * gi;
    const float vi = s.beta2 * v0[i] + (1 - s.beta2) * gi * gi;
    EXPECT_EQ(m[i], mi) << i;
    EXPECT_EQ(v[i], vi) << i;
    EXPECT_EQ(p[i], p0[i] * s.decay - s.step_size * mi / (std::sqrt(vi) * s.v_correction + s.eps)) << i;
  }
}

// One LayerNorm row forward and backward against the formulas in double
// (sums over lanes: within float32 rounding, not bit for bit).
void check_layer_norm(const SimdOps& ops, int64_t n) {
  const std::vector<float> x = random_row(n, 1.0f, 5.0f, uint64_t(n) + 1100);  // an offset the mean must remove
  const std::vector<float> gamma = random_row(n, 0.5f, 1.5f, uint64_t(n) + 1200);
  const std::vector<float> beta = random_row(n, -1.0f, 1.0f, uint64_t(n) + 1300);
  const std::vector<float> dout = random_row(n, -1.0f, 1.0f, uint64_t(n) + 1400);
  const float eps = 1e-5f;
  std::vector<float> out(static_cast<size_t>(n)), dx(static_cast<size_t>(n), 0.25f);
  float mean = 0, rstd = 0;
  ops.layer_norm_row(x.data(), gamma.data(), beta.data(), n, eps, out.data(), &mean, &rstd);
  double mu = 0, var = 0;
  for (float v : x) mu += v / double(n);
  for (float v : x) var += (v - mu) * (v - mu) / double(n);
  const double s = 1 / std::sqrt(var + eps);
  EXPECT_NEAR(mean, mu, 1e-6 * std::abs(mu));
  // float32 sums: the variance of values near 3 keeps the rounding of a float32 mean
  EXPECT_NEAR(rstd, s, 2e-5 * s);
  std::vector<double> xhat(static_cast<size_t>(n));
  double mean_g = 0, mean_gx = 0;
  for (int64_t i = 0; i < n; ++i) {
    xhat[i] = (x[i] - mu) * s;
    EXPECT_NEAR(out[i], xhat[i] * gamma[i] + beta[i], 2e-5 * (1 + std::abs(xhat[i]))) << i;
    mean_g += double(dout[i]) * gamma[i] / double(n);
    mean_gx += double(dout[i]) * gamma[i] * xhat[i] / double(n);
  }
  ops.layer_norm_backward_row(dout.data(), x.data(), gamma.data(), mean, rstd, n, dx.data());
  for (int64_t i = 0; i < n; ++i) {
    const double expected = 0.25 + s * (double(dout[i]) * gamma[i] - mean_g - xhat[i] * mean_gx);
    EXPECT_NEAR(dx[i], expected, 2e-5 * s) << i;  // added to the 0.25 there
  }
}

// The staircase product against a double-precision product of the same
// operands: A with zeros where a depth cut lets the kernel skip, a column cut
// checked on the entries it promises (the others: the product or zero), and
// c's padding past n untouched. The bound is recursive summation's,
// k * eps * (sum |alpha a b| + |beta c|), twice over.
void check_staircase_product(const SimdOps& ops, int64_t m, int64_t n, int64_t k, relpos::simd::Staircase cut,
                             int64_t delta, bool transposed_a, float beta) {
  using relpos::simd::Staircase;
  SCOPED_TRACE("m n k = " + std::to_string(m) + " " + std::to_string(n) + " " + std::to_string(k) + ", cut " +
               std::to_string(int(cut)) + ", delta " + std::to_string(delta) + (transposed_a ? ", A^T" : "") +
               ", beta " + std::to_string(beta));
  const uint64_t seed = uint64_t(m * 1000003 + n * 1009 + k * 17 + delta + 64);
  std::vector<float> a = random_row(m * k, -1.0f, 1.0f, seed), b = random_row(k * (n + 2), -1.0f, 1.0f, seed + 1);
  const int64_t ldb = n + 2, ldc = n + 3, a_row = transposed_a ? 1 : k, a_col = transposed_a ? m : 1;
  for (int64_t r = 0; r < m; ++r)
    for (int64_t p = 0; p < k; ++p)
      if ((cut == Staircase::leading_depth && p > r + delta) || (cut == Staircase::trailing_depth && p < r - delta))
        a[r * a_row + p * a_col] = 0.0f;
  const std::vector<float> c0 = random_row(m * ldc, -1.0f, 1.0f, seed + 2);
  std::vector<float> c = c0;
  const float alpha = 0.75f;
  ops.staircase_product(
      {m, n, k, alpha, beta, a.data(), a_row, a_col, b.data(), ldb, c.data(), ldc, cut, delta});
  for (int64_t r = 0; r < m; ++r) {
    for (int64_t x = 0; x < n; ++x) {
      double exact = beta * double(c0[r * ldc + x]), size = std::abs(exact);
      for (int64_t p = 0; p < k; ++p) {
        const double term = double(alpha) * a[r * a_row + p * a_col] * b[p * ldb + x];
        exact += term, size += std::abs(term);
      }
      const float got = c[r * ldc + x];
      const double bound = 2.0 * double(k + 1) * std::numeric_limits<float>::epsilon() * size;
      if (cut == Staircase::columns && x > r + delta) {
        EXPECT_TRUE(got == 0.0f || std::abs(got - exact) <= bound) << r << ", " << x << ": " << got;
        continue;
      }
      EXPECT_LE(std::abs(got - exact), bound) << r << ", " << x << ": " << got << " vs " << exact;
    }
    for (int64_t x = n; x < ldc; ++x) EXPECT_EQ(c[r * ldc + x], c0[r * ldc + x]) << "padding " << r << ", " << x;
  }
}

void check_transposes(const SimdOps& ops) {
  // Shapes of whole 8 x 8 and 4 x 4 blocks, of blocks and edges, of edges only
  // (8-row bands narrower than a block among them).
  for (const auto& [rows, cols] : {std::pair<int64_t, int64_t>{1, 1}, {3, 5}, {4, 4}, {8, 8}, {64, 32}, {13, 97},
                                   {33, 8}, {8, 13}, {21, 19}, {8, 3}, {17, 7}}) {
    const int64_t ldx = cols + 5;
    const std::vector<float> x = random_row(rows * ldx, -1.0f, 1.0f, uint64_t(rows * 131 + cols));
    std::vector<float> out(rows * cols, -7.0f);
    ops.transpose(x.data(), rows, cols, ldx, out.data(), rows);
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = 0; c < cols; ++c) EXPECT_EQ(out[c * rows + r], x[r * ldx + c]) << rows << "x" << cols;
    // x's rows taken in reverse (a negative stride).
    std::vector<float> reversed(rows * cols, -7.0f);
    ops.transpose(x.data() + (rows - 1) * ldx, rows, cols, -ldx, reversed.data(), rows);
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = 0; c < cols; ++c)
        EXPECT_EQ(reversed[c * rows + r], x[(rows - 1 - r) * ldx + c]) << "reversed " << rows << "x" << cols;
    // Into the columns of a wider output (row stride rows + 5), its other entries kept.
    std::vector<float> wide(cols * (rows + 5), -7.0f);
    ops.transpose(x.data(), rows, cols, ldx, wide.data(), rows + 5);
    for (int64_t c = 0; c < cols; ++c)
      for (int64_t r = 0; r < rows + 5; ++r)
        EXPECT_EQ(wide[c * (rows + 5) + r], r < rows ? x[r * ldx + c] : -7.0f) << "wide " << rows << "x" << cols;
    // Added, x's rows taken and the output's rows put in reverse (negative strides), the output's padding kept.
    const int64_t ldo = rows + 3;
    const std::vector<float> before = random_row(cols * ldo, -1.0f, 1.0f, uint64_t(rows * 7 + cols));
    std::vector<float> sum = before;
    ops.add_transposed(x.data() + (rows - 1) * ldx, rows, cols, -ldx, sum.data() + (cols - 1) * ldo, -ldo);
    for (int64_t c = 0; c < cols; ++c)
      for (int64_t r = 0; r < ldo; ++r) {
        const float added = r < rows ? x[(rows - 1 - r) * ldx + c] : 0.0f;
        EXPECT_EQ(sum[(cols - 1 - c) * ldo + r], r < rows ? before[(cols - 1 - c) * ldo + r] + added
                                                          : before[(cols - 1 - c) * ldo + r])
            << "add_transposed " << rows << "x" << cols << " at " << r << ", " << c;
      }
  }
}

void check_staircase_products(const SimdOps& ops) {
  using relpos::simd::Staircase;
  check_transposes(ops);
  const int64_t shapes[][3] = {{1, 1, 1}, {5, 7, 3}, {6, 16, 9}, {13, 97, 128}, {64, 64, 32}, {64, 32, 64},
                               {33, 17, 40}, {128, 128, 128}, {7, 70, 5}};
  for (const auto& s : shapes)
    for (Staircase cut : {Staircase::none, Staircase::columns, Staircase::leading_depth, Staircase::trailing_depth})
      for (int64_t delta : {int64_t(-5), int64_t(0), int64_t(3), int64_t(200)}) {
        check_staircase_product(ops, s[0], s[1], s[2], cut, delta, false, 0.0f);
        check_staircase_product(ops, s[0], s[1], s[2], cut, delta, true, cut == Staircase::columns ? 0.0f : 1.0f);
      }
}

// NaN and infinite lanes, at every position of rows around the vector
// widths: the exponentials keep a NaN (a NaN logit must not become a
// probability of 0: the clamp to [-87, 88] once turned it into e^-87) and
// give 0 at -inf and infinity at +inf; a row's maximum is NaN when any of
// its entries is; the softmax gradient is exactly 0 where p is 0, whatever
// dP and D hold; every element-wise operation keeps a NaN in its lane and
// reductions over it are NaN.
void check_nonfinite_lanes(const SimdOps& ops) {
  const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
  for (int64_t n : {1, 5, 8, 16, 17, 33}) {
    for (int64_t at = 0; at < n; ++at) {
      SCOPED_TRACE("n = " + std::to_string(n) + ", lane " + std::to_string(at));
      std::vector<float> x = random_row(n, -5.0f, 0.0f, uint64_t(n * 100 + at)), out(x.size(), 0.0f);
      for (float special : {nan, inf, -inf}) {
        x[at] = special;
        const float sum = ops.exp_shifted_sum(x.data(), 0.5f, out.data(), n);
        if (std::isnan(special)) {
          EXPECT_TRUE(std::isnan(out[at]) && std::isnan(sum));
          EXPECT_TRUE(std::isnan(ops.max_of(x.data(), n, -inf)));
          EXPECT_TRUE(std::isnan(ops.max_of(x.data(), n, 1e30f)));  // a NaN beside a larger init
        } else {
          float largest = -inf;
          for (float v : x) largest = v > largest ? v : largest;
          EXPECT_EQ(out[at], special > 0 ? inf : 0.0f);
          EXPECT_TRUE(special > 0 ? sum == inf : std::isfinite(sum));
          EXPECT_EQ(ops.max_of(x.data(), n, -inf), largest);
        }
        EXPECT_FALSE(ops.all_finite(x.data(), 1, n, n));
        for (int64_t i = 0; i < n; ++i) EXPECT_TRUE(i == at || (std::isfinite(out[i]) && out[i] > 0)) << i;
        EXPECT_EQ(std::isnan(relpos::exp_approx<true>(special)), std::isnan(special));
        EXPECT_EQ(relpos::exp_approx<false>(special) == inf, special == inf);

        // element-wise operations: the NaN (or infinity) stays in its lane
        std::vector<float> y = random_row(n, -1.0f, 1.0f, uint64_t(n + at)), w = y, gy(x.size()), slope(x.size());
        std::vector<float> scaled = x, shifted = x;
        ops.add_scaled(y.data(), x.data(), 0.5f, n);
        ops.scale(scaled.data(), 2.0f, n);
        ops.add_constant(shifted.data(), 1.0f, n);
        ops.multiply(x.data(), w.data(), w.data(), n);
        ops.gelu_forward(x.data(), gy.data(), slope.data(), n);
        for (const std::vector<float>* lane : {&y, &scaled, &shifted, &w}) {
          EXPECT_EQ(std::isnan((*lane)[at]), std::isnan(special));
          EXPECT_FALSE(std::isfinite((*lane)[at]));
        }
        if (std::isnan(special)) {
          EXPECT_TRUE(std::isnan(gy[at]) && std::isnan(slope[at]));
        } else if (special == inf) {
          EXPECT_EQ(gy[at], inf);  // gelu(x) = x Phi(x); at -inf the formula's inf x 0 is NaN
        }
        EXPECT_EQ(std::isnan(ops.sum_of(x.data(), n)), std::isnan(special));
      }
      x[at] = 1.0f;
      EXPECT_TRUE(ops.all_finite(x.data(), 1, n, n));
      x[at] = nan;  // as one of several rows, and outside the rows read
      std::vector<float> rows(3 * (n + 2), 1.0f);
      rows[(n + 2) + at] = nan;
      EXPECT_FALSE(ops.all_finite(rows.data(), 3, n, n + 2));
      EXPECT_TRUE(ops.all_finite(rows.data() + 2 * (n + 2), 1, n, n + 2));
      rows[(n + 2) + at] = 1.0f, rows[n + 1] = nan;  // padding between rows
      EXPECT_TRUE(ops.all_finite(rows.data(), 3, n, n + 2));
      x[at] = 1.0f;

      // the softmax gradient: p = 0 gives 0 whatever dP (ds) and D are; p > 0 keeps a NaN
      std::vector<float> p = random_row(n, 0.1f, 1.0f, uint64_t(n + 7 * at));
      std::vector<float> ds = random_row(n, -1.0f, 1.0f, uint64_t(at));
      p[at] = 0.0f;
      ds[at] = inf;
      ops.softmax_grad(p.data(), ds.data(), 0.25f, n);
      EXPECT_EQ(ds[at], 0.0f);
      std::vector<float> ds_nan_d = ds;
      ops.softmax_grad(p.data(), ds_nan_d.data(), nan, n);
      for (int64_t i = 0; i < n; ++i) EXPECT_EQ(std::isnan(ds_nan_d[i]), i != at) << i;
    }
  }
  std::vector<float> row = {-1.0f, -2.0f, -3.0f};
  std::vector<float> out(3);
  EXPECT_TRUE(std::isnan(ops.exp_shifted_sum(row.data(), nan, out.data(), 3)));  // a NaN shift (row maximum)
  EXPECT_TRUE(std::isnan(out[0]) && std::isnan(out[2]));
  EXPECT_TRUE(std::isnan(ops.max_of(row.data(), 3, nan)));
}

template <bool kFused>
void check_current_target(const SimdOps& ops) {
  check_nonfinite_lanes(ops);
  // Lengths around the vector widths (4, 8, 16 lanes) and a softmax row.
  for (int64_t n : {1, 3, 7, 8, 9, 15, 16, 17, 33, 128, 129}) {
    SCOPED_TRACE("n = " + std::to_string(n));
    std::vector<float> x = random_row(n, -95.0f, 12.0f, uint64_t(n));
    if (n > 2) x[1] = -std::numeric_limits<float>::infinity();  // a masked logit
    const float shift = 3.5f;
    std::vector<float> out(static_cast<size_t>(n));
    const float sum = ops.exp_shifted_sum(x.data(), shift, out.data(), n);
    double exact_sum = 0;
    for (int64_t i = 0; i < n; ++i) {
      const bool cut = x[i] - shift < relpos::simd::kSoftmaxCutoff;  // terms below e^-44 are 0
      const double exact = cut ? 0.0 : std::exp(double(x[i]) - shift);
      exact_sum += out[i];
      // the scalar arithmetic, bit for bit
      EXPECT_EQ(out[i], cut ? 0.0f : relpos::exp_approx<kFused>(x[i] - shift)) << i;
      // about 2 ulp near 0; the range reduction's error grows with |x| to ~4e-6 near -87
      EXPECT_NEAR(out[i], exact, (x[i] - shift > -10 ? 3e-7 : 5e-6) * exact) << i;
    }
    EXPECT_NEAR(sum, exact_sum, 1e-6 * exact_sum);
    float biggest = -1e30f;
    for (float v : x) biggest = v > biggest ? v : biggest;
    EXPECT_EQ(ops.max_of(x.data(), n, -1e30f), biggest);
    EXPECT_EQ(ops.max_of(x.data(), n, 1e30f), 1e30f);

    check_row_ops<kFused>(ops, n);
    check_adamw(ops, n);
    check_layer_norm(ops, n);
    check_reductions(ops, n);

    const std::vector<float> g = random_row(n, -9.0f, 9.0f, uint64_t(n) + 100);
    const std::vector<float> dy = random_row(n, -1.0f, 1.0f, uint64_t(n) + 200);
    std::vector<float> y(static_cast<size_t>(n)), slope(static_cast<size_t>(n)), dx(static_cast<size_t>(n), 0.25f);
    std::vector<float> y_alone(static_cast<size_t>(n)), slope_in_place = g;
    ops.gelu_forward(g.data(), y.data(), slope.data(), n);
    ops.gelu_forward(g.data(), y_alone.data(), nullptr, n);
    ops.multiply(dy.data(), slope.data(), dx.data(), n);
    ops.gelu_forward(slope_in_place.data(), y_alone.data(), slope_in_place.data(), n);
    EXPECT_EQ(slope_in_place, slope);  // written over its input
    EXPECT_EQ(y_alone, y);
    for (int64_t i = 0; i < n; ++i) {
      float cdf = 0, pdf = 0;
      relpos::nn::normal_cdf_pdf<kFused>(g[i], cdf, pdf);
      EXPECT_EQ(y[i], g[i] * cdf) << i;
      EXPECT_EQ(dx[i], dy[i] * (cdf + g[i] * pdf)) << i;  // written over the 0.25 there
      double cdf_exact = 0, pdf_exact = 0;
      relpos::nn::normal_cdf_pdf(double(g[i]), cdf_exact, pdf_exact);
      EXPECT_NEAR(y[i], g[i] * cdf_exact, 2e-6 * (1 + std::abs(g[i]))) << i;
      EXPECT_NEAR(dx[i], dy[i] * (cdf_exact + g[i] * pdf_exact), 4e-6 * (1 + std::abs(g[i]))) << i;
    }
  }
}

// The half conversions against relpos/half.hpp's scalar ones: every bit
// pattern widened, and floats narrowed (every value of the format, the
// midpoints between neighbours, random values over the whole exponent range,
// infinities, NaN), bit for bit; a NaN need only stay a NaN.
template <class H>
void check_conversions(void (*widen)(const uint16_t*, float*, int64_t),
                       void (*narrow)(const float*, uint16_t*, int64_t)) {
  std::vector<uint16_t> patterns(65536);
  for (size_t b = 0; b < patterns.size(); ++b) patterns[b] = uint16_t(b);
  std::vector<float> wide(patterns.size());
  widen(patterns.data(), wide.data(), int64_t(patterns.size()));
  int bad = 0;
  for (size_t b = 0; b < patterns.size(); ++b) {
    H h;
    h.bits = patterns[b];
    const float expected = float(h);
    const bool ok = std::isnan(expected) ? std::isnan(wide[b]) : std::memcmp(&wide[b], &expected, 4) == 0;
    if (!ok && bad++ < 3) ADD_FAILURE() << "widen " << b << ": " << wide[b] << ", expected " << expected;
  }
  std::vector<float> x;
  for (size_t b = 0; b + 1 < wide.size(); ++b)
    if (std::isfinite(wide[b]) && std::isfinite(wide[b + 1]) && (b & 0x7fff) != 0x7fff)
      x.push_back(wide[b]), x.push_back(float((double(wide[b]) + double(wide[b + 1])) / 2));
  std::mt19937_64 rng(11);
  std::uniform_real_distribution<double> exponent(-140, 128);
  for (int n = 0; n < 100000; ++n) x.push_back(float((n % 2 ? -1 : 1) * std::exp2(exponent(rng))));
  for (float v : {INFINITY, -INFINITY, NAN, -NAN, 65504.0f, 65519.99f, 65520.0f, 3.4e38f, 1e-45f, 0.0f, -0.0f})
    x.push_back(v);
  x.push_back(1.0f);  // an odd length: the tail runs lane by lane
  std::vector<uint16_t> narrow_bits(x.size());
  narrow(x.data(), narrow_bits.data(), int64_t(x.size()));
  for (size_t i = 0; i < x.size(); ++i) {
    H expected(x[i]), got;
    got.bits = narrow_bits[i];
    const bool ok = std::isnan(x[i]) ? std::isnan(float(got)) : got.bits == expected.bits;
    if (!ok && bad++ < 6) ADD_FAILURE() << "narrow " << x[i] << ": bits " << got.bits << ", expected " << expected.bits;
  }
}

// split_bf16 bit for bit against the scalar rule, each part the top 16 bits
// of the rest of x after the parts before it (the rests computed in double,
// where they are exact); and the three parts summed in double give x back
// exactly (|x| at least 2^-100, where no rest is subnormal).
void check_split_bf16(const SimdOps& ops) {
  std::mt19937_64 rng(17);
  std::uniform_real_distribution<double> exponent(-100, 100), mantissa(1, 2);
  std::vector<float> x;
  for (int n = 0; n < 20001; ++n) x.push_back(float((n % 2 ? -1 : 1) * mantissa(rng) * std::exp2(exponent(rng))));
  for (float v : {0.0f, -0.0f, 1.0f, 1.00390625f, 1.0f + 0x1p-9f + 0x1p-17f, 1.0f - 0x1p-24f, 3.4e38f}) x.push_back(v);
  const int64_t n = int64_t(x.size());  // odd: the tail runs lane by lane
  std::vector<uint16_t> hi(x.size()), mid(x.size()), lo(x.size());
  ops.split_bf16(x.data(), hi.data(), mid.data(), lo.data(), n);
  int bad = 0;
  for (int64_t i = 0; i < n; ++i) {
    double rest = x[i];
    double sum = 0;
    for (const std::vector<uint16_t>* part : {&hi, &mid, &lo}) {
      const uint16_t expected = uint16_t(std::bit_cast<uint32_t>(float(rest)) >> 16);
      relpos::bfloat16 got;
      got.bits = (*part)[i];
      if (got.bits != expected && bad++ < 6)
        ADD_FAILURE() << "split " << x[i] << ": bits " << got.bits << ", expected " << expected;
      rest -= double(float(got));
      sum += double(float(got));
    }
    if (sum != double(x[i]) && bad++ < 6) ADD_FAILURE() << "split " << x[i] << " sums to " << sum;
  }
}

// Every target compiled here that this CPU runs, each by its own functions:
// a hwy::ChosenTarget of this test's own picks the target's entry of the
// table, as the library's dispatch picks its chosen target's.
std::vector<SimdOps> runnable_targets() {
  std::vector<SimdOps> out;
  for (int64_t targets = hwy::SupportedTargets() & HWY_TARGETS; targets != 0; targets &= targets - 1) {
    hwy::ChosenTarget one;
    one.Update(targets & -targets);
    out.push_back(relpos::simd::detail::table_entry(HWY_DISPATCH_TABLE(TargetOps), one)());
  }
  return out;
}

// Every check of this file on one table of functions.
void check_all(const SimdOps& ops) {
  check_conversions<relpos::bfloat16>(ops.widen_bf16, ops.narrow_bf16);
  check_conversions<relpos::float16>(ops.widen_f16, ops.narrow_f16);
  check_split_bf16(ops);
  check_staircase_products(ops);
  ops.fused ? check_current_target<true>(ops) : check_current_target<false>(ops);
}

TEST(Simd, EveryTargetThisMachineRunsAgreesWithTheFormulas) {
  const std::string dispatched = active_target();
  std::vector<std::string> names;
  for (const SimdOps& ops : runnable_targets()) {
    SCOPED_TRACE(ops.target);
    names.push_back(ops.target);
    check_all(ops);
  }
  const auto checked = [&](const char* name) { return std::ranges::count(names, name) == 1; };
  EXPECT_TRUE(!(HWY_TARGETS & HWY_SSE4) || checked("SSE4")) << "every x86-64 runs SSE4";
  EXPECT_GE(names.size(), size_t((HWY_TARGETS & (HWY_TARGETS - 1)) ? 2 : 1)) << testing::PrintToString(names);
  EXPECT_TRUE(checked(dispatched.c_str())) << "the library dispatches to " << dispatched << ", which was not checked";
  EXPECT_EQ(active_target(), dispatched) << "checking the targets changed the library's dispatch";
}

// The dispatched wrapper refuses what no target's product may be asked.
TEST(Simd, StaircaseProductRefusesWhatItCannotCompute) {
  using relpos::simd::Staircase;
  EXPECT_THROW(relpos::simd::staircase_product({1, 1, relpos::simd::kStaircaseMaxSize + 1}), std::logic_error);
  EXPECT_THROW(relpos::simd::staircase_product({1, 1, 1, 1.0f, 1.0f, nullptr, 0, 0, nullptr, 0, nullptr, 0,
                                                Staircase::columns, 0}),
               std::logic_error);
}

// The library's own functions (simd.hpp's wrappers, through the families'
// dispatch tables), as one table; multiply-adds as the target they dispatch
// to now rounds them.
SimdOps dispatched_ops() {
  namespace s = relpos::simd;
  bool fused = false;
  for (const SimdOps& ops : runnable_targets())
    if (active_target() == ops.target) fused = ops.fused;
  return {.target = "dispatched",
          .fused = fused,
          .exp_shifted_sum = &s::exp_shifted_sum,
          .max_of = &s::max_of,
          .all_finite = &s::all_finite,
          .softmax_grad = &s::softmax_grad,
          .add_scaled = &s::add_scaled,
          .add_scaled_reversed = &s::add_scaled_reversed,
          .add_constant = &s::add_constant,
          .scale = &s::scale,
          .sum_of = &s::sum_of,
          .multiply = &s::multiply,
          .rotate_pairs = &s::rotate_pairs,
          .add_column_sums = &s::add_column_sums,
          .add_column_sums_bf16 = &s::add_column_sums_bf16,
          .sum_of_squares = &s::sum_of_squares,
          .transpose = &s::transpose,
          .add_transposed = &s::add_transposed,
          .staircase_product = &s::staircase_product,
          .gelu_forward = &s::gelu_forward,
          .layer_norm_row = &s::layer_norm_row,
          .layer_norm_backward_row = &s::layer_norm_backward_row,
          .adamw_update = &s::adamw_update,
          .widen_bf16 = &s::widen_bf16,
          .narrow_bf16 = &s::narrow_bf16,
          .split_bf16 = &s::split_bf16,
          .widen_f16 = &s::widen_f16,
          .narrow_f16 = &s::narrow_f16};
}

// RELPOS_SIMD's limit (limit_targets), the one test here that changes the
// library's dispatch (and sets it back to RELPOS_SIMD's after): at the CPU's
// best and below every x86-64 CPU, the library's functions pass every check as
// the target they run on (a wrapper dispatching past the limit, or to another
// function, fails them); asking what the CPU supports keeps the limit.
TEST(Simd, TheLibrarysFunctionsDispatchWithinTheLimit) {
  for (const std::string name : {"", "sse4", "scalar"}) {
    limit_targets(name);
    SCOPED_TRACE("limit '" + name + "', runs as " + active_target());
    EXPECT_TRUE(name.empty() || runs_as(name, active_target()));
    check_all(dispatched_ops());
    // Asking what the CPU supports (relpos info does, after a dispatch) keeps the limit.
    for (const std::string& target : relpos::simd::supported_targets())
      EXPECT_TRUE(name != "scalar" || runs_as("scalar", target)) << name << " supports " << target;
    EXPECT_TRUE(name.empty() || runs_as(name, active_target())) << "after supported_targets";
  }
  const char* environment = std::getenv("RELPOS_SIMD");
  limit_targets(environment ? environment : "");
}

TEST(Simd, UnknownTargetNamesAreRefused) {
  const std::string before = active_target();
  EXPECT_THROW(limit_targets("avx1024"), std::invalid_argument);
  EXPECT_EQ(active_target(), before) << "a refused name changed the dispatch";
  EXPECT_FALSE(active_target().empty());
}

}  // namespace
}  // namespace relpos_test
#endif  // HWY_ONCE
