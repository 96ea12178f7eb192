// Relative embeddings of one head listed by distance index m = r - rmin
// (Head in head.hpp), the matrix E that the skew and rel-shift algorithms
// multiply by the queries:
//   Shaw            key row  wk[c(r)]   value row wv[c(r)]   (zero when c(r) = -1)
//   Transformer-XL  key row  W_R R(xl_distance(r))
// and the way back: a gradient per distance row summed into the parameters.
// Shared by the unfused algorithms and the fused kernel, with the per-head
// slices of Shaw's tables both read.
#pragma once

#include <algorithm>
#include <cmath>
#include <vector>

#include "relpos/gemm.hpp"
#include "../backend/parallel.hpp"
#include "../backend/scratch.hpp"
#include "head.hpp"
#include "relpos/attention.hpp"

namespace relpos {

// Dense copy of head h's slice of a (1 or H, rows, width) table.
template <class T>
Scratch<T> table_slice(const View3<const T>& table, int64_t h) {
  const int64_t ht = table.shape[0] == 1 ? 0 : h, rows = table.shape[1], width = table.shape[2];
  Scratch<T> dense(rows * width);
  for (int64_t c = 0; c < rows; ++c)
    for (int64_t x = 0; x < width; ++x) dense[c * width + x] = table(ht, c, x);
  return dense;
}

// grad(ht(h), c, x) += dense[c * width + x]
template <class T>
void add_to_table(const View3<T>& grad, int64_t h, const Scratch<T>& dense) {
  const int64_t ht = grad.shape[0] == 1 ? 0 : h, rows = grad.shape[1], width = grad.shape[2];
  for (int64_t c = 0; c < rows; ++c)
    for (int64_t x = 0; x < width; ++x) grad(ht, c, x) += dense[c * width + x];
}

// Shaw's table row for every distance of the head: c(r) or -1 (zero embedding).
template <class T>
Scratch<int64_t> shaw_rows_by_distance(const Head<T>& hd, const ShawParams<T>& shaw) {
  Scratch<int64_t> rows(hd.distances());
  for (int64_t m = 0; m < hd.distances(); ++m) rows[m] = shaw_index(hd.rmin + m, shaw.k, shaw.beyond);
  return rows;
}


template <class T>
class DistanceTable {
 public:
  // sinusoids: Transformer-XL's R of the call's distances (make_sinusoids),
  // shared by every head so that it is computed once; null = per use.
  DistanceTable(const PositionParams<T>& pos, const PositionGrads<T>* grads, const Scratch<T>* sinusoids = nullptr)
      : pos_(pos), grads_(grads), shared_sinusoids_(sinusoids) {}

  // (count, pos_dim) sinusoids R(xl_distance(rmin + m)) of distances m = 0 .. count-1,
  // on `threads` threads. Consecutive rows differ by one position (or none, where
  // clamped), so a row follows from the one before by the angle-addition formulas
  // in double; every kAnchorRows-th row is computed exactly, which keeps the error
  // within ~1e-14 and lets chunks of rows run in parallel. Exact sin and cos for
  // every entry cost more than the attention itself at pos_dim 512.
  static Scratch<T> make_sinusoids(const PositionParams<T>& pos, int64_t rmin, int64_t count, int threads = 1) {
    constexpr int64_t kAnchorRows = 32;
    const int64_t pd = pos.xl.w_r.shape[2], half = pd / 2;
    Scratch<T> R(count * pd);
    const std::vector<double> inv_freq = sinusoid_inv_freq(pd);
    std::vector<double> step_sin(half), step_cos(half);
    for (int64_t i = 0; i < half; ++i) step_sin[i] = std::sin(inv_freq[i]), step_cos[i] = std::cos(inv_freq[i]);
    const auto distance = [&](int64_t m) { return xl_distance(rmin + m, pos.xl.clamp_len); };
    const int64_t chunks = (count + kAnchorRows - 1) / kAnchorRows;
    parallel_for(
        chunks, std::max(1, std::min<int>(threads, int(chunks))), [](int) {},
        [&](int, int64_t chunk) {
          std::vector<double> sn(half), cs(half);
          const int64_t first = chunk * kAnchorRows, last = std::min(count, first + kAnchorRows);
          for (int64_t m = first; m < last; ++m) {
            const int64_t step = m == first ? 0 : distance(m) - distance(m - 1);
            if (m == first || (step != 0 && step != 1 && step != -1)) {
              for (int64_t i = 0; i < half; ++i) {
                const double angle = double(distance(m)) * inv_freq[i];
                sn[i] = std::sin(angle), cs[i] = std::cos(angle);
              }
            } else if (step != 0) {  // sin(a +- b), cos(a +- b)
              const double sign = double(step);
              for (int64_t i = 0; i < half; ++i) {
                const double s0 = sn[i], c0 = cs[i];
                sn[i] = s0 * step_cos[i] + sign * c0 * step_sin[i];
                cs[i] = c0 * step_cos[i] - sign * s0 * step_sin[i];
              }
            }
            T* row = &R[m * pd];
            for (int64_t i = 0; i < half; ++i) row[i] = T(sn[i]), row[half + i] = T(cs[i]);
          }
        });
    return R;
  }

  bool has_keys() const { return pos_.scheme == Scheme::xl || !pos_.shaw.wk.empty(); }
  bool has_values() const { return pos_.scheme == Scheme::shaw && !pos_.shaw.wv.empty(); }

  // (count, d) key embeddings of distances m = 0 .. count-1.
  Scratch<T> keys(const Head<T>& hd, int64_t count) const {
    Scratch<T> E(count * hd.d);
    if (pos_.scheme == Scheme::xl) {  // E = R W_R^T
      Scratch<T> own;
      const Scratch<T>& R = sinusoids(hd, count, own);
      const int64_t pd = pos_dim();
      Scratch<T> w(hd.d * pd);  // this head's W_R, dense
      for (int64_t x = 0; x < hd.d; ++x)
        for (int64_t e = 0; e < pd; ++e) w[x * pd + e] = pos_.xl.w_r(hd.h, x, e);
      gemm<T>(Trans::no, Trans::yes, count, hd.d, pd, T(1), R.data(), pd, w.data(), pd, T(0), E.data(), hd.d);
    } else {
      shaw_rows(hd, pos_.shaw.wk, count, E);
    }
    return E;
  }

  // (count, dv) value embeddings (Shaw only).
  Scratch<T> values(const Head<T>& hd, int64_t count) const {
    Scratch<T> E(count * hd.dv);
    shaw_rows(hd, pos_.shaw.wv, count, E);
    return E;
  }

  // Parameter gradients from dE (count, d) of the key embeddings.
  void add_key_grad(const Head<T>& hd, const Scratch<T>& dE, int64_t count) const {
    if (!grads_) return;
    if (pos_.scheme == Scheme::xl) {
      if (grads_->xl_w_r.empty()) return;
      Scratch<T> own;
      const Scratch<T>& R = sinusoids(hd, count, own);
      const int64_t pd = pos_dim();
      Scratch<T> dW(hd.d * pd);  // dE^T R
      gemm<T>(Trans::yes, Trans::no, hd.d, pd, count, T(1), dE.data(), hd.d, R.data(), pd, T(0), dW.data(), pd);
      for (int64_t x = 0; x < hd.d; ++x)
        for (int64_t e = 0; e < pd; ++e) grads_->xl_w_r(hd.h, x, e) += dW[x * pd + e];
    } else if (!grads_->shaw_wk.empty()) {
      add_shaw_rows(hd, grads_->shaw_wk, dE, count);
    }
  }

  void add_value_grad(const Head<T>& hd, const Scratch<T>& dE, int64_t count) const {
    if (grads_ && !grads_->shaw_wv.empty()) add_shaw_rows(hd, grads_->shaw_wv, dE, count);
  }

 private:
  int64_t pos_dim() const { return pos_.xl.w_r.shape[2]; }

  // The shared sinusoids when given (the caller made them for the same
  // distances), else a table made in `own`.
  const Scratch<T>& sinusoids(const Head<T>& hd, int64_t count, Scratch<T>& own) const {
    if (shared_sinusoids_) return *shared_sinusoids_;
    own = make_sinusoids(pos_, hd.rmin, count);
    return own;
  }

  void shaw_rows(const Head<T>& hd, const View3<const T>& table, int64_t count, Scratch<T>& E) const {
    const int64_t width = table.shape[2], ht = table.shape[0] == 1 ? 0 : hd.h;
    for (int64_t m = 0; m < count; ++m)
      if (const int64_t c = shaw_index(hd.rmin + m, pos_.shaw.k, pos_.shaw.beyond); c >= 0)
        for (int64_t x = 0; x < width; ++x) E[m * width + x] = table(ht, c, x);
  }

  void add_shaw_rows(const Head<T>& hd, const View3<T>& grad, const Scratch<T>& dE, int64_t count) const {
    const int64_t width = grad.shape[2], ht = grad.shape[0] == 1 ? 0 : hd.h;
    for (int64_t m = 0; m < count; ++m)
      if (const int64_t c = shaw_index(hd.rmin + m, pos_.shaw.k, pos_.shaw.beyond); c >= 0)
        for (int64_t x = 0; x < width; ++x) grad(ht, c, x) += dE[m * width + x];
  }

  const PositionParams<T>& pos_;
  const PositionGrads<T>* grads_;
  const Scratch<T>* shared_sinusoids_;
};

}  // namespace relpos
