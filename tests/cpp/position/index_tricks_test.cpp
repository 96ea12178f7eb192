// Each index trick of docs/design.md section 2 worked out by hand on a 4 x 4 (or
// 2 x 4) problem, with the numbers written out below, then checked through the
// public API. The problems are engineered so the output reveals the softmax:
// B = H = 1, d = 1, every key zero (q . k = 0, so the logits are the relative
// term alone) and v = identity (dv = Lk, so out_i = P_i and
// logits_ij = log out_ij + lse_i). Every algorithm that serves an example
// must reproduce its numbers.
#include <cmath>
#include <limits>

#include "algorithm_cases.hpp"
#include "relpos/position.hpp"

namespace relpos_test {
namespace {

using Matrix = std::vector<std::vector<double>>;
constexpr double kMasked = -std::numeric_limits<double>::infinity();

// One head, d = 1, the given queries, zero keys, v = identity; positional
// parameters are set by the caller.
Problem<double> tiny(Spec s, const std::vector<double>& q) {
  s.B = s.H = 1, s.Lq = int64_t(q.size()), s.d = 1, s.dv = s.Lk;
  Problem<double> p(s);
  for (int64_t i = 0; i < s.Lq; ++i) p.q(0, 0, i, 0) = q[i];
  p.k.fill(0);
  for (int64_t j = 0; j < s.Lk; ++j)
    for (int64_t c = 0; c < s.Lk; ++c) p.v(0, 0, j, c) = j == c ? 1 : 0;
  return p;
}

Spec shaw_spec(ShawTables tables, int64_t k, int64_t lk, double scale) {
  Spec s;
  s.scheme = Scheme::shaw, s.shaw_tables = tables, s.shaw_k = k, s.Lk = lk, s.scale = scale;
  return s;
}

void set_table(Tensor<double, 3>& table, const Matrix& rows) {
  for (std::size_t c = 0; c < rows.size(); ++c)
    for (std::size_t x = 0; x < rows[c].size(); ++x) table(0, c, x) = rows[c][x];
}

// Runs p with every algorithm that serves it and checks that the logits it
// reveals are scale * expected (kMasked: P = 0) and lse the given values.
void expect_logits(Problem<double>& p, const Matrix& expected, double scale, const std::vector<double>& lse) {
  for (Algorithm a : every_algorithm()) {
    if (!serves(a, p.spec)) continue;
    SCOPED_TRACE(relpos::to_string(a));
    p.spec.algorithm = a;
    p.forward();
    for (int64_t i = 0; i < p.spec.Lq; ++i) {
      EXPECT_NEAR(p.lse(0, 0, i), lse[i], 1e-12) << "row " << i;
      for (int64_t j = 0; j < p.spec.Lk; ++j) {
        const double P = p.out(0, 0, i, j);
        if (expected[i][j] == kMasked) {
          EXPECT_EQ(P, 0.0) << "(" << i << ", " << j << ") is masked";
        } else {
          EXPECT_NEAR(std::log(P) + p.lse(0, 0, i), scale * expected[i][j], 1e-12) << "(" << i << ", " << j << ")";
        }
      }
    }
  }
}

// (a) Gather. Shaw K-only, k = 1, Lq = Lk = 4, offsets 0: r_ij = j - i and
// c(r) = clip(r, -1, 1) + 1 indexes wk = [-1, 0.5, 2] (r <= -1, r = 0, r >= 1):
//
//   c(r_ij) = | 1 2 2 2 |     R = q wk^T (4 x 3), q = [1, 2, -1, 0.5]:  | -1    0.5   2   |
//             | 0 1 2 2 |                                               | -2    1     4   |
//             | 0 0 1 2 |                                               |  1   -0.5  -2   |
//             | 0 0 0 1 |                                               | -0.5  0.25  1   |
//
// S_ij = R[i, c(r_ij)]:  | 0.5   2     2     2    |
//                        | -2    1     4     4    |
//                        | 1     1    -0.5  -2    |
//                        | -0.5 -0.5  -0.5   0.25 |
// lse_0 = log(e^0.5 + 3 e^2) = 3.17035298679863, lse_1 = log(e^-2 + e + 2 e^4) = 4.718944461094357,
// lse_2 = log(2e + e^-0.5 + e^-2) = 1.82106412912434, lse_3 = log(3 e^-0.5 + e^0.25) = 1.13256833306952.
TEST(IndexTricks, GatherOfTheClippedTableRows) {
  const std::vector<std::vector<int64_t>> clip_index = {{1, 2, 2, 2}, {0, 1, 2, 2}, {0, 0, 1, 2}, {0, 0, 0, 1}};
  for (int64_t i = 0; i < 4; ++i)
    for (int64_t j = 0; j < 4; ++j) EXPECT_EQ(relpos::shaw_index(j - i, 1, Beyond::clip), clip_index[i][j]);

  Problem<double> p = tiny(shaw_spec(ShawTables::k_only, 1, 4, 1.0), {1, 2, -1, 0.5});
  set_table(p.shaw_wk, {{-1}, {0.5}, {2}});
  const Matrix gathered = {{0.5, 2, 2, 2}, {-2, 1, 4, 4}, {1, 1, -0.5, -2}, {-0.5, -0.5, -0.5, 0.25}};
  expect_logits(p, gathered, 1.0, {3.17035298679863, 4.718944461094357, 1.82106412912434, 1.13256833306952});
}

// (b) Bucket sums of the value term. Shaw V-only, k = 1, wv = identity (3 x 3),
// v = 0, q = 1 and k_j = log(j + 1), so logits_ij = log(j + 1) and every
// unmasked row's P is proportional to [1, 2, 3, 4]. out_i = sum_j P_ij wv[c(r_ij)]
// = Pb[i, :], the row's probabilities summed per table row c (c(r_ij) as in (a)):
//   no mask, P_i = [.1 .2 .3 .4]: Pb_0 = [0, .1, .2+.3+.4] = [0, .1, .9]
//                                 Pb_1 = [.1, .2, .7],  Pb_2 = [.1+.2, .3, .4] = [.3, .3, .4],  Pb_3 = [.6, .4, 0]
//   causal: P_0 = [1], P_1 = [1 2]/3, P_2 = [1 2 3]/6, P_3 = [1 2 3 4]/10:
//           Pb_0 = [0, 1, 0], Pb_1 = [1/3, 2/3, 0], Pb_2 = [1/2, 1/2, 0], Pb_3 = [.6, .4, 0]
// lse_i = log of the row's sum: log 10 unmasked; log 1, log 3, log 6, log 10 causal.
TEST(IndexTricks, BucketSumsOfTheValueTerm) {
  struct Case {
    MaskKind mask;
    Matrix bucket_sums;
    std::vector<double> lse;
  };
  const double ln10 = 2.302585092994046;
  const Case cases[] = {
      {MaskKind::none, {{0, .1, .9}, {.1, .2, .7}, {.3, .3, .4}, {.6, .4, 0}}, {ln10, ln10, ln10, ln10}},
      {MaskKind::causal,
       {{0, 1, 0}, {1. / 3, 2. / 3, 0}, {.5, .5, 0}, {.6, .4, 0}},
       {0, 1.0986122886681098, 1.791759469228055, ln10}},
  };
  for (const Case& c : cases) {
    Spec s = shaw_spec(ShawTables::v_only, 1, 4, 1.0);
    s.mask = c.mask, s.B = s.H = 1, s.d = 1, s.dv = 3;
    Problem<double> p(s);  // not tiny(): v is zero and dv = 3 here
    p.q.fill(1);
    p.v.fill(0);
    for (int64_t j = 0; j < 4; ++j) p.k(0, 0, j, 0) = std::log(double(j + 1));
    set_table(p.shaw_wv, {{1, 0, 0}, {0, 1, 0}, {0, 0, 1}});
    for (Algorithm a : every_algorithm()) {
      if (!serves(a, s)) continue;
      SCOPED_TRACE(std::string(relpos::to_string(a)) + (c.mask == MaskKind::causal ? " causal" : " no mask"));
      p.spec.algorithm = a;
      p.forward();
      for (int64_t i = 0; i < 4; ++i) {
        EXPECT_NEAR(p.lse(0, 0, i), c.lse[i], 1e-12);
        for (int64_t x = 0; x < 3; ++x) EXPECT_NEAR(p.out(0, 0, i, x), c.bucket_sums[i][x], 1e-12) << i << ", " << x;
      }
    }
  }
}

// (c) Music Transformer's skew, L = 4, causal. Shaw K-only with k = 3, so the
// distances -3..0 have rows c = 0..3 of wk = [1, 5, 25, 125] (rows 4..6, the
// future, are 1000 and must never show). q = [1, 2, 3, 4], scale 0.01.
// R[i, m] = q_i wk[m], the score of query i at distance m - 3:
//
//   R = | 1  5  25  125 |   padded (4 x 5) = | 0  1  5   25  125 |
//       | 2  10 50  250 |                    | 0  2  10  50  250 |
//       | 3  15 75  375 |                    | 0  3  15  75  375 |
//       | 4  20 100 500 |                    | 0  4  20  100 500 |
//
// read as (5 x 4): [0 1 5 25 | 125 0 2 10 | 50 250 0 3 | 15 75 375 0 | 4 20 100 500];
// dropping the first row leaves
//
//   skewed = | 125  0   2   10  |   lower triangle: skewed[i][j] = R[i, j - i + 3],
//            | 50   250 0   3   |   e.g. skewed[2][0] = R[2, 1] = 15 (distance -2);
//            | 15   75  375 0   |   the upper triangle is garbage, masked.
//            | 4    20  100 500 |
//
// lse_i = log sum_{j<=i} exp(0.01 skewed[i][j]): 1.25, 2.6269280110429722,
// 3.8242822627211694, 5.033007522128332.
TEST(IndexTricks, MusicTransformerSkew) {
  const Matrix R = {{1, 5, 25, 125}, {2, 10, 50, 250}, {3, 15, 75, 375}, {4, 20, 100, 500}};
  const Matrix padded = {{0, 1, 5, 25, 125}, {0, 2, 10, 50, 250}, {0, 3, 15, 75, 375}, {0, 4, 20, 100, 500}};
  const Matrix skewed = {{125, 0, 2, 10}, {50, 250, 0, 3}, {15, 75, 375, 0}, {4, 20, 100, 500}};
  // The pad-reshape-slice itself, on the numbers above.
  for (int i = 0; i < 4; ++i)
    for (int c = 0; c < 5; ++c) EXPECT_EQ(padded[i][c], c == 0 ? 0 : R[i][c - 1]);
  for (int n = 0; n < 16; ++n) {
    const int flat = 4 + n;  // skip the first row of the (5 x 4) reading
    EXPECT_EQ(skewed[n / 4][n % 4], padded[flat / 5][flat % 5]);
  }
  Matrix expected(4, std::vector<double>(4, kMasked));
  for (int i = 0; i < 4; ++i)
    for (int j = 0; j <= i; ++j) {
      EXPECT_EQ(skewed[i][j], R[i][j - i + 3]);
      expected[i][j] = skewed[i][j];
    }

  Spec s = shaw_spec(ShawTables::k_only, 3, 4, 0.01);
  s.mask = MaskKind::causal;
  Problem<double> p = tiny(s, {1, 2, 3, 4});
  set_table(p.shaw_wk, {{1}, {5}, {25}, {125}, {1000}, {1000}, {1000}});
  ASSERT_TRUE(serves(Algorithm::skew, p.spec));
  expect_logits(p, expected, 0.01, {1.25, 2.6269280110429722, 3.8242822627211694, 5.033007522128332});
}

// (d) Generalized skew, cross-attention Lq = 2, Lk = 4, q_offset = 1,
// k_offset = 0, no mask: r_ij = j - 1 - i, row 0 sees r = -1..2, row 1 r = -2..1.
// E lists the Lq + Lk - 1 = 5 distances r = rmin + m = -2 + m; Shaw K-only with
// k = 2 makes E_m = wk[m] = [1, 5, 25, 125, 625]. q = [1, 2], scale 0.001.
//
//   R = q E^T = | 1  5  25  125  625  |   flat: 1 5 25 125 625 2 10 50 250 1250
//               | 2  10 50  250  1250 |
//
// Pair (i, j) lies on diagonal m = j - i + Lq - 1: the view of R from flat
// element Lq - 1 = 1 with row stride 5 - 1 = 4 reads
//   S = | 5  25  125  625 |   (flat 1..4)
//       | 2  10  50   250 |   (flat 5..8)
// lse_0 = log(e^.005 + e^.025 + e^.125 + e^.625) = 1.6157622817602637,
// lse_1 = log(e^.002 + e^.01 + e^.05 + e^.25) = 1.4695661607709674.
TEST(IndexTricks, GeneralizedSkewDiagonalExtraction) {
  const std::vector<double> R_flat = {1, 5, 25, 125, 625, 2, 10, 50, 250, 1250};
  const Matrix S = {{5, 25, 125, 625}, {2, 10, 50, 250}};
  for (int i = 0; i < 2; ++i)
    for (int j = 0; j < 4; ++j) {
      EXPECT_EQ(S[i][j], R_flat[1 + i * 4 + j]);      // the strided view
      EXPECT_EQ(S[i][j], R_flat[i * 5 + (j - i + 1)]);  // R[i, m(i, j)]
    }
  Spec s = shaw_spec(ShawTables::k_only, 2, 4, 0.001);
  s.q_offset = 1;
  Problem<double> p = tiny(s, {1, 2});
  set_table(p.shaw_wk, {{1}, {5}, {25}, {125}, {625}});
  ASSERT_TRUE(serves(Algorithm::generalized_skew, p.spec));
  expect_logits(p, S, 0.001, {1.6157622817602637, 1.4695661607709674});
}

// (e) Transformer-XL's rel-shift, Lq = 2 queries after a memory of 2: Lk = 4,
// q_offset = 2, k_offset = 0, causal. u = v = 0, pos_dim = 2, so R(p) =
// [sin p, cos p] and W_R = [0 1] makes the positional embedding cos p, p = -r
// = 2 + i - j. q = [1, 2], scale 1. BD[i, c] = q_i cos(3 - c), column c the
// distance Lk - 1 - c back (cos 1 = 0.5403023058681398,
// cos 2 = -0.4161468365471424, cos 3 = -0.9899924966004454):
//
//   BD = | cos3   cos2   cos1   1 |   padded (2 x 5) = | 0 cos3  cos2  cos1  1 |
//        | 2cos3  2cos2  2cos1  2 |                    | 0 2cos3 2cos2 2cos1 2 |
//
// read from flat element Lq = 2 on as (2 x 4):
//   shifted = | cos2   cos1   1      0 |   row 0 (position 2): p = 2, 1, 0, key 3 masked
//             | 2cos3  2cos2  2cos1  2 |   row 1 (position 3): p = 3, 2, 1, 0
// lse_0 = log(e^cos2 + e^cos1 + e) = 1.6281401188874338,
// lse_1 = log(e^2cos3 + e^2cos2 + e^2cos1 + e^2) = 2.389554967433139.
TEST(IndexTricks, TransformerXLRelShift) {
  const double c1 = 0.5403023058681398, c2 = -0.4161468365471424, c3 = -0.9899924966004454;
  EXPECT_NEAR(std::cos(1.0), c1, 1e-16);
  EXPECT_NEAR(std::cos(2.0), c2, 1e-16);
  EXPECT_NEAR(std::cos(3.0), c3, 1e-16);
  const Matrix BD = {{c3, c2, c1, 1}, {2 * c3, 2 * c2, 2 * c1, 2}};
  const Matrix shifted = {{c2, c1, 1, 0}, {2 * c3, 2 * c2, 2 * c1, 2}};
  for (int n = 0; n < 8; ++n) {
    const int flat = 2 + n;  // in the padded (2 x 5) buffer
    const double padded = flat % 5 == 0 ? 0 : BD[flat / 5][flat % 5 - 1];
    EXPECT_EQ(shifted[n / 4][n % 4], padded);
  }
  Spec s;
  s.scheme = Scheme::xl, s.mask = MaskKind::causal, s.Lk = 4, s.q_offset = 2, s.scale = 1.0, s.xl_pos_dim = 2;
  Problem<double> p = tiny(s, {1, 2});
  p.xl_u.fill(0), p.xl_v.fill(0);
  p.xl_w_r(0, 0, 0) = 0, p.xl_w_r(0, 0, 1) = 1;
  ASSERT_TRUE(serves(Algorithm::relshift, p.spec));
  const Matrix expected = {{c2, c1, 1, kMasked}, {2 * c3, 2 * c2, 2 * c1, 2}};
  expect_logits(p, expected, 1.0, {1.6281401188874338, 2.389554967433139});
}

}  // namespace
}  // namespace relpos_test
