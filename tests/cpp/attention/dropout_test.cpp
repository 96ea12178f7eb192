// Attention dropout (relpos/dropout.hpp, docs/design.md "Attention dropout"):
//  * the reference against the direct-softmax oracle with the mask restated
//    in the tests (dropout_oracle.hpp), every scheme x mask x geometry;
//  * the reference's and the fused kernel's gradients against central
//    differences (the mask is fixed by its seed: the function is smooth);
//  * the mask keyed by global positions: a decode step, a window of queries
//    or a slice of the batch draws what the whole call draws there;
//  * its statistics: the kept fraction and independent rows;
//  * p = 0 is the call without dropout, bit for bit; bad arguments refused.
// Every algorithm against the reference with dropout, threads and multi-tile
// sizes: algorithm_cases.hpp's dropout cases (algorithms_test.cpp),
// fused_multi_tile_test.cpp; grouped-query attention: gqa_test.cpp; half
// storage: half_storage_test.cpp.
#include <cmath>
#include <stdexcept>
#include <string>
#include <vector>

#include "algorithm_cases.hpp"
#include "central_differences.hpp"
#include "oracle.hpp"

namespace relpos_test {
namespace {

using relpos::Algorithm;

std::vector<Spec> dropout_oracle_cases() {
  std::vector<Spec> out;
  for (const Spec& s : all_cases()) out.push_back(with_dropout(s, 0.4));
  return out;
}

class DropoutMatchesDirectSoftmax : public ::testing::TestWithParam<Spec> {};

TEST_P(DropoutMatchesDirectSoftmax, OutAndLse) {
  Problem<double> p(GetParam());
  p.forward();
  const oracle::Result expected = oracle::attention(p);
  EXPECT_TRUE(all_near("out", p.out.values(), expected.out, 1e-12, 1e-12));
  EXPECT_TRUE(all_near("lse", p.lse.values(), expected.lse, 1e-12, 1e-12));
}

INSTANTIATE_TEST_SUITE_P(AllSchemesMasksGeometries, DropoutMatchesDirectSoftmax,
                         ::testing::ValuesIn(dropout_oracle_cases()), spec_name);

// Dropout changes the output, and the oracle's mask is not all kept or all dropped.
TEST(DropoutMatchesDirectSoftmax, TheMaskChangesTheOutputAndDropsAboutP) {
  Spec s = with_mask_and_geometry(scheme_variants()[0], masks()[0], geometries()[0]);
  s.Lq = s.Lk = 40;
  Problem<double> plain(s), dropped(with_dropout(s, 0.4));
  plain.forward(), dropped.forward();
  EXPECT_FALSE(all_near("out", dropped.out.values(), plain.out.values(), 1e-3));
  EXPECT_TRUE(all_near("lse", dropped.lse.values(), plain.lse.values(), 0)) << "lse is the softmax's";
  int64_t kept = 0;
  for (int64_t b = 0; b < s.B; ++b)
    for (int64_t h = 0; h < s.H; ++h)
      for (int64_t i = 0; i < s.Lq; ++i)
        for (int64_t j = 0; j < s.Lk; ++j) kept += oracle::kept(dropped.spec, b, h, i, j);
  const double n = double(s.B * s.H * s.Lq * s.Lk);  // 9600 entries: 5 sigma of the fraction is 0.025
  EXPECT_NEAR(double(kept) / n, 0.6, 0.025);
}

class DropoutGradientCheck : public ::testing::TestWithParam<Spec> {};

TEST_P(DropoutGradientCheck, AnalyticGradientsMatchCentralDifferences) {
  Problem<double> p(GetParam());
  expect_gradients_match_central_differences(p, 1);
}

// The reference's gradients on every dropout case of the algorithms, and the
// fused kernel's (checked on its own, not only against the reference) on
// each scheme variant. Not with a single key (the softmax is then 1 whatever
// q and k are), nor on a grid whose rows see one key grid row each.
std::vector<Spec> dropout_gradient_cases() {
  std::vector<Spec> out;
  for (Spec s : dropout_cases()) {
    if (s.Lk == 1 || (s.grid_qh > 0 && grid_rows_see_one_key_row(s))) continue;
    s.B = 1;
    out.push_back(with_algorithm(s, Algorithm::reference));
    if (s.mask == MaskKind::causal_padding && s.label.find("__self__") != std::string::npos)
      out.push_back(with_algorithm(s, Algorithm::fused));
  }
  return out;
}

INSTANTIATE_TEST_SUITE_P(ReferenceAndFused, DropoutGradientCheck, ::testing::ValuesIn(dropout_gradient_cases()),
                         spec_name);

// out and lse of the rows [i0, i0 + n) of one head's values, as values() orders them.
std::vector<double> rows_of(const std::vector<double>& all, int64_t heads_before, int64_t L, int64_t width,
                            int64_t i0, int64_t n) {
  const auto first = all.begin() + (heads_before * L + i0) * width;
  return {first, first + n * width};
}

// Entries are keyed by global positions and batch rows: the last query as a
// decode step (Lq = 1, q_offset = L - 1), a window of queries (q_offset = 5),
// and batch row 1 as a call of its own (batch_offset = 1) draw the whole
// call's mask there, in every algorithm that serves them.
TEST(DropoutMask, AWindowOfACallDrawsThatWindowOfItsMask) {
  Spec whole = with_mask_and_geometry(scheme_variants()[1], masks()[1], geometries()[0]);  // Shaw K+V, causal
  whole.Lq = whole.Lk = 150, whole.B = 2, whole.H = 2;
  whole = with_dropout(whole, 0.25);
  Problem<double> full(whole);
  full.forward();
  const std::vector<double> out = full.out.values();
  for (Algorithm a : {Algorithm::reference, Algorithm::gather, Algorithm::fused}) {
    SCOPED_TRACE(relpos::to_string(a));
    for (auto [i0, n] : {std::pair<int64_t, int64_t>{149, 1}, {5, 60}}) {
      Spec window = whole;
      window.algorithm = a;
      window.Lq = n, window.q_offset = i0;
      Problem<double> w(window);
      for (int64_t b = 0; b < window.B; ++b)  // the same inputs: q's rows of the window
        for (int64_t h = 0; h < window.H; ++h)
          for (int64_t i = 0; i < n; ++i)
            for (int64_t x = 0; x < window.d; ++x) w.q(b, h, i, x) = full.q(b, h, i0 + i, x);
      for (int64_t b = 0; b < window.B; ++b)
        for (int64_t h = 0; h < window.H; ++h)
          for (int64_t j = 0; j < window.Lk; ++j) {
            for (int64_t x = 0; x < window.d; ++x) w.k(b, h, j, x) = full.k(b, h, j, x);
            for (int64_t x = 0; x < window.dv; ++x) w.v(b, h, j, x) = full.v(b, h, j, x);
          }
      w.shaw_wk = full.shaw_wk, w.shaw_wv = full.shaw_wv;
      w.forward();
      const std::vector<double> got = w.out.values();
      for (int64_t bh = 0; bh < window.B * window.H; ++bh)
        EXPECT_TRUE(all_near("out", rows_of(got, bh, n, window.dv, 0, n), rows_of(out, bh, 150, whole.dv, i0, n),
                             1e-12, 1e-12))
            << "rows " << i0 << " + " << n << " of head " << bh;
    }
    Spec second = whole;  // batch row 1 alone, numbered 1 in the mask
    second.algorithm = a;
    second.B = 1, second.dropout.batch_offset = 1;
    Problem<double> one(second);
    for (Tensor<double, 4>* t : {&one.q, &one.k, &one.v})
      for (int64_t h = 0; h < whole.H; ++h)
        for (int64_t i = 0; i < whole.Lq; ++i)
          for (int64_t x = 0; x < t->shape()[3]; ++x)
            (*t)(0, h, i, x) = (t == &one.q ? full.q : t == &one.k ? full.k : full.v)(1, h, i, x);
    one.shaw_wk = full.shaw_wk, one.shaw_wv = full.shaw_wv;
    one.forward();
    const std::vector<double> got = one.out.values();
    EXPECT_TRUE(all_near("out", got, {out.begin() + long(got.size()), out.end()}, 1e-12, 1e-12)) << "batch row 1";
  }
}

// Rows and heads draw different bits, and the kept fraction over many
// entries is 1 - p within 5 standard deviations.
TEST(DropoutMask, RowsDifferAndKeepOneMinusP) {
  const relpos::AttentionDropout d{0.1, 2024, 7, 0};
  int64_t kept = 0, equal_rows = 0;
  const int64_t L = 256, heads = 4;
  std::vector<std::vector<bool>> rows;
  for (int64_t h = 0; h < heads; ++h)
    for (int64_t i = 0; i < L; ++i) {
      std::vector<bool> row(L);
      for (int64_t j = 0; j < L; ++j) kept += row[j] = relpos::dropout_keeps(d, heads, 0, h, i, j);
      rows.push_back(row);
    }
  for (std::size_t a = 1; a < rows.size(); ++a) equal_rows += rows[a] == rows[a - 1];
  const double n = double(heads * L * L), sigma = std::sqrt(0.1 * 0.9 / n);
  EXPECT_NEAR(double(kept) / n, 0.9, 5 * sigma);
  EXPECT_EQ(equal_rows, 0);
}

// p = 0 is the call without dropout, bit for bit, whatever the seed.
TEST(DropoutMask, ProbabilityZeroIsTheCallWithoutDropout) {
  for (Algorithm a : {Algorithm::reference, Algorithm::gather, Algorithm::fused}) {
    Spec s = with_mask_and_geometry(scheme_variants()[6], masks()[3], geometries()[1]);  // T5
    s.algorithm = a;
    Problem<float> plain(s);
    s.dropout = {0.0, 99, 5, 0};
    Problem<float> zero(s);
    EXPECT_TRUE(same_outcome(run_forward_backward(zero), run_forward_backward(plain), 0, 0)) << relpos::to_string(a);
  }
}

// A probability outside [0, 1), and batch rows past the counter's 32 bits, are refused by name.
TEST(DropoutValidation, BadArgumentsAreRefusedByName) {
  const auto message = [](const relpos::AttentionDropout& d, int64_t B) {
    Spec s;
    s.B = B;
    s.dropout = d;
    Problem<float> p(s);
    try {
      relpos::attention_forward(p.forward_args());
    } catch (const std::invalid_argument& e) {
      return std::string(e.what());
    }
    return std::string("accepted");
  };
  for (double p : {1.0, -0.1, 1.5, std::nan("")})
    EXPECT_NE(message({p, 1, 0, 0}, 2).find("dropout.p: must be in [0, 1)"), std::string::npos) << p;
  EXPECT_NE(message({0.5, 1, 0, (int64_t(1) << 32) / 3}, 2).find("dropout.batch_offset"), std::string::npos);
  EXPECT_NE(message({0.5, 1, 0, -1}, 2).find("dropout.batch_offset"), std::string::npos);
  EXPECT_EQ(message({0.5, 1, 0, (int64_t(1) << 32) / 3 - 2}, 2), "accepted");
}

}  // namespace
}  // namespace relpos_test
