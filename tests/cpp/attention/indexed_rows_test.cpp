// An indexed table's row per distance cut into runs, and the fused kernel's
// picks through them (src/attention/indexed_rows.hpp), against a load and a
// store per pair: DeBERTa's maps (exact, log and edge buckets, c2p rising and
// p2c falling), maps with jumps and short runs, windows starting inside a
// run, in float32 and float64.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "../../../src/attention/indexed_rows.hpp"
#include "relpos/position.hpp"

namespace relpos::fused {
namespace {

// DeBERTa's table row of each distance index from -(count / 2) on, c2p's or
// (by_key) p2c's: clamp(bucket(+-r) + span, 0, 2 span - 1).
std::vector<int32_t> deberta_rows(int64_t count, int64_t buckets, int64_t max_relative, bool by_key) {
  const int64_t span = buckets > 0 ? buckets : max_relative;
  std::vector<int32_t> rows(count);
  for (int64_t m = 0; m < count; ++m) {
    const int64_t r = m - count / 2, bucket = deberta_bucket(by_key ? -r : r, buckets, max_relative);
    rows[m] = int32_t(std::clamp<int64_t>(bucket + span, 0, 2 * span - 1));
  }
  return rows;
}

// Rows with jumps of 2 and more, runs of every length from 1 to 12, rising and falling.
std::vector<int32_t> ragged_rows(int64_t count, uint32_t seed) {
  std::mt19937 gen(seed);
  std::vector<int32_t> rows(count);
  int32_t row = 40;
  for (int64_t m = 0; m < count;) {
    const int64_t length = 1 + int64_t(gen() % 12), step = int64_t(gen() % 5) - 2;  // -2 .. 2
    for (int64_t u = 0; u < length && m < count; ++u, ++m) {
      rows[m] = row;
      row = std::clamp<int32_t>(row + int32_t(step), 0, 79);
    }
  }
  return rows;
}

template <class T>
std::vector<T> random_values(int64_t n, uint32_t seed) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<double> u(-1.0, 1.0);
  std::vector<T> x(n);
  for (T& v : x) v = T(u(gen));
  return x;
}

// Agreement of one sum of a few products: float32 rounds each, the vector
// loops in another order.
template <class T>
void expect_close(const std::vector<T>& got, const std::vector<double>& want, const std::string& what) {
  const double tolerance = std::is_same_v<T, float> ? 1e-5 : 1e-13;
  ASSERT_EQ(got.size(), want.size());
  for (std::size_t i = 0; i < got.size(); ++i)
    ASSERT_NEAR(double(got[i]), want[i], tolerance * (1.0 + std::abs(want[i]))) << what << " at " << i;
}

template <class T>
void check_row_picks(const std::vector<int32_t>& rows, int64_t nb, const std::string& name) {
  const RowRuns runs(relpos::Scratch<int32_t>(rows.begin(), rows.end()));
  const int64_t count = int64_t(rows.size());
  const std::vector<T> R = random_values<T>(nb, 7), in = random_values<T>(count, 8);
  const T alpha = T(0.75);
  for (const auto& [m, n] : {std::pair<int64_t, int64_t>{0, count}, {3, count - 3}, {count / 2 - 5, 37}, {1, 1}}) {
    if (m < 0 || n < 1 || m + n > count) continue;  // a window the map is too short for
    const std::string what = name + " m " + std::to_string(m) + " n " + std::to_string(n);
    std::vector<T> out = random_values<T>(n, 9), dR = random_values<T>(nb, 10);
    std::vector<double> want_out(out.begin(), out.end()), want_dR(dR.begin(), dR.end());
    for (int64_t t = 0; t < n; ++t) {
      want_out[t] += double(alpha) * double(R[rows[m + t]]);
      want_dR[rows[m + t]] += double(alpha) * double(in[t]);
    }
    add_picks(runs, m, n, R.data(), nb, alpha, out.data());
    sum_picks(runs, m, n, in.data(), alpha, dR.data());
    expect_close(out, want_out, "add_picks " + what);
    expect_close(dR, want_dR, "sum_picks " + what);
  }
}

// A tile (bq, bk) whose pair (ii, jj) sits at distance index m0 + (bq - 1 - ii) + jj.
template <class T>
void check_key_picks(const std::vector<int32_t>& rows, int64_t nb, int64_t bq, int64_t bk, int64_t m0,
                     const std::string& name) {
  const RowRuns runs(relpos::Scratch<int32_t>(rows.begin(), rows.end()));
  const std::vector<T> Rk = random_values<T>(bk * nb, 11), dS = random_values<T>(bq * bk, 12);
  std::vector<T> S = random_values<T>(bq * bk, 13), dRk = random_values<T>(bk * nb, 14);
  std::vector<double> want_S(S.begin(), S.end()), want_dRk(dRk.begin(), dRk.end());
  const T alpha = T(-1.25);
  for (int64_t ii = 0; ii < bq; ++ii)
    for (int64_t jj = 0; jj < bk; ++jj) {
      const int64_t row = rows[m0 + (bq - 1 - ii) + jj];
      want_S[ii * bk + jj] += double(alpha) * double(Rk[jj * nb + row]);
      want_dRk[jj * nb + row] += double(alpha) * double(dS[ii * bk + jj]);
    }
  Scratch<T> by_key;
  add_key_picks(runs, m0, Rk.data(), nb, bq, bk, alpha, S.data(), by_key);
  sum_key_picks(runs, m0, dS.data(), bq, bk, alpha, dRk.data(), nb, by_key);
  const std::string what = name + " tile " + std::to_string(bq) + " x " + std::to_string(bk);
  expect_close(S, want_S, "add_key_picks " + what);
  expect_close(dRk, want_dRk, "sum_key_picks " + what);
}

template <class T>
void check_every_map() {
  // DeBERTa-v3's 256 buckets to 512 over distances -1000..1000 (exact, log, edge); 8 buckets to 20; no buckets.
  for (const bool by_key : {false, true}) {
    const std::string side = by_key ? "p2c " : "c2p ";
    check_row_picks<T>(deberta_rows(2001, 256, 512, by_key), 512, side + "256/512");
    check_row_picks<T>(deberta_rows(301, 8, 20, by_key), 16, side + "8/20");
    check_row_picks<T>(deberta_rows(301, -1, 64, by_key), 128, side + "none/64");
    // Tiles of 1 to 300 keys (several chunks of tiles::kKeyPickChunk) at the diagonal and far from it.
    const std::vector<int32_t> rows = deberta_rows(2001, 256, 512, by_key);
    for (const auto& [bq, bk, m0] : {std::tuple<int64_t, int64_t, int64_t>{128, 128, 873}, {16, 300, 100},
                                     {7, 1, 0}, {128, 257, 1500}, {33, 130, 600}, {16, 300, 1680}})
      check_key_picks<T>(rows, 512, bq, bk, m0, side + "256/512");
    // Tiles of one row (past the last bucket) and tiles ending at, or one past, the edge run's end.
    for (int64_t m0 = 470; m0 <= 500; ++m0) check_key_picks<T>(rows, 512, 8, 9, m0, side + "edge run");
    for (int64_t m0 = 1490; m0 <= 1520; ++m0) check_key_picks<T>(rows, 512, 9, 8, m0, side + "edge run");
  }
  // Maps shorter than a long run, and of one distance.
  check_row_picks<T>(deberta_rows(7, 8, 20, false), 16, "7 distances");
  check_row_picks<T>({3}, 4, "1 distance");
  for (const uint32_t seed : {1u, 2u, 3u}) {
    check_row_picks<T>(ragged_rows(400, seed), 80, "ragged " + std::to_string(seed));
    check_key_picks<T>(ragged_rows(400, seed), 80, 64, 200, 90, "ragged " + std::to_string(seed));
  }
}

TEST(IndexedRows, PicksAndSumsAgreeWithOnePairAtATimeFloat) { check_every_map<float>(); }
TEST(IndexedRows, PicksAndSumsAgreeWithOnePairAtATimeDouble) { check_every_map<double>(); }

}  // namespace
}  // namespace relpos::fused
