// Shaw et al.'s own efficient form (section 3.3): QK^T + Q A^K^T, where the
// relative embeddings A^K, A^V (Lq, Lk, d) are materialised once and shared
// by every batch entry (and every head when the tables are shared), and the
// second product is one (1 x d)(d x Lk) product per query position. Memory
// O(L^2 d), as in the paper; its saving is the sharing, not the size.
#include <algorithm>

#include "distance_table.hpp"
#include "unfused.hpp"

namespace relpos::unfused {
namespace {

// y (n) += alpha * A (n, width) x (width): one query row against its A_i.
template <class T>
void matvec(int64_t n, int64_t width, T alpha, const T* A, const T* x, T* y) {
  for (int64_t j = 0; j < n; ++j) {
    T s = 0;
    for (int64_t c = 0; c < width; ++c) s += A[j * width + c] * x[c];
    y[j] += alpha * s;
  }
}

// y (width) += alpha * x (n) A (n, width)
template <class T>
void vecmat(int64_t n, int64_t width, T alpha, const T* x, const T* A, T* y) {
  for (int64_t j = 0; j < n; ++j) {
    const T w = alpha * x[j];
    if (w == T(0)) continue;
    for (int64_t c = 0; c < width; ++c) y[c] += w * A[j * width + c];
  }
}

template <class T>
class TableSplit final : public RelativeTerm<T> {
 public:
  TableSplit(const AttentionForward<T>& p, const PositionGrads<T>* grads)
      : key_embedding_(make_key_embedding(p)), value_embedding_(make_value_embedding(p)), grads_(grads) {}

  void add_scores(const Head<T>& hd, T scale, T* S) override {
    if (!key_embedding_) return;
    const Scratch<T>& AK = materialised(hd, keys(), ak_, ak_head_);
    for (int64_t i = 0; i < hd.lq; ++i)  // S_i += scale * A^K_i qp_i
      matvec(hd.lk, hd.d, scale, &AK[i * hd.lk * hd.d], hd.qp + i * hd.d, S + i * hd.lk);
  }

  void add_values(const Head<T>& hd, const T* P, T* out) override {
    if (!value_embedding_) return;
    const Scratch<T>& AV = materialised(hd, values(), av_, av_head_);
    for (int64_t i = 0; i < hd.lq; ++i)  // out_i += P_i A^V_i
      vecmat(hd.lk, hd.dv, T(1), P + i * hd.lk, &AV[i * hd.lk * hd.dv], out + i * hd.dv);
  }

  void backward_values(const Head<T>& hd, const T* P, const T* dout, T* dP) override {
    if (!value_embedding_) return;
    const Scratch<T>& AV = materialised(hd, values(), av_, av_head_);
    for (int64_t i = 0; i < hd.lq; ++i)  // dP_i += A^V_i dout_i
      matvec(hd.lk, hd.dv, T(1), &AV[i * hd.lk * hd.dv], dout + i * hd.dv, dP + i * hd.lk);
    if (grads_ && values().wants_grad(*grads_))  // dA^V_ij = P_ij dout_i, summed per table row
      scatter(hd, values(), [&](int64_t i, int64_t j) { return P[i * hd.lk + j]; }, dout);
  }

  void backward_scores(const Head<T>& hd, T scale, const T* dS, T* dqp) override {
    if (!key_embedding_) return;
    const Scratch<T>& AK = materialised(hd, keys(), ak_, ak_head_);
    for (int64_t i = 0; i < hd.lq; ++i)  // dqp_i += scale * dS_i A^K_i
      vecmat(hd.lk, hd.d, scale, dS + i * hd.lk, &AK[i * hd.lk * hd.d], dqp + i * hd.d);
    if (grads_ && keys().wants_grad(*grads_))  // dA^K_ij = scale dS_ij qp_i
      scatter(hd, keys(), [&](int64_t i, int64_t j) { return scale * dS[i * hd.lk + j]; }, hd.qp);
  }

 private:
  // The algorithm serves clipped tables (the capability table says which schemes).
  const ClippedTable<T>& keys() const { return *key_embedding_->clipped(); }
  const ClippedTable<T>& values() const { return *value_embedding_->clipped(); }

  // A (Lq, Lk, width) for head h; rebuilt only when the table slice changes
  // (a shared table is built once per call).
  static const Scratch<T>& materialised(const Head<T>& hd, const ClippedTable<T>& table, Scratch<T>& A,
                                        int64_t& built_for) {
    const int64_t ht = table.slice_of(hd.h);
    if (built_for == ht) return A;
    const int64_t width = table.width();
    const Scratch<T> slice = table_slice(table, hd.h);
    A.assign(hd.lq * hd.lk * width, T(0));
    for (int64_t i = 0; i < hd.lq; ++i)
      for (int64_t j = 0; j < hd.lk; ++j)
        if (const int64_t c = table.row(hd.r(i, j)); c >= 0)
          std::copy_n(&slice[c * width], width, &A[(i * hd.lk + j) * width]);
    built_for = ht;
    return A;
  }

  // The table's gradient row c(r_ij) += weight(i, j) * rows_i for every pair.
  template <class Weight>
  void scatter(const Head<T>& hd, const ClippedTable<T>& table, Weight weight, const T* rows) {
    const int64_t width = table.width();
    Scratch<T> dslice(table.table_rows() * width);
    for (int64_t i = 0; i < hd.lq; ++i)
      for (int64_t j = 0; j < hd.lk; ++j)
        if (const int64_t c = table.row(hd.r(i, j)); c >= 0) {
          const T w = weight(i, j);
          if (w == T(0)) continue;  // no pair (masked): nothing, also from a non-finite row
          for (int64_t x = 0; x < width; ++x) dslice[c * width + x] += w * rows[i * width + x];
        }
    table.add_slice_grad(*grads_, hd.h, dslice.data());
  }

  std::unique_ptr<DistanceEmbedding<T>> key_embedding_, value_embedding_;
  const PositionGrads<T>* grads_;
  Scratch<T> ak_, av_;
  int64_t ak_head_ = -1, av_head_ = -1;
};

}  // namespace

template <class T>
std::unique_ptr<RelativeTerm<T>> make_table_split(const AttentionForward<T>& p, const PositionGrads<T>* grads) {
  return std::make_unique<TableSplit<T>>(p, grads);
}

template std::unique_ptr<RelativeTerm<float>> make_table_split(const AttentionForward<float>&,
                                                              const PositionGrads<float>*);
template std::unique_ptr<RelativeTerm<double>> make_table_split(const AttentionForward<double>&,
                                                               const PositionGrads<double>*);

}  // namespace relpos::unfused
