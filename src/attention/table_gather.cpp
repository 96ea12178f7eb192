// Shaw's terms by gather / bucket sums, O(Lq (2k+1)) beside the logits, for
// any scheme whose embeddings are clipped tables (ClippedTable), and nothing
// for a scheme without embeddings (its bias is gathered by the pipeline):
//   key term    R = qp wk^T (Lq, 2k+1);  S_ij += scale * R[i, c(r_ij)]
//   value term  Pb[i, c] = sum_{j: c(r_ij) = c} P_ij;  out += Pb wv
// and the transposes for backward (bucket sums of dS, gathers of dout wv^T).
#include <stdexcept>

#include "relpos/gemm.hpp"
#include "distance_table.hpp"
#include "tile_products.hpp"
#include "unfused.hpp"

namespace relpos::unfused {
namespace {

template <class T>
class TableGather final : public RelativeTerm<T> {
 public:
  TableGather(const AttentionForward<T>& p, const PositionGrads<T>* grads)
      : key_embedding_(make_key_embedding(p)), value_embedding_(make_value_embedding(p)), grads_(grads) {
    for (const auto* e : {key_embedding_.get(), value_embedding_.get()})
      if (e && !e->clipped()) throw std::logic_error("relpos: gather serves clipped tables only");
  }

  void add_scores(const Head<T>& hd, T scale, T* S) override {
    const ClippedTable<T>* wk = keys();
    if (!wk) return;
    const Scratch<T> R = queries_times_table(hd, *wk);
    const Scratch<int64_t> rows = table_rows_by_distance(hd, *wk);
    const int64_t n = wk->table_rows();
    for (int64_t i = 0; i < hd.lq; ++i)
      for (int64_t j = 0; j < hd.lk; ++j)
        if (const int64_t c = rows[hd.diagonal(i, j)]; c >= 0) S[i * hd.lk + j] += scale * R[i * n + c];
  }

  void add_values(const Head<T>& hd, const T* P, T* out) override {
    const ClippedTable<T>* wv = values();
    if (!wv) return;
    const Scratch<T> Pb = bucket_sums(hd, *wv, P);
    const Scratch<T> slice = table_slice(*wv, hd.h);
    const int64_t n = wv->table_rows();
    weights_times<T>(Trans::no, hd.lq, hd.dv, n, T(1), Pb.data(), n, slice.data(), hd.dv, T(1), out, hd.dv);
  }

  void backward_values(const Head<T>& hd, const T* P, const T* dout, T* dP) override {
    const ClippedTable<T>* wv = values();
    if (!wv) return;
    const Scratch<T> slice = table_slice(*wv, hd.h);
    const int64_t n = wv->table_rows();
    Scratch<T> dPb(hd.lq * n);  // dout wv^T, gathered back to (i, j)
    gemm<T>(Trans::no, Trans::yes, hd.lq, n, hd.dv, T(1), dout, hd.dv, slice.data(), hd.dv, T(0), dPb.data(), n);
    const Scratch<int64_t> rows = table_rows_by_distance(hd, *wv);
    for (int64_t i = 0; i < hd.lq; ++i)
      for (int64_t j = 0; j < hd.lk; ++j)
        if (const int64_t c = rows[hd.diagonal(i, j)]; c >= 0) dP[i * hd.lk + j] += dPb[i * n + c];
    if (grads_ && wv->wants_grad(*grads_)) {  // dwv = Pb^T dout
      const Scratch<T> Pb = bucket_sums(hd, *wv, P);
      Scratch<T> dwv(n * hd.dv);
      weights_times<T>(Trans::yes, n, hd.dv, hd.lq, T(1), Pb.data(), n, dout, hd.dv, T(0), dwv.data(), hd.dv);
      wv->add_slice_grad(*grads_, hd.h, dwv.data());
    }
  }

  void backward_scores(const Head<T>& hd, T scale, const T* dS, T* dqp) override {
    const ClippedTable<T>* wk = keys();
    if (!wk) return;
    const Scratch<T> dR = bucket_sums(hd, *wk, dS);
    const Scratch<T> slice = table_slice(*wk, hd.h);
    const int64_t n = wk->table_rows();
    weights_times<T>(Trans::no, hd.lq, hd.d, n, scale, dR.data(), n, slice.data(), hd.d, T(1), dqp, hd.d);
    if (grads_ && wk->wants_grad(*grads_)) {  // dwk = scale dR^T qp
      Scratch<T> dwk(n * hd.d);
      weights_times<T>(Trans::yes, n, hd.d, hd.lq, scale, dR.data(), n, hd.qp, hd.d, T(0), dwk.data(), hd.d);
      wk->add_slice_grad(*grads_, hd.h, dwk.data());
    }
  }

 private:
  const ClippedTable<T>* keys() const { return key_embedding_ ? key_embedding_->clipped() : nullptr; }
  const ClippedTable<T>* values() const { return value_embedding_ ? value_embedding_->clipped() : nullptr; }

  // qp (Lq, d) times head h's table (2k+1, d), transposed: (Lq, 2k+1).
  static Scratch<T> queries_times_table(const Head<T>& hd, const ClippedTable<T>& table) {
    const Scratch<T> w = table_slice(table, hd.h);
    const int64_t n = table.table_rows();
    Scratch<T> R(hd.lq * n);
    gemm<T>(Trans::no, Trans::yes, hd.lq, n, hd.d, T(1), hd.qp, hd.d, w.data(), hd.d, T(0), R.data(), n);
    return R;
  }

  // X (Lq, Lk) summed per query row and table row: (Lq, 2k+1).
  static Scratch<T> bucket_sums(const Head<T>& hd, const ClippedTable<T>& table, const T* X) {
    const Scratch<int64_t> rows = table_rows_by_distance(hd, table);
    const int64_t n = table.table_rows();
    Scratch<T> sums(hd.lq * n);
    for (int64_t i = 0; i < hd.lq; ++i)
      for (int64_t j = 0; j < hd.lk; ++j)
        if (const int64_t c = rows[hd.diagonal(i, j)]; c >= 0) sums[i * n + c] += X[i * hd.lk + j];
    return sums;
  }

  std::unique_ptr<DistanceEmbedding<T>> key_embedding_, value_embedding_;
  const PositionGrads<T>* grads_;
};

}  // namespace

template <class T>
std::unique_ptr<RelativeTerm<T>> make_table_gather(const AttentionForward<T>& p, const PositionGrads<T>* grads) {
  return std::make_unique<TableGather<T>>(p, grads);
}

template std::unique_ptr<RelativeTerm<float>> make_table_gather(const AttentionForward<float>&,
                                                               const PositionGrads<float>*);
template std::unique_ptr<RelativeTerm<double>> make_table_gather(const AttentionForward<double>&,
                                                                const PositionGrads<double>*);

}  // namespace relpos::unfused
