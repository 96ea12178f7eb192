// The products of one fused-attention tile, cut where the causal mask hides
// part of it. A tile on the mask's diagonal (some keys in the future of some
// of its queries) of at most simd::kStaircaseMaxSize queries, keys and
// features goes to simd::staircase_product, which skips the hidden part; at
// such sizes sgemm's per-call cost dominates anyway (one Zen 4 core, 64 x 64
// x 32: q k^T 3.7 us by sgemm, 2.0 us cut; P v 2.6 us against 1.4). Every
// other tile, and double, goes to gemm as before, so a call without a causal
// mask computes what it always did.
//
// In a tile of bq queries and bk keys, key jj is visible to query row ii iff
// jj <= ii + delta. The products by that cut:
//   S = q k^T, dP = dout v^T    rows against rows: row ii needs keys jj <= ii + delta
//   O += P v, dq += dS k        P's rows are zero past ii + delta
//   dv += P^T dout, dk += dS^T q  P's columns are zero above jj - delta
#pragma once

#include <algorithm>
#include <cstdint>
#include <type_traits>
#include <utility>

#include "relpos/gemm.hpp"
#include "../backend/row_ops.hpp"
#include "../backend/scratch.hpp"
#include "../backend/simd.hpp"
#include "causal_cut.hpp"

namespace relpos {

// c (bq x bk) = alpha a b^T over `width` features, rows ia.. of a against rows
// jb.. of b (row strides lda, ldb; c's row stride bk). The cut path reads b's
// rows through their transpose, made in `transposed`.
template <class T>
void rows_by_rows(const TileCut& cut, int64_t bq, int64_t bk, int64_t width, T alpha, const T* a, int64_t lda,
                  const T* b, int64_t ldb, T* c, Scratch<T>& transposed) {
  if constexpr (std::is_same_v<T, float>)
    if (cut.staircase) {
      transposed.resize(width * bk);
      simd::transpose(b, bk, width, ldb, transposed.data(), bk);
      return simd::staircase_product({bq, bk, width, alpha, 0.0f, a, lda, 1, transposed.data(), bk, c, bk,
                                      simd::Staircase::columns, cut.delta});
    }
  gemm<T>(Trans::no, Trans::yes, bq, bk, width, alpha, a, lda, b, ldb, T(0), c, bk);
}

// A masked key contributes exactly nothing, whatever its rows hold: the
// products below multiply P or dS, zero where the mask hides, by rows of
// keys or queries, and 0 x inf is NaN. Where a row the cut hides from part
// of the tile is not finite (an uninitialised slot of a KV cache, a NaN
// query), a product adds the visible pairs only, row by row; everywhere
// else (every finite input) it runs as before.
//
// Whether rows [first, end) of x (n entries each, row stride ld) hold a non-finite value.
template <class T>
bool nonfinite_in(std::pair<int64_t, int64_t> rows, int64_t n, const T* x, int64_t ld) {
  const auto [first, end] = rows;
  return first < end && !rows::rows_finite(x + first * ld, end - first, n, ld);
}

// Whether the cut of a backward tile hides a non-finite row of its keys k
// (d features, row stride ldk), queries q (d) or dout (dv), dense rows, from some of its pairs.
template <class T>
bool hides_nonfinite(const TileCut& cut, int64_t bq, const T* k, int64_t ldk, int64_t d, const T* q,
                     const T* dout, int64_t dv) {
  const auto queries = hidden_query_rows(cut, bq);
  return nonfinite_in(hidden_key_rows(cut), d, k, ldk) || nonfinite_in(queries, d, q, d) ||
         nonfinite_in(queries, dv, dout, dv);
}

// c (bq x n) = alpha P b + beta c (beta 0 or 1), the visible pairs only: row ii of P against b's rows jj <= ii + delta.
template <class T>
void visible_times(const TileCut& cut, int64_t bq, int64_t n, T alpha, const T* P, int64_t ldp, const T* b,
                   int64_t ldb, T beta, T* c, int64_t ldc) {
  for (int64_t ii = 0; ii < bq; ++ii) {
    T* row = c + ii * ldc;
    if (beta == T(0)) std::fill(row, row + n, T(0));
    for (int64_t jj = 0, shown = cut.shown(ii); jj < shown; ++jj)
      rows::add_scaled(row, b + jj * ldb, alpha * P[ii * ldp + jj], n);
  }
}

// c (bk x n) = alpha P^T b + beta c (beta 0 or 1), the visible pairs only: key jj against b's rows ii >= jj - delta.
template <class T>
void visible_transposed_times(const TileCut& cut, int64_t bq, int64_t n, int64_t bk, T alpha, const T* P,
                              int64_t ldp, const T* b, int64_t ldb, T beta, T* c, int64_t ldc) {
  for (int64_t jj = 0; jj < bk; ++jj) {
    T* row = c + jj * ldc;
    if (beta == T(0)) std::fill(row, row + n, T(0));
    for (int64_t ii = std::clamp<int64_t>(jj - cut.delta, 0, bq); ii < bq; ++ii)
      rows::add_scaled(row, b + ii * ldb, alpha * P[ii * ldp + jj], n);
  }
}

// c (m x n) = alpha op(a) b + beta c (beta 0 or 1) for a matrix of weights
// op(a) (m x k: a, or a^T for Trans::yes) whose zero entries mean "no pair"
// (bucket sums of P or dS per positional table row, which are 0 for the rows
// a query does not reach) and b (k x n, row stride ldb): gemm, unless a row
// of b is not finite (a NaN table row, a NaN query), where a zero weight
// still contributes nothing and the product skips it.
template <class T>
void weights_times(Trans ta, int64_t m, int64_t n, int64_t k, T alpha, const T* a, int64_t lda, const T* b,
                   int64_t ldb, T beta, T* c, int64_t ldc) {
  if (rows::rows_finite(b, k, n, ldb)) return gemm<T>(ta, Trans::no, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
  for (int64_t i = 0; i < m; ++i) {
    T* row = c + i * ldc;
    if (beta == T(0)) std::fill(row, row + n, T(0));
    for (int64_t p = 0; p < k; ++p)
      if (const T w = ta == Trans::no ? a[i * lda + p] : a[p * lda + i]; w != T(0))
        rows::add_scaled(row, b + p * ldb, alpha * w, n);
  }
}

// c (bq x n) = alpha P b + beta c for the tile's P (bq x bk, row-major, zero
// where the mask hides) and b (bk x n).
template <class T>
void tile_times(const TileCut& cut, int64_t bq, int64_t n, int64_t bk, T alpha, const T* P, const T* b, int64_t ldb,
                T beta, T* c, int64_t ldc) {
  if (nonfinite_in(hidden_key_rows(cut), n, b, ldb))
    return visible_times(cut, bq, n, alpha, P, bk, b, ldb, beta, c, ldc);
  if constexpr (std::is_same_v<T, float>)
    if (cut.staircase)
      return simd::staircase_product({bq, n, bk, alpha, beta, P, bk, 1, b, ldb, c, ldc,
                                      simd::Staircase::leading_depth, cut.delta});
  gemm<T>(Trans::no, Trans::no, bq, n, bk, alpha, P, bk, b, ldb, beta, c, ldc);
}

// c (bk x n) = alpha P^T b + beta c for the tile's P (bq x bk, row stride
// ldp: a tile's later keys are a tile of their own) and b (bq x n).
template <class T>
void tile_transposed_times(const TileCut& cut, int64_t bq, int64_t n, int64_t bk, T alpha, const T* P, int64_t ldp,
                           const T* b, int64_t ldb, T beta, T* c, int64_t ldc) {
  if (nonfinite_in(hidden_query_rows(cut, bq), n, b, ldb))
    return visible_transposed_times(cut, bq, n, bk, alpha, P, ldp, b, ldb, beta, c, ldc);
  if constexpr (std::is_same_v<T, float>)
    if (cut.staircase)
      return simd::staircase_product({bk, n, bq, alpha, beta, P, 1, ldp, b, ldb, c, ldc,
                                      simd::Staircase::trailing_depth, cut.delta});
  gemm<T>(Trans::yes, Trans::no, bk, n, bq, alpha, P, ldp, b, ldb, beta, c, ldc);
}

}  // namespace relpos
