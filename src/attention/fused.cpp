// The fused streaming kernel: flash-style tiles with an online softmax; no
// (L, L) buffer anywhere. Per (batch, head) it keeps O((Lq + Lk) d) prepared
// inputs and, for clipped tables, O(Lq (2k+1)) bucket matrices; per tile a
// (Bq, Bk) block.
//
// Relative terms per tile, by kind (src/schemes/scheme.hpp; docs/design.md
// section 2):
//   bias per distance   precomputed per head (T5, ALiBi, KERPLE)
//   rotation            q and k rotated once, before the tiles (RoPE)
//   query biases        added to the head's queries when loaded (XL's u, v)
//   key table           clipped table (Shaw): R = qp wk^T (Bq, 2k+1) per
//                       query tile, gathered by c(r)
//   value table         clipped table (Shaw): per-row bucket sums of P,
//                       rescaled with the running max like the output, then
//                       one (Bq, 2k+1) x (2k+1, dv) product
//   key band            a key embedding with a row per distance (XL's W_R R):
//                       qp times those rows, per query tile for the band of
//                       distances its key tiles reach (Bq + keys - 1), filled
//                       as the key tiles reach it and read skewed by each;
//                       under a causal mask a cut tile of its own (key_band.hpp)
//
// Backward recomputes P from the saved logsumexp, query tiles outer and key
// tiles inner; positional gradients go to per-thread partials summed in
// thread order, so results do not depend on thread timing. Small tiles on the
// causal diagonal skip what the mask hides (tile_products.hpp).
#include "fused.hpp"

#include <algorithm>
#include <cmath>
#include <memory>
#include <stdexcept>
#include <type_traits>
#include <vector>

#include "relpos/gemm.hpp"
#include "../backend/parallel.hpp"
#include "../backend/row_ops.hpp"
#include "../backend/vexp.hpp"
#include "distance_table.hpp"
#include "grad_partials.hpp"
#include "head.hpp"
#include "key_band.hpp"
#include "tile_products.hpp"
#include "tiles.hpp"

namespace relpos::fused {
namespace {

using tiles::kBackwardKeys;
using tiles::kBackwardRows;

// Keys per step of a forward query tile of bq rows: a full query tile takes
// the keys of its tiles (tiles.hpp), a query tile of few rows (a decode step)
// proportionally more, up to kDecodeBlockK keys per GEMM call (Lq = 1,
// Lk = 32768, B = 8, H = 8, ALiBi, two threads: 34.0 ms instead of 40.0 with
// 128 keys per call).
constexpr int64_t kDecodeBlockK = 4096;
inline int64_t forward_key_block(const tiles::ForwardTiles& f, int64_t bq) {
  return std::clamp<int64_t>(f.rows * f.keys / bq / kBackwardKeys * kBackwardKeys, f.keys, kDecodeBlockK);
}

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
struct StoredBf16Rows {
  const bfloat16 *q = nullptr, *k = nullptr, *v = nullptr, *dout = nullptr;
  int64_t ldq = 0, ldk = 0, ldv = 0, lddout = 0;
  bool split = false;

  explicit operator bool() const { return q != nullptr; }
};

template <class T, class Stored>
bool multiplies_stored_bf16(const AttentionForward<T>& p, const AttentionForward<Stored>& data) {
  if constexpr (!std::is_same_v<Stored, bfloat16>) {
    return false;
  } else {
    const auto dense = [](const auto& x) { return x.stride[3] == 1 && x.stride[2] >= x.shape[3]; };
    return gemm_bf16_native() && !scheme_has<RotationOf, T>(p.pos.scheme) && !scheme_has<QueryBiasOf, T>(p.pos.scheme) &&
           dense(data.q) && dense(data.k) && dense(data.v);
  }
}

// One (batch, head), prepared once and shared by its tiles.
template <class T>
struct HeadContext {
  int64_t b = -1, h = -1;
  HeadData<T> x;
  int64_t k = 0, nb = 0;    // clipped tables: window k, rows 2k+1
  bool clip = true;         // clipped tables: distances beyond +-k use the edge rows (else a zero embedding)
  Scratch<T> wk, wv;        // the clipped tables' slices of this head (nb, d), (nb, dv)
  const T* E = nullptr;     // a key band's rows per distance (distances, d), falling, from CallEmbeddings
  StoredBf16Rows stored;    // the head's bfloat16 rows, where the logits may multiply them in place

  bool key_table() const { return !wk.empty(); }
  bool value_table() const { return !wv.empty(); }
  bool band() const { return E != nullptr; }
};

// What shapes a tile's row loops, fixed at compile time at one dispatch point
// (with_tile_features, in run_forward and run_backward) so that the loops
// over a tile's rows test none of it, as FlashAttention's static switches do:
// the causal mask, a key-padding mask, and the kind of relative term a tile
// adds (rotations and query biases happen before the tiles: plain). Within
// clipped tables, key-only and value-only stay run-time tests, once per tile.
enum class TileTerm { plain, bias, table, band };

template <bool Causal, bool Padding, TileTerm Term>
struct TileFeatures {
  static constexpr bool causal = Causal, padding = Padding;
  static constexpr bool bias = Term == TileTerm::bias, table = Term == TileTerm::table, band = Term == TileTerm::band;
};

template <class F>
void bool_switch(bool value, F&& f) {
  if (value)
    f(std::true_type{});
  else
    f(std::false_type{});
}

// The call's embeddings per distance (its scheme's KeyEmbedding and
// ValueEmbedding), made once per call. Clipped tables are read through their
// per-head slices; a key embedding with a row per distance is read as a band,
// its rows for every head over the call's distances computed here once (they
// depend on the head, not on the batch row), in falling distance order (see
// KeyBand). Value embeddings must be clipped tables (the schemes' capability
// table offers fused for no other).
template <class T>
struct CallEmbeddings {
  std::unique_ptr<DistanceEmbedding<T>> keys, values;
  std::vector<Scratch<T>> E;  // a key band: per head (distances, d), row r the distance index distances - 1 - r

  explicit CallEmbeddings(const AttentionForward<T>& p) : keys(make_key_embedding(p)), values(make_value_embedding(p)) {
    if (values && !values->clipped()) throw std::logic_error("relpos: fused reads value embeddings as clipped tables");
    if (const ClippedTable<T>*a = key_table(), *b = value_table();
        a && b && (a->k() != b->k() || a->repeats_edges() != b->repeats_edges()))
      throw std::logic_error("relpos: fused reads a key and a value table of one window k and edge rule");
    if (!band()) return;
    const int64_t heads = p.q.shape[1], count = keys->count();
    // Under a causal mask no pair has a distance past 0: only the rows up to
    // distance 0 are made (half of them in self-attention); the rest stay zero, unread.
    const int64_t made = p.causal ? std::clamp<int64_t>(1 - keys->rmin(), 0, count) : count;
    E.resize(heads);
    // In a parallel region like every GEMM of the kernel: one thread per GEMM, not OpenMP's default team.
    parallel_for(
        heads, thread_count(p.num_threads, heads), [](int) {},
        [&](int, int64_t h) {
          const int64_t width = keys->width();
          E[h].assign(count * width, T(0));
          keys->rows(h, made, E[h].data());
          for (int64_t r = 0; r < count / 2; ++r)
            std::swap_ranges(&E[h][r * width], &E[h][(r + 1) * width], &E[h][(count - 1 - r) * width]);
        });
  }

  const ClippedTable<T>* key_table() const { return keys ? keys->clipped() : nullptr; }
  const ClippedTable<T>* value_table() const { return values ? values->clipped() : nullptr; }
  bool band() const { return keys && !keys->clipped(); }
};

// Calls f(TileFeatures<...>{}) with the features of call p.
template <class T, class F>
void with_tile_features(const AttentionForward<T>& p, const CallEmbeddings<T>& embeddings, F&& f) {
  const bool bias = scheme_has<BiasOf, T>(p.pos.scheme);
  const TileTerm term = embeddings.band()                                       ? TileTerm::band
                        : embeddings.key_table() || embeddings.value_table() ? TileTerm::table
                        : bias                                                 ? TileTerm::bias
                                                                               : TileTerm::plain;
  bool_switch(p.causal, [&](auto causal) {
    bool_switch(!p.key_padding.empty(), [&](auto padding) {
      constexpr bool c = decltype(causal)::value, k = decltype(padding)::value;
      switch (term) {
        case TileTerm::plain: return f(TileFeatures<c, k, TileTerm::plain>{});
        case TileTerm::bias: return f(TileFeatures<c, k, TileTerm::bias>{});
        case TileTerm::table: return f(TileFeatures<c, k, TileTerm::table>{});
        case TileTerm::band: return f(TileFeatures<c, k, TileTerm::band>{});
      }
    });
  });
}

// p: the call; data: where its tensors are (p itself, or the stored call of
// a half-storage twin; see load_head).
template <class T, class Stored>
void prepare(const AttentionForward<T>& p, const AttentionForward<Stored>& data, const CallEmbeddings<T>& e,
             int64_t b, int64_t h, HeadContext<T>& c) {
  if (c.b == b && c.h == h) return;
  c.b = b, c.h = h;
  load_head(p, data, b, h, c.x, /*in_place=*/true);
  c.wk.clear(), c.wv.clear();
  for (const ClippedTable<T>* table : {e.key_table(), e.value_table()})
    if (table) c.k = table->k(), c.nb = table->table_rows(), c.clip = table->repeats_edges();
  if (e.key_table()) c.wk = table_slice(*e.key_table(), h);
  if (e.value_table()) c.wv = table_slice(*e.value_table(), h);
  c.E = e.E.empty() ? nullptr : e.E[h].data();
  c.stored = {};
  if constexpr (std::is_same_v<Stored, bfloat16>)
    if (multiplies_stored_bf16(p, data) && !c.x.padded_keys_zeroed) {
      const int64_t hk = kv_head(p, h);
      c.stored = {&data.q(b, h, 0, 0), &data.k(b, hk, 0, 0), &data.v(b, hk, 0, 0), nullptr,
                  data.q.stride[2], data.k.stride[2], data.v.stride[2], 0,
                  gemm_bf16_matrix_units() && data.v.shape[3] >= kSplitMinValueWidth};
    }
}

// O (bq, dv) += P v for a tile's P (bq, bk) and the values from key j0: by P
// split (every row passed to split_row) against the stored bfloat16 values
// where the head multiplies its stored rows split, else by the float32 P.
template <class T>
void times_values(const HeadContext<T>& c, const SplitTile& split, const TileCut& cut, const T* P, int64_t bq,
                  int64_t bk, int64_t j0, int64_t dv, T* O) {
  const T* v = c.x.vp + j0 * c.x.ldv;
  if constexpr (std::is_same_v<T, float>)  // the split multiplies every pair: not where a hidden value is not finite
    if (c.stored.split && !nonfinite_in(hidden_key_rows(cut, bk), dv, v, c.x.ldv))
      return split.accumulate_times(dv, c.stored.v + j0 * c.stored.ldv, c.stored.ldv, 1.0f, O, dv);
  tile_times(cut, bq, dv, bk, T(1), P, v, c.x.ldv, T(1), O, dv);
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

// A tile: queries [i0, i0 + bq) against keys [j0, j0 + bk).
struct Tile {
  int64_t i0, bq, j0, bk;
};

// True when every pair of the tile is in the future of its query (causal).
template <class T>
bool above_diagonal(const AttentionForward<T>& p, const Head<T>& hd, const Tile& t) {
  return p.causal && hd.r(t.i0 + t.bq - 1, t.j0) > 0;
}

// How the causal mask cuts tile t (tile_products.hpp).
template <class T>
TileCut cut_of(const AttentionForward<T>& p, const Head<T>& hd, const Tile& t) {
  return tile_cut(p.causal, -hd.r(t.i0, t.j0), t.bq, t.bk, std::max(hd.d, hd.dv));
}

// End of the keys a query tile visits: its key tiles up to the last one not
// wholly in the future (causal).
template <class T>
int64_t visited_keys(const AttentionForward<T>& p, const Head<T>& hd, int64_t i0, int64_t bq) {
  int64_t end = 0;
  for (int64_t j0 = 0; j0 < hd.lk; j0 += kBackwardKeys) {
    const Tile t{i0, bq, j0, std::min(kBackwardKeys, hd.lk - j0)};
    if (above_diagonal(p, hd, t)) break;  // later key tiles lie further in the future
    end = j0 + t.bk;
  }
  return end;
}

// Keys jj < this of a tile's row whose first key has distance index mrow lie
// outside the row's future: all bk of them without a causal mask.
template <class F, class T>
int64_t present_keys(const Head<T>& hd, int64_t mrow, int64_t bk) {
  if constexpr (F::causal)
    return std::clamp<int64_t>(-(hd.rmin + mrow) + 1, 0, bk);
  else
    return bk;
}

// A tile row's P where its logsumexp is NaN (the row saw a NaN): the
// exponentials of its masked logits are NaN too, and are set to 0, so that
// a key the row cannot see gets no gradient from it. present: present_keys.
template <class F, class T>
void zero_masked(const AttentionForward<T>& p, const Head<T>& hd, int64_t j0, int64_t present, T* row, int64_t seen) {
  if (present < seen) std::fill(row + present, row + seen, T(0));
  if constexpr (F::padding)
    for (int64_t jj = 0; jj < seen; ++jj)
      if (p.key_padding(hd.b, j0 + jj)) row[jj] = T(0);
}

// Row ii of a tile, the keys [0, seen) from distance r0 on, by clipped-table
// bucket, with the key table's edge scores from Rq (BucketedRow); one part
// without a table.
template <class F, class T>
BucketedRow<T> bucketed_row(const HeadContext<T>& c, int64_t r0, int64_t seen, const T* Rq, int64_t ii, T scale) {
  if constexpr (!F::table) {
    return BucketedRow<T>::whole(seen);
  } else {
    BucketedRow<T> row = BucketedRow<T>::clipped(r0, seen, c.k);
    // Under a causal mask the keys past +k are all masked: no shift (a NaN table row there must not reach the row).
    if (c.key_table() && c.clip) row.below = scale * Rq[ii * c.nb], row.above = F::causal ? T(0) : scale * Rq[ii * c.nb + 2 * c.k];
    return row;
  }
}

// S (bq, bk) = the tile's logits, masked pairs -inf (cut: cut_of the tile), but for a clipped key
// table's edge scores (bucketed_row). Rq: the key table's scores of the tile's queries, (bq, nb).
// band: the query tile's key band scores.
template <class F, class T>
void tile_logits(const AttentionForward<T>& p, const HeadContext<T>& c, T scale, const Tile& t, const TileCut& cut,
                 const T* Rq, KeyBand<T>& band, T* S, Scratch<T>& transposed) {
  const Head<T>& hd = c.x.hd;
  if constexpr (F::band) band.reach_keys(t.j0, t.bk);
  const int64_t d = hd.d, bq = t.bq, bk = t.bk;
  product_of_rows(c.stored.q, c.stored.ldq, c.stored.k, c.stored.ldk, c.x.qc.data(), d, c.x.kp, c.x.ldk, t.i0, t.j0,
                  bq, bk, d, scale, S, cut, transposed);
  const int64_t m0 = hd.diagonal(t.i0 + bq - 1, t.j0);  // distance index of the tile's smallest distance
  const Scratch<T>& bias = c.x.bias;
  for (int64_t ii = 0; ii < bq; ++ii) {
    T* row = S + ii * bk;
    const int64_t mrow = m0 + (bq - 1 - ii);  // distance index of (ii, jj = 0)
    const int64_t present = present_keys<F>(hd, mrow, bk);
    if constexpr (F::band)  // the band holds the present keys' columns only, right to left
      rows::add_scaled_reversed(row, band.scores() + band.at(ii, t.j0, present), scale, present);
    if (F::table && c.key_table())  // the window's scores; the edges' are the softmax's (bucketed_row)
      add_window_by_row(row, bk, hd.rmin + mrow, c.k, Rq + ii * c.nb, scale);
    if constexpr (F::bias)
      rows::add_scaled(row, &bias[mrow], T(1), bk);
    if constexpr (F::causal)
      for (int64_t jj = present; jj < bk; ++jj) row[jj] = kNegInf<T>;
    if constexpr (F::padding)
      for (int64_t jj = 0; jj < bk; ++jj)
        if (p.key_padding(hd.b, t.j0 + jj)) row[jj] = kNegInf<T>;
  }
}

template <class T>
struct ForwardScratch {
  HeadContext<T> head;
  Scratch<T> S, O, Rq, Pb, m, l, transposed;
  KeyBand<T> band;
  SplitTile split;  // P, where split_row splits it
};

// One query tile of one head: all key tiles, online softmax, out and lse.
template <class F, class T, class Stored>
void forward_tile(const AttentionForward<T>& p, const AttentionForward<Stored>& data, const CallEmbeddings<T>& e,
                  const tiles::ForwardTiles& f, int64_t b, int64_t h, int64_t i0, ForwardScratch<T>& w) {
  HeadContext<T>& c = w.head;
  prepare(p, data, e, b, h, c);
  const Head<T>& hd = c.x.hd;
  const int64_t d = hd.d, dv = hd.dv, bq = std::min(f.rows, hd.lq - i0);
  const T scale = T(effective_scale(p));
  w.O.assign(bq * dv, T(0));
  w.m.assign(bq, kNegInf<T>);
  w.l.assign(bq, T(0));
  if (F::table && c.key_table()) {
    w.Rq.resize(bq * c.nb);
    gemm<T>(Trans::no, Trans::yes, bq, c.nb, d, T(1), hd.qp + i0 * d, d, c.wk.data(), d, T(0), w.Rq.data(), c.nb);
  }
  if (F::table && c.value_table()) w.Pb.assign(bq * c.nb, T(0));
  const int64_t keys = visited_keys(p, hd, i0, bq), block = std::min(forward_key_block(f, bq), keys);
  w.S.resize(bq * block);
  if (F::band && keys) w.band.reset(hd, c.E, F::causal, i0, bq, 0, keys, w.transposed);
  for (int64_t j0 = 0; j0 < keys; j0 += block) {
    const Tile t{i0, bq, j0, std::min(block, keys - j0)};
    T* S = w.S.data();
    const TileCut cut = cut_of(p, hd, t);
    tile_logits<F>(p, c, scale, t, cut, w.Rq.data(), w.band, S, w.transposed);
    if (c.stored.split) w.split.reshape(bq, t.bk, SplitTile::Layout::stacked);
    for (int64_t ii = 0; ii < bq; ++ii) {  // online softmax: S becomes P, O and Pb rescaled
      T* row = S + ii * t.bk;
      const int64_t seen = visible_keys(cut, ii, t.bk);
      std::fill(row + seen, row + t.bk, T(0));
      const BucketedRow<T> buckets = bucketed_row<F>(c, hd.r(i0 + ii, j0), seen, w.Rq.data(), ii, scale);
      const T m_new = buckets.max(row, w.m[ii]);
      if (m_new == kNegInf<T>) {  // nothing visible yet in this row
        std::fill(row, row + seen, T(0));
        if (c.stored.split) split_row(w.split, ii, row);
        continue;
      }
      // Rescaled by less than e^-44, the old terms drop, as exp_shifted_sum's
      // do (simd::kSoftmaxCutoff): kept, they would be subnormal numbers.
      const T alpha = w.m[ii] - m_new < T(simd::kSoftmaxCutoff) ? T(0) : std::exp(w.m[ii] - m_new);
      const auto sums = buckets.exp_shifted(row, m_new);
      w.l[ii] = w.l[ii] * alpha + sums.total();
      w.m[ii] = m_new;
      if (alpha != T(1)) {
        rows::scale(&w.O[ii * dv], alpha, dv);
        if (F::table && c.value_table())
          rows::scale(&w.Pb[ii * c.nb], alpha, c.nb);
      }
      if (F::table && c.value_table()) buckets.add_bucket_sums(&w.Pb[ii * c.nb], c.k, c.clip, row, sums);
      if (c.stored.split) split_row(w.split, ii, row);
    }
    times_values(c, w.split, cut, S, bq, t.bk, j0, dv, w.O.data());
  }
  if (F::table && c.value_table())
    weights_times<T>(Trans::no, bq, dv, c.nb, T(1), w.Pb.data(), c.nb, c.wv.data(), dv, T(1), w.O.data(), dv);
  for (int64_t ii = 0; ii < bq; ++ii) {
    const bool empty = w.l[ii] == T(0);  // fully masked row: zeros, lse -inf
    const T inv = empty ? T(0) : T(1) / w.l[ii];
    rows::scale(&w.O[ii * dv], inv, dv);
    write_row(data.out, b, h, i0 + ii, &w.O[ii * dv]);
    data.lse(b, h, i0 + ii) = empty ? kNegInf<T> : w.m[ii] + std::log(w.l[ii]);
  }
}

}  // namespace

// Key-tile groups per head in the backward. Fewer heads than threads would
// leave threads idle (B = 1, H = 1 ran on one thread), so each head's key
// tiles are split into contiguous groups that run as separate work items,
// each with its own query-side gradients (dq and the positional sums), added
// in group order. Two items per thread let the head-tail order balance a
// causal mask. Groups cost copies and sums (one head at L = 8192 on one
// thread in 8 groups: 8-20% slower), so one thread, or at least two heads per
// thread, keeps one group per head. The grouping depends on the thread count,
// so dq's rounding does too; the same thread count gives the same bits.

template <class T>
int64_t backward_key_groups(const AttentionForward<T>& p) {
  const int64_t heads = p.q.shape[0] * p.q.shape[1], tiles = (p.k.shape[2] + kBackwardKeys - 1) / kBackwardKeys;
  const int64_t threads = thread_count(p.num_threads, heads * tiles);
  if (threads == 1) return 1;
  return std::clamp<int64_t>((2 * threads + heads - 1) / heads, 1, std::max<int64_t>(tiles, 1));
}

namespace {

// The gradients of one head that sum over its key tiles, for one group of them.
template <class T>
struct QueryGrads {
  Scratch<T> dqc, dqp;  // dL/d(q + u) and dL/d(q + v), (lq, d)
  Scratch<T> dR, Pb;    // clipped tables: key-score gradients and value bucket sums of P, (lq, 2k+1)
  Scratch<T> dE;        // a key band: gradients of its rows, (distances, d)
  Scratch<T> dbias;     // a bias per distance with learnable parameters: its gradient per distance

  void reset(const HeadContext<T>& c, bool bias_grads) {
    const Head<T>& hd = c.x.hd;
    dqc.assign(hd.lq * hd.d, T(0)), dqp.assign(hd.lq * hd.d, T(0));
    dR.assign(c.key_table() ? hd.lq * c.nb : 0, T(0)), Pb.assign(c.value_table() ? hd.lq * c.nb : 0, T(0));
    dE.assign(c.band() ? hd.distances() * hd.d : 0, T(0));
    dbias.assign(c.x.bias.empty() || !bias_grads ? 0 : hd.distances(), T(0));
  }

  void add(const QueryGrads& o) {
    for (auto [mine, theirs] : {std::pair{&dqc, &o.dqc}, {&dqp, &o.dqp}, {&dR, &o.dR}, {&Pb, &o.Pb}, {&dE, &o.dE},
                                {&dbias, &o.dbias}})
      for (std::size_t n = 0; n < mine->size(); ++n) (*mine)[n] += (*theirs)[n];
  }
};

template <class T>
struct BackwardScratch {
  HeadContext<T> head;
  Scratch<T> dout, out_row, D, P, dP, Rq, G, dband, transposed;
  KeyBand<T> band;
  QueryGrads<T> query;  // one head's, when a head is one group
  Scratch<T> dk, dv;
  SplitBackward split;  // where splits_backward
};

// Whether the backward multiplies P and dS split (SplitBackward): the head
// multiplies its stored rows split and its dout is stored densely too.
template <class T>
bool splits_backward(const HeadContext<T>& c) {
  return std::is_same_v<T, float> && c.stored.split && c.stored.dout != nullptr;
}

// The start of a key group [begin, end) of a backward that splits.
template <class T>
void start_split(const HeadContext<T>& c, SplitBackward& split, int64_t begin, int64_t end, int64_t d, int64_t dv) {
  split.start_group(end - begin, kBackwardKeys, c.stored.k + begin * c.stored.ldk, c.stored.ldk, d, dv);
}

// The dense dout of the prepared head and D_i = dout_i . out_i.
template <class Stored, class T>
void load_dout(const AttentionBackward<Stored>& data, BackwardScratch<T>& w) {
  const Head<T>& hd = w.head.x.hd;
  const int64_t dv = hd.dv;
  w.dout.resize(hd.lq * dv), w.out_row.resize(dv), w.D.resize(hd.lq);
  for (int64_t i = 0; i < hd.lq; ++i) {
    read_row(data.dout, hd.b, hd.h, i, &w.dout[i * dv]);
    read_row(View4<const Stored>(data.out), hd.b, hd.h, i, w.out_row.data());
    T D = 0;
    for (int64_t x = 0; x < dv; ++x) D += w.dout[i * dv + x] * w.out_row[x];
    w.D[i] = D;
  }
  if constexpr (std::is_same_v<Stored, bfloat16>)
    if (w.head.stored && data.dout.stride[3] == 1 && data.dout.stride[2] >= dv) {
      w.head.stored.dout = &data.dout(hd.b, hd.h, 0, 0);
      w.head.stored.lddout = data.dout.stride[2];
    }
}

// Key tiles [group n / groups, (group + 1) n / groups) of the n of head
// (b, h) against every query tile that sees them: dk and dv of those keys
// (rows no other group writes; dk, dv zeroed by the caller) and the group's
// query-side sums in q.
template <class F, class T, class Stored>
void backward_key_group(const AttentionBackward<T>& p, const AttentionBackward<Stored>& data, const CallEmbeddings<T>& e,
                        int64_t b, int64_t h, int64_t group, int64_t groups, QueryGrads<T>& q, Scratch<T>& dk,
                        Scratch<T>& dv, BackwardScratch<T>& w) {
  HeadContext<T>& c = w.head;
  prepare(p, data, e, b, h, c);
  load_dout(data, w);
  q.reset(c, wants_scheme_grads(p));
  const Head<T>& hd = c.x.hd;
  const int64_t lq = hd.lq, d = hd.d, dvd = hd.dv, nb = c.nb;
  const T scale = T(effective_scale(p));
  const int64_t tiles = (hd.lk + kBackwardKeys - 1) / kBackwardKeys;
  const int64_t begin = group * tiles / groups * kBackwardKeys, end = std::min(hd.lk, (group + 1) * tiles / groups * kBackwardKeys);
  w.P.resize(kBackwardRows * kBackwardKeys), w.dP.resize(kBackwardRows * kBackwardKeys);
  const bool split = splits_backward(c);
  if (split) start_split(c, w.split, begin, end, d, dvd);

  for (int64_t i0 = 0; i0 < lq; i0 += kBackwardRows) {
    const int64_t bq = std::min(kBackwardRows, lq - i0), keys = std::min(end, visited_keys(p, hd, i0, bq));
    if (keys <= begin) continue;
    if (split)
      w.split.start_query_tile(c.stored.q + i0 * c.stored.ldq, c.stored.ldq, c.stored.dout + i0 * c.stored.lddout,
                               c.stored.lddout, bq);
    if (F::table && c.key_table()) {  // key-table scores of the query tile, (bq, nb)
      w.Rq.resize(bq * nb);
      gemm<T>(Trans::no, Trans::yes, bq, nb, d, T(1), hd.qp + i0 * d, d, c.wk.data(), d, T(0), w.Rq.data(), nb);
    }
    if (F::table && c.value_table()) {  // dout wv^T of the query tile, (bq, nb)
      w.G.resize(bq * nb);
      gemm<T>(Trans::no, Trans::yes, bq, nb, dvd, T(1), w.dout.data() + i0 * dvd, dvd, c.wv.data(), dvd, T(0),
              w.G.data(), nb);
    }
    if constexpr (F::band) {  // one band for all the keys of the group this query tile sees
      w.band.reset(hd, c.E, F::causal, i0, bq, begin, keys, w.transposed);
      w.dband.assign(bq * w.band.width(), T(0));
    }
    for (int64_t j0 = begin; j0 < keys; j0 += kBackwardKeys) {
      const Tile t{i0, bq, j0, std::min(kBackwardKeys, keys - j0)};
      const int64_t bk = t.bk;
      T *P = w.P.data(), *dS = w.dP.data();
      const TileCut cut = cut_of(p, hd, t);
      // Keys before p.key_grads_from get no gradient: dv and dk of the tile's later keys only.
      const int64_t skip = std::clamp<int64_t>(p.key_grads_from - j0, 0, bk), graded = bk - skip;
      // Split products serve whole tiles; a tile the mask cuts small enough
      // for the staircase kernel keeps float32, which skips the hidden half
      // where the split would multiply three whole parts.
      // Nor a tile whose hidden part holds a non-finite row (tile_products.hpp).
      const bool split_tile = split && !cut.staircase && skip == 0 &&
                              !hides_nonfinite(cut, bq, bk, c.x.kp + j0 * c.x.ldk, c.x.ldk, d, c.x.qc.data() + i0 * d,
                                               w.dout.data() + i0 * dvd, dvd);
      if (split_tile)
        for (SplitTile* tile : {&w.split.P, &w.split.dS}) tile->reshape(bq, bk, SplitTile::Layout::interleaved);
      tile_logits<F>(p, c, scale, t, cut, w.Rq.data(), w.band, P, w.transposed);
      const int64_t m0 = hd.diagonal(i0 + bq - 1, j0);
      for (int64_t ii = 0; ii < bq; ++ii) {
        const T lse = data.lse(b, h, i0 + ii);
        T* row = P + ii * bk;
        const int64_t seen = lse == kNegInf<T> ? 0 : visible_keys(cut, ii, bk);
        const BucketedRow<T> buckets = bucketed_row<F>(c, hd.r(i0 + ii, j0), seen, w.Rq.data(), ii, scale);
        const auto sums = buckets.exp_shifted(row, lse);
        std::fill(row + seen, row + bk, T(0));
        if (std::isnan(lse)) zero_masked<F>(p, hd, j0, present_keys<F>(hd, m0 + (bq - 1 - ii), bk), row, seen);
        if (F::table && c.value_table()) buckets.add_bucket_sums(&q.Pb[(i0 + ii) * nb], c.k, c.clip, row, sums);
        if (split_tile) split_row(w.split.P, ii, row);
      }
      const TileCut graded_cut = cut_of(p, hd, Tile{i0, bq, j0 + skip, graded});
      if (graded > 0 && !split_tile)
        tile_transposed_times(graded_cut, bq, dvd, graded, T(1), P + skip, bk, w.dout.data() + i0 * dvd, dvd, T(1),
                              dv.data() + (j0 + skip) * dvd, dvd);
      product_of_rows(c.stored.dout, c.stored.lddout, c.stored.v, c.stored.ldv, w.dout.data(), dvd, c.x.vp, c.x.ldv,
                      i0, j0, bq, bk, dvd, T(1), dS, cut, w.transposed);
      for (int64_t ii = 0; ii < bq; ++ii) {
        const int64_t i = i0 + ii, mrow = m0 + (bq - 1 - ii);
        T* prow = P + ii * bk;
        T* srow = dS + ii * bk;
        const int64_t r0 = hd.rmin + mrow, k = c.k;
        if (F::table && c.value_table())
          add_by_row(srow, bk, r0, k, c.clip, &w.G[ii * nb], T(1));
        const int64_t seen = visible_keys(cut, ii, bk);
        rows::softmax_grad(prow, srow, w.D[i], seen);
        std::fill(srow + seen, srow + bk, T(0));
        if (split_tile) split_row(w.split.dS, ii, srow);
        if (F::bias && !q.dbias.empty())
          rows::add_scaled(&q.dbias[mrow], srow, T(1), bk);
        if (F::table && c.key_table()) sum_by_row(&q.dR[i * nb], bk, r0, k, c.clip, srow, scale);
        if constexpr (F::band) {  // un-skew scale * dS onto the band: each present (ii, j) owns one column of row ii
          const int64_t present = present_keys<F>(hd, mrow, bk);
          rows::add_scaled_reversed(w.dband.data() + w.band.at(ii, j0, present), srow, scale, present);
        }
      }
      if (split_tile) {
        split_products(w.split, j0 - begin, bk, scale, q.dqc.data() + i0 * d);
        continue;
      }
      tile_times(cut, bq, d, bk, scale, dS, c.x.kp + j0 * c.x.ldk, c.x.ldk, T(1), q.dqc.data() + i0 * d, d);
      if (graded > 0)
        tile_transposed_times(graded_cut, bq, d, graded, scale, dS + skip, bk, c.x.qc.data() + i0 * d, d, T(1),
                              dk.data() + (j0 + skip) * d, d);
    }
    if constexpr (F::band) {  // the band's products backwards, once per query tile
      const KeyBand<T>& band = w.band;
      const int64_t rows = band.row_offset(hd);
      tile_times(band.cut(), bq, d, band.width(), T(1), w.dband.data(), c.E + rows, d, T(1), q.dqp.data() + i0 * d, d);
      tile_transposed_times(band.cut(), bq, d, band.width(), T(1), w.dband.data(), band.width(), hd.qp + i0 * d, d, T(1),
                            q.dE.data() + rows, d);
    }
  }
  if (split) finish_split(w.split, dk, dv, begin, d, dvd);
}

// A key band's row gradients, summed over the batch entries of one head that
// a thread finishes in a row before they become the embedding's parameter
// gradient (W_R's: a (rows, d)^T (rows, pos_dim) product per head and thread,
// not per batch entry; at the trainer's L = 64 that product cost twice the
// band's own). The backward's items run head-major for it. Under a causal
// mask only the rows of distances <= 0 can be non-zero, and only they are read.
// dE's rows fall in distance (KeyBand); the sum's rise, as the embedding reads them.
template <class T>
class BandRowSum {
 public:
  template <class F>
  void add(F, const CallEmbeddings<T>& e, const PositionGrads<T>& g, const Head<T>& hd, const Scratch<T>& dE) {
    if (hd.h != head_) flush(e, g);
    const int64_t count = hd.distances(), d = hd.d;
    const int64_t rows = F::causal ? std::clamp<int64_t>(1 - hd.rmin, 0, count) : count;
    if (head_ < 0) head_ = hd.h, rows_ = rows, sum_.assign(rows * d, T(0));
    for (int64_t m = 0; m < rows; ++m) rows::add_scaled(&sum_[m * d], &dE[(count - 1 - m) * d], T(1), d);
  }
  void flush(const CallEmbeddings<T>& e, const PositionGrads<T>& g) {
    if (head_ >= 0) e.keys->add_rows_grad(g, head_, rows_, sum_.data());
    head_ = -1;
  }

 private:
  int64_t head_ = -1, rows_ = 0;
  Scratch<T> sum_;
};

// The backward's items in head-major order: item -> (batch entry, head).
inline std::pair<int64_t, int64_t> head_major(int64_t item, int64_t batch) { return {item % batch, item / batch}; }

// The end of one head's backward, from its query-side sums (all groups
// added) and its dk, dv: the positional parameters' gradients into g (a key
// band's through band_rows), then dq, dk, dv into the caller's tensors. w
// holds the head and its dout.
template <class F, class T, class Stored>
void finish_head(F, const AttentionBackward<Stored>& data, const CallEmbeddings<T>& e, const PositionGrads<T>& g,
                 QueryGrads<T>& q, Scratch<T>& dk, const Scratch<T>& dv, BandRowSum<T>& band_rows,
                 BackwardScratch<T>& w) {
  const HeadContext<T>& c = w.head;
  const Head<T>& hd = c.x.hd;
  const int64_t lq = hd.lq, d = hd.d, dvd = hd.dv, nb = c.nb;
  if (c.key_table()) {  // dqp += dR wk; dwk += dR^T qp
    weights_times<T>(Trans::no, lq, d, nb, T(1), q.dR.data(), nb, c.wk.data(), d, T(1), q.dqp.data(), d);
    if (e.key_table()->wants_grad(g)) {
      Scratch<T> dwk(nb * d);
      weights_times<T>(Trans::yes, nb, d, lq, T(1), q.dR.data(), nb, hd.qp, d, T(0), dwk.data(), d);
      e.key_table()->add_slice_grad(g, hd.h, dwk.data());
    }
  }
  if (c.value_table() && e.value_table()->wants_grad(g)) {  // dwv += Pb^T dout
    Scratch<T> dwv(nb * dvd);
    weights_times<T>(Trans::yes, nb, dvd, lq, T(1), q.Pb.data(), nb, w.dout.data(), dvd, T(0), dwv.data(), dvd);
    e.value_table()->add_slice_grad(g, hd.h, dwv.data());
  }
  if constexpr (F::band) band_rows.add(F{}, e, g, hd, q.dE);
  if (!q.dbias.empty()) add_bias_grad(g, c.x, q.dbias);
  write_input_grads(data, c.x, g, q.dqc, q.dqp, dk, dv);
}

}  // namespace

// A head's query tiles in head-tail order 0, n-1, 1, n-2, ...: under a causal
// mask a tile's cost grows with its index, so the contiguous runs of items
// that the static split hands each thread cost about the same (one head on
// two threads: 1.34x faster than one thread in tile order, 1.81-1.98x in this).
inline int64_t head_tail(int64_t n, int64_t tiles) { return n % 2 == 0 ? n / 2 : tiles - 1 - n / 2; }

namespace {

template <class T, class Stored>
void run_forward(const AttentionForward<T>& p, const AttentionForward<Stored>& data) {
  const tiles::ForwardTiles f = tiles::forward(p.q.shape[3], p.v.shape[3]);
  const int64_t heads = p.q.shape[1], query_tiles = (p.q.shape[2] + f.rows - 1) / f.rows;
  const int64_t items = p.q.shape[0] * heads * query_tiles;
  const int threads = thread_count(p.num_threads, items);
  std::vector<ForwardScratch<T>> scratch(threads);
  const CallEmbeddings<T> e(p);
  with_tile_features(p, e, [&](auto features) {
    parallel_for(
        items, threads, [](int) {},
        [&](int t, int64_t item) {
          const int64_t bh = item / query_tiles;
          forward_tile<decltype(features)>(p, data, e, f, bh / heads, bh % heads,
                                           head_tail(item % query_tiles, query_tiles) * f.rows, scratch[t]);
        });
  });
}

// Heads that are one group each run whole on one thread; otherwise the
// (batch, head, group) items run first, then per head the groups' sums are
// added in group order and the head finished. Positional-parameter gradients
// go to per-thread partials added in thread order.
template <class F, class T, class Stored>
void backward_with(const AttentionBackward<T>& p, const AttentionBackward<Stored>& data, const CallEmbeddings<T>& e) {
  const int64_t batch = p.q.shape[0], heads = p.q.shape[1], count = batch * heads, groups = backward_key_groups(p);
  const int64_t lk = p.k.shape[2], d = p.q.shape[3], dv = p.v.shape[3];
  const int threads = thread_count(p.num_threads, count * groups);
  std::vector<BackwardScratch<T>> scratch(threads);
  std::vector<std::unique_ptr<GradPartials<T>>> partials(threads);
  std::vector<BandRowSum<T>> band_rows(threads);
  const auto make_partials = [&](int t) { partials[t] = std::make_unique<GradPartials<T>>(p.dpos); };
  if (groups == 1) {
    parallel_for(count, threads, make_partials, [&](int t, int64_t item) {
      const auto [b, h] = head_major(item, batch);
      BackwardScratch<T>& w = scratch[t];
      w.dk.assign(lk * d, T(0)), w.dv.assign(lk * dv, T(0));
      backward_key_group<F>(p, data, e, b, h, 0, 1, w.query, w.dk, w.dv, w);
      finish_head(F{}, data, e, partials[t]->grads(), w.query, w.dk, w.dv, band_rows[t], w);
    });
  } else {
    std::vector<QueryGrads<T>> query(count * groups);
    std::vector<Scratch<T>> dk(count, Scratch<T>(lk * d)), dvs(count, Scratch<T>(lk * dv));
    parallel_for(count * groups, threads, [](int) {}, [&](int t, int64_t item) {
      const int64_t bh = item / groups;
      const int64_t group = head_tail(item % groups, groups);  // causal: early key groups cost more
      backward_key_group<F>(p, data, e, bh / heads, bh % heads, group, groups, query[bh * groups + group], dk[bh],
                            dvs[bh], scratch[t]);
    });
    parallel_for(count, thread_count(p.num_threads, count), make_partials, [&](int t, int64_t item) {
      const auto [b, h] = head_major(item, batch);
      const int64_t bh = b * heads + h;
      QueryGrads<T>& sum = query[bh * groups];
      for (int64_t g = 1; g < groups; ++g) sum.add(query[bh * groups + g]);
      BackwardScratch<T>& w = scratch[t];
      prepare(p, data, e, b, h, w.head);
      load_dout(data, w);
      finish_head(F{}, data, e, partials[t]->grads(), sum, dk[bh], dvs[bh], band_rows[t], w);
    });
  }
  if constexpr (F::band)  // each thread's last head; item t of a static split of `threads` items runs on thread t
    parallel_for(threads, threads, [](int) {}, [&](int t, int64_t) {
      if (partials[t]) band_rows[t].flush(e, partials[t]->grads());
    });
  for (const auto& part : partials)  // fixed order: deterministic sums
    if (part) part->add_into(p.dpos);
}

template <class T, class Stored>
void run_backward(const AttentionBackward<T>& p, const AttentionBackward<Stored>& data) {
  const CallEmbeddings<T> e(p);
  with_tile_features(p, e, [&](auto features) { backward_with<decltype(features)>(p, data, e); });
}

}  // namespace

template <class T>
void forward(const AttentionForward<T>& p) {
  run_forward(p, p);
}
template <class T>
void backward(const AttentionBackward<T>& p) {
  run_backward(p, p);
}
template <class S>
void forward_stored(const AttentionForward<compute_t<S>>& twin, const AttentionForward<S>& data) {
  run_forward(twin, data);
}
template <class S>
void backward_stored(const AttentionBackward<compute_t<S>>& twin, const AttentionBackward<S>& data) {
  run_backward(twin, data);
}

template void forward_stored<bfloat16>(const AttentionForward<float>&, const AttentionForward<bfloat16>&);
template void forward_stored<float16>(const AttentionForward<float>&, const AttentionForward<float16>&);
template void backward_stored<bfloat16>(const AttentionBackward<float>&, const AttentionBackward<bfloat16>&);
template void backward_stored<float16>(const AttentionBackward<float>&, const AttentionBackward<float16>&);
template void forward<float>(const AttentionForward<float>&);
template void forward<double>(const AttentionForward<double>&);
template void backward<float>(const AttentionBackward<float>&);
template void backward<double>(const AttentionBackward<double>&);
template int64_t backward_key_groups<float>(const AttentionForward<float>&);
template int64_t backward_key_groups<double>(const AttentionForward<double>&);
template int64_t backward_key_groups<bfloat16>(const AttentionForward<bfloat16>&);
template int64_t backward_key_groups<float16>(const AttentionForward<float16>&);

}  // namespace relpos::fused
