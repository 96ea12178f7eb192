// Central-difference gradient checks in double of every algorithm other than
// the reference, so each backward is checked on its own, not only against the
// reference backward: f = sum(G * out) for the random G = dout, every input and
// parameter element's analytic gradient against (f(x+h) - f(x-h)) / 2h, with
// the forward of the same algorithm. Per algorithm, every scheme variant it
// serves on two small geometries that it serves (one of them strided); one
// test per (algorithm, scheme).
#include <algorithm>
#include <cmath>
#include <functional>

#include "algorithm_cases.hpp"
#include "central_differences.hpp"

namespace relpos_test {
namespace {


constexpr Algorithm kCheckedAlgorithms[] = {Algorithm::split,            Algorithm::gather,   Algorithm::skew,
                                            Algorithm::generalized_skew, Algorithm::relshift, Algorithm::fused};

// Two geometries per algorithm, both served by it for the schemes it serves.
std::vector<Geometry> geometries_for(Algorithm a) {
  const Geometry causal_padding_self = {"causal_padding_self", [](Spec& s) { s.mask = MaskKind::causal_padding; }};
  switch (a) {
    case Algorithm::skew:  // causal self-attention at equal nonzero offsets
      return {causal_padding_self, {"causal_self_L5_offset2_strided", [](Spec& s) {
                                      s.mask = MaskKind::causal, s.Lq = s.Lk = 5, s.q_offset = s.k_offset = 2;
                                      s.layout = Layout::strided;
                                    }}};
    case Algorithm::relshift:  // Transformer-XL memory: 3 queries after 2 memory keys
      return {causal_padding_self, {"causal_memory_strided", [](Spec& s) {
                                      s.mask = MaskKind::causal, s.Lq = 3, s.Lk = 5, s.q_offset = 2, s.k_offset = 0;
                                      s.layout = Layout::strided;
                                    }}};
    default:  // cross-attention, queries partly before the keys, explicit scale
      return {causal_padding_self, {"padding_cross_strided", [](Spec& s) {
                                      s.mask = MaskKind::padding, s.Lq = 4, s.Lk = 3, s.q_offset = 1, s.k_offset = 3;
                                      s.layout = Layout::strided, s.scale = 0.7;
                                    }}};
  }
}

std::vector<Spec> gradient_cases() {
  std::vector<Spec> out;
  for (Algorithm a : kCheckedAlgorithms)
    for (const Spec& variant : scheme_variants())
      for (const Geometry& g : geometries_for(a)) {
        Spec s = variant;
        s.B = 1, s.H = 2;  // per-head tables still differ; a third of the default's elements to perturb
        g.apply(s);
        s.label += std::string("__") + g.name;
        if (serves(a, s)) out.push_back(with_algorithm(s, a));
      }
  for (Spec s : grid_cases())  // the fused kernel's grid terms, where every row sees several key rows
    if (s.mask == MaskKind::padding && s.grid_qh > 1) {
      s.B = 1, s.H = 2;
      out.push_back(with_algorithm(s, Algorithm::fused));
    }
  return out;
}

// One test per (algorithm, scheme), every variant and geometry of it inside.
std::vector<CaseGroup> gradient_groups() {
  return group_by(gradient_cases(), [](const Spec& s) {
    return std::string(relpos::to_string(s.algorithm)) + "__" + relpos::to_string(s.scheme);
  });
}

class AlgorithmGradientCheck : public ::testing::TestWithParam<CaseGroup> {};

TEST_P(AlgorithmGradientCheck, AnalyticGradientsMatchCentralDifferences) {
  for (const Spec& spec : GetParam().cases) {
    SCOPED_TRACE(spec.label);
    Problem<double> p(spec);
    // The analytic gradients run threaded over heads; the differences on one thread.
    expect_gradients_match_central_differences(p, 1);
  }
}

INSTANTIATE_TEST_SUITE_P(EveryAlgorithmAndScheme, AlgorithmGradientCheck, ::testing::ValuesIn(gradient_groups()),
                         group_name);

// Each algorithm gets a fair share of the checks.
TEST(AlgorithmGradientCases, EveryAlgorithmIsChecked) {
  for (Algorithm a : kCheckedAlgorithms) {
    int n = 0;
    for (const Spec& s : gradient_cases()) n += s.algorithm == a;
    EXPECT_GE(n, 4) << relpos::to_string(a);
  }
}

}  // namespace
}  // namespace relpos_test
