// Transformer-XL's sinusoid table of consecutive distances (built by angle
// addition from exact anchor rows, in parallel chunks) against the exact
// sinusoid of every distance, with and without clamp_len. Bound: 1e-12, the
// double tolerance of the algorithm tests (an exact angle of 700 already
// carries ~1e-13 of rounding).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "../../../src/schemes/xl.hpp"
#include "relpos/position.hpp"

namespace relpos {
namespace {

double largest_error(int64_t rmin, int64_t count, int64_t pos_dim, int64_t clamp_len, int threads) {
  std::vector<double> w_r(pos_dim);  // only its shape matters here
  XLParams<double> xl;
  xl.w_r = View3<const double>::contiguous(w_r.data(), {1, 1, pos_dim});
  xl.clamp_len = clamp_len;
  const auto table = XLScheme::KeyEmbedding<double>::sinusoids(xl, rmin, count, threads);
  std::vector<double> exact(pos_dim);
  double error = 0;
  for (int64_t m = 0; m < count; ++m) {
    sinusoid(double(xl_distance(rmin + m, clamp_len)), pos_dim, exact.data());
    for (int64_t e = 0; e < pos_dim; ++e) error = std::max(error, std::abs(table[m * pos_dim + e] - exact[e]));
  }
  return error;
}

TEST(SinusoidTable, ConsecutiveDistancesMatchExactSinusoids) {
  for (int threads : {1, 2})
    for (int64_t clamp : {0, 5, 100}) {
      EXPECT_LT(largest_error(-700, 1401, 512, clamp, threads), 1e-12) << "clamp " << clamp << " threads " << threads;
      EXPECT_LT(largest_error(3, 33, 6, clamp, threads), 1e-12) << "clamp " << clamp << " threads " << threads;
    }
  EXPECT_EQ(largest_error(-10, 1, 8, 0, 2), 0.0);  // a single (anchor) row is exact
}

}  // namespace
}  // namespace relpos
