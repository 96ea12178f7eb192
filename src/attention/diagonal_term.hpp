// The relative term of the skew-family algorithms: R = qp E^T holds the score
// of every query against every distance, (Lq, count); a Layout policy moves it
// onto (query, key) pairs, S_ij += scale * R[i, m(i, j)], each with its
// paper's index trick, and back (the transpose, for value terms and backward).
//
// A Layout provides
//   static const char* name;
//   static int64_t count(const Head<T>&)                 distances m = 0 .. count-1 it uses
//   static void to_pairs(hd, X, scale, Y)                Y_ij += scale * X[i, m(i, j)]
//   static void to_distances(hd, Y, X)                   X[i, m(i, j)] += Y_ij
// to_pairs may write garbage where m(i, j) is out of its range; those pairs
// are masked (dispatch's geometry conditions guarantee it) and to_distances only ever sees zeros there.
#pragma once

#include "distance_table.hpp"
#include "tile_products.hpp"
#include "relpos/gemm.hpp"
#include "unfused.hpp"

namespace relpos::unfused {

template <class T, class Layout>
class DiagonalTerm final : public RelativeTerm<T> {
 public:
  DiagonalTerm(const AttentionForward<T>& p, const PositionGrads<T>* grads) : table_(p, grads) {}

  void add_scores(const Head<T>& hd, T scale, T* S) override {
    if (!table_.has_keys()) return;
    const int64_t n = Layout::count(hd);
    const Scratch<T> E = table_.keys(hd, n);
    Scratch<T> R(hd.lq * n);
    gemm<T>(Trans::no, Trans::yes, hd.lq, n, hd.d, T(1), hd.qp, hd.d, E.data(), hd.d, T(0), R.data(), n);
    Layout::to_pairs(hd, R.data(), scale, S);
  }

  void add_values(const Head<T>& hd, const T* P, T* out) override {
    if (!table_.has_values()) return;
    const int64_t n = Layout::count(hd);
    const Scratch<T> Prel = by_distance(hd, P);
    const Scratch<T> E = table_.values(hd, n);
    weights_times<T>(Trans::no, hd.lq, hd.dv, n, T(1), Prel.data(), n, E.data(), hd.dv, T(1), out, hd.dv);
  }

  void backward_values(const Head<T>& hd, const T* P, const T* dout, T* dP) override {
    if (!table_.has_values()) return;
    const int64_t n = Layout::count(hd);
    const Scratch<T> E = table_.values(hd, n);
    Scratch<T> dPrel(hd.lq * n);  // dout E^T
    gemm<T>(Trans::no, Trans::yes, hd.lq, n, hd.dv, T(1), dout, hd.dv, E.data(), hd.dv, T(0), dPrel.data(), n);
    Layout::to_pairs(hd, dPrel.data(), T(1), dP);
    const Scratch<T> Prel = by_distance(hd, P);
    Scratch<T> dE(n * hd.dv);  // Prel^T dout
    weights_times<T>(Trans::yes, n, hd.dv, hd.lq, T(1), Prel.data(), n, dout, hd.dv, T(0), dE.data(), hd.dv);
    table_.add_value_grad(hd, dE, n);
  }

  void backward_scores(const Head<T>& hd, T scale, const T* dS, T* dqp) override {
    if (!table_.has_keys()) return;
    const int64_t n = Layout::count(hd);
    const Scratch<T> dR = by_distance(hd, dS);
    const Scratch<T> E = table_.keys(hd, n);
    weights_times<T>(Trans::no, hd.lq, hd.d, n, scale, dR.data(), n, E.data(), hd.d, T(1), dqp, hd.d);
    Scratch<T> dE(n * hd.d);  // scale dR^T qp
    weights_times<T>(Trans::yes, n, hd.d, hd.lq, scale, dR.data(), n, hd.qp, hd.d, T(0), dE.data(), hd.d);
    table_.add_key_grad(hd, dE, n);
  }

 private:
  // Y (Lq, Lk) summed onto (Lq, count) by distance.
  static Scratch<T> by_distance(const Head<T>& hd, const T* Y) {
    Scratch<T> X(hd.lq * Layout::count(hd));
    Layout::to_distances(hd, Y, X.data());
    return X;
  }

  DistanceTable<T> table_;
};

}  // namespace relpos::unfused
