// Fully masked rows, in float and double, for every scheme variant: a query
// row that sees no key outputs exactly zero with lse = -inf, receives exactly
// zero gradients, gives none to keys it cannot see, and puts no NaN anywhere.
// Two ways to get such rows: key padding masking every key of batch 0, and a
// causal mask with queries placed before the first key (q_offset < k_offset).
#include <cmath>
#include <limits>

#include "oracle.hpp"
#include "problem.hpp"

namespace relpos_test {
namespace {

std::vector<Spec> masked_row_cases() {
  std::vector<Spec> out;
  for (Spec s : scheme_variants()) {
    Spec padded = s;
    padded.mask = MaskKind::all_keys_of_batch0;
    padded.label += "__all_keys_of_batch0_padded";
    out.push_back(padded);
    Spec early = s;
    early.mask = MaskKind::causal;
    early.Lq = 5, early.Lk = 3, early.q_offset = 1, early.k_offset = 4;  // rows 0-2 see no key
    early.layout = Layout::strided;
    early.label += "__causal_queries_before_keys";
    out.push_back(early);
  }
  return out;
}

int64_t keys_seen(const Spec& s, int64_t b, int64_t i) {
  int64_t n = 0;
  for (int64_t j = 0; j < s.Lk; ++j) n += !oracle::masked(s, b, i, j);
  return n;
}

bool key_seen_by_no_row(const Spec& s, int64_t b, int64_t j) {
  for (int64_t i = 0; i < s.Lq; ++i)
    if (!oracle::masked(s, b, i, j)) return false;
  return true;
}

template <class T>
void check_fully_masked_rows(const Spec& spec) {
  SCOPED_TRACE(sizeof(T) == 4 ? "float" : "double");
  Problem<T> p(spec);
  p.forward();
  p.fill_grads(T(0));
  p.backward();
  int64_t masked_rows = 0, open_rows = 0;
  for (int64_t b = 0; b < spec.B; ++b)
    for (int64_t h = 0; h < spec.H; ++h)
      for (int64_t i = 0; i < spec.Lq; ++i) {
        const bool none = keys_seen(spec, b, i) == 0;
        (none ? masked_rows : open_rows)++;
        if (none) {
          EXPECT_EQ(p.lse(b, h, i), -std::numeric_limits<T>::infinity()) << b << "," << h << "," << i;
        } else {
          EXPECT_TRUE(std::isfinite(p.lse(b, h, i))) << b << "," << h << "," << i;
        }
        double dq_norm = 0;
        for (int64_t x = 0; x < spec.d; ++x) {
          EXPECT_TRUE(std::isfinite(p.dq(b, h, i, x)));
          if (none) {
            EXPECT_EQ(p.dq(b, h, i, x), T(0)) << "dq of a fully masked row";
          }
          dq_norm += std::abs(double(p.dq(b, h, i, x)));
        }
        // (a row that sees one key has softmax 1 whatever q is: its dq is zero too)
        if (keys_seen(spec, b, i) >= 2) {
          EXPECT_GT(dq_norm, 0.0) << "an open row got no gradient";
        }
        for (int64_t x = 0; x < spec.dv; ++x) {
          EXPECT_TRUE(std::isfinite(p.out(b, h, i, x)));
          if (none) {
            EXPECT_EQ(p.out(b, h, i, x), T(0)) << "out of a fully masked row";
          }
        }
      }
  ASSERT_GT(masked_rows, 0) << "the case has no fully masked row";
  ASSERT_GT(open_rows, 0);
  for (int64_t b = 0; b < spec.B; ++b)
    for (int64_t h = 0; h < spec.H; ++h)
      for (int64_t j = 0; j < spec.Lk; ++j) {
        if (!key_seen_by_no_row(spec, b, j)) continue;
        for (int64_t x = 0; x < spec.d; ++x) EXPECT_EQ(p.dk(b, h, j, x), T(0)) << "dk of a key no row sees";
        for (int64_t x = 0; x < spec.dv; ++x) EXPECT_EQ(p.dv(b, h, j, x), T(0)) << "dv of a key no row sees";
      }
  for (Param<T>& param : p.params())
    for (T* g : param.grad) EXPECT_TRUE(std::isfinite(*g)) << "d" << param.name;
}

class FullyMaskedRows : public ::testing::TestWithParam<Spec> {};

TEST_P(FullyMaskedRows, OutputZeroLseMinusInfinityGradientsZeroNoNaN) {
  check_fully_masked_rows<double>(GetParam());
  check_fully_masked_rows<float>(GetParam());
}

INSTANTIATE_TEST_SUITE_P(AllSchemes, FullyMaskedRows, ::testing::ValuesIn(masked_row_cases()), spec_name);

// The same rows in double agree with the independent oracle, so the open rows
// around them are not merely finite but right.
TEST_P(FullyMaskedRows, OpenRowsMatchTheOracle) {
  Problem<double> p(GetParam());
  p.forward();
  const oracle::Result expected = oracle::attention(p);
  EXPECT_TRUE(all_near("out", p.out.values(), expected.out, 1e-12, 1e-12));
  EXPECT_TRUE(all_near("lse", p.lse.values(), expected.lse, 1e-12, 1e-12));
}

}  // namespace
}  // namespace relpos_test
