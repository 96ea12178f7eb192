// The bfloat16 split: how the fused kernel multiplies a call stored in
// bfloat16 where the CPU has bfloat16 products, as one policy beside the
// kernel (fused_*.cpp ask it per head and per tile; for float32 or float16
// storage, and double, it compiles to nothing):
//   * the rows as stored (StoredBf16Rows), read in place by the products
//     whose operands are exactly those values;
//   * P and dS split exactly into three bfloat16 tiles (SplitTile,
//     SplitBackward) for their products with stored rows on matrix units.
#pragma once

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "relpos/gemm.hpp"
#include "../backend/scratch.hpp"
#include "../backend/simd.hpp"
#include "fused_plan.hpp"
#include "head.hpp"
#include "tile_products.hpp"

namespace relpos {

// The rows of one head as a bfloat16 call stores them (pointer, row stride),
// read in place by the two products whose operands are exactly those stored
// values: q k^T (forward and backward) and dout v^T (backward). Where the CPU
// has bfloat16 products (gemm_bf16_native) these run at about twice sgemm's
// rate, with the same exact products as a float32 GEMM of the widened rows,
// summed in another order. Null elsewhere: float32 / float16 storage, a CPU
// without bfloat16 products, a scheme that changes q or k before the
// product (a rotation, a query bias), rows not dense in their
// features. The other products read P or dS, which are float32 numbers:
// where the bfloat16 products run on matrix units and the values have at
// least kSplitMinValueWidth features (`split`), the forward's P v multiplies
// P split exactly into three bfloat16 tiles by the stored values
// (SplitTile). The split costs the same per entry of P at any width and
// saves sgemm work in proportion to it. On one Intel AMX core, L = 4096,
// plain forward in bfloat16 over float32: 1.81-1.88x at d = 128; at d = 64,
// 1.25-1.44x with the split against 1.03-1.13x without (d = 32 did not
// gain measurably). The backward's three products of P and dS split them
// too, each as one bfloat16 product of thrice the depth over an interleaved
// split (SplitBackward): one core, L = 4096, d = 128, backward 468-479 ms ->
// 395-418 ms. Reading P^T or dS^T transposed, as the float32 products do,
// three products cost about one sgemm (128^3: 7.9 us each against 22 us) and
// were 5-10% slower; the untransposed products of depth 384 take 14.5 us.
constexpr int64_t kSplitMinValueWidth = 64;

namespace fused {

struct StoredBf16Rows {
  const bfloat16 *q = nullptr, *k = nullptr, *v = nullptr, *dout = nullptr;
  int64_t ldq = 0, ldk = 0, ldv = 0, lddout = 0;
  bool split = false;

  explicit operator bool() const { return q != nullptr; }
  // Whether the backward multiplies P and dS split (SplitBackward): the
  // head multiplies its stored rows split and its dout is stored densely too.
  bool splits_backward() const { return split && dout != nullptr; }
};

// Whether the products of a call stored in bfloat16 (`data`, of scheme
// `scheme`) read its stored rows in place (but a head whose padded keys were
// zeroed in a copy), and whether they split P and dS besides; the scratch
// estimate asks the same.
inline bool reads_stored_bf16(Scheme scheme, const AttentionForward<bfloat16>& data) {
  const auto dense = [](const auto& x) { return x.stride[3] == 1 && x.stride[2] >= x.shape[3]; };
  return gemm_bf16_native() && !scheme_has<RotationOf, float>(scheme) && !scheme_has<QueryBiasOf, float>(scheme) &&
         dense(data.q) && dense(data.k) && dense(data.v);
}
inline bool splits_stored_bf16(Scheme scheme, const AttentionForward<bfloat16>& data) {
  return reads_stored_bf16(scheme, data) && gemm_bf16_matrix_units() && data.v.shape[3] >= kSplitMinValueWidth;
}

// The stored rows of head (b, h) of call p whose tensors are in `data`
// (p itself, or the stored call of a half-storage twin; see load_head), or
// none where its products cannot read them in place; keys_zeroed: the head's
// padded keys were zeroed in a copy, which the stored rows do not hold.
template <class T, class Stored>
StoredBf16Rows stored_bf16_rows(const AttentionForward<T>& p, const AttentionForward<Stored>& data, int64_t b,
                                int64_t h, bool keys_zeroed) {
  if constexpr (!std::is_same_v<Stored, bfloat16>) {
    return {};
  } else {
    if (keys_zeroed || !reads_stored_bf16(p.pos.scheme, data)) return {};
    const int64_t hk = kv_head(p, h);
    return {&data.q(b, h, 0, 0), &data.k(b, hk, 0, 0), &data.v(b, hk, 0, 0), nullptr,
            data.q.stride[2], data.k.stride[2], data.v.stride[2], 0, splits_stored_bf16(p.pos.scheme, data)};
  }
}

// c (bq, bk) = alpha a b^T for the rows [ia, ia + bq) of a and [jb, jb + bk)
// of b (both with `width` features): on the stored bfloat16 rows a16, b16
// where given, else on the compute-type rows a, b, cut where the mask cuts.
template <class T>
void product_of_rows(const bfloat16* a16, int64_t lda16, const bfloat16* b16, int64_t ldb16, const T* a, int64_t lda,
                     const T* b, int64_t ldb, int64_t ia, int64_t jb, int64_t bq, int64_t bk, int64_t width, T alpha,
                     T* c, const TileCut& cut, Scratch<T>& transposed) {
  if constexpr (std::is_same_v<T, float>)
    if (a16 && b16)
      return gemm_bf16(Trans::no, Trans::yes, bq, bk, width, alpha, a16 + ia * lda16, lda16, b16 + jb * ldb16, ldb16,
                       0.f, c, bk);
  rows_by_rows(cut, bq, bk, width, alpha, a + ia * lda, lda, b + jb * ldb, ldb, c, transposed);
}

}  // namespace fused

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
  void reserve(int64_t parts) { parts_.reserve(parts); }
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

  void reserve(const fused::SplitBackwardPlan& plan) {
    P.reserve(plan.tile), dS.reserve(plan.tile);
    qT3_.reserve(plan.qT3), doutT3_.reserve(plan.doutT3), k3_.reserve(plan.k3);
    dkT_.reserve(plan.dkT), dvT_.reserve(plan.dvT);
  }
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
void finish_split(const SplitBackward& split, T* dk, T* dv, int64_t first, int64_t d, int64_t dv_width) {
  if constexpr (std::is_same_v<T, float>) split.finish_group(dk + first * d, dv + first * dv_width);
}

// O (bq, dv) += P v for a tile's P (bq, bk) and the values v from key j0
// (row stride ldv): by P split (every row passed to split_row) against the
// stored bfloat16 values where the head multiplies its stored rows split,
// else by the float32 P.
template <class T>
void times_values(const fused::StoredBf16Rows& stored, const SplitTile& split, const TileCut& cut, const T* P,
                  int64_t bq, int64_t bk, int64_t j0, int64_t dv, const T* v, int64_t ldv, T* O) {
  if constexpr (std::is_same_v<T, float>)  // the split multiplies every pair: not where a hidden value is not finite
    if (stored.split && !nonfinite_in(hidden_key_rows(cut), dv, v, ldv))
      return split.accumulate_times(dv, stored.v + j0 * stored.ldv, stored.ldv, 1.0f, O, dv);
  tile_times(cut, bq, dv, bk, T(1), P, v, ldv, T(1), O, dv);
}

}  // namespace relpos
