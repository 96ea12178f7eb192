// Transformer-XL's relative shift (Dai et al. 2019, appendix B). With memory,
// keys are [memory; current] and queries the current segment, end-aligned:
// key j lies (Lk - Lq) + i - j positions before query i. The positional scores
// BD = qp (W_R R)^T are computed once per distance, column c for distance
// index c (R of Lk - 1 - c positions back), (Lq, Lk); then pad one zero column
// on the left, (Lq, Lk+1); read the buffer from element Lq on as (Lq, Lk).
// Pair (i, j) lands on BD[i, j - i + Lq - 1] for every j <= i + Lk - Lq (the
// causal ones; the rest is masked).
#include <stdexcept>

#include "diagonal_term.hpp"

namespace relpos::unfused {
namespace {

struct RelShift {
  static constexpr const char* name = "relshift";


  template <class T>
  static int64_t count(const Head<T>& hd) {
    return hd.lk;
  }

  template <class T>
  static void to_pairs(const Head<T>& hd, const T* BD, T scale, T* S) {
    const int64_t lq = hd.lq, lk = hd.lk;
    Scratch<T> padded(lq * (lk + 1));  // (Lq, Lk+1), column 0 zero
    for (int64_t i = 0; i < lq; ++i)
      for (int64_t c = 0; c < lk; ++c) padded[i * (lk + 1) + c + 1] = BD[i * lk + c];
    const T* shifted = padded.data() + lq;
    for (int64_t i = 0; i < lq; ++i)
      for (int64_t j = 0; j < lk; ++j) S[i * lk + j] += scale * shifted[i * lk + j];
  }

  template <class T>
  static void to_distances(const Head<T>& hd, const T* Y, T* BD) {
    const int64_t lq = hd.lq, lk = hd.lk;
    Scratch<T> padded(lq * (lk + 1));
    T* shifted = padded.data() + lq;
    for (int64_t i = 0; i < lq; ++i)
      for (int64_t j = 0; j < lk; ++j) shifted[i * lk + j] += Y[i * lk + j];
    for (int64_t i = 0; i < lq; ++i)
      for (int64_t c = 0; c < lk; ++c) BD[i * lk + c] += padded[i * (lk + 1) + c + 1];
  }
};

}  // namespace

template <class T>
std::unique_ptr<RelativeTerm<T>> make_relshift(const AttentionForward<T>& p, const PositionGrads<T>* grads) {
  return std::make_unique<DiagonalTerm<T, RelShift>>(p, grads);
}

template std::unique_ptr<RelativeTerm<float>> make_relshift(const AttentionForward<float>&, const PositionGrads<float>*);
template std::unique_ptr<RelativeTerm<double>> make_relshift(const AttentionForward<double>&,
                                                             const PositionGrads<double>*);

}  // namespace relpos::unfused
