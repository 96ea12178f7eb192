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
#include "head.hpp"
#include "relpos/attention.hpp"

namespace relpos {

// Dense copy of head h's slice of a clipped table, (2k+1, width).
template <class T>
Scratch<T> table_slice(const ClippedTable<T>& table, int64_t h) {
  Scratch<T> dense(table.table_rows() * table.width());
  table.slice(h, dense.data());
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

// row[jj] += alpha * table[c(r0 + jj)] for jj < bk; table holds 2k+1 entries.
template <class T>
void add_by_row(T* row, int64_t bk, int64_t r0, int64_t k, bool clip, const T* table, T alpha) {
  const ClippedRow s = clipped_row(r0, bk, k);
  if (clip) {
    const T below = alpha * table[0], above = alpha * table[2 * k];
    rows::add_constant(row, below, s.lo);
    rows::add_constant(row + s.hi, above, bk - s.hi);
  }
  const T* window = table + s.first - s.lo;
  rows::add_scaled(row + s.lo, window + s.lo, alpha, s.hi - s.lo);
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

}  // namespace relpos
