// A key band: the scores of one query tile against a key embedding with a row
// per distance (Transformer-XL's W_R R), for the fused kernel's forward and
// backward.
//
// The tile's queries [i0, i0 + bq) and its keys [start, end) meet at
// bq + (end - start) - 1 distances, so the band is one (bq, width) product of
// the queries with the embedding's rows, distance index first ..
// first + width - 1 in falling order (column x is first + width - 1 - x): the
// pair (ii, j) is column width - 1 - (j - start + bq - 1 - ii) and a row's keys
// run leftwards. Every key tile reads its pairs from it, skewed; a band per
// key tile would compute bq + bk - 1 columns for bk keys. Under a causal mask
// the distances past 0 are future pairs of every row and are left out (at the
// trainer's L = 64 without memory: half the band), and row ii needs the
// columns x <= ii + width - bq only: the staircase of a cut tile, which the
// band's products (forward one, backward three) skip through
// tile_products.hpp where they are small, as the tiles' own products do.
//
// A wider band is computed as the key tiles reach it, about a key tile's
// columns per product: one core's sgemm of 128 queries by 64 features ran at
// 240 GFLOP/s for 512 columns and 195 for 2048 or more, whose output no longer
// fits in L2 (Zen 5, dnnl_sgemm); later reads of the columns find them in
// cache too.
#pragma once

#include <algorithm>
#include <cstdint>

#include "relpos/gemm.hpp"
#include "../backend/scratch.hpp"
#include "head.hpp"
#include "tile_products.hpp"

namespace relpos::fused {

template <class T>
class KeyBand {
 public:
  // Sets the band of queries [i0, i0 + bq) against keys [start, end); E: the
  // embedding's rows per distance for the head, falling (hd.distances(), d).
  // No scores are computed yet but a small band's, in one cut product.
  void reset(const Head<T>& hd, const T* E, bool causal, int64_t i0, int64_t bq, int64_t start, int64_t end,
             Scratch<T>& transposed) {
    start_ = start, bq_ = bq, d_ = hd.d;
    first_ = hd.diagonal(i0 + bq - 1, start);
    width_ = width_of(hd, causal, i0, bq, start, end);
    cut_ = cut_of(causal, bq, width_, hd.d);
    if (scores_.size() < static_cast<size_t>(bq * width_)) scores_.resize(bq * width_);  // only grows: no refill
    queries_ = hd.qp + i0 * hd.d;
    rows_ = E + row_offset(hd);
    computed_ = width_;
    if (cut_.staircase) {
      rows_by_rows(cut_, bq, width_, d_, T(1), queries_, d_, rows_, d_, scores_.data(), transposed);
      computed_ = 0;
    }
  }

  // The band's columns for those arguments of reset (the scratch plan's too).
  template <class U>
  static int64_t width_of(const Head<U>& hd, bool causal, int64_t i0, int64_t bq, int64_t start, int64_t end) {
    const int64_t width = end - start + bq - 1;
    // The tile sees a key, so distance 0 lies in the band.
    return causal ? std::min(width, -hd.rmin - hd.diagonal(i0 + bq - 1, start) + 1) : width;
  }
  // The cut of a band of bq rows and `width` columns of d features: row ii
  // sees the columns up to ii + width - bq.
  static TileCut cut_of(bool causal, int64_t bq, int64_t width, int64_t d) {
    return tile_cut(causal, width - bq, bq, width, d);
  }
  void reserve(int64_t scores) { scores_.reserve(scores); }

  // Computes the columns of keys [j0, j0 + n) that are not computed yet. The
  // computed columns are always the band's right end (the lowest keys);
  // callers walk the keys upwards, so each call adds about n columns.
  void reach_keys(int64_t j0, int64_t n) {
    const int64_t lowest = std::max<int64_t>(0, width_ - (j0 + n - start_) - bq_ + 1);
    if (lowest >= computed_) return;
    gemm<T>(Trans::no, Trans::yes, bq_, computed_ - lowest, d_, T(1), queries_, d_, rows_ + lowest * d_, d_, T(0),
            scores_.data() + lowest, width_);
    computed_ = lowest;
  }

  int64_t width() const { return width_; }
  const TileCut& cut() const { return cut_; }
  const T* scores() const { return scores_.data(); }
  // Offset of the pairs (ii, j0 + n - 1) .. (ii, j0), consecutive, in scores
  // and in any (bq, width) buffer like it.
  int64_t at(int64_t ii, int64_t j0, int64_t n) const { return ii * width_ + width_ - (j0 - start_ + bq_ - ii + n - 1); }
  // Offset of the band's first row in the falling per-distance rows of a head
  // (the E of reset, the backward's gradient of those rows).
  int64_t row_offset(const Head<T>& hd) const { return (hd.distances() - first_ - width_) * hd.d; }

 private:
  Scratch<T> scores_;
  int64_t width_ = 0, first_ = 0, start_ = 0, bq_ = 0, d_ = 0;
  int64_t computed_ = 0;  // columns [computed_, width_) hold their scores
  TileCut cut_;
  const T* queries_ = nullptr;  // the tile's rows of q + v
  const T* rows_ = nullptr;     // the embedding's rows of column 0 onwards
};

}  // namespace relpos::fused
