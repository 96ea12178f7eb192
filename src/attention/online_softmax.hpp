// The online softmax of the fused forward (Milakov and Gimelshein 2018, as
// FlashAttention runs it): the rows of one query tile meet their keys a tile
// at a time, each row keeping its running maximum m and its sum l of
// exp(logit - m). A tile whose logits raise m rescales what the row summed
// before (its output, a value table's bucket sums) by exp(m_old - m_new);
// at the end the output is divided by l and the row's logsumexp is m + log l.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "../backend/scratch.hpp"
#include "../backend/simd.hpp"
#include "distance_table.hpp"
#include "head.hpp"

namespace relpos::fused {

template <class T>
class OnlineSoftmax {
 public:
  void reserve(int64_t rows) { m_.reserve(rows), l_.reserve(rows); }
  void reset(int64_t rows) {
    m_.assign(rows, kNegInf<T>);
    l_.assign(rows, T(0));
  }

  struct Step {
    bool visible = false;  // the row has seen a key; until then its logits came out all zero
    T rescale = T(1);      // by which the row's earlier sums are scaled
    typename BucketedRow<T>::Sums sums;  // of the row's new exponentials, by bucket part
  };

  // The logits of row ii against the next keys, row[0, buckets.n), become
  // exp(logit - m) with the row's new running maximum m.
  Step step(int64_t ii, const BucketedRow<T>& buckets, T* row) {
    Step s;
    const T m_new = buckets.max(row, m_[ii]);
    if (m_new == kNegInf<T>) {  // nothing visible yet in this row
      std::fill(row, row + buckets.n, T(0));
      return s;
    }
    s.visible = true;
    // Rescaled by less than e^-44, the old terms drop, as exp_shifted_sum's
    // do (simd::kSoftmaxCutoff): kept, they would be subnormal numbers.
    s.rescale = m_[ii] - m_new < T(simd::kSoftmaxCutoff) ? T(0) : std::exp(m_[ii] - m_new);
    s.sums = buckets.exp_shifted(row, m_new);
    l_[ii] = l_[ii] * s.rescale + s.sums.total();
    m_[ii] = m_new;
    return s;
  }

  // What row ii's output is multiplied by at the end: 1 / l, 0 for a row
  // that saw no key (a fully masked row's output is zeros).
  T normaliser(int64_t ii) const { return l_[ii] == T(0) ? T(0) : T(1) / l_[ii]; }
  // Row ii's logsumexp, -inf for a row that saw no key.
  T logsumexp(int64_t ii) const { return l_[ii] == T(0) ? kNegInf<T> : m_[ii] + std::log(l_[ii]); }

 private:
  Scratch<T> m_, l_;
};

}  // namespace relpos::fused
