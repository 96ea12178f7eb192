// The bfloat16 GEMMs against a double-precision sum of the same products, for
// every transposition, padded leading dimensions, alpha and beta. Where the CPU
// has AVX512-BF16 this runs oneDNN's bfloat16 matmul; the AVX2 stage of
// scripts/test.sh (ONEDNN_MAX_CPU_ISA=AVX2) runs the widening path.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "relpos/gemm.hpp"

namespace {

using relpos::bfloat16;
using relpos::Trans;

struct Case {
  Trans ta, tb;
  int64_t m, n, k;
  float alpha, beta;
};

std::string name(const Case& c) {
  return std::string(c.ta == Trans::yes ? "T" : "N") + (c.tb == Trans::yes ? "T" : "N") + " " +
         std::to_string(c.m) + "x" + std::to_string(c.n) + "x" + std::to_string(c.k) + " alpha " +
         std::to_string(c.alpha) + " beta " + std::to_string(c.beta);
}

// A stored matrix op(X) (rows x cols) with `pad` unused columns per stored row.
struct Operand {
  int64_t stored_rows, stored_cols, ld;
  std::vector<bfloat16> values;
  Operand(Trans t, int64_t rows, int64_t cols, int64_t pad, std::mt19937& rng)
      : stored_rows(t == Trans::no ? rows : cols), stored_cols(t == Trans::no ? cols : rows), ld(stored_cols + pad) {
    std::normal_distribution<float> normal;
    values.resize(stored_rows * ld);
    for (auto& v : values) v = bfloat16(normal(rng));
  }
  // op(X)(i, p)
  double at(Trans t, int64_t i, int64_t p) const { return float(values[t == Trans::no ? i * ld + p : p * ld + i]); }
  std::vector<float> widened() const { return std::vector<float>(values.begin(), values.end()); }
};

void expect_matches_the_exact_sum(const Case& c) {
  SCOPED_TRACE(name(c));
  std::mt19937 rng(static_cast<unsigned>(c.m * 131 + c.n * 17 + c.k));
  const Operand a(c.ta, c.m, c.k, 3, rng), b(c.tb, c.k, c.n, 5, rng);
  const int64_t ldc = c.n + 2;
  std::vector<float> c0(c.m * ldc);
  std::normal_distribution<float> normal;
  for (auto& v : c0) v = normal(rng);
  std::vector<float> native = c0, valued = c0;
  relpos::gemm_bf16(c.ta, c.tb, c.m, c.n, c.k, c.alpha, a.values.data(), a.ld, b.values.data(), b.ld, c.beta,
                    native.data(), ldc);
  const std::vector<float> wa = a.widened(), wb = b.widened();
  relpos::gemm_bf16_valued(c.ta, c.tb, c.m, c.n, c.k, c.alpha, wa.data(), a.ld, wb.data(), b.ld, c.beta, valued.data(),
                           ldc);
  for (int64_t i = 0; i < c.m; ++i) {
    for (int64_t j = 0; j < c.n; ++j) {
      double exact = 0, magnitude = 0;
      for (int64_t p = 0; p < c.k; ++p) {
        const double product = a.at(c.ta, i, p) * b.at(c.tb, p, j);
        exact += product;
        magnitude += std::abs(product);
      }
      const double old = c0[i * ldc + j];
      exact = c.alpha * exact + c.beta * old;
      // Any order of float32 sums of exact products: at most (k + 2) roundings
      // of the running magnitude (the last two: alpha, then beta C).
      const double bound = (c.k + 2) * std::ldexp(1.0, -24) * (std::abs(c.alpha) * magnitude + std::abs(c.beta * old));
      ASSERT_NEAR(native[i * ldc + j], exact, bound) << "gemm_bf16 at " << i << ", " << j;
      ASSERT_NEAR(valued[i * ldc + j], exact, bound) << "gemm_bf16_valued at " << i << ", " << j;
    }
    for (int64_t j = c.n; j < ldc; ++j) {  // the padding of C is never written
      ASSERT_EQ(native[i * ldc + j], c0[i * ldc + j]);
      ASSERT_EQ(valued[i * ldc + j], c0[i * ldc + j]);
    }
  }
}

TEST(GemmBf16, EveryTranspositionAndShapeMatchesTheExactSum) {
  for (Trans ta : {Trans::no, Trans::yes})
    for (Trans tb : {Trans::no, Trans::yes})
      for (auto [m, n, k] : {std::tuple<int64_t, int64_t, int64_t>{1, 1, 1}, {7, 13, 5}, {64, 97, 130},
                             {300, 257, 129}, {1, 384, 128}})
        for (auto [alpha, beta] : {std::pair{1.f, 0.f}, {1.f, 1.f}, {0.5f, -0.25f}})
          expect_matches_the_exact_sum({ta, tb, m, n, k, alpha, beta});
}

TEST(GemmBf16, AnEmptySumScalesC) {
  expect_matches_the_exact_sum({Trans::no, Trans::no, 4, 6, 0, 1.f, 0.5f});
  expect_matches_the_exact_sum({Trans::yes, Trans::no, 4, 6, 0, 1.f, 0.f});
}

// Repeated calls of one shape reuse a built primitive and give the same bits.
TEST(GemmBf16, RepeatedCallsGiveTheSameBits) {
  std::mt19937 rng(7);
  const Operand a(Trans::no, 96, 64, 0, rng), b(Trans::yes, 64, 80, 0, rng);
  std::vector<float> first(96 * 80), again(96 * 80);
  relpos::gemm_bf16(Trans::no, Trans::yes, 96, 80, 64, 1.f, a.values.data(), a.ld, b.values.data(), b.ld, 0.f,
                    first.data(), 80);
  relpos::gemm_bf16(Trans::no, Trans::yes, 96, 80, 64, 1.f, a.values.data(), a.ld, b.values.data(), b.ld, 0.f,
                    again.data(), 80);
  EXPECT_EQ(first, again);
}

// bfloat16 products run exactly where oneDNN may use AVX512-BF16: on such a
// CPU unless ONEDNN_MAX_CPU_ISA keeps it below (the AVX2 stage sets AVX2).
TEST(GemmBf16, NativeExactlyWhereTheCpuAndOneDnnAllowIt) {
  const char* limit = std::getenv("ONEDNN_MAX_CPU_ISA");
  const bool cpu = __builtin_cpu_supports("avx512bf16");
  if (!limit)
    EXPECT_EQ(relpos::gemm_bf16_native(), cpu);
  else if (std::string(limit) == "AVX2")
    EXPECT_FALSE(relpos::gemm_bf16_native());
  else
    GTEST_SKIP() << "ONEDNN_MAX_CPU_ISA=" << limit << ": no expectation written for it";
  std::printf("bfloat16 GEMMs: %s\n", relpos::gemm_bf16_native() ? "oneDNN bfloat16 matmul" : "widened to float32");
}

}  // namespace
