// Invariances the semantics imply, each checked on out, lse and every gradient:
//  * relative schemes see only r = key - query: shifting q_offset and
//    k_offset together changes nothing (RoPE up to rounding of the angles);
//  * memory layout (dense or strided views) changes nothing;
//  * float and double references agree to float tolerance;
//  * Shaw with k >= the longest distance is unclipped: equal to a larger k with
//    the same rows, and beyond = zero equals beyond = clip there;
//  * RoPE scores of rotated vectors depend only on the position difference.
#include <cmath>
#include <random>

#include "problem.hpp"

namespace relpos_test {
namespace {

// Self-attention of length L = 4, distances -3..3.
bool is_self(const Spec& s) { return s.Lq == 4 && s.Lk == 4 && s.q_offset == 0 && s.k_offset == 0; }

std::vector<Spec> every_scheme_causal_padding() {
  return cases_where([](const Spec& s) { return s.mask == MaskKind::causal_padding; });
}

// ---- offsets ------------------------------------------------------------------

class OffsetShift : public ::testing::TestWithParam<Spec> {};

TEST_P(OffsetShift, ShiftingBothOffsetsChangesNothing) {
  Spec base = GetParam(), shifted = GetParam();
  shifted.q_offset += 1000;
  shifted.k_offset += 1000;
  Problem<double> a(base), b(shifted);
  // Only RoPE uses absolute positions (rotation angles 1000x larger round differently).
  const double tol = base.scheme == Scheme::rope ? 1e-10 : 0.0;
  EXPECT_TRUE(same_outcome(run_forward_backward(b), run_forward_backward(a), tol, tol));
}

INSTANTIATE_TEST_SUITE_P(AllSchemes, OffsetShift, ::testing::ValuesIn(every_scheme_causal_padding()), spec_name);

// The check above is not vacuous: every position scheme does see the offsets.
class QueryShift : public ::testing::TestWithParam<Spec> {};

TEST_P(QueryShift, ShiftingOnlyTheQueriesChangesTheOutput) {
  Spec moved = GetParam();
  moved.q_offset += 1;
  moved.mask = MaskKind::padding;  // keep the mask, change only the position terms
  Spec base = GetParam();
  base.mask = MaskKind::padding;
  Problem<double> a(base), b(moved);
  a.forward();
  b.forward();
  EXPECT_FALSE(all_near("out", b.out.values(), a.out.values(), 1e-6));
}

// (Self-attention, where keys lie on both sides of a query: with every key on one
// side, ALiBi's shift adds one constant to a whole row, which softmax ignores.)
INSTANTIATE_TEST_SUITE_P(PositionSchemes, QueryShift, ::testing::ValuesIn(cases_where([](const Spec& s) {
                           return s.scheme != Scheme::none && s.mask == MaskKind::causal_padding && is_self(s);
                         })),
                         spec_name);

// ---- layout and precision -----------------------------------------------------

class LayoutAndPrecision : public ::testing::TestWithParam<Spec> {};

TEST_P(LayoutAndPrecision, StridedViewsGiveExactlyTheDenseResult) {
  Spec dense = GetParam(), strided = GetParam();
  dense.layout = Layout::dense;
  strided.layout = Layout::strided;
  Problem<double> a(dense), b(strided);
  EXPECT_TRUE(same_outcome(run_forward_backward(b), run_forward_backward(a), 0.0));
  EXPECT_TRUE(b.outputs_padding_untouched()) << "an output was written between its rows";
}

TEST_P(LayoutAndPrecision, FloatAgreesWithDoubleToFloatTolerance) {
  Problem<double> exact(GetParam());
  Problem<float> single(GetParam());
  EXPECT_TRUE(same_outcome(run_forward_backward(single), run_forward_backward(exact), 2e-6, 2e-5));
}

INSTANTIATE_TEST_SUITE_P(AllSchemes, LayoutAndPrecision, ::testing::ValuesIn(every_scheme_causal_padding()), spec_name);

// ---- Shaw clipping -------------------------------------------------------------

// Self-attention for every Shaw variant and mask.
std::vector<Spec> shaw_self_cases() {
  return cases_where([](const Spec& s) { return s.scheme == Scheme::shaw && is_self(s); });
}

class ShawUnclipped : public ::testing::TestWithParam<Spec> {};

TEST_P(ShawUnclipped, ClipAtTheLongestDistanceEqualsALargerKWithTheSameRows) {
  Spec small = GetParam(), large = GetParam();
  small.shaw_k = small.Lk - 1;  // = the longest distance: nothing is clipped
  large.shaw_k = small.shaw_k + 3;
  Problem<double> a(small), b(large);
  // The large table holds the small one's rows at the same distances; its
  // rows for |r| > 3 stay random: they must never be read.
  auto embed = [&](Tensor<double, 3>& from, Tensor<double, 3>& to) {
    if (from.empty()) return;
    for (int64_t h = 0; h < from.shape()[0]; ++h)
      for (int64_t c = 0; c < from.shape()[1]; ++c)
        for (int64_t x = 0; x < from.shape()[2]; ++x) to(h, c + 3, x) = from(h, c, x);
  };
  embed(a.shaw_wk, b.shaw_wk);
  embed(a.shaw_wv, b.shaw_wv);
  Outcome oa = run_forward_backward(a), ob = run_forward_backward(b);
  const Outcome::difference_type inputs = 5;  // out, lse, dq, dk, dv; the table gradients follow
  EXPECT_TRUE(same_outcome({ob.begin(), ob.begin() + inputs}, {oa.begin(), oa.begin() + inputs}, 1e-15, 1e-14));
  // Table gradients: the small table's at the same distances, zero in the rows never read.
  auto expect_embedded = [](Tensor<double, 3>& small_grad, Tensor<double, 3>& large_grad, const char* name) {
    if (small_grad.empty()) return;
    for (int64_t h = 0; h < large_grad.shape()[0]; ++h)
      for (int64_t c = 0; c < large_grad.shape()[1]; ++c)
        for (int64_t x = 0; x < large_grad.shape()[2]; ++x) {
          const int64_t cs = c - 3;  // the small table's row of the same distance
          const double expected = cs >= 0 && cs < small_grad.shape()[1] ? small_grad(h, cs, x) : 0.0;
          EXPECT_NEAR(large_grad(h, c, x), expected, 1e-15) << name << " row " << c;
        }
  };
  expect_embedded(a.grad_shaw_wk, b.grad_shaw_wk, "dshaw.wk");
  expect_embedded(a.grad_shaw_wv, b.grad_shaw_wv, "dshaw.wv");
}

TEST_P(ShawUnclipped, BeyondZeroEqualsBeyondClipWhenNothingIsBeyond) {
  Spec clip = GetParam(), zero = GetParam();
  clip.shaw_k = zero.shaw_k = clip.Lk - 1;
  clip.shaw_beyond = Beyond::clip;
  zero.shaw_beyond = Beyond::zero;
  Problem<double> a(clip), b(zero);
  EXPECT_TRUE(same_outcome(run_forward_backward(b), run_forward_backward(a), 0.0));
}

TEST_P(ShawUnclipped, BeyondZeroDiffersFromClipWhenDistancesExceedK) {
  Spec clip = GetParam(), zero = GetParam();
  clip.shaw_k = zero.shaw_k = 1;
  clip.shaw_beyond = Beyond::clip;
  zero.shaw_beyond = Beyond::zero;
  Problem<double> a(clip), b(zero);
  a.forward();
  b.forward();
  EXPECT_FALSE(all_near("out", b.out.values(), a.out.values(), 1e-6));
}

INSTANTIATE_TEST_SUITE_P(ShawVariantsAndMasks, ShawUnclipped, ::testing::ValuesIn(shaw_self_cases()), spec_name);

// ---- RoPE is relative ------------------------------------------------------------

class RopeRelative : public ::testing::TestWithParam<Spec> {};

std::vector<double> rotated(const Spec& s, std::vector<double> x, double pos) {
  const int64_t dims = s.rope.rotary_dims ? s.rope.rotary_dims : s.d;
  relpos::rope_rotate(x.data(), 1, pos, relpos::rope_inv_freq(dims, s.rope.base), s.rope.style);
  return x;
}

double dot(const std::vector<double>& a, const std::vector<double>& b) {
  double s = 0;
  for (std::size_t n = 0; n < a.size(); ++n) s += a[n] * b[n];
  return s;
}

TEST_P(RopeRelative, ScoreOfRotatedVectorsIsAFunctionOfThePositionDifference) {
  const Spec& s = GetParam();
  std::mt19937_64 rng(7);
  std::uniform_real_distribution<double> u(-1, 1);
  std::vector<double> x(s.d), y(s.d);
  for (int64_t n = 0; n < s.d; ++n) x[n] = u(rng), y[n] = u(rng);
  for (int64_t diff : {-7, -1, 0, 2, 5}) {
    // the score at query position m, key position m - diff, is that of positions (diff, 0)
    const double expected = dot(rotated(s, x, double(diff)), y);
    for (int64_t m : {7, 10, 31, 1000})
      EXPECT_NEAR(dot(rotated(s, x, double(m)), rotated(s, y, double(m - diff))), expected, 1e-12)
          << "diff " << diff << " m " << m;
  }
  // ...and it does depend on the difference.
  EXPECT_GT(std::abs(dot(rotated(s, x, 3.0), y) - dot(x, y)), 1e-3);
}

INSTANTIATE_TEST_SUITE_P(RopeVariants, RopeRelative, ::testing::ValuesIn(cases_where([](const Spec& s) {
                           return s.scheme == Scheme::rope && s.mask == MaskKind::none && s.Lq == s.Lk;
                         })),
                         spec_name);

}  // namespace
}  // namespace relpos_test
