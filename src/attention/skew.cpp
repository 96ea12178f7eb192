// Music Transformer's skew and the generalized skew: the relative scores of
// every query against every distance, R = qp E^T, moved onto (query, key)
// pairs by an index trick instead of an (L, L, d) gather.
#include <stdexcept>

#include "diagonal_term.hpp"

namespace relpos::unfused {
namespace {

// Huang et al. 2018, section 3.4.1, for causal self-attention of length L:
// E lists distances -(L-1) .. 0, R is (L, L); pad one zero column on the
// left, (L, L+1); read the buffer as (L+1, L) and drop the first row. Row i,
// column j of the result is R[i, j - i + L - 1], the score at distance j - i,
// for every j <= i (the rest is masked).
struct MusicSkew {
  static constexpr const char* name = "skew";


  template <class T>
  static int64_t count(const Head<T>& hd) {
    return hd.lq;
  }

  template <class T>
  static void to_pairs(const Head<T>& hd, const T* R, T scale, T* S) {
    const int64_t L = hd.lq;
    Scratch<T> padded(L * (L + 1));  // (L, L+1), column 0 zero
    for (int64_t i = 0; i < L; ++i)
      for (int64_t c = 0; c < L; ++c) padded[i * (L + 1) + c + 1] = R[i * L + c];
    const T* reshaped = padded.data() + L;  // (L+1, L) without its first row
    for (int64_t i = 0; i < L; ++i)
      for (int64_t j = 0; j < L; ++j) S[i * L + j] += scale * reshaped[i * L + j];
  }

  template <class T>
  static void to_distances(const Head<T>& hd, const T* Y, T* R) {
    const int64_t L = hd.lq;
    Scratch<T> padded(L * (L + 1));
    T* reshaped = padded.data() + L;
    for (int64_t i = 0; i < L; ++i)
      for (int64_t j = 0; j < L; ++j) reshaped[i * L + j] += Y[i * L + j];
    for (int64_t i = 0; i < L; ++i)
      for (int64_t c = 0; c < L; ++c) R[i * L + c] += padded[i * (L + 1) + c + 1];
  }
};

// Any mask, any offsets, cross-attention: E lists all Lq + Lk - 1 distances
// of the head, and the score of pair (i, j) sits on R's diagonal
// m = j - i + Lq - 1, i.e. in the strided view of R that starts at column
// Lq - 1 with row stride (count - 1).
struct GeneralizedSkew {
  static constexpr const char* name = "generalized_skew";


  template <class T>
  static int64_t count(const Head<T>& hd) {
    return hd.distances();
  }

  template <class T>
  static void to_pairs(const Head<T>& hd, const T* R, T scale, T* S) {
    const T* diagonal = R + (hd.lq - 1);
    const int64_t row_stride = hd.distances() - 1;
    for (int64_t i = 0; i < hd.lq; ++i)
      for (int64_t j = 0; j < hd.lk; ++j) S[i * hd.lk + j] += scale * diagonal[i * row_stride + j];
  }

  template <class T>
  static void to_distances(const Head<T>& hd, const T* Y, T* R) {
    T* diagonal = R + (hd.lq - 1);
    const int64_t row_stride = hd.distances() - 1;
    for (int64_t i = 0; i < hd.lq; ++i)
      for (int64_t j = 0; j < hd.lk; ++j) diagonal[i * row_stride + j] += Y[i * hd.lk + j];
  }
};

}  // namespace

template <class T>
std::unique_ptr<RelativeTerm<T>> make_skew(const AttentionForward<T>& p, const PositionGrads<T>* grads) {
  return std::make_unique<DiagonalTerm<T, MusicSkew>>(p, grads);
}

template <class T>
std::unique_ptr<RelativeTerm<T>> make_generalized_skew(const AttentionForward<T>& p, const PositionGrads<T>* grads) {
  return std::make_unique<DiagonalTerm<T, GeneralizedSkew>>(p, grads);
}

#define RELPOS_INSTANTIATE(T)                                                                                       \
  template std::unique_ptr<RelativeTerm<T>> make_skew(const AttentionForward<T>&, const PositionGrads<T>*);       \
  template std::unique_ptr<RelativeTerm<T>> make_generalized_skew(const AttentionForward<T>&, const PositionGrads<T>*);
RELPOS_INSTANTIATE(float)
RELPOS_INSTANTIATE(double)
#undef RELPOS_INSTANTIATE

}  // namespace relpos::unfused
