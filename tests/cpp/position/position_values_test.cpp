// Hand-checked values of the position functions (include/relpos/position.hpp):
// T5 buckets, ALiBi slopes, Shaw rows, RoPE frequencies and rotations, the
// Transformer-XL sinusoid and its distance clamping.
#include <stdexcept>
#include <gtest/gtest.h>

#include <cmath>
#include <tuple>
#include <vector>

#include "oracle.hpp"
#include "relpos/position.hpp"

namespace relpos_test {
namespace {

using relpos::Beyond;
using relpos::RopeStyle;

// ---- T5 ----------------------------------------------------------------------------

// HF defaults num_buckets = 32, max_distance = 128, derived by hand.
// Bidirectional: 16 buckets per side (r > 0 adds 16), exact below max_exact = 8,
// then bucket 8 + floor(log(n/8) / log(128/8) * 8) = 8 + floor(2 log2(n/8)),
// capped at 15: bucket 8 + m starts at n = ceil(8 * 2^(m/2)).
constexpr int64_t kBidirectionalLogStarts[] = {8, 12, 16, 23, 32, 46, 64, 91};  // buckets 8..15
// Causal: only the past (n = -r > 0) is told apart, max_exact = 16, bucket
// 16 + floor(log(n/16) / log(8) * 16), capped at 31: bucket 16 + m starts at
// n = ceil(16 * 2^(3m/16)). No start lies near enough an integer for float32
// rounding to move it.
constexpr int64_t kCausalLogStarts[] = {16, 19, 21, 24, 27, 31, 35, 40, 46, 52, 59, 67, 77, 87, 99, 113};

template <std::size_t N>
int64_t bucket_from_starts(int64_t n, int64_t max_exact, const int64_t (&starts)[N]) {
  if (n < max_exact) return n;
  int64_t bucket = max_exact;
  for (std::size_t m = 0; m < N; ++m)
    if (n >= starts[m]) bucket = max_exact + int64_t(m);
  return bucket;
}

TEST(T5Bucket, HuggingFaceDefaultsBidirectionalBothSignsUpTo200) {
  for (int64_t n = 0; n <= 200; ++n) {
    const int64_t past = bucket_from_starts(n, 8, kBidirectionalLogStarts);
    EXPECT_EQ(relpos::t5_bucket(-n, true, 32, 128), past) << "r = " << -n;
    EXPECT_EQ(relpos::t5_bucket(n, true, 32, 128), n == 0 ? 0 : 16 + past) << "r = " << n;
  }
}

TEST(T5Bucket, HuggingFaceDefaultsCausalBothSignsUpTo200) {
  for (int64_t n = 0; n <= 200; ++n) {
    EXPECT_EQ(relpos::t5_bucket(-n, false, 32, 128), bucket_from_starts(n, 16, kCausalLogStarts)) << "r = " << -n;
    EXPECT_EQ(relpos::t5_bucket(n, false, 32, 128), 0) << "future key r = " << n;
  }
}

TEST(T5Bucket, LiteralValues) {
  // (r, bidirectional, expected), checked by hand against the formula above
  const std::tuple<int64_t, bool, int64_t> cases[] = {
      {0, true, 0},     {-1, true, 1},     {1, true, 17},     {-7, true, 7},     {-8, true, 8},
      {-10, true, 8},   {10, true, 24},    {-12, true, 9},    {12, true, 25},    {-64, true, 14},
      {-100, true, 15}, {100, true, 31},   {-200, true, 15},  {0, false, 0},     {5, false, 0},
      {-15, false, 15}, {-16, false, 16},  {-18, false, 16},  {-19, false, 17},  {-20, false, 17},
      {-60, false, 26}, {-112, false, 30}, {-113, false, 31}, {-128, false, 31}, {-1000, false, 31}};
  for (const auto& [r, bidirectional, expected] : cases)
    EXPECT_EQ(relpos::t5_bucket(r, bidirectional, 32, 128), expected) << "r = " << r << " bidi " << bidirectional;
}

// The small settings the attention tests use, against the exact-arithmetic
// formula of the oracle (their bucket edges are far from float rounding).
TEST(T5Bucket, TestSettingsMatchTheExactFormula) {
  const std::tuple<bool, int64_t, int64_t> settings[] = {
      {true, 10, 6}, {false, 6, 8}, {true, 32, 128}, {false, 32, 128}};
  for (const auto& [bidirectional, nb, md] : settings)
    for (int64_t r = -60; r <= 60; ++r)
      EXPECT_EQ(relpos::t5_bucket(r, bidirectional, nb, md), oracle::t5_bucket_exact(r, bidirectional, nb, md))
          << "r = " << r << " nb " << nb << " md " << md << " bidi " << bidirectional;
}

// ---- ALiBi -------------------------------------------------------------------------

void expect_slopes(int64_t heads, const std::vector<double>& expected) {
  const std::vector<double> got = relpos::alibi_slopes(heads);
  ASSERT_EQ(got.size(), expected.size()) << heads << " heads";
  for (std::size_t h = 0; h < expected.size(); ++h)
    EXPECT_NEAR(got[h], expected[h], 1e-15) << heads << " heads, head " << h;
}

TEST(AlibiSlopes, PowersOfTwo) {
  expect_slopes(1, {1.0 / 256});
  expect_slopes(4, {0.25, 0.0625, 0.015625, 0.00390625});
  expect_slopes(8, {0.5, 0.25, 0.125, 0.0625, 0.03125, 0.015625, 0.0078125, 0.00390625});
}

TEST(AlibiSlopes, TwelveHeadsAreTheEightHeadSlopesThenEveryOtherSixteenHeadSlope) {
  expect_slopes(12, {0.5, 0.25, 0.125, 0.0625, 0.03125, 0.015625, 0.0078125, 0.00390625,
                     0.7071067811865476,     // 2^-0.5
                     0.3535533905932738,     // 2^-1.5
                     0.1767766952966369,     // 2^-2.5
                     0.08838834764831845});  // 2^-3.5
}

TEST(AlibiSlopes, SixAndThreeHeads) {
  expect_slopes(6, {0.25, 0.0625, 0.015625, 0.00390625, 0.5, 0.125});
  expect_slopes(3, {0.0625, 0.00390625, 0.25});
}

// ---- Shaw ----------------------------------------------------------------------------

TEST(ShawIndex, ClipAndZero) {
  // (r, k, beyond, expected row)
  const std::tuple<int64_t, int64_t, Beyond, int64_t> cases[] = {
      {0, 2, Beyond::clip, 2},  {-2, 2, Beyond::clip, 0}, {2, 2, Beyond::clip, 4},    {-1, 2, Beyond::clip, 1},
      {-5, 2, Beyond::clip, 0}, {7, 2, Beyond::clip, 4},  {0, 0, Beyond::clip, 0},    {5, 0, Beyond::clip, 0},
      {2, 2, Beyond::zero, 4},  {-2, 2, Beyond::zero, 0}, {-3, 2, Beyond::zero, -1},  {3, 2, Beyond::zero, -1},
      {0, 0, Beyond::zero, 0},  {1, 0, Beyond::zero, -1}, {-64, 64, Beyond::zero, 0}, {65, 64, Beyond::zero, -1}};
  for (const auto& [r, k, beyond, expected] : cases)
    EXPECT_EQ(relpos::shaw_index(r, k, beyond), expected)
        << "r = " << r << " k = " << k << (beyond == Beyond::zero ? " zero" : " clip");
}

// ---- RoPE ----------------------------------------------------------------------------

TEST(Rope, InverseFrequencies) {
  const std::vector<double> f = relpos::rope_inv_freq(8, 10000.0);
  const double expected[] = {1.0, 0.1, 0.01, 0.001};  // 10000^(-2i/8)
  ASSERT_EQ(f.size(), 4u);
  for (int i = 0; i < 4; ++i) EXPECT_NEAR(f[i], expected[i], 1e-15 * expected[i]);
  const std::vector<double> g = relpos::rope_inv_freq(4, 100.0);
  ASSERT_EQ(g.size(), 2u);
  EXPECT_DOUBLE_EQ(g[0], 1.0);
  EXPECT_DOUBLE_EQ(g[1], 0.1);  // 100^(-2/4)
}

TEST(Rope, PairsOfFeatures) {
  EXPECT_EQ(relpos::rope_pair(0, 8, RopeStyle::half_split), std::make_pair(int64_t(0), int64_t(4)));
  EXPECT_EQ(relpos::rope_pair(3, 8, RopeStyle::half_split), std::make_pair(int64_t(3), int64_t(7)));
  EXPECT_EQ(relpos::rope_pair(0, 8, RopeStyle::interleaved), std::make_pair(int64_t(0), int64_t(1)));
  EXPECT_EQ(relpos::rope_pair(3, 8, RopeStyle::interleaved), std::make_pair(int64_t(6), int64_t(7)));
}

TEST(Rope, UnitVectorRotatedByAKnownAngle) {
  // One frequency (theta = 1): position pi/3 turns e0 by 60 degrees.
  double e0[2] = {1.0, 0.0};
  relpos::rope_rotate(e0, 1, M_PI / 3, {1.0}, RopeStyle::half_split);
  EXPECT_NEAR(e0[0], 0.5, 1e-15);
  EXPECT_NEAR(e0[1], 0.8660254037844386, 1e-15);
  // Four rotary dims of six, base 100: frequencies (1, 0.1); position 5 turns
  // frequency 1 by 0.5 rad. Half-split pairs feature 1 with 3, interleaved 2 with 3;
  // features 4 and 5 are not rotary and stay put.
  const std::vector<double> inv_freq = relpos::rope_inv_freq(4, 100.0);
  const double c = 0.8775825618903728, s = 0.479425538604203;  // cos 0.5, sin 0.5
  double half[6] = {0, 1, 0, 0, 7, 8};
  relpos::rope_rotate(half, 1, 5.0, inv_freq, RopeStyle::half_split);
  const double half_expected[6] = {0, c, 0, s, 7, 8};
  double inter[6] = {0, 0, 1, 0, 7, 8};
  relpos::rope_rotate(inter, 1, 5.0, inv_freq, RopeStyle::interleaved);
  const double inter_expected[6] = {0, 0, c, s, 7, 8};
  for (int x = 0; x < 6; ++x) {
    EXPECT_NEAR(half[x], half_expected[x], 1e-15) << x;
    EXPECT_NEAR(inter[x], inter_expected[x], 1e-15) << x;
  }
  // direction -1 is the inverse rotation; the stride argument walks a column
  relpos::rope_rotate(half, 1, 5.0, inv_freq, RopeStyle::half_split, -1);
  const double back[6] = {0, 1, 0, 0, 7, 8};
  for (int x = 0; x < 6; ++x) EXPECT_NEAR(half[x], back[x], 1e-15) << x;
  float column[4][3] = {};
  column[2][1] = 1.0f;  // e2 of the vector in column 1 of a 4x3 array
  relpos::rope_rotate(&column[0][1], 3, 5.0, inv_freq, RopeStyle::interleaved);
  EXPECT_NEAR(column[2][1], c, 1e-7);
  EXPECT_NEAR(column[3][1], s, 1e-7);
  for (int x = 0; x < 4; ++x) {
    EXPECT_EQ(column[x][0], 0.0f);
    EXPECT_EQ(column[x][2], 0.0f);
  }
}

// ---- Transformer-XL ----------------------------------------------------------------

TEST(Sinusoid, SinsThenCosines) {
  // dim 4: frequencies 1 and 10000^(-2/4) = 0.01; position 2
  double out[4];
  relpos::sinusoid(2.0, 4, out);
  const double expected[4] = {0.9092974268256817, 0.01999866669333308,   // sin 2, sin 0.02
                              -0.4161468365471424, 0.9998000066665778};  // cos 2, cos 0.02
  for (int i = 0; i < 4; ++i) EXPECT_NEAR(out[i], expected[i], 1e-15) << i;
  float at_zero[6];
  relpos::sinusoid(0.0, 6, at_zero);
  const float zero_expected[6] = {0, 0, 0, 1, 1, 1};
  for (int i = 0; i < 6; ++i) EXPECT_EQ(at_zero[i], zero_expected[i]) << i;
}

TEST(XLDistance, NegatedAndClamped) {
  // (r, clamp_len, expected): R is evaluated at -r, how far the key lies in the past
  const std::tuple<int64_t, int64_t, int64_t> cases[] = {{-5, 0, 5}, {3, 0, -3}, {0, 0, 0}, {-5, 2, 2},      {5, 2, -2},
                                                         {-1, 2, 1}, {2, 2, -2}, {0, 3, 0}, {-1000, 0, 1000}};
  for (const auto& [r, clamp, expected] : cases)
    EXPECT_EQ(relpos::xl_distance(r, clamp), expected) << "r = " << r << " clamp_len = " << clamp;
}

TEST(PositionValidation, AlibiSlopesRejectHeadCountsOutsideRange) {
  for (int64_t heads : {int64_t(0), int64_t(-3), int64_t(1) << 20})
    EXPECT_THROW(relpos::alibi_slopes(heads), std::invalid_argument) << heads << " heads";
}

TEST(PositionValidation, T5ConfigWithoutBucketsIsRejected) {
  EXPECT_THROW(relpos::check_t5_config(true, 2, 128), std::invalid_argument);   // no exact range
  EXPECT_THROW(relpos::check_t5_config(false, 1, 128), std::invalid_argument);  // no exact range
  EXPECT_THROW(relpos::check_t5_config(true, 32, 8), std::invalid_argument);    // max_distance inside it
  EXPECT_NO_THROW(relpos::check_t5_config(true, 4, 3));
  EXPECT_NO_THROW(relpos::check_t5_config(false, 2, 2));
}

}  // namespace
}  // namespace relpos_test
