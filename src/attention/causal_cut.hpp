// The causal mask's cut, at the three scales the fused kernel works at, one
// name each:
//   a query tile   visited_keys: the end of the keys it visits, its key tiles
//                  up to the last one not wholly in its future;
//                  first_row_visiting: the first tile that visits a key
//   a tile         TileCut: key jj of the tile is visible to its row ii iff
//                  jj <= ii + delta (every key without a causal mask)
//   a tile's row   TileCut::shown(ii): the keys [0, shown) the mask shows it;
//                  TileCut::computed(ii): those its softmax runs over, shown
//                  rounded up to whole vectors (the rest of the row is zero)
// Rows and keys the cut hides from part of a tile are what a product that
// must skip a non-finite row reads (hidden_key_rows, hidden_query_rows).
#pragma once

#include <algorithm>
#include <cstdint>
#include <utility>

#include "../backend/simd.hpp"
#include "head.hpp"
#include "tiles.hpp"

namespace relpos {

struct TileCut {
  bool causal = false;
  bool staircase = false;  // the mask cuts the tile and it is small enough for simd::staircase_product
  int64_t delta = 0;
  int64_t keys = 0;  // the tile's

  int64_t shown(int64_t ii) const { return causal ? std::clamp<int64_t>(ii + delta + 1, 0, keys) : keys; }

  // Rounded up to whole vectors (tiles::kCausalKeyRounding).
  int64_t computed(int64_t ii) const {
    constexpr int64_t r = tiles::kCausalKeyRounding;
    return causal ? std::min(keys, (shown(ii) + r - 1) / r * r) : keys;
  }
};

// The cut of a tile of bq queries and bk keys of `features` (the larger of
// d and dv) where key jj is visible to row ii iff jj <= ii + delta.
inline TileCut tile_cut(bool causal, int64_t delta, int64_t bq, int64_t bk, int64_t features) {
  const int64_t most = simd::kStaircaseMaxSize;
  const bool cut = causal && delta < bk - 1;  // row 0 cannot see the last key
  return {causal, cut && bq <= most && bk <= most && features <= most, delta, bk};
}

// Key rows jj of a tile hidden from its row 0 (jj > delta), and query rows
// ii that do not see its last key (ii < bk - 1 - delta).
inline std::pair<int64_t, int64_t> hidden_key_rows(const TileCut& cut) {
  return {cut.causal ? std::clamp<int64_t>(cut.delta + 1, 0, cut.keys) : cut.keys, cut.keys};
}
inline std::pair<int64_t, int64_t> hidden_query_rows(const TileCut& cut, int64_t bq) {
  return {0, cut.causal ? std::clamp<int64_t>(cut.keys - 1 - cut.delta, 0, bq) : 0};
}

namespace fused {

// A tile: queries [i0, i0 + bq) against keys [j0, j0 + bk).
struct Tile {
  int64_t i0, bq, j0, bk;
};

template <class T>
TileCut cut_of(const AttentionForward<T>& p, const Head<T>& hd, const Tile& t) {
  return tile_cut(p.causal, -hd.r(t.i0, t.j0), t.bq, t.bk, std::max(hd.d, hd.dv));
}

// The key tiles (kBackwardKeys wide) from 0 up to the last one not wholly in
// the future of the query tile: that of `last`, the last key its last query
// sees under a causal mask. In closed form: the scratch plan asks it for every
// query tile of calls of millions of keys.
template <class T>
int64_t visited_keys(const AttentionForward<T>& p, const Head<T>& hd, int64_t i0, int64_t bq) {
  if (!p.causal) return hd.lk;
  const int64_t last = (i0 + bq - 1) - (hd.lq - 1) - hd.rmin;  // hd.r(i0 + bq - 1, last) == 0
  if (last < 0) return 0;
  return std::min(hd.lk, (last / tiles::kBackwardKeys + 1) * tiles::kBackwardKeys);
}

// The first row of the first backward query tile that visits key `key` (lq
// where none does). visited_keys never falls from one query tile to the next,
// so every tile before it visits none of the keys from `key` on: a causal
// key group's query-side gradients start at this row.
template <class T>
int64_t first_row_visiting(const AttentionForward<T>& p, const Head<T>& hd, int64_t key) {
  const int64_t rows = tiles::kBackwardRows;
  int64_t lo = 0, hi = (hd.lq + rows - 1) / rows;  // query tile indices: the answer is in [lo, hi]
  while (lo < hi) {
    const int64_t mid = (lo + hi) / 2, i0 = mid * rows;
    if (visited_keys(p, hd, i0, std::min(rows, hd.lq - i0)) > key) hi = mid;
    else lo = mid + 1;
  }
  return std::min(hd.lq, lo * rows);
}

}  // namespace fused
}  // namespace relpos
