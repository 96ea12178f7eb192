// Central-difference gradient checks of the reference backward in double, for
// every scheme variant x mask x geometry (problem.hpp's all_cases) and every
// input and learnable parameter the case has: f = sum(G * out) for the random
// G = dout, each analytic gradient element against (f(x+h) - f(x-h)) / 2h.
#include <algorithm>
#include <cmath>

#include "central_differences.hpp"

namespace relpos_test {
namespace {

class GradientCheck : public ::testing::TestWithParam<Spec> {};

TEST_P(GradientCheck, AnalyticGradientsMatchCentralDifferences) {
  Problem<double> p(GetParam());
  expect_gradients_match_central_differences(p, GetParam().num_threads);
}

INSTANTIATE_TEST_SUITE_P(AllSchemesMasksGeometries, GradientCheck, ::testing::ValuesIn(all_cases()), spec_name);
// On a grid, where a query row sees keys of more than one key grid row.
std::vector<Spec> grid_gradient_cases() {
  std::vector<Spec> out;
  for (const Spec& s : grid_cases())
    if (!grid_rows_see_one_key_row(s)) out.push_back(s);
  return out;
}
INSTANTIATE_TEST_SUITE_P(PositionsOnAGrid, GradientCheck, ::testing::ValuesIn(grid_gradient_cases()), spec_name);
INSTANTIATE_TEST_SUITE_P(Segments, GradientCheck, ::testing::ValuesIn(segment_cases()), spec_name);

// Two backward calls leave fill + 2 * gradient in every buffer: backward adds
// and neither overwrites nor reads its own output.
class BackwardAccumulates : public ::testing::TestWithParam<Spec> {};

TEST_P(BackwardAccumulates, SecondCallAddsTheSameGradientAgain) {
  Problem<double> once(GetParam()), twice(GetParam());
  once.forward();
  twice.forward();
  once.fill_grads(kGradFill);
  twice.fill_grads(kGradFill);
  once.backward();
  twice.backward();
  twice.backward();
  std::vector<Param<double>> a = once.params(), b = twice.params();
  ASSERT_EQ(a.size(), b.size());
  for (std::size_t n = 0; n < a.size(); ++n) {
    std::vector<double> expected, actual;
    for (std::size_t e = 0; e < a[n].grad.size(); ++e) {
      expected.push_back(kGradFill + 2 * (*a[n].grad[e] - kGradFill));
      actual.push_back(*b[n].grad[e]);
    }
    EXPECT_TRUE(all_near("d" + a[n].name, actual, expected, 1e-12, 1e-12));
  }
}

INSTANTIATE_TEST_SUITE_P(AllSchemes, BackwardAccumulates, ::testing::ValuesIn(cases_where([](const Spec& s) {
                           return s.mask == MaskKind::causal_padding;
                         })),
                         spec_name);

}  // namespace
}  // namespace relpos_test
