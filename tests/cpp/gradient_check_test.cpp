// Central-difference gradient checks of the reference backward in double, for
// every scheme variant x mask x geometry (problem.hpp's all_cases) and every
// input and learnable parameter the case has: f = sum(G * out) for the random
// G = dout, each analytic gradient element against (f(x+h) - f(x-h)) / 2h.
#include <algorithm>
#include <cmath>

#include "problem.hpp"

namespace relpos_test {
namespace {

constexpr double kStep = 1e-6;
// Central differences in double at h = 1e-6 are good to ~1e-10 here; a wrong
// term in a gradient is off by far more than the tolerance.
constexpr double kRelTol = 1e-6, kAbsTol = 1e-8;
// Gradient buffers start at this value: backward must add into them.
constexpr double kGradFill = 0.25;

double objective(Problem<double>& p) {
  p.forward();
  const std::vector<double> out = p.out.values(), g = p.dout.values();
  double f = 0;
  for (std::size_t n = 0; n < out.size(); ++n) f += g[n] * out[n];
  return f;
}

class GradientCheck : public ::testing::TestWithParam<Spec> {};

TEST_P(GradientCheck, AnalyticGradientsMatchCentralDifferences) {
  Problem<double> p(GetParam());
  p.forward();
  p.fill_grads(kGradFill);
  p.backward();
  for (Param<double>& param : p.params()) {
    std::vector<double> analytic, numeric;
    for (std::size_t n = 0; n < param.value.size(); ++n) {
      double& x = *param.value[n];
      const double x0 = x;
      x = x0 + kStep;
      const double f_plus = objective(p);
      x = x0 - kStep;
      const double f_minus = objective(p);
      x = x0;
      numeric.push_back((f_plus - f_minus) / (2 * kStep));
      analytic.push_back(*param.grad[n] - kGradFill);
    }
    EXPECT_TRUE(all_near("d" + param.name, analytic, numeric, kAbsTol, kRelTol));
    double largest = 0;
    for (double g : numeric) largest = std::max(largest, std::abs(g));
    EXPECT_GT(largest, 1e-3) << param.name << " barely moves f: the check would prove nothing";
  }
}

INSTANTIATE_TEST_SUITE_P(AllSchemesMasksGeometries, GradientCheck, ::testing::ValuesIn(all_cases()), spec_name);

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
