// The call's embeddings per distance (its scheme's KeyEmbedding and
// ValueEmbedding, src/schemes/scheme.hpp) as the kernels read them for one
// head (Head in head.hpp): the matrix E of the rows of distance indices
// m = r - rmin that the skew and rel-shift algorithms multiply by the
// queries, a clipped table's dense slice that the gather and the fused
// kernel multiply instead, and the way back from their gradients. Shared by
// the unfused algorithms and the fused kernel.
#pragma once

#include <algorithm>
#include <memory>

#include "../backend/row_ops.hpp"
#include "../backend/scratch.hpp"
#include "../backend/vexp.hpp"
#include "head.hpp"
#include "relpos/attention.hpp"

namespace relpos {

// Dense copy of head h's slice of a clipped table, (2k+1, width).
template <class T>
void table_slice(const ClippedTable<T>& table, int64_t h, Scratch<T>& dense) {
  dense.resize(table.table_rows() * table.width());
  table.slice(h, dense.data());
}
template <class T>
Scratch<T> table_slice(const ClippedTable<T>& table, int64_t h) {
  Scratch<T> dense;
  table_slice(table, h, dense);
  return dense;
}

// The table row of every distance index of the head, or -1 (no embedding).
template <class T>
Scratch<int64_t> table_rows_by_distance(const Head<T>& hd, const ClippedTable<T>& table) {
  Scratch<int64_t> rows(hd.distances());
  for (int64_t m = 0; m < hd.distances(); ++m) rows[m] = table.row(hd.rmin + m);
  return rows;
}

template <class T>
class DistanceTable {
 public:
  // grads: where the parameters' gradients go (null in forward).
  DistanceTable(const AttentionForward<T>& p, const PositionGrads<T>* grads)
      : keys_(make_key_embedding(p)), values_(make_value_embedding(p)), grads_(grads) {}

  bool has_keys() const { return keys_ != nullptr; }
  bool has_values() const { return values_ != nullptr; }

  // (count, d) key embeddings of distance indices m = 0 .. count-1.
  Scratch<T> keys(const Head<T>& hd, int64_t count) const { return rows(*keys_, hd, count); }
  // (count, dv) value embeddings.
  Scratch<T> values(const Head<T>& hd, int64_t count) const { return rows(*values_, hd, count); }

  // Parameter gradients from dE (count, width) of the key or value embeddings.
  void add_key_grad(const Head<T>& hd, const Scratch<T>& dE, int64_t count) const {
    if (grads_) keys_->add_rows_grad(*grads_, hd.h, count, dE.data());
  }
  void add_value_grad(const Head<T>& hd, const Scratch<T>& dE, int64_t count) const {
    if (grads_) values_->add_rows_grad(*grads_, hd.h, count, dE.data());
  }

 private:
  static Scratch<T> rows(const DistanceEmbedding<T>& e, const Head<T>& hd, int64_t count) {
    Scratch<T> E(count * e.width());
    e.rows(hd.h, count, E.data());
    return E;
  }

  std::unique_ptr<DistanceEmbedding<T>> keys_, values_;
  const PositionGrads<T>* grads_;
};

// A clipped table's row of the keys of one row of a tile, whose distances are
// r0, r0 + 1, ..., r0 + bk - 1: a prefix below -k (row 0, or none with a zero
// embedding), a window where the row is r + k (consecutive), a suffix above k
// (row 2k, or none). The two loops below walk the three parts so that every
// inner loop is contiguous; tiles wholly beyond +-k reduce to one row sum.
struct ClippedRow {
  int64_t lo, hi;  // window: jj in [lo, hi)
  int64_t first;   // table row of jj = lo
};

inline ClippedRow clipped_row(int64_t r0, int64_t bk, int64_t k) {
  const int64_t lo = std::clamp<int64_t>(-k - r0, 0, bk), hi = std::clamp<int64_t>(k - r0 + 1, lo, bk);
  return {lo, hi, r0 + lo + k};
}

// row[jj] += alpha * table[r0 + jj + k] for the window's keys only.
template <class T>
void add_window_by_row(T* row, int64_t bk, int64_t r0, int64_t k, const T* table, T alpha) {
  const ClippedRow s = clipped_row(r0, bk, k);
  const T* window = table + s.first - s.lo;
  rows::add_scaled(row + s.lo, window + s.lo, alpha, s.hi - s.lo);
}

// row[jj] += alpha * table[c(r0 + jj)] for jj < bk; table holds 2k+1 entries.
template <class T>
void add_by_row(T* row, int64_t bk, int64_t r0, int64_t k, bool clip, const T* table, T alpha) {
  const ClippedRow s = clipped_row(r0, bk, k);
  if (clip) {
    const T below = alpha * table[0], above = alpha * table[2 * k];
    rows::add_constant(row, below, s.lo);
    rows::add_constant(row + s.hi, above, bk - s.hi);
  }
  add_window_by_row(row, bk, r0, k, table, alpha);
}

// table[c(r0 + jj)] += alpha * row[jj] for jj < bk: bucket sums.
template <class T>
void sum_by_row(T* table, int64_t bk, int64_t r0, int64_t k, bool clip, const T* row, T alpha) {
  const ClippedRow s = clipped_row(r0, bk, k);
  if (clip) {
    table[0] += alpha * rows::sum_of(row, s.lo);
    table[2 * k] += alpha * rows::sum_of(row + s.hi, bk - s.hi);
  }
  T* window = table + s.first - s.lo;
  rows::add_scaled(window + s.lo, row + s.lo, alpha, s.hi - s.lo);
}

// The keys [0, n) of a tile row that its softmax reads, in the parts of
// ClippedRow: [0, lo) all of table row 0, [lo, hi) a row each, [hi, n) all
// of row 2k (a row without a clipped table is one part, [lo, hi) = [0, n)).
// The edge rows' key scores (below, above; 0 without a key table or with a
// zero embedding beyond +-k) are not in the logits: they enter each part's
// max and exponentials as a shift, where add_by_row would add them to every
// logit, and the parts' sums of exponentials are the edge rows' bucket sums
// of P that a value table needs, where sum_by_row would read the row again
// (the two passes: 2.7% of Shaw K+V's forward, L = 4096, one Zen 5 core).
template <class T>
struct BucketedRow {
  int64_t lo = 0, hi = 0, n = 0, first = 0;  // first: the table row of key lo
  T below = 0, above = 0;

  static BucketedRow whole(int64_t n) { return {0, n, n}; }
  static BucketedRow clipped(int64_t r0, int64_t n, int64_t k) {
    const ClippedRow s = clipped_row(r0, n, k);
    return {s.lo, s.hi, n, s.first};
  }

  // The largest logit of the row, or init if larger; NaN if any is. Empty parts are
  // skipped: most rows are one part, and vector loops called empty cost
  // about what the constant-adding pass they replace did (perf, Shaw keys only).
  T max(const T* row, T init) const {
    T m = init;
    if (hi > lo) m = max_of(row + lo, hi - lo, m);
    if (lo > 0) m = max_keeping_nan(m, max_of(row, lo, kNegInf<T>) + below);
    if (hi < n) m = max_keeping_nan(m, max_of(row + hi, n - hi, kNegInf<T>) + above);
    return m;
  }

  struct Sums {
    T below = 0, window = 0, above = 0;
    T total() const { return below + window + above; }
  };
  // row = exp(logit - shift) in place; the sums of the three parts.
  Sums exp_shifted(T* row, T shift) const {
    Sums s;
    if (hi > lo) s.window = exp_shifted_sum(row + lo, shift, row + lo, hi - lo);
    if (lo > 0) s.below = exp_shifted_sum(row, shift - below, row, lo);
    if (hi < n) s.above = exp_shifted_sum(row + hi, shift - above, row + hi, n - hi);
    return s;
  }

  // The sums of the three parts of a row of exponentials (P, or P times
  // dropout's multipliers), where exp_shifted did not make them.
  Sums sums_of(const T* row) const {
    Sums s;
    if (hi > lo) s.window = rows::sum_of(row + lo, hi - lo);
    if (lo > 0) s.below = rows::sum_of(row, lo);
    if (hi < n) s.above = rows::sum_of(row + hi, n - hi);
    return s;
  }

  // table[c(r)] += the row's P by bucket, from exponentials' sums of it; table: 2k+1 entries.
  void add_bucket_sums(T* table, int64_t k, bool clip, const T* row, const Sums& sums) const {
    if (clip) table[0] += sums.below, table[2 * k] += sums.above;
    rows::add_scaled(table + first, row + lo, T(1), hi - lo);
  }
};

}  // namespace relpos
