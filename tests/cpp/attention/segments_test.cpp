// Segments (q_segments, k_segments: a query sees the keys of its own segment)
// beyond the cases every algorithm runs (algorithm_cases.hpp's segment cases,
// the oracle, central differences, multi-tile): a key or value that is not
// finite is refused by name beside segments, a padded one is not; a row whose
// segment has no key it may see outputs zeros and lse -inf, as a fully
// masked row, and is not taken for an overflow.
#include <cmath>
#include <limits>
#include <stdexcept>
#include <string>

#include "problem.hpp"

namespace relpos_test {
namespace {

Spec packed(relpos::Algorithm a) {
  Spec s;
  s.label = "packed";
  s.Lq = s.Lk = 9, s.segment_length = 4, s.mask = MaskKind::causal, s.algorithm = a;
  return s;
}

TEST(Segments, AKeyThatIsNotFiniteIsRefusedUnlessPadded) {
  for (relpos::Algorithm a : {relpos::Algorithm::reference, relpos::Algorithm::fused}) {
    Problem<float> p(packed(a));
    p.v(1, 2, 5, 0) = std::numeric_limits<float>::infinity();
    try {
      p.forward();
      ADD_FAILURE() << "accepted an infinite value beside segments";
    } catch (const std::invalid_argument& e) {
      EXPECT_EQ(std::string(e.what()).rfind("relpos: k, v: key 5 of batch row 1", 0), 0u) << e.what();
    }
    Spec padded = packed(a);
    padded.mask = MaskKind::causal_padding;  // key j of batch row b is padded where (j + b) % 3 == 2: key 4 of row 1
    Problem<float> q(padded);
    q.k(1, 0, 4, 2) = std::numeric_limits<float>::quiet_NaN();
    q.forward();
    for (double x : q.out.values()) ASSERT_TRUE(std::isfinite(x));
  }
}

TEST(Segments, ARowWhoseSegmentShowsItNoKeyIsZero) {
  for (relpos::Algorithm a : {relpos::Algorithm::reference, relpos::Algorithm::fused}) {
    Spec s = packed(a);
    s.mask = MaskKind::none;
    Problem<float> p(s);
    for (int64_t b = 0; b < s.B; ++b)  // segments no key is in
      for (int64_t i = 0; i < s.Lq; ++i) p.q_segments(b, i) = 100 + int32_t(i);
    p.forward();
    for (double x : p.lse.values()) EXPECT_EQ(x, -std::numeric_limits<double>::infinity());
    for (double x : p.out.values()) EXPECT_EQ(x, 0.0);
    p.backward();
    for (double x : p.dq.values()) EXPECT_EQ(x, 0.0);
  }
}

}  // namespace
}  // namespace relpos_test
