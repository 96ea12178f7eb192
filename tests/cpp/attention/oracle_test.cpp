// The reference forward against oracles built in the tests (oracle.hpp):
//  * every scheme x mask x geometry against a direct softmax of the
//    docs/design.md formulas, computed without any library position code;
//  * T5, ALiBi, Shaw K-only and Transformer-XL against the library's plain
//    attention (scheme none) with the scheme's score / bias matrix folded into
//    extra feature dimensions of q and k.
#include "oracle.hpp"

#include "problem.hpp"

namespace relpos_test {
namespace {

class MatchesDirectSoftmax : public ::testing::TestWithParam<Spec> {};

TEST_P(MatchesDirectSoftmax, OutAndLse) {
  Problem<double> p(GetParam());
  p.forward();
  const oracle::Result expected = oracle::attention(p);
  EXPECT_TRUE(all_near("out", p.out.values(), expected.out, 1e-12, 1e-12));
  EXPECT_TRUE(all_near("lse", p.lse.values(), expected.lse, 1e-12, 1e-12));
  // Strided outputs: nothing written between the rows.
  EXPECT_TRUE(p.out.padding_untouched());
  EXPECT_TRUE(p.lse.padding_untouched());
}

INSTANTIATE_TEST_SUITE_P(AllSchemesMasksGeometries, MatchesDirectSoftmax, ::testing::ValuesIn(all_cases()), spec_name);
INSTANTIATE_TEST_SUITE_P(PositionsOnAGrid, MatchesDirectSoftmax, ::testing::ValuesIn(grid_cases()), spec_name);
INSTANTIATE_TEST_SUITE_P(Segments, MatchesDirectSoftmax, ::testing::ValuesIn(segment_cases()), spec_name);

// The oracle is not vacuous: a relative scheme changes the output.
TEST(MatchesDirectSoftmax, EverySchemeChangesTheOutputOfPlainAttention) {
  Spec plain = with_mask_and_geometry(scheme_variants()[0], masks()[1], geometries()[0]);
  Problem<double> none(plain);
  none.forward();
  for (const Spec& variant : scheme_variants()) {
    if (variant.scheme == Scheme::none) continue;
    Problem<double> p(with_mask_and_geometry(variant, masks()[1], geometries()[0]));
    p.forward();
    EXPECT_FALSE(all_near("out", p.out.values(), none.out.values(), 1e-6)) << variant.label;
  }
}

class EqualsPlainAttentionWithFoldedTerms : public ::testing::TestWithParam<Spec> {};

TEST_P(EqualsPlainAttentionWithFoldedTerms, OutLseAndInputGradients) {
  Problem<double> p(GetParam());
  Problem<double> plain = oracle::folded_into_none(p);
  p.forward();
  plain.forward();
  EXPECT_TRUE(all_near("out", p.out.values(), plain.out.values(), 1e-12, 1e-12));
  EXPECT_TRUE(all_near("lse", p.lse.values(), plain.lse.values(), 1e-12, 1e-12));
  // A bias independent of q and k (T5, ALiBi, KERPLE) leaves dq, dk, dv those of plain attention.
  if (p.spec.scheme != Scheme::t5 && p.spec.scheme != Scheme::alibi && p.spec.scheme != Scheme::kerple &&
      p.spec.scheme != Scheme::kerple_power)
    return;
  p.backward();
  plain.backward();
  EXPECT_TRUE(all_near("dv", p.dv.values(), plain.dv.values(), 1e-12, 1e-12));
  std::vector<double> dq, dk;  // the first d features of the folded gradients
  for (int64_t b = 0; b < p.spec.B; ++b)
    for (int64_t h = 0; h < p.spec.H; ++h) {
      for (int64_t i = 0; i < p.spec.Lq; ++i)
        for (int64_t x = 0; x < p.spec.d; ++x) dq.push_back(plain.dq(b, h, i, x));
      for (int64_t j = 0; j < p.spec.Lk; ++j)
        for (int64_t x = 0; x < p.spec.d; ++x) dk.push_back(plain.dk(b, h, j, x));
    }
  EXPECT_TRUE(all_near("dq", p.dq.values(), dq, 1e-12, 1e-12));
  EXPECT_TRUE(all_near("dk", p.dk.values(), dk, 1e-12, 1e-12));
}

INSTANTIATE_TEST_SUITE_P(T5AlibiShawKOnlyXLDeberta, EqualsPlainAttentionWithFoldedTerms,
                         ::testing::ValuesIn(cases_where([](const Spec& s) {
                           return s.scheme == Scheme::t5 || s.scheme == Scheme::alibi || s.scheme == Scheme::kerple ||
                                  s.scheme == Scheme::kerple_power || s.scheme == Scheme::xl ||
                                  s.scheme == Scheme::deberta ||
                                  (s.scheme == Scheme::shaw && s.shaw_tables == ShawTables::k_only);
                         })),
                         spec_name);

}  // namespace
}  // namespace relpos_test
