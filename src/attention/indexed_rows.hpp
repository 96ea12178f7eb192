// An indexed table's row per distance (DeBERTa's log buckets) and the fused
// kernel's picks of a tile's pairs through it, forward and backward.
#pragma once

#include <algorithm>
#include <cstdint>
#include <utility>

#include "../backend/row_ops.hpp"
#include "../backend/scratch.hpp"
#include "tiles.hpp"

namespace relpos::fused {

// Table rows [first, end).
struct RowSpan {
  int64_t first, end;
  int64_t count() const { return end - first; }
};

// The rows step by one per distance near the diagonal (exact buckets), stay
// on one row for a run of distances beyond (log buckets, then the edge row).
class RowRuns {
 public:
  RowRuns() = default;
  // rows[m]: the table row of distance index m.
  explicit RowRuns(Scratch<int32_t> rows) : row_(std::move(rows)), run_end_(row_.size()) {
    for (int64_t m = int64_t(row_.size()) - 1; m >= 0; --m)
      run_end_[m] = m + 1 < int64_t(row_.size()) && row_[m + 1] == row_[m] ? run_end_[m + 1] : int32_t(m + 1);
  }

  bool empty() const { return row_.empty(); }
  // The one row of the distance indices [m, m + count), or -1 where they read more.
  int32_t single_row(int64_t m, int64_t count) const { return run_end_[m] >= m + count ? row_[m] : -1; }
  const int32_t* rows_from(int64_t m) const { return &row_[m]; }
  // The rows from the least to the greatest that the distance indices
  // [m, m + count) read (count > 0), a run at a time.
  RowSpan row_span(int64_t m, int64_t count) const {
    int32_t least = row_[m], greatest = row_[m];
    for (int64_t x = m; x < m + count; x = run_end_[x])
      least = std::min(least, row_[x]), greatest = std::max(greatest, row_[x]);
    return {least, int64_t(greatest) + 1};
  }

 private:
  Scratch<int32_t> row_;
  Scratch<int32_t> run_end_;  // the end of m's run of one row
};

// A tile's pairs by distance. Tile (bq, bk), pair (ii, jj) at distance index
// m0 + t, t = (bq - 1 - ii) + jj: the fused kernel's layout. Both terms read
// one row of a table's scores per distance, the query's (c2p: RqT, rows x
// queries) or the key's (p2c: RkT, rows x keys), so that the pairs of one
// distance t read one stretch of a row of each: c2p's queries [lo, hi) at
// RqT[row(m0 + t)][lo ..], p2c's keys jj = ii + t - (bq - 1) at
// RkT[row'(m0 + t)][lo + t - (bq - 1) ..]. The picks add those stretches
// into a block by distance (distances x bq queries, a group of distances at a
// time), transpose each group into the columns of a block by query (bq x
// (bq + bk - 1): row ii holds the tile row's pairs from distance bq - 1 - ii
// on) and add its rows to the tile's rows; the sums copy dS's rows at those
// offsets, transpose a group of columns at a time, and add each distance's
// stretch into the score gradients' rows. Every step is a
// contiguous vector loop: no pair is picked by its row, whatever the rows'
// runs (log buckets, exact buckets, jumps). The keys of a tile are taken
// tiles::kDiagonalKeys at a time (a step), so that the blocks stay in L2; a
// term whose step reads one row (past the last bucket, most tiles of a long
// call) adds that row's stretch straight to every tile row, and sums its rows
// or columns back.

// The row stride of a table's scores or score gradients over n queries or keys:
// n rounded up to a multiple of 16 (64 bytes of float32), and 16 more where
// that is a multiple of 1 KiB. A step of a tile reads stretches of up to
// bq + keys - 1 rows (255 at 128 x 128) at once, and rows a power of two
// apart (L = 2048: 8 KiB) fall into a few of the caches' sets and evict each
// other (Zen 4, B = 2, H = 12, L = 2048, one process alternating: 829 against
// 838 ms forward + backward, minimum of 8 calls; within that machine's noise,
// and free).
inline int64_t indexed_stride(int64_t n) {
  const int64_t rounded = (n + 15) / 16 * 16;
  return rounded % 256 == 0 ? rounded + 16 : rounded;
}

// The rows of a table that a tile of n of its columns from c0 reaches, from
// the least to the greatest its pairs read: c2p's columns are queries (a
// query tile against every key), p2c's keys (a key tile against every
// query). The products of a table's scores and of their gradients are taken
// tile by tile of kReachedColumns columns over those rows alone: at L = 512 a
// tile of 128 reaches about four fifths of DeBERTa's 512 rows, and a row
// outside the span is neither computed nor summed.
constexpr int64_t kReachedColumns = 128;
inline RowSpan reached_rows(const RowRuns& runs, bool by_query, int64_t lq, int64_t lk, int64_t c0, int64_t n) {
  // Distance index of (i, j): j - i + lq - 1 (Head::diagonal).
  return by_query ? runs.row_span(lq - c0 - n, n + lk - 1) : runs.row_span(c0, n + lq - 1);
}
// f(c0, n, rows) for the tiles of kReachedColumns of the columns [begin, end).
template <class F>
void for_each_reached_tile(const RowRuns& runs, bool by_query, int64_t lq, int64_t lk, int64_t begin, int64_t end,
                           F&& f) {
  for (int64_t c0 = begin; c0 < end; c0 += kReachedColumns) {
    const int64_t n = std::min(kReachedColumns, end - c0);
    f(c0, n, reached_rows(runs, by_query, lq, lk, c0, n));
  }
}

// One term's view: the table row of each distance index, and the scores
// (rows x columns, row stride ld) from the tile's first query (c2p) or key
// (p2c); runs null where the call has no such term.
template <class T>
struct IndexedScores {
  const RowRuns* runs = nullptr;
  T* scores = nullptr;
  int64_t ld = 0;
};

// The queries [lo, hi) of a tile (bq rows, bk keys) that have a pair at t.
struct DiagonalQueries {
  int64_t lo, hi;
};
inline DiagonalQueries diagonal_queries(int64_t t, int64_t bq, int64_t bk) {
  return {std::max<int64_t>(0, bq - 1 - t), std::min<int64_t>(bq, bq - 1 - t + bk)};
}

// Distances per group that the block by distance holds at a time: a group's
// rows (8 KiB in float32 at 128 queries) stay in L1 between their picks and
// their transpose (Zen 4, B = 2, H = 12, L = 2048, one process alternating:
// 807 -> 798 ms forward + backward, minimum of 12 calls, against the whole
// block by distance; 8 and 32 alike), and the scratch is half the size.
constexpr int64_t kDistanceGroup = 16;

// The block by distance (kDistanceGroup x bq) and the bq x (bq + bk - 1)
// block by query, in one scratch (diagonal_scratch elements).
inline int64_t diagonal_scratch(int64_t bq, int64_t bk) { return (kDistanceGroup + bq + bk - 1) * bq; }
template <class T>
std::pair<T*, T*> diagonal_blocks(Scratch<T>& scratch, int64_t bq, int64_t bk) {
  scratch.resize(diagonal_scratch(bq, bk));
  return {scratch.data(), scratch.data() + kDistanceGroup * bq};
}

// Distances ahead of the one being picked (or summed) whose stretches are
// prefetched: each distance reads (or writes) another row of the scores, and
// a long call's rows (rows x Lk, 4 MiB a head at L = 2048) live in L3; the
// hardware's prefetchers do not follow a stretch of 8 lines a row apart. On
// Zen 4 (B = 2, H = 12, L = 2048, 2 threads, one process alternating a build
// with a switch, minimum of 8 calls): 884 -> 830 ms forward + backward; 4 and
// 16 distances ahead alike.
constexpr int64_t kDistancesAhead = 8;

// Prefetches the cache lines that hold the count values at `at` (for writing
// where `write`), the first line from its start: a stretch rarely starts on one.
template <class T>
void prefetch_stretch(const T* at, int64_t count, bool write) {
  const uintptr_t last = reinterpret_cast<uintptr_t>(at + count - 1);
  for (uintptr_t line = reinterpret_cast<uintptr_t>(at) & ~uintptr_t(63); line <= last; line += 64)
    write ? __builtin_prefetch(reinterpret_cast<const void*>(line), 1)
          : __builtin_prefetch(reinterpret_cast<const void*>(line), 0);
}

// One step of a tile (bq rows) through its keys [j, j + n), n at most
// tiles::kDiagonalKeys: its distances, each term's one row (-1 where the
// step reads more), and where distance t's stretch of a term lies in its
// scores (U: T, or const T for the forward's scores).
template <class U>
struct KeyStep {
  const IndexedScores<U>& c2p;
  const IndexedScores<U>& p2c;
  int64_t bq, j, n, m, distances;
  int32_t c2p_row, p2c_row;

  KeyStep(const IndexedScores<U>& c2p, const IndexedScores<U>& p2c, int64_t m0, int64_t bq, int64_t bk, int64_t j)
      : c2p(c2p), p2c(p2c), bq(bq), j(j), n(std::min(tiles::kDiagonalKeys, bk - j)), m(m0 + j),
        distances(bq + n - 1), c2p_row(c2p.runs ? c2p.runs->single_row(m, distances) : -1),
        p2c_row(p2c.runs ? p2c.runs->single_row(m, distances) : -1) {}

  bool c2p_by_distance() const { return c2p.runs && c2p_row < 0; }
  bool p2c_by_distance() const { return p2c.runs && p2c_row < 0; }
  // Query lo's pair of distance t, in each term's scores.
  U* c2p_at(int64_t t, int64_t lo) const { return c2p.scores + c2p.runs->rows_from(m)[t] * c2p.ld + lo; }
  U* p2c_at(int64_t t, int64_t lo) const {
    return p2c.scores + p2c.runs->rows_from(m)[t] * p2c.ld + j + lo + t - (bq - 1);
  }
  // Prefetches distance t's stretches of the terms read by distance (for writing where `write`).
  void prefetch(int64_t t, bool write) const {
    if (t >= distances) return;
    const auto [lo, hi] = diagonal_queries(t, bq, n);
    if (c2p_by_distance()) prefetch_stretch(c2p_at(t, lo), hi - lo, write);
    if (p2c_by_distance()) prefetch_stretch(p2c_at(t, lo), hi - lo, write);
  }
};

// S (bq rows of row stride lds, keys [0, bk)) += alpha * (c2p's and p2c's
// scores of each pair's rows); scratch: the blocks.
template <class T>
void add_indexed_picks(const IndexedScores<const T>& c2p, const IndexedScores<const T>& p2c, int64_t m0, int64_t bq,
                       int64_t bk, T alpha, T* S, int64_t lds, Scratch<T>& scratch) {
  for (int64_t j = 0; j < bk; j += tiles::kDiagonalKeys) {
    const KeyStep<const T> step(c2p, p2c, m0, bq, bk, j);
    const int64_t n = step.n, distances = step.distances;
    for (int64_t ii = 0; ii < bq; ++ii) {  // a one-row term: its row's scores
      if (step.c2p_row >= 0) rows::add_constant(S + ii * lds + j, alpha * c2p.scores[step.c2p_row * c2p.ld + ii], n);
      if (step.p2c_row >= 0) rows::add_scaled(S + ii * lds + j, p2c.scores + step.p2c_row * p2c.ld + j, alpha, n);
    }
    const bool c2p_by_distance = step.c2p_by_distance(), p2c_by_distance = step.p2c_by_distance();
    if (!c2p_by_distance && !p2c_by_distance) continue;
    auto [by_distance, by_query] = diagonal_blocks(scratch, bq, n);
    for (int64_t t = 0; t < distances; ++t) {
      step.prefetch(t + kDistancesAhead, /*write=*/false);
      const auto [lo, hi] = diagonal_queries(t, bq, n);
      const int64_t t0 = t / kDistanceGroup * kDistanceGroup;
      T* g = by_distance + (t - t0) * bq + lo;
      if (c2p_by_distance) std::copy(step.c2p_at(t, lo), step.c2p_at(t, lo) + (hi - lo), g);
      if (p2c_by_distance) {
        if (c2p_by_distance) rows::add_scaled(g, step.p2c_at(t, lo), T(1), hi - lo);
        else std::copy(step.p2c_at(t, lo), step.p2c_at(t, lo) + (hi - lo), g);
      }
      if (t + 1 == distances || t + 1 - t0 == kDistanceGroup)  // the group's distances into their columns
        rows::transpose(by_distance, t + 1 - t0, bq, bq, by_query + t0, distances);
    }
    for (int64_t ii = 0; ii < bq; ++ii)
      rows::add_scaled(S + ii * lds + j, by_query + ii * distances + (bq - 1 - ii), alpha, n);
  }
}

// c2p's and p2c's score gradients (the rows of their views) += alpha * dS
// (bq rows of row stride lds, keys [0, bk)) by each pair's rows:
// add_indexed_picks backwards.
template <class T>
void sum_indexed_picks(const IndexedScores<T>& c2p, const IndexedScores<T>& p2c, int64_t m0, int64_t bq, int64_t bk,
                       T alpha, const T* dS, int64_t lds, Scratch<T>& scratch) {
  for (int64_t j = 0; j < bk; j += tiles::kDiagonalKeys) {
    const KeyStep<T> step(c2p, p2c, m0, bq, bk, j);
    const int64_t n = step.n, distances = step.distances;
    for (int64_t ii = 0; ii < bq; ++ii) {  // a one-row term: its row's sums, query by query or key by key
      if (step.c2p_row >= 0) c2p.scores[step.c2p_row * c2p.ld + ii] += alpha * rows::sum_of(dS + ii * lds + j, n);
      if (step.p2c_row >= 0) rows::add_scaled(p2c.scores + step.p2c_row * p2c.ld + j, dS + ii * lds + j, alpha, n);
    }
    const bool c2p_by_distance = step.c2p_by_distance(), p2c_by_distance = step.p2c_by_distance();
    if (!c2p_by_distance && !p2c_by_distance) continue;
    auto [by_distance, by_query] = diagonal_blocks(scratch, bq, n);
    // Row ii's pairs from distance bq - 1 - ii on; the block's other entries are never read.
    for (int64_t ii = 0; ii < bq; ++ii)
      std::copy(dS + ii * lds + j, dS + ii * lds + j + n, by_query + ii * distances + (bq - 1 - ii));
    for (int64_t t = 0; t < distances; ++t) {
      step.prefetch(t + kDistancesAhead, /*write=*/true);
      const auto [lo, hi] = diagonal_queries(t, bq, n);
      const int64_t t0 = t / kDistanceGroup * kDistanceGroup;
      if (t == t0)  // the group's columns into its distances' rows
        rows::transpose(by_query + t, bq, std::min(kDistanceGroup, distances - t), distances, by_distance, bq);
      const T* g = by_distance + (t - t0) * bq + lo;
      if (c2p_by_distance) rows::add_scaled(step.c2p_at(t, lo), g, alpha, hi - lo);
      if (p2c_by_distance) rows::add_scaled(step.p2c_at(t, lo), g, alpha, hi - lo);
    }
  }
}

}  // namespace relpos::fused
