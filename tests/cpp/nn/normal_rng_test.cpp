// The initialisation generator: splitmix64's published sequence, and normals
// with the right moments.
#include <gtest/gtest.h>

#include <cmath>

#include "../../../src/nn/normal_rng.hpp"

using relpos::nn::NormalRng;

TEST(NnNormalRng, SplitMix64MatchesTheReferenceSequence) {
  // Outputs of Vigna's splitmix64.c for seed 0.
  NormalRng rng(0);
  EXPECT_EQ(rng.next_u64(), 0xe220a8397b1dcdafull);
  EXPECT_EQ(rng.next_u64(), 0x6e789e6aa1b965f4ull);
  EXPECT_EQ(rng.next_u64(), 0x06c45d188009454full);
}

TEST(NnNormalRng, NormalsHaveZeroMeanUnitVarianceAndNormalTails) {
  NormalRng rng(42);
  const int n = 200000;
  double sum = 0, sq = 0;
  int beyond_two = 0;
  for (int i = 0; i < n; ++i) {
    const double x = rng.normal();
    ASSERT_TRUE(std::isfinite(x));
    sum += x, sq += x * x;
    beyond_two += std::abs(x) > 2;
  }
  EXPECT_NEAR(sum / n, 0.0, 0.01);           // standard error 0.0022
  EXPECT_NEAR(sq / n, 1.0, 0.015);           // standard error 0.0032
  EXPECT_NEAR(double(beyond_two) / n, 0.0455, 0.003);  // P(|X| > 2) = 4.55 %
}

TEST(NnNormalRng, SameSeedSameSequence) {
  NormalRng a(7), b(7), c(8);
  bool differs = false;
  for (int i = 0; i < 10; ++i) {
    const double x = a.normal();
    EXPECT_EQ(x, b.normal());
    differs |= x != c.normal();
  }
  EXPECT_TRUE(differs);
}
