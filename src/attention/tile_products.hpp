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

namespace relpos {

struct TileCut {
  bool causal = false;
  bool staircase = false;  // the mask cuts the tile and it is small enough for staircase_product
  int64_t delta = 0;
};

// The cut of a tile of bq queries and bk keys of `features` (the larger of
// d and dv) where key jj is visible to row ii iff jj <= ii + delta.
inline TileCut tile_cut(bool causal, int64_t delta, int64_t bq, int64_t bk, int64_t features) {
  const int64_t most = simd::kStaircaseMaxSize;
  const bool cut = causal && delta < bk - 1;  // row 0 cannot see the last key
  return {causal, cut && bq <= most && bk <= most && features <= most, delta};
}

// The keys [0, visible) of row ii that the softmax's exponentials and
// gradient need: those the mask shows, rounded up to 16 so that the vector
// loops run whole vectors (a tail runs lane by lane, and a third of the
// plain forward at L = 64 went to it); the masked keys among them are -inf
// logits and come out 0. The rest of the row is set to zero.
inline int64_t visible_keys(const TileCut& cut, int64_t ii, int64_t bk) {
  constexpr int64_t kVector = 16;
  if (!cut.causal) return bk;
  const int64_t shown = std::clamp<int64_t>(ii + cut.delta + 1, 0, bk);
  return std::min(bk, (shown + kVector - 1) / kVector * kVector);
}

// c (bq x bk) = alpha a b^T over `width` features, rows ia.. of a against rows
// jb.. of b (row strides lda, ldb; c's row stride bk). The cut path reads b's
// rows through their transpose, made in `transposed`.
template <class T>
void rows_by_rows(const TileCut& cut, int64_t bq, int64_t bk, int64_t width, T alpha, const T* a, int64_t lda,
                  const T* b, int64_t ldb, T* c, Scratch<T>& transposed) {
  if constexpr (std::is_same_v<T, float>)
    if (cut.staircase) {
      transposed.resize(width * bk);
      simd::transpose(b, bk, width, ldb, transposed.data());
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
// Key rows jj of a tile hidden from its row 0 (jj > delta), and query rows
// ii that do not see its last key (ii < bk - 1 - delta).
inline std::pair<int64_t, int64_t> hidden_key_rows(const TileCut& cut, int64_t bk) {
  return {cut.causal ? std::clamp<int64_t>(cut.delta + 1, 0, bk) : bk, bk};
}
inline std::pair<int64_t, int64_t> hidden_query_rows(const TileCut& cut, int64_t bq, int64_t bk) {
  return {0, cut.causal ? std::clamp<int64_t>(bk - 1 - cut.delta, 0, bq) : 0};
}

// Whether rows [first, end) of x (n entries each, row stride ld) hold a non-finite value.
template <class T>
bool nonfinite_in(std::pair<int64_t, int64_t> rows, int64_t n, const T* x, int64_t ld) {
  const auto [first, end] = rows;
  return first < end && !rows::rows_finite(x + first * ld, end - first, n, ld);
}

// Whether the cut of a backward tile hides a non-finite row of its keys k
// (d features, row stride ldk), queries q (d) or dout (dv), dense rows, from some of its pairs.
template <class T>
bool hides_nonfinite(const TileCut& cut, int64_t bq, int64_t bk, const T* k, int64_t ldk, int64_t d, const T* q,
                     const T* dout, int64_t dv) {
  const auto queries = hidden_query_rows(cut, bq, bk);
  return nonfinite_in(hidden_key_rows(cut, bk), d, k, ldk) || nonfinite_in(queries, d, q, d) ||
         nonfinite_in(queries, dv, dout, dv);
}

// c (bq x n) = alpha P b + beta c (beta 0 or 1), the visible pairs only: row ii of P against b's rows jj <= ii + delta.
template <class T>
void visible_times(const TileCut& cut, int64_t bq, int64_t n, int64_t bk, T alpha, const T* P, int64_t ldp,
                   const T* b, int64_t ldb, T beta, T* c, int64_t ldc) {
  for (int64_t ii = 0; ii < bq; ++ii) {
    T* row = c + ii * ldc;
    if (beta == T(0)) std::fill(row, row + n, T(0));
    const int64_t seen = std::clamp<int64_t>(ii + cut.delta + 1, 0, bk);
    for (int64_t jj = 0; jj < seen; ++jj) rows::add_scaled(row, b + jj * ldb, alpha * P[ii * ldp + jj], n);
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
  if (nonfinite_in(hidden_key_rows(cut, bk), n, b, ldb))
    return visible_times(cut, bq, n, bk, alpha, P, bk, b, ldb, beta, c, ldc);
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
  if (nonfinite_in(hidden_query_rows(cut, bq, bk), n, b, ldb))
    return visible_transposed_times(cut, bq, n, bk, alpha, P, ldp, b, ldb, beta, c, ldc);
  if constexpr (std::is_same_v<T, float>)
    if (cut.staircase)
      return simd::staircase_product({bk, n, bq, alpha, beta, P, 1, ldp, b, ldb, c, ldc,
                                      simd::Staircase::trailing_depth, cut.delta});
  gemm<T>(Trans::yes, Trans::no, bk, n, bq, alpha, P, ldp, b, ldb, beta, c, ldc);
}

// A float32 tile (the forward's P) as the sum of three bfloat16 tiles
// (simd::split_bf16, exact), for its product with a head's values stored in
// bfloat16 on CPUs whose bfloat16 products run on matrix units
// (gemm_bf16_matrix_units): there three bfloat16 products cost less than one
// float32 product (one core, 128 x 128 x 128: 3 x 5.9 us against 22 us),
// and together they multiply every bit of the float32 tile, so the result
// has float32's accuracy. Fewer parts do not: P rounded once to bfloat16
// (as FlashAttention does) broke the error rule of bfloat16 storage in
// dozens of test cases, two parts (16 bits) still in one of the 34
// two-thread cases.
class SplitTile {
 public:
  // How the three parts lie in one buffer: three dense tiles one after the
  // other (`stacked`), or row by row (`interleaved`: row r of hi, of mid, of
  // lo, then row r + 1), which makes the buffer at once the dense
  // rows x 3 cols matrix [hi mid lo] and the dense 3 rows x cols matrix whose
  // row 3 r + t is row r of part t, so that one product multiplies all three.
  enum class Layout { stacked, interleaved };

  // Makes room for a tile of rows x cols; its rows are then split one by one
  // (split_row) as the softmax finishes them, while each is still in the
  // core's first-level cache (splitting the whole tile afterwards read it
  // back from the second: 7% of the bfloat16 forward on one AMX core).
  void reshape(int64_t rows, int64_t cols, Layout layout) {
    const std::size_t n = static_cast<std::size_t>(3 * rows * cols);
    if (parts_.size() < n) parts_.resize(n);
    rows_ = rows, cols_ = cols, layout_ = layout;
  }
  void split_row(int64_t r, const float* x) {
    const int64_t part = layout_ == Layout::stacked ? rows_ * cols_ : cols_;
    uint16_t* hi = reinterpret_cast<uint16_t*>(parts_.data()) + (layout_ == Layout::stacked ? r : 3 * r) * cols_;
    simd::split_bf16(x, hi, hi + part, hi + 2 * part, cols_);
  }
  const bfloat16* data() const { return parts_.data(); }

  // c (rows x n) += alpha x b for the stacked split tile x and b (cols x n),
  // bfloat16 rows of row stride ldb.
  void accumulate_times(int64_t n, const bfloat16* b, int64_t ldb, float alpha, float* c, int64_t ldc) const {
    for (int64_t t = 0; t < 3; ++t)
      gemm_bf16(Trans::no, Trans::no, rows_, n, cols_, alpha, parts_.data() + t * rows_ * cols_, cols_, b, ldb, 1.0f,
                c, ldc);
  }

 private:
  Scratch<bfloat16> parts_;
  int64_t rows_ = 0, cols_ = 0;
  Layout layout_ = Layout::stacked;
};

// The backward's three products of P and dS where a head's q, k and dout
// are stored in bfloat16 and bfloat16 products run on matrix units: P and dS
// split exactly, interleaved (SplitTile), so that each product is one
// untransposed bfloat16 product over three times the depth:
//   dq   += scale [dS parts] (bq x 3 bk) [k; k; k] (3 bk x d),
//   dv^T += dout^T' P' (dv x bk), dk^T += scale q^T' dS' (d x bk), where P'
//           and dS' are the 3 bq x bk views and dout^T', q^T' the query
//           tile's stored rows transposed with each column written thrice,
// at float32's accuracy. On one AMX core an untransposed 128^3 bfloat16
// product took 6.0 us, one reading an operand transposed 7.9 us, and sgemm
// 22 us; one product of depth 384 took 14.5 us against 19.5 for three of
// 128. dk^T and dv^T accumulate per key tile in dense blocks (oneDNN's AMX
// matmul takes no output rows of another stride: it ran a generic kernel
// 10x slower) and are added into the caller's rows when the key group ends.
class SplitBackward {
 public:
  SplitTile P, dS;  // the tile's, split row by row as the loops finish them

  // A key group of `keys` keys in tiles `block` wide (the last: the rest),
  // k its stored rows.
  void start_group(int64_t keys, int64_t block, const bfloat16* k, int64_t ldk, int64_t d, int64_t dv) {
    keys_ = keys, block_ = block, d_ = d, dv_ = dv;
    dkT_.assign(d * keys, 0.0f), dvT_.assign(dv * keys, 0.0f);
    k3_.resize(3 * keys * d);
    for (int64_t key = 0; key < keys; key += block) {
      const int64_t bk = std::min(block, keys - key);
      for (int64_t t = 0; t < 3; ++t)
        for (int64_t j = 0; j < bk; ++j)
          std::copy_n(k + (key + j) * ldk, d, k3_.data() + (3 * key + t * bk + j) * d);
    }
  }
  void start_query_tile(const bfloat16* q, int64_t ldq, const bfloat16* dout, int64_t lddout, int64_t bq) {
    bq_ = bq;
    transpose_thrice(q, bq, d_, ldq, qT3_);
    transpose_thrice(dout, bq, dv_, lddout, doutT3_);
  }
  // The products of the tile of the group's keys [key, key + bk) (P and dS
  // split, interleaved, bq x bk).
  void tile_products(int64_t key, int64_t bk, float scale, float* dq) {
    gemm_bf16(Trans::no, Trans::no, bq_, d_, 3 * bk, scale, dS.data(), 3 * bk, k3_.data() + 3 * key * d_, d_, 1.0f,
              dq, d_);
    gemm_bf16(Trans::no, Trans::no, dv_, bk, 3 * bq_, 1.0f, doutT3_.data(), 3 * bq_, P.data(), bk, 1.0f,
              dvT_.data() + key * dv_, bk);
    gemm_bf16(Trans::no, Trans::no, d_, bk, 3 * bq_, scale, qT3_.data(), 3 * bq_, dS.data(), bk, 1.0f,
              dkT_.data() + key * d_, bk);
  }
  // dk and dv (rows of d and dv features) of the group's keys += the sums.
  void finish_group(float* dk, float* dv) const {
    for (int64_t key = 0; key < keys_; key += block_) {
      const int64_t bk = std::min(block_, keys_ - key);
      add_transposed(dkT_.data() + key * d_, d_, bk, dk + key * d_);
      add_transposed(dvT_.data() + key * dv_, dv_, bk, dv + key * dv_);
    }
  }

 private:
  // out (cols x 3 rows): out(c, 3 r + t) = x(r, c) for t < 3.
  static void transpose_thrice(const bfloat16* x, int64_t rows, int64_t cols, int64_t ld, Scratch<bfloat16>& out) {
    out.resize(3 * rows * cols);
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = 0; c < cols; ++c) {
        bfloat16* to = out.data() + c * 3 * rows + 3 * r;
        to[0] = to[1] = to[2] = x[r * ld + c];
      }
  }
  // y (cols x rows) += x^T for x (rows x cols), both dense.
  static void add_transposed(const float* x, int64_t rows, int64_t cols, float* y) {
    for (int64_t c = 0; c < cols; ++c)
      for (int64_t r = 0; r < rows; ++r) y[c * rows + r] += x[r * cols + c];
  }
  Scratch<bfloat16> qT3_, doutT3_, k3_;
  Scratch<float> dkT_, dvT_;
  int64_t keys_ = 0, block_ = 0, d_ = 0, dv_ = 0, bq_ = 0;
};

// The split products as the kernels' templates call them for any compute
// type: only float32 computation splits (the callers test whether a call
// does), so for double they compile to nothing.

// Row ii of a tile's P (or dS), final, into its split parts (shaped for the
// tile by the caller).
template <class T>
void split_row(SplitTile& split, int64_t ii, const T* row) {
  if constexpr (std::is_same_v<T, float>) split.split_row(ii, row);
}

// A tile's products of its split P and dS (SplitBackward::tile_products).
template <class T>
void split_products(SplitBackward& split, int64_t key, int64_t bk, T scale, T* dq) {
  if constexpr (std::is_same_v<T, float>) split.tile_products(key, bk, scale, dq);
}

// dk and dv of the group's keys from row `first` += the split products' sums.
template <class T>
void finish_split(const SplitBackward& split, Scratch<T>& dk, Scratch<T>& dv, int64_t first, int64_t d, int64_t dv_width) {
  if constexpr (std::is_same_v<T, float>) split.finish_group(dk.data() + first * d, dv.data() + first * dv_width);
}

}  // namespace relpos
