// An indexed table's row per distance (DeBERTa's log buckets), cut into runs,
// and the fused kernel's picks of a tile row through them.
//
// The rows step by one per distance near the diagonal (exact buckets), stay
// on one row for a run of distances beyond (log buckets, then the edge row).
// The picks follow the runs along a row of scores: a long run of one row
// adds one constant, a long stepping run one contiguous stretch of the scores;
// the stretches between (short runs: for DeBERTa-v3's 256 buckets to 512,
// every log bucket, 1-6 distances each) are picked a vector at a time, a
// loaded vector of scores permuted where a vector's rows lie within its width
// (add_picked). The backward sums the same long runs whole and the short
// stretches pair by pair, a run of one row in a register (no store-to-load
// chain). By the query (c2p) the row of scores is the query's against the
// table, along the keys of a tile row. By the key (p2c) it is the key's, along
// the queries: a tile row of p2c reads a diagonal of the keys' scores, a cache
// line per pair, so its picks are made key by key, where its rows run as
// c2p's do, and added to the tile transposed; a tile whose pairs all read one
// row (past the last bucket, most tiles of a long call) adds each key's score
// down its column instead, and sums its column backward, with no transpose.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <vector>

#include "../backend/row_ops.hpp"
#include "../backend/scratch.hpp"
#include "tiles.hpp"

namespace relpos::fused {

class RowRuns {
 public:
  RowRuns() = default;
  // rows[m]: the table row of distance index m.
  explicit RowRuns(Scratch<int32_t> rows) : row_(std::move(rows)), next_(row_.size()), step_(row_.size()) {
    const int64_t count = int64_t(row_.size());
    int64_t short_from = 0;  // the first distance index of the short stretch under way
    const auto end_short = [&](int64_t at) {
      std::fill(&next_[0] + short_from, &next_[0] + at, int32_t(at));
      std::fill(&step_[0] + short_from, &step_[0] + at, kShort);
    };
    for (int64_t m = 0; m < count;) {
      int64_t step = m + 1 < count ? int64_t(row_[m + 1]) - row_[m] : 0, e = m + 1;
      if (std::abs(step) > 1) step = 0;  // a jump: a run of one distance
      else
        while (e < count && int64_t(row_[e]) - row_[e - 1] == step) ++e;
      if (e - m >= kLongRun) {
        end_short(m);
        std::fill(&next_[m], &next_[0] + e, int32_t(e));
        std::fill(&step_[m], &step_[0] + e, int8_t(step));
        short_from = e;
      }
      m = e;
    }
    end_short(count);
  }

  bool empty() const { return row_.empty(); }
  // The one row of the distance indices [m, m + count), or -1 where they read more.
  int32_t single_row(int64_t m, int64_t count) const {
    return step_[m] == 0 && next_[m] >= m + count ? row_[m] : -1;
  }
  const int32_t* rows_from(int64_t m) const { return &row_[m]; }

  // For the distance indices [m, m + count), positions t = 0, 1, ...: the
  // long runs, whole(t, n, row, step) (positions [t, t + n), the first's row,
  // the run's step -1, 0 or +1); picked(t, n) for each stretch between them.
  template <class Whole, class Picked>
  void for_each_stretch(int64_t m, int64_t count, Whole&& whole, Picked&& picked) const {
    for (int64_t t = 0; t < count;) {
      const int64_t e = std::min<int64_t>(next_[m + t] - m, count);
      if (const int step = step_[m + t]; step == kShort)
        picked(t, e - t);
      else
        whole(t, e - t, row_[m + t], step);
      t = e;
    }
  }

 private:
  // Runs from this long go to a vector loop whole: a call costs more for fewer.
  static constexpr int64_t kLongRun = 8;
  static constexpr int8_t kShort = 2;  // step_ of a short stretch's distances
  Scratch<int32_t> row_;
  Scratch<int32_t> next_;  // the end of m's long run or short stretch
  Scratch<int8_t> step_;   // the step of m's long run, or kShort
};

// dR[rows[u]] += alpha * in[u] for u < n, a run of one row summed in a
// register (no store-to-load chain).
template <class T>
void sum_picked(const int32_t* rows, const T* in, T alpha, T* dR, int64_t n) {
  for (int64_t u = 0; u < n;) {
    T sum = in[u];
    const int32_t row = rows[u];
    for (++u; u < n && rows[u] == row; ++u) sum += in[u];
    dR[row] += alpha * sum;
  }
}

// out[t] += alpha * R[row(m + t)] for t < count: the picks from one row of
// scores R against the table's nb rows.
template <class T>
void add_picks(const RowRuns& runs, int64_t m, int64_t count, const T* R, int64_t nb, T alpha, T* out) {
  runs.for_each_stretch(
      m, count,
      [&](int64_t t, int64_t n, int64_t row, int step) {
        if (step == 0) rows::add_constant(out + t, alpha * R[row], n);
        else if (step > 0) rows::add_scaled(out + t, R + row, alpha, n);
        else rows::add_scaled_reversed(out + t, R + row - (n - 1), alpha, n);
      },
      [&](int64_t t, int64_t n) { rows::add_picked(out + t, R, nb, runs.rows_from(m + t), alpha, n); });
}

// dR[row(m + t)] += alpha * in[t] for t < count: add_picks backwards.
template <class T>
void sum_picks(const RowRuns& runs, int64_t m, int64_t count, const T* in, T alpha, T* dR) {
  runs.for_each_stretch(
      m, count,
      [&](int64_t t, int64_t n, int64_t row, int step) {
        if (step == 0) dR[row] += alpha * rows::sum_of(in + t, n);
        else if (step > 0) rows::add_scaled(dR + row, in + t, alpha, n);
        else rows::add_scaled_reversed(dR + row - (n - 1), in + t, alpha, n);
      },
      [&](int64_t t, int64_t n) { sum_picked(runs.rows_from(m + t), in + t, alpha, dR, n); });
}

// Keys ahead of the one being picked (or summed) whose windows are
// prefetched: a key's row of scores (2 KiB for DeBERTa-v3's 512 rows) is
// read or written in a window per tile, a row's jump from the key before; a
// long call's rows (Lk x rows, 4 MiB at L = 2048) live in L3. On Zen 4
// (B = 2, H = 12, L = 2048, 2 threads), with every key's picks reading one
// row instead (a measuring build) the p2c picks kept a quarter to a third of
// their time: the rest waited on those rows, which the hardware's prefetchers
// did not appear to cover. Against no prefetching, in one process alternating
// a build with a switch (minimum of 8 calls): 900 -> 844 ms forward +
// backward with 6 keys ahead, 3-6% at B = 1, H = 4; 2, 3, 4, 6 and 8 ahead
// measured alike, and separate processes of the two builds differ by less
// than that machine's noise (+-5%).
constexpr int64_t kKeysAhead = 4;

// Prefetches the rows that the distance indices [m, m + count) read in the
// key's row of scores at R (for writing where `write`): the rows between the
// ends' rows (monotone in the distance for DeBERTa's buckets; a prefetch of
// another address is harmless, so a table whose rows were not would only
// waste it).
template <class T>
void prefetch_window(const RowRuns& runs, int64_t m, int64_t count, const T* R, bool write) {
  const int32_t* rows = runs.rows_from(m);
  const int64_t line = 64 / int64_t(sizeof(T)), lo = std::min(rows[0], rows[count - 1]) / line * line;
  for (int64_t row = lo, hi = std::max(rows[0], rows[count - 1]); row <= hi; row += line)
    write ? __builtin_prefetch(R + row, 1) : __builtin_prefetch(R + row, 0);
}

// A tile's picks by the key, as the fused kernel lays them out: tile (bq, bk),
// pair (ii, jj) at distance index m0 + (bq - 1 - ii) + jj; key jj's scores
// Rk + jj * nb. Along the queries in falling order (ii' = bq - 1 - ii) the
// distance rises, as add_picks reads it.
//
// S (bq, bk) += alpha * the picks, made tiles::kKeyPickChunk keys at a time
// into by_key (keys, bq) and added transposed.

template <class T>
void add_key_picks(const RowRuns& runs, int64_t m0, const T* Rk, int64_t nb, int64_t bq, int64_t bk, T alpha, T* S,
                   Scratch<T>& by_key) {
  if (const int32_t row = runs.single_row(m0, bq + bk - 1); row >= 0) {  // key jj's score in its column
    by_key.resize(bk);
    for (int64_t jj = 0; jj < bk; ++jj) by_key[jj] = alpha * Rk[jj * nb + row];
    for (int64_t ii = 0; ii < bq; ++ii) rows::add_scaled(S + ii * bk, by_key.data(), T(1), bk);
    return;
  }
  for (int64_t j = 0; j < bk; j += tiles::kKeyPickChunk) {
    const int64_t keys = std::min(tiles::kKeyPickChunk, bk - j);
    by_key.assign(keys * bq, T(0));
    for (int64_t jj = j; jj < j + keys; ++jj) {
      if (jj + kKeysAhead < bk)
        prefetch_window(runs, m0 + jj + kKeysAhead, bq, Rk + (jj + kKeysAhead) * nb, /*write=*/false);
      add_picks(runs, m0 + jj, bq, Rk + jj * nb, nb, alpha, &by_key[(jj - j) * bq]);
    }
    // Query ii' of by_key to tile row bq - 1 - ii'.
    rows::add_transposed(by_key.data(), keys, bq, bq, S + (bq - 1) * bk + j, -bk);
  }
}

// dRk (key jj's row at dRk + jj * nb) += alpha * dS (bq, bk) by each pair's
// row: add_key_picks backwards, dS transposed into by_key first (a one-row
// tile: its column sums instead).
template <class T>
void sum_key_picks(const RowRuns& runs, int64_t m0, const T* dS, int64_t bq, int64_t bk, T alpha, T* dRk, int64_t nb,
                   Scratch<T>& by_key) {
  if (const int32_t row = runs.single_row(m0, bq + bk - 1); row >= 0) {  // the column sums, rows in order
    by_key.assign(bk, T(0));
    for (int64_t ii = 0; ii < bq; ++ii) rows::add_scaled(by_key.data(), dS + ii * bk, T(1), bk);
    for (int64_t jj = 0; jj < bk; ++jj) dRk[jj * nb + row] += alpha * by_key[jj];
    return;
  }
  by_key.resize(bk * bq);
  rows::transpose(dS + (bq - 1) * bk, bq, bk, -bk, by_key.data());  // tile row bq - 1 - ii' to query ii'
  for (int64_t jj = 0; jj < bk; ++jj) {
    if (jj + kKeysAhead < bk)
      prefetch_window(runs, m0 + jj + kKeysAhead, bq, dRk + (jj + kKeysAhead) * nb, /*write=*/true);
    sum_picks(runs, m0 + jj, bq, &by_key[jj * bq], alpha, dRk + jj * nb);
  }
}

}  // namespace relpos::fused
