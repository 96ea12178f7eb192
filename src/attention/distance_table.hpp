// The call's embeddings per distance (its scheme's KeyEmbedding and
// ValueEmbedding, src/schemes/scheme.hpp) as the kernels read them for one
// head (Head in head.hpp): the matrix E of the rows of distance indices
// m = r - rmin that the skew and rel-shift algorithms multiply by the
// queries, a clipped table's dense slice that the gather and the fused
// kernel multiply instead, and the way back from their gradients. Shared by
// the unfused algorithms and the fused kernel.
#pragma once

#include <memory>

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

}  // namespace relpos
