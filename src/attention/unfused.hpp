// The unfused algorithms of the papers (split, gather/bucket, skew,
// generalized skew, rel-shift) share one pipeline per (batch, head):
//
//   S   = scale * qc k^T  (+ term.add_scores)  + bias[distance]    masked, softmax -> P, lse
//   out = P v             (+ term.add_values)
//
// and its exact backward. They differ only in how the relative embedding
// term is computed: that is a RelativeTerm. Biases (T5, ALiBi) are one value
// per distance, O(Lq + Lk) for every algorithm; their gradients are summed
// per distance, then per bucket.
//
// Distances: r(i, j) = rmin + (lq - 1 - i) + j, where rmin is r(lq - 1, 0);
// the diagonal index m = j - i + lq - 1 in [0, lq + lk - 1) numbers them.
#pragma once

#include <memory>

#include "../backend/scratch.hpp"
#include "head.hpp"
#include "relpos/attention.hpp"

namespace relpos::unfused {

// The relative embedding term of one algorithm. All matrices are dense
// row-major: S, P, dS, dP are (lq, lk), out and dout (lq, dv), dqp (lq, d).
template <class T>
class RelativeTerm {
 public:
  virtual ~RelativeTerm() = default;
  // S_ij += scale * qp_i . rk(i, j)
  virtual void add_scores(const Head<T>& hd, T scale, T* S) { (void)hd, (void)scale, (void)S; }
  // out_i += sum_j P_ij rv(i, j)
  virtual void add_values(const Head<T>& hd, const T* P, T* out) { (void)hd, (void)P, (void)out; }
  // dP_ij += dout_i . rv(i, j); value-table gradients += sum P_ij dout_i
  virtual void backward_values(const Head<T>& hd, const T* P, const T* dout, T* dP) {
    (void)hd, (void)P, (void)dout, (void)dP;
  }
  // dqp_i += scale * sum_j dS_ij rk(i, j); score-table gradients
  virtual void backward_scores(const Head<T>& hd, T scale, const T* dS, T* dqp) {
    (void)hd, (void)scale, (void)dS, (void)dqp;
  }
};

// The term of `algorithm` for p's scheme; grads is null in forward. Call only
// for an algorithm check_algorithm accepted for p (dispatch's capability table).
template <class T>
std::unique_ptr<RelativeTerm<T>> make_term(Algorithm algorithm, const AttentionForward<T>& p,
                                           const PositionGrads<T>* grads);

// Constructors of the terms, one file each.
template <class T>
std::unique_ptr<RelativeTerm<T>> make_table_gather(const AttentionForward<T>& p, const PositionGrads<T>* grads);
template <class T>
std::unique_ptr<RelativeTerm<T>> make_table_split(const AttentionForward<T>& p, const PositionGrads<T>* grads);
template <class T>
std::unique_ptr<RelativeTerm<T>> make_skew(const AttentionForward<T>& p, const PositionGrads<T>* grads);
template <class T>
std::unique_ptr<RelativeTerm<T>> make_generalized_skew(const AttentionForward<T>& p, const PositionGrads<T>* grads);
template <class T>
std::unique_ptr<RelativeTerm<T>> make_relshift(const AttentionForward<T>& p, const PositionGrads<T>* grads);

template <class T>
void forward(const AttentionForward<T>& p);
template <class T>
void backward(const AttentionBackward<T>& p);

}  // namespace relpos::unfused
