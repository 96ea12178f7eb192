// Every algorithm against the reference (docs/design.md sections 2 and 4),
// on every case of problem.hpp's generator plus the geometries of
// algorithm_cases.hpp (in groups, one test each), every algorithm on each case:
//  * one the rule serves (automatic included) gives out, lse, dq, dk, dv and
//    every positional parameter gradient equal to the reference's to ~1e-12 in
//    double; in float its error against the double reference is at most twice
//    the float reference's (FlashAttention's rule) plus a floor of a few float
//    ulps; resolve_algorithm names it (automatic: the rule's choice, which it
//    then runs bit for bit);
//  * one the rule does not serve throws std::invalid_argument naming
//    'algorithm' from check_algorithm, validate_forward, forward and backward,
//    before writing anything.
// Plus gather and fused at L = 1025 in float.
#include <algorithm>
#include <cmath>
#include <limits>
#include <stdexcept>
#include <string>

#include "algorithm_cases.hpp"

namespace relpos_test {
namespace {

// ---- comparisons ----------------------------------------------------------------

double largest_magnitude(const std::vector<double>& x) {
  double m = 0;
  for (double v : x)
    if (std::isfinite(v)) m = std::max(m, std::abs(v));
  return m;
}

// Double: each element within 1e-12 of the reference, relative to the
// element and to the tensor's largest element (gradients that cancel to ~0).
constexpr double kDoubleTol = 1e-12;

::testing::AssertionResult equals_in_double(const Outcome& actual, const Outcome& expected) {
  if (actual.size() != expected.size()) return ::testing::AssertionFailure() << "different tensors";
  for (std::size_t n = 0; n < actual.size(); ++n) {
    const auto& [name, values] = expected[n];
    if (actual[n].first != name) return ::testing::AssertionFailure() << actual[n].first << " vs " << name;
    const double atol = kDoubleTol * std::max(1.0, largest_magnitude(values));
    if (auto r = all_near(name, actual[n].second, values, atol, kDoubleTol); !r) return r;
  }
  return ::testing::AssertionSuccess();
}

// Largest |x - exact| over a tensor; equal infinities (fully masked rows'
// lse) are exact, any other non-finite value an infinite error.
double max_error(const std::vector<double>& x, const std::vector<double>& exact) {
  double e = 0;
  for (std::size_t n = 0; n < x.size(); ++n) {
    if (std::isinf(exact[n]) && x[n] == exact[n]) continue;
    const double d = std::abs(x[n] - exact[n]);
    e = std::isfinite(d) ? std::max(e, d) : std::numeric_limits<double>::infinity();
  }
  return e;
}

// Float: err(algorithm) <= 2 err(float reference) + floor, both against the
// double reference; the floor, a few float ulps of the tensor's scale, covers
// tensors the float reference gets exactly (zeros, L = 1).
constexpr double kFloatFloorUlps = 4 * std::numeric_limits<float>::epsilon();

::testing::AssertionResult float_error_within_twice_reference(const Outcome& algorithm, const Outcome& float_reference,
                                                              const Outcome& exact) {
  if (algorithm.size() != exact.size() || float_reference.size() != exact.size())
    return ::testing::AssertionFailure() << "different tensors";
  for (std::size_t n = 0; n < exact.size(); ++n) {
    const auto& [name, values] = exact[n];
    if (algorithm[n].second.size() != values.size())
      return ::testing::AssertionFailure() << name << ": " << algorithm[n].second.size() << " values";
    const double err = max_error(algorithm[n].second, values);
    const double ref_err = max_error(float_reference[n].second, values);
    const double floor = kFloatFloorUlps * std::max(1.0, largest_magnitude(values));
    if (!(err <= 2 * ref_err + floor))
      return ::testing::AssertionFailure() << name << ": float error " << err << " > 2 x float reference error "
                                           << ref_err << " + " << floor;
  }
  return ::testing::AssertionSuccess();
}

Spec as_reference(Spec s) {
  s.algorithm = Algorithm::reference;
  return s;
}

// ---- every algorithm on every case ------------------------------------------------

// The call throws std::invalid_argument whose message contains "algorithm".
template <class Call>
::testing::AssertionResult refused(Call call) {
  try {
    call();
  } catch (const std::invalid_argument& e) {
    if (std::string(e.what()).find("algorithm") != std::string::npos) return ::testing::AssertionSuccess();
    return ::testing::AssertionFailure() << "message does not name 'algorithm': " << e.what();
  } catch (const std::exception& e) {
    return ::testing::AssertionFailure() << "threw something else: " << e.what();
  }
  return ::testing::AssertionFailure() << "did not throw";
}

// An algorithm the rule does not serve: check_algorithm, validate_forward,
// forward and backward all refuse, and neither call writes anything.
void expect_refused(const Spec& spec) {
  Problem<double> p(spec);
  const relpos::AttentionForward<double> args = p.forward_args();
  EXPECT_TRUE(refused([&] { relpos::check_algorithm(args); }));
  EXPECT_TRUE(refused([&] { relpos::validate_forward(args); }));
  EXPECT_TRUE(refused([&] { relpos::attention_forward(args); }));
  EXPECT_TRUE(refused([&] { relpos::attention_backward(p.backward_args()); }));
  for (double x : p.out.values()) ASSERT_TRUE(std::isnan(x)) << "forward wrote out before refusing";
  for (double x : p.lse.values()) ASSERT_TRUE(std::isnan(x)) << "forward wrote lse before refusing";
  for (Param<double>& param : p.params())
    for (double* g : param.grad) ASSERT_EQ(*g, 0.0) << "backward wrote d" << param.name << " before refusing";
}

// A served algorithm: resolves as the rule says, and forward + backward equal
// the reference in double and within the float rule.
void expect_equals_reference(const Spec& spec, const Outcome& exact, const Outcome& float_reference) {
  Problem<double> p(spec);
  const Algorithm resolved = spec.algorithm == Algorithm::automatic ? automatic_choice(spec) : spec.algorithm;
  EXPECT_NO_THROW(relpos::check_algorithm(p.forward_args()));
  EXPECT_EQ(relpos::resolve_algorithm(p.forward_args()), resolved);
  const Outcome actual = run_forward_backward(p);
  EXPECT_TRUE(equals_in_double(actual, exact));
  EXPECT_TRUE(p.outputs_padding_untouched()) << "wrote between the rows of a strided output";
  Problem<float> pf(spec);
  EXPECT_TRUE(float_error_within_twice_reference(run_forward_backward(pf), float_reference, exact));
  if (spec.algorithm == Algorithm::automatic) {  // automatic runs what it resolves to, bit for bit
    Spec explicit_spec = spec;
    explicit_spec.algorithm = resolved;
    Problem<double> explicit_run(explicit_spec);
    EXPECT_TRUE(same_outcome(actual, run_forward_backward(explicit_run), 0, 0))
        << "automatic does not run " << relpos::to_string(resolved);
  }
}

class EveryAlgorithm : public ::testing::TestWithParam<CaseGroup> {};

TEST_P(EveryAlgorithm, ServedOnesEqualTheReferenceTheOthersThrow) {
  for (const Spec& c : GetParam().cases) {
    Problem<double> exact(as_reference(c));
    Problem<float> float_reference(as_reference(c));
    const Outcome e = run_forward_backward(exact), fe = run_forward_backward(float_reference);
    for (Algorithm a : every_algorithm()) {
      if (a == Algorithm::reference) continue;
      const Spec spec = with_algorithm(c, a);
      SCOPED_TRACE(spec.label);
      if (serves(a, spec))
        expect_equals_reference(spec, e, fe);
      else
        expect_refused(spec);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(AllCases, EveryAlgorithm, ::testing::ValuesIn(algorithm_problem_groups()), group_name);

// available_algorithms (the capability table, nothing run) lists exactly the
// algorithms the rule serves, automatic excluded, in the enum's order, and
// writes nothing.
TEST(AvailableAlgorithms, ListExactlyTheServedOnes) {
  int cases = 0;
  for (const CaseGroup& g : algorithm_problem_groups())
    for (const Spec& c : g.cases) {
      std::vector<Algorithm> expected;
      for (Algorithm a : every_algorithm())
        if (a != Algorithm::automatic && serves(a, c)) expected.push_back(a);
      Problem<double> p(c);
      EXPECT_EQ(relpos::available_algorithms(p.forward_args()), expected) << c.label;
      for (double x : p.out.values()) ASSERT_TRUE(std::isnan(x)) << c.label << ": wrote out";
      ++cases;
    }
  EXPECT_GE(cases, 100);
}

// An invalid call is refused naming its problem, not answered with a list.
TEST(AvailableAlgorithms, RefuseAnInvalidCall) {
  Spec s;
  s.scheme = Scheme::kerple;
  Problem<double> p(s);
  p.kerple_r2(0) = -1;
  try {
    relpos::available_algorithms(p.forward_args());
    FAIL() << "accepted a negative kerple.r2";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("kerple.r2"), std::string::npos) << e.what();
  }
}

// Heads run in parallel: with 2 and 4 threads every served algorithm gives
// the single-threaded result, for every scheme variant over B x H = 6 heads
// (4 threads: an uneven split), causal with key padding (skew and rel-shift
// serve it), without and with dropout. One head split over its query tiles:
// fused_multi_tile_test.cpp.
TEST(EveryAlgorithmThreaded, ThreadCountDoesNotChangeTheResult) {
  std::vector<Spec> cases;
  for (const Spec& variant : scheme_variants()) {
    cases.push_back(with_mask_and_geometry(variant, masks()[3], geometries()[0]));
    cases.push_back(with_dropout(cases.back()));
  }
  for (const Spec& c : cases) {
    for (Algorithm a : every_algorithm()) {
      if (!serves(a, c)) continue;
      Spec spec = with_algorithm(c, a);
      SCOPED_TRACE(spec.label);
      spec.num_threads = 1;
      Problem<double> one(spec);
      const Outcome expected = run_forward_backward(one);
      for (int threads : {2, 4}) {
        spec.num_threads = threads;
        Problem<double> many(spec);
        EXPECT_TRUE(equals_in_double(run_forward_backward(many), expected)) << threads << " threads";
      }
    }
  }
}

// The extra geometries reach the algorithms they were made for.
TEST(AlgorithmCases, SkewAndRelshiftAreExercisedOnManyCases) {
  int skew = 0, relshift = 0, skew_refused_equal_lengths = 0;
  for (const CaseGroup& g : algorithm_problem_groups())
    for (const Spec& s : g.cases) {
      skew += serves(Algorithm::skew, s);
      relshift += serves(Algorithm::relshift, s);
      skew_refused_equal_lengths +=
          s.scheme == Scheme::shaw && s.causal() && s.Lq == s.Lk && !serves(Algorithm::skew, s);
    }
  EXPECT_GE(skew, 30);
  EXPECT_GE(relshift, 10);
  EXPECT_GE(skew_refused_equal_lengths, 1);
}

// The rule itself, on a few literal calls (a check of the test's encoding).
TEST(AlgorithmRule, LiteralExamples) {
  Spec s;
  s.scheme = Scheme::shaw;
  s.mask = MaskKind::causal_padding;
  EXPECT_TRUE(serves(Algorithm::skew, s));
  s.q_offset = 1, s.k_offset = 1;
  EXPECT_TRUE(serves(Algorithm::skew, s));
  s.k_offset = 0;
  EXPECT_FALSE(serves(Algorithm::skew, s));
  s.scheme = Scheme::xl;
  s.mask = MaskKind::causal;
  s.Lq = 7, s.Lk = 12, s.q_offset = 5, s.k_offset = 0;
  EXPECT_TRUE(serves(Algorithm::relshift, s));
  s.mask = MaskKind::padding;
  EXPECT_FALSE(serves(Algorithm::relshift, s));
  EXPECT_TRUE(serves(Algorithm::generalized_skew, s));
  EXPECT_TRUE(serves(Algorithm::fused, s));
  EXPECT_FALSE(serves(Algorithm::gather, s));
  EXPECT_EQ(automatic_choice(s), Algorithm::fused);
  s.scheme = Scheme::t5;
  EXPECT_TRUE(serves(Algorithm::gather, s));
  EXPECT_FALSE(serves(Algorithm::split, s));
}

// ---- long sequence -----------------------------------------------------------------

// Gather and fused at L = 1025 (the longest odd shape of docs/design.md 4.1), Shaw K+V
// with the window well inside the sequence, causal with key padding, in float.
// The reference they are measured against materialises (L, L, d + dv).
TEST(AlgorithmLongSequence, GatherAndFusedAtL1025InFloat) {
  Spec s;
  s.label = "shaw_L1025";
  s.scheme = Scheme::shaw;
  s.mask = MaskKind::causal_padding;
  s.B = 1, s.H = 1, s.Lq = s.Lk = 1025, s.d = 16, s.dv = 4, s.shaw_k = 16;
  Problem<double> exact(as_reference(s));
  Problem<float> reference(as_reference(s));
  const Outcome e = run_forward_backward(exact), fe = run_forward_backward(reference);
  for (Algorithm a : {Algorithm::gather, Algorithm::fused}) {
    SCOPED_TRACE(relpos::to_string(a));
    s.algorithm = a;
    Problem<float> p(s);
    EXPECT_TRUE(float_error_within_twice_reference(run_forward_backward(p), fe, e));
  }
}

}  // namespace
}  // namespace relpos_test
