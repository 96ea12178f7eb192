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

#include "relpos/gemm.hpp"
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

// c (bq x n) = alpha P b + beta c for the tile's P (bq x bk, row-major, zero
// where the mask hides) and b (bk x n).
template <class T>
void tile_times(const TileCut& cut, int64_t bq, int64_t n, int64_t bk, T alpha, const T* P, const T* b, int64_t ldb,
                T beta, T* c, int64_t ldc) {
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
  // Makes room for a tile of rows x cols; its rows are then split one by one
  // (split_row) as the softmax finishes them, while each is still in the
  // core's first-level cache (splitting the whole tile afterwards read it
  // back from the second: 7% of the bfloat16 forward on one AMX core).
  void reshape(int64_t rows, int64_t cols) {
    const std::size_t n = static_cast<std::size_t>(rows * cols);
    for (Scratch<bfloat16>& part : parts_)
      if (part.size() < n) part.resize(n);
    ld_ = cols;
  }
  void split_row(int64_t r, const float* x) {
    simd::split_bf16(x, bits(parts_[0], r), bits(parts_[1], r), bits(parts_[2], r), ld_);
  }

  // c (m x n) += x b for the split tile x (m x k) and b (k x n),
  // bfloat16 rows of row stride ldb.
  void accumulate_times(int64_t m, int64_t n, const bfloat16* b, int64_t ldb, float* c, int64_t ldc) const {
    for (const Scratch<bfloat16>& part : parts_)
      gemm_bf16(Trans::no, Trans::no, m, n, ld_, 1.0f, part.data(), ld_, b, ldb, 1.0f, c, ldc);
  }

 private:
  uint16_t* bits(Scratch<bfloat16>& x, int64_t r) const { return reinterpret_cast<uint16_t*>(x.data() + r * ld_); }
  Scratch<bfloat16> parts_[3];
  int64_t ld_ = 0;
};

}  // namespace relpos
