// Shaw's terms by gather / bucket sums, O(Lq (2k+1)) beside the logits:
//   key term    R = qp wk^T (Lq, 2k+1);  S_ij += scale * R[i, c(r_ij)]
//   value term  Pb[i, c] = sum_{j: c(r_ij) = c} P_ij;  out += Pb wv
// and the transposes for backward (bucket sums of dS, gathers of dout wv^T).
#include "relpos/gemm.hpp"
#include "distance_table.hpp"
#include "unfused.hpp"

namespace relpos::unfused {
namespace {

template <class T>
class ShawGather final : public RelativeTerm<T> {
 public:
  ShawGather(const ShawParams<T>& shaw, const PositionGrads<T>* grads) : shaw_(shaw), grads_(grads) {}

  void add_scores(const Head<T>& hd, T scale, T* S) override {
    if (shaw_.wk.empty()) return;
    const Scratch<T> R = queries_times_table(hd, shaw_.wk);
    const Scratch<int64_t> rows = shaw_rows_by_distance(hd, shaw_);
    for (int64_t i = 0; i < hd.lq; ++i)
      for (int64_t j = 0; j < hd.lk; ++j)
        if (const int64_t c = rows[hd.diagonal(i, j)]; c >= 0) S[i * hd.lk + j] += scale * R[i * buckets() + c];
  }

  void add_values(const Head<T>& hd, const T* P, T* out) override {
    if (shaw_.wv.empty()) return;
    const Scratch<T> Pb = bucket_sums(hd, P);
    const Scratch<T> wv = table_slice(shaw_.wv, hd.h);
    gemm<T>(Trans::no, Trans::no, hd.lq, hd.dv, buckets(), T(1), Pb.data(), buckets(), wv.data(), hd.dv, T(1), out,
            hd.dv);
  }

  void backward_values(const Head<T>& hd, const T* P, const T* dout, T* dP) override {
    if (shaw_.wv.empty()) return;
    const Scratch<T> wv = table_slice(shaw_.wv, hd.h);
    Scratch<T> dPb(hd.lq * buckets());  // dout wv^T, gathered back to (i, j)
    gemm<T>(Trans::no, Trans::yes, hd.lq, buckets(), hd.dv, T(1), dout, hd.dv, wv.data(), hd.dv, T(0), dPb.data(),
            buckets());
    const Scratch<int64_t> rows = shaw_rows_by_distance(hd, shaw_);
    for (int64_t i = 0; i < hd.lq; ++i)
      for (int64_t j = 0; j < hd.lk; ++j)
        if (const int64_t c = rows[hd.diagonal(i, j)]; c >= 0) dP[i * hd.lk + j] += dPb[i * buckets() + c];
    if (grads_ && !grads_->shaw_wv.empty()) {  // dwv = Pb^T dout
      const Scratch<T> Pb = bucket_sums(hd, P);
      Scratch<T> dwv(buckets() * hd.dv);
      gemm<T>(Trans::yes, Trans::no, buckets(), hd.dv, hd.lq, T(1), Pb.data(), buckets(), dout, hd.dv, T(0),
              dwv.data(), hd.dv);
      add_to_table(grads_->shaw_wv, hd.h, dwv);
    }
  }

  void backward_scores(const Head<T>& hd, T scale, const T* dS, T* dqp) override {
    if (shaw_.wk.empty()) return;
    const Scratch<T> dR = bucket_sums(hd, dS);
    const Scratch<T> wk = table_slice(shaw_.wk, hd.h);
    gemm<T>(Trans::no, Trans::no, hd.lq, hd.d, buckets(), scale, dR.data(), buckets(), wk.data(), hd.d, T(1), dqp,
            hd.d);
    if (grads_ && !grads_->shaw_wk.empty()) {  // dwk = scale dR^T qp
      Scratch<T> dwk(buckets() * hd.d);
      gemm<T>(Trans::yes, Trans::no, buckets(), hd.d, hd.lq, scale, dR.data(), buckets(), hd.qp, hd.d, T(0),
              dwk.data(), hd.d);
      add_to_table(grads_->shaw_wk, hd.h, dwk);
    }
  }

 private:
  int64_t buckets() const { return 2 * shaw_.k + 1; }

  // qp (Lq, d) times head h's table (2k+1, d), transposed: (Lq, 2k+1).
  Scratch<T> queries_times_table(const Head<T>& hd, const View3<const T>& table) const {
    const Scratch<T> w = table_slice(table, hd.h);
    Scratch<T> R(hd.lq * buckets());
    gemm<T>(Trans::no, Trans::yes, hd.lq, buckets(), hd.d, T(1), hd.qp, hd.d, w.data(), hd.d, T(0), R.data(),
            buckets());
    return R;
  }

  // X (Lq, Lk) summed per query row and table row: (Lq, 2k+1).
  Scratch<T> bucket_sums(const Head<T>& hd, const T* X) const {
    const Scratch<int64_t> rows = shaw_rows_by_distance(hd, shaw_);
    Scratch<T> sums(hd.lq * buckets());
    for (int64_t i = 0; i < hd.lq; ++i)
      for (int64_t j = 0; j < hd.lk; ++j)
        if (const int64_t c = rows[hd.diagonal(i, j)]; c >= 0) sums[i * buckets() + c] += X[i * hd.lk + j];
    return sums;
  }

  const ShawParams<T>& shaw_;
  const PositionGrads<T>* grads_;
};

}  // namespace

template <class T>
std::unique_ptr<RelativeTerm<T>> make_shaw_gather(const AttentionForward<T>& p, const PositionGrads<T>* grads) {
  return std::make_unique<ShawGather<T>>(p.pos.shaw, grads);
}

template std::unique_ptr<RelativeTerm<float>> make_shaw_gather(const AttentionForward<float>&,
                                                               const PositionGrads<float>*);
template std::unique_ptr<RelativeTerm<double>> make_shaw_gather(const AttentionForward<double>&,
                                                                const PositionGrads<double>*);

}  // namespace relpos::unfused
