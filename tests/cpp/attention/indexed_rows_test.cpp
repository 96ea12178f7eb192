// An indexed table's row per distance and its runs, and the fused kernel's
// picks and sums of a tile's pairs through them by distance
// (src/attention/indexed_rows.hpp), against a load and a store per pair, and
// the rows a tile of columns reaches, against its pairs:
// DeBERTa's maps (exact, log and edge buckets, c2p rising and p2c falling),
// maps with jumps and short runs, tiles starting inside a run, each term alone
// and both, in float32 and float64.
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

// A RowRuns' single_row against the rows themselves, for every window of up to 40 distances.
void check_single_row(const std::vector<int32_t>& rows, const std::string& name) {
  const RowRuns runs(relpos::Scratch<int32_t>(rows.begin(), rows.end()));
  const int64_t count = int64_t(rows.size());
  for (int64_t m = 0; m < count; ++m)
    for (int64_t n = 1; n <= 40 && m + n <= count; ++n) {
      const bool one = std::all_of(rows.begin() + m, rows.begin() + m + n, [&](int32_t r) { return r == rows[m]; });
      ASSERT_EQ(runs.single_row(m, n), one ? rows[m] : -1) << name << " m " << m << " n " << n;
    }
}

// A tile (bq, bk; its rows lds apart) whose pair (ii, jj) sits at distance
// index m0 + (bq - 1 - ii) + jj, c2p reading RqT (nb x (bq + 3): a row stride
// past the tile's queries) and p2c RkT (nb x (bk + 5)), either or both, against
// a load and a store per pair in double.
template <class T>
void check_tile_picks(const std::vector<int32_t>& c2p_rows, const std::vector<int32_t>& p2c_rows, int64_t nb,
                      int64_t bq, int64_t bk, int64_t m0, const std::string& name) {
  const RowRuns c2p_runs(relpos::Scratch<int32_t>(c2p_rows.begin(), c2p_rows.end()));
  const RowRuns p2c_runs(relpos::Scratch<int32_t>(p2c_rows.begin(), p2c_rows.end()));
  const int64_t ldq = bq + 3, ldk = bk + 5, lds = bk + 2;
  const std::vector<T> RqT = random_values<T>(nb * ldq, 11), RkT = random_values<T>(nb * ldk, 12);
  const std::vector<T> dS = random_values<T>(bq * lds, 13);
  const T alpha = T(-1.25);
  for (const auto& [with_c2p, with_p2c] : {std::pair{true, false}, {false, true}, {true, true}}) {
    std::vector<T> S = random_values<T>(bq * lds, 14), dRqT = random_values<T>(nb * ldq, 15);
    std::vector<T> dRkT = random_values<T>(nb * ldk, 16);
    std::vector<double> want_S(S.begin(), S.end()), want_dRqT(dRqT.begin(), dRqT.end());
    std::vector<double> want_dRkT(dRkT.begin(), dRkT.end());
    for (int64_t ii = 0; ii < bq; ++ii)
      for (int64_t jj = 0; jj < bk; ++jj) {
        const int64_t m = m0 + (bq - 1 - ii) + jj, c2p_at = c2p_rows[m] * ldq + ii, p2c_at = p2c_rows[m] * ldk + jj;
        const double g = double(alpha) * double(dS[ii * lds + jj]);
        if (with_c2p) want_S[ii * lds + jj] += double(alpha) * double(RqT[c2p_at]), want_dRqT[c2p_at] += g;
        if (with_p2c) want_S[ii * lds + jj] += double(alpha) * double(RkT[p2c_at]), want_dRkT[p2c_at] += g;
      }
    IndexedScores<const T> c2p, p2c;
    IndexedScores<T> dc2p, dp2c;
    if (with_c2p) c2p = {&c2p_runs, RqT.data(), ldq}, dc2p = {&c2p_runs, dRqT.data(), ldq};
    if (with_p2c) p2c = {&p2c_runs, RkT.data(), ldk}, dp2c = {&p2c_runs, dRkT.data(), ldk};
    Scratch<T> scratch;
    add_indexed_picks(c2p, p2c, m0, bq, bk, alpha, S.data(), lds, scratch);
    sum_indexed_picks(dc2p, dp2c, m0, bq, bk, alpha, dS.data(), lds, scratch);
    const std::string what = name + (with_c2p ? " c2p" : "") + (with_p2c ? " p2c" : "") + " tile " +
                             std::to_string(bq) + " x " + std::to_string(bk) + " m0 " + std::to_string(m0);
    expect_close(S, want_S, "add_indexed_picks " + what);
    expect_close(dRqT, want_dRqT, "sum_indexed_picks c2p " + what);
    expect_close(dRkT, want_dRkT, "sum_indexed_picks p2c " + what);
  }
}

template <class T>
void check_every_map() {
  // DeBERTa-v3's 256 buckets to 512 over distances -1000..1000 (exact, log, edge); 8 buckets to 20.
  const std::vector<int32_t> c2p = deberta_rows(2001, 256, 512, false), p2c = deberta_rows(2001, 256, 512, true);
  // Tiles of 1 to 300 keys (several steps of tiles::kDiagonalKeys) at the diagonal and far from it.
  for (const auto& [bq, bk, m0] : {std::tuple<int64_t, int64_t, int64_t>{128, 128, 873}, {16, 300, 100},
                                   {7, 1, 0}, {128, 257, 1500}, {33, 130, 600}, {16, 300, 1680}, {1, 129, 1000}})
    check_tile_picks<T>(c2p, p2c, 512, bq, bk, m0, "256/512");
  // Tiles of one row (past the last bucket) and tiles ending at, or one past, the edge run's end.
  for (int64_t m0 = 470; m0 <= 500; ++m0) check_tile_picks<T>(c2p, p2c, 512, 8, 9, m0, "edge run");
  for (int64_t m0 = 1490; m0 <= 1520; ++m0) check_tile_picks<T>(c2p, p2c, 512, 9, 8, m0, "edge run");
  check_tile_picks<T>(deberta_rows(301, 8, 20, false), deberta_rows(301, 8, 20, true), 16, 40, 70, 100, "8/20");
  check_tile_picks<T>(deberta_rows(301, -1, 64, false), deberta_rows(301, -1, 64, true), 128, 40, 70, 100, "none/64");
  for (const uint32_t seed : {1u, 2u, 3u})
    check_tile_picks<T>(ragged_rows(400, seed), ragged_rows(400, seed + 10), 80, 64, 200, 90,
                        "ragged " + std::to_string(seed));
  // One term of one row, the other by distance, over several groups of distances and a partial last one.
  const std::vector<int32_t> one_row(400, 5), ragged = ragged_rows(400, 4);
  check_tile_picks<T>(one_row, ragged, 80, 40, 70, 90, "c2p one row, p2c ragged");
  check_tile_picks<T>(ragged, one_row, 80, 40, 70, 90, "c2p ragged, p2c one row");
}

TEST(IndexedRows, ScoreStridesAreMultiplesOf64BytesButNotOf1KiB) {
  for (int64_t n = 1; n <= 5000; ++n) {
    const int64_t stride = indexed_stride(n);
    ASSERT_GE(stride, n);
    ASSERT_LT(stride, n + 32) << n;
    ASSERT_EQ(stride % 16, 0) << n;    // 64 bytes of float32
    ASSERT_NE(stride % 256, 0) << n;   // rows not a multiple of 1 KiB apart
  }
}

TEST(IndexedRows, SingleRowFindsEveryWindowOfOneRow) {
  check_single_row(deberta_rows(2001, 256, 512, false), "256/512");
  check_single_row(deberta_rows(7, 8, 20, true), "7 distances");
  check_single_row({3}, "1 distance");
  for (const uint32_t seed : {1u, 2u, 3u}) check_single_row(ragged_rows(400, seed), "ragged " + std::to_string(seed));
}
// reached_rows against every pair of each tile of columns: the least and the
// greatest row that a pair (i, j) of the tile's queries (c2p) or keys (p2c)
// reads at distance index j - i + lq - 1, self- and cross-attention.
TEST(IndexedRows, ReachedRowsAreThoseOfEveryPairOfATile) {
  for (const auto& [lq, lk] : {std::pair<int64_t, int64_t>{1, 1}, {130, 130}, {600, 600}, {300, 77}, {5, 700}})
    for (const bool ragged : {false, true}) {
      const std::vector<int32_t> rows =
          ragged ? ragged_rows(lq + lk - 1, uint32_t(lq)) : deberta_rows(lq + lk - 1, 256, 512, false);
      const RowRuns runs(relpos::Scratch<int32_t>(rows.begin(), rows.end()));
      for (const bool by_query : {true, false}) {
        const int64_t columns = by_query ? lq : lk;
        for (int64_t c0 = 0; c0 < columns; c0 += 50)
          for (const int64_t width : {int64_t(1), int64_t(32), kReachedColumns}) {
            const int64_t n = std::min(width, columns - c0);
            int32_t least = INT32_MAX, greatest = INT32_MIN;
            for (int64_t c = c0; c < c0 + n; ++c)
              for (int64_t other = 0; other < (by_query ? lk : lq); ++other) {
                const int64_t m = by_query ? other - c + lq - 1 : c - other + lq - 1;  // (i, j): j - i + lq - 1
                least = std::min(least, rows[m]), greatest = std::max(greatest, rows[m]);
              }
            const RowSpan reached = reached_rows(runs, by_query, lq, lk, c0, n);
            ASSERT_EQ(reached.first, least) << lq << " x " << lk << " ragged " << ragged << " by query " << by_query
                                            << " from " << c0 << " width " << n;
            ASSERT_EQ(reached.end, int64_t(greatest) + 1) << lq << " x " << lk << " from " << c0 << " width " << n;
          }
      }
    }
}

// for_each_reached_tile covers the columns [begin, end) once, in tiles of at
// most kReachedColumns, each with its reached_rows.
TEST(IndexedRows, ReachedTilesCoverTheirColumnsOnce) {
  const std::vector<int32_t> rows = deberta_rows(2 * 700 - 1, 256, 512, false);
  const RowRuns runs(relpos::Scratch<int32_t>(rows.begin(), rows.end()));
  for (const auto& [begin, end] : {std::pair<int64_t, int64_t>{0, 700}, {128, 384}, {300, 301}, {650, 700}}) {
    int64_t next = begin;
    for_each_reached_tile(runs, /*by_query=*/true, 700, 700, begin, end, [&](int64_t c0, int64_t n, RowSpan span) {
      ASSERT_EQ(c0, next);
      ASSERT_TRUE(n >= 1 && n <= kReachedColumns);
      const RowSpan want = reached_rows(runs, true, 700, 700, c0, n);
      ASSERT_EQ(span.first, want.first);
      ASSERT_EQ(span.end, want.end);
      next = c0 + n;
    });
    ASSERT_EQ(next, end) << begin << " .. " << end;
  }
}
TEST(IndexedRows, PicksAndSumsAgreeWithOnePairAtATimeFloat) { check_every_map<float>(); }
TEST(IndexedRows, PicksAndSumsAgreeWithOnePairAtATimeDouble) { check_every_map<double>(); }

}  // namespace
}  // namespace relpos::fused
