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
//   indexed tables      a table read at a row per distance (DeBERTa's buckets),
//                       by the query (c2p: c2p qp^T, rows x queries, per query
//                       tile) or by the key (p2c: p2c k^T, rows x keys, once
//                       per head), a tile's pairs picked by distance, each
//                       distance's stretch of one row contiguous
//                       (indexed_rows.hpp); the backward sums dS into the
//                       same shapes
//   grid bias           a bias per (head, offsets) on a grid (Swin's): the
//                       head's values by offset pair, read per key run
//                       (grid_rows.hpp)
//   grid tables         tables per axis on a grid read by the query (SAM's):
//                       the query tile's scores against both tables, (bq,
//                       rows_y + rows_x), picked per key run; dS summed into
//                       the same shapes
//
// Backward recomputes P from the saved logsumexp, query tiles outer and key
// tiles inner; positional gradients go to per-thread partials summed in
// thread order, so results do not depend on thread timing. Small tiles on the
// causal diagonal skip what the mask hides (tile_products.hpp).
//
// This header holds what the forward (fused_forward.cpp) and the backward
// (fused_backward.cpp) share: a head's prepared inputs, the compile-time
// features of a call's tiles and a tile's logits. The two halves compile
// apart, on two cores at once.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <memory>
#include <stdexcept>
#include <type_traits>
#include <vector>

#include "relpos/gemm.hpp"
#include "../backend/parallel.hpp"
#include "../backend/row_ops.hpp"
#include "bf16_split.hpp"
#include "causal_cut.hpp"
#include "distance_table.hpp"
#include "fused_plan.hpp"
#include "grid_rows.hpp"
#include "head.hpp"
#include "indexed_rows.hpp"
#include "key_band.hpp"
#include "tile_products.hpp"
#include "tiles.hpp"

namespace relpos::fused {

using tiles::kBackwardKeys;
using tiles::kBackwardRows;

// One (batch, head), prepared once and shared by its tiles.
template <class T>
struct HeadContext {
  int64_t b = -1, h = -1;
  HeadData<T> x;
  int64_t k = 0, nb = 0;    // clipped tables: window k, rows 2k+1
  bool clip = true;         // clipped tables: distances beyond +-k use the edge rows (else a zero embedding)
  Scratch<T> wk, wv;        // the clipped tables' slices of this head (nb, d), (nb, dv)
  const T* E = nullptr;     // a key band's rows per distance (distances, d), falling, from CallEmbeddings
  Scratch<T> c2p, p2c;      // indexed tables: this head's slices (nb, d), read by the query and by the key
  Scratch<T> Rk;            // p2c: the keys' scores against the rows each key tile reaches (reached_rows), (nb, lk)
  const RowRuns* c2p_rows = nullptr;  // indexed tables: the table row of each distance index, from CallEmbeddings
  const RowRuns* p2c_rows = nullptr;
  int64_t by_query_ld = 0;  // indexed tables: the row stride of the score gradients by query (c2p's dR)
  int64_t by_key_ld = 0;    // and of the scores and score gradients by key (p2c's Rk, dRk): indexed_stride
  const GridAxes* axes = nullptr;  // on a grid: the call's offsets, from CallEmbeddings
  Scratch<T> grid;          // a grid bias's values of this head by offsets (rows_y rows_x), or grid tables (rows, d)
  StoredBf16Rows stored;    // the head's bfloat16 rows, where the logits may multiply them in place

  // Every buffer of the plan, and the scheme's objects for call p (their
  // buffers are the worker's too), before the worker's first head.
  void allocate(const HeadPlan& plan, const AttentionForward<T>& p) {
    for (auto [buffer, size] : {std::pair{&x.qc, plan.qc}, {&x.qp, plan.qp}, {&x.k, plan.k}, {&x.v, plan.v},
                                {&x.bias, plan.bias}, {&wk, plan.wk}, {&wv, plan.wv}, {&c2p, plan.c2p},
                                {&p2c, plan.p2c}, {&Rk, plan.Rk}, {&grid, plan.grid}})
      buffer->reserve(size);
    x.rotation = make_rotation(p);
    x.query_bias = make_query_bias(p);
    x.distance_bias = make_distance_bias(p);
  }

  bool key_table() const { return !wk.empty(); }
  bool value_table() const { return !wv.empty(); }
  bool band() const { return E != nullptr; }
};

// What shapes a tile's row loops, fixed at compile time at one dispatch point
// (with_tile_features, in run_forward and run_backward) so that the loops
// over a tile's rows test none of it, as FlashAttention's static switches do:
// the causal mask, a mask per pair (key padding, segments), and the kind of relative term a tile
// adds (rotations and query biases happen before the tiles: plain), clipped
// tables of keys, of values or both apart, indexed tables read by the query
// (c2p), by the key (p2c) or both.
enum class TileTerm {
  plain, bias, key_table, value_table, key_and_value_tables, band, c2p, p2c, c2p_and_p2c, grid_bias, grid_tables
};

template <bool Causal, bool Padding, TileTerm Term>
struct TileFeatures {
  static constexpr bool causal = Causal, padding = Padding;
  static constexpr bool bias = Term == TileTerm::bias, band = Term == TileTerm::band;
  static constexpr bool c2p = Term == TileTerm::c2p || Term == TileTerm::c2p_and_p2c;
  static constexpr bool p2c = Term == TileTerm::p2c || Term == TileTerm::c2p_and_p2c;
  static constexpr bool indexed = c2p || p2c;
  static constexpr bool key_table = Term == TileTerm::key_table || Term == TileTerm::key_and_value_tables;
  static constexpr bool value_table = Term == TileTerm::value_table || Term == TileTerm::key_and_value_tables;
  static constexpr bool table = key_table || value_table;
  static constexpr bool grid_bias = Term == TileTerm::grid_bias, grid_tables = Term == TileTerm::grid_tables;
  static constexpr bool grid = grid_bias || grid_tables;
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
// table offers fused for no other). Indexed tables (key or query embeddings)
// are read through their per-head slices at each distance's row, listed here.
template <class T>
struct CallEmbeddings {
  std::unique_ptr<DistanceEmbedding<T>> keys, values, queries;
  std::vector<Scratch<T>> E;  // a key band: per head (distances, d), row r the distance index distances - 1 - r
  RowRuns key_rows, query_rows;  // indexed tables: the row of distance index m
  std::unique_ptr<GridBias<T>> grid_bias;            // on a grid: a bias per (head, offsets)
  std::unique_ptr<GridEmbedding<T>> grid_embedding;  // or tables per axis read by the query

  explicit CallEmbeddings(const AttentionForward<T>& p)
      : keys(make_key_embedding(p)),
        values(make_value_embedding(p)),
        queries(make_query_embedding(p)),
        grid_bias(make_grid_bias(p)),
        grid_embedding(make_grid_embedding(p)) {
    if (queries && !queries->indexed()) throw std::logic_error("relpos: fused reads query embeddings as indexed tables");
    for (const auto& [table, rows] : {std::pair{indexed_keys(), &key_rows}, std::pair{indexed_queries(), &query_rows}})
      if (table) {
        if (table->table_rows() > INT32_MAX || table->count() > INT32_MAX)  // rows and distances listed as int32
          throw std::invalid_argument("relpos: fused: a table of more than 2^31 - 1 rows or distances");
        Scratch<int32_t> of_distance(table->count());
        for (int64_t m = 0; m < table->count(); ++m) of_distance[m] = int32_t(table->index(table->rmin() + m));
        *rows = RowRuns(std::move(of_distance));
      }
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
  const IndexedTable<T>* indexed_keys() const { return keys ? keys->indexed() : nullptr; }
  const IndexedTable<T>* indexed_queries() const { return queries ? queries->indexed() : nullptr; }
  bool indexed() const { return indexed_keys() || indexed_queries(); }
  bool band() const { return keys && !keys->clipped() && !keys->indexed(); }
  // The call's offsets on its grids; null off a grid.
  const GridAxes* grid_axes() const {
    return grid_bias ? &grid_bias->axes() : grid_embedding ? &grid_embedding->axes() : nullptr;
  }
};

// Calls f(TileFeatures<...>{}) with the features of call p.
template <class T, class F>
void with_tile_features(const AttentionForward<T>& p, const CallEmbeddings<T>& embeddings, F&& f) {
  const bool bias = scheme_has<BiasOf, T>(p.pos.scheme);
  const bool keys = embeddings.key_table() != nullptr, values = embeddings.value_table() != nullptr;
  const bool c2p = embeddings.indexed_keys() != nullptr, p2c = embeddings.indexed_queries() != nullptr;
  const TileTerm term = embeddings.grid_bias      ? TileTerm::grid_bias
                        : embeddings.grid_embedding ? TileTerm::grid_tables
                        : c2p && p2c          ? TileTerm::c2p_and_p2c
                        : c2p               ? TileTerm::c2p
                        : p2c               ? TileTerm::p2c
                        : embeddings.band() ? TileTerm::band
                        : keys && values   ? TileTerm::key_and_value_tables
                        : keys             ? TileTerm::key_table
                        : values           ? TileTerm::value_table
                        : bias             ? TileTerm::bias
                                           : TileTerm::plain;
  bool_switch(p.causal, [&](auto causal) {
    bool_switch(!p.key_padding.empty() || !p.q_segments.empty(), [&](auto padding) {
      constexpr bool c = decltype(causal)::value, k = decltype(padding)::value;
      switch (term) {
        case TileTerm::plain: return f(TileFeatures<c, k, TileTerm::plain>{});
        case TileTerm::bias: return f(TileFeatures<c, k, TileTerm::bias>{});
        case TileTerm::key_table: return f(TileFeatures<c, k, TileTerm::key_table>{});
        case TileTerm::value_table: return f(TileFeatures<c, k, TileTerm::value_table>{});
        case TileTerm::key_and_value_tables: return f(TileFeatures<c, k, TileTerm::key_and_value_tables>{});
        case TileTerm::band: return f(TileFeatures<c, k, TileTerm::band>{});
        case TileTerm::c2p: return f(TileFeatures<c, k, TileTerm::c2p>{});
        case TileTerm::p2c: return f(TileFeatures<c, k, TileTerm::p2c>{});
        case TileTerm::c2p_and_p2c: return f(TileFeatures<c, k, TileTerm::c2p_and_p2c>{});
        case TileTerm::grid_bias: return f(TileFeatures<c, k, TileTerm::grid_bias>{});
        case TileTerm::grid_tables: return f(TileFeatures<c, k, TileTerm::grid_tables>{});
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
  // Into the buffers of the head before: a new slice beside the old one would hold both at once.
  if (e.key_table()) table_slice(*e.key_table(), h, c.wk);
  if (e.value_table()) table_slice(*e.value_table(), h, c.wv);
  c.E = e.E.empty() ? nullptr : e.E[h].data();
  c.c2p.clear(), c.p2c.clear(), c.Rk.clear();
  c.c2p_rows = e.key_rows.empty() ? nullptr : &e.key_rows;
  c.p2c_rows = e.query_rows.empty() ? nullptr : &e.query_rows;
  c.by_query_ld = indexed_stride(c.x.hd.lq), c.by_key_ld = indexed_stride(c.x.hd.lk);
  if (const IndexedTable<T>* table = e.indexed_keys()) {
    c.nb = table->table_rows();
    c.c2p.resize(c.nb * table->width()), table->slice(h, c.c2p.data());
  }
  if (const IndexedTable<T>* table = e.indexed_queries()) {
    const Head<T>& hd = c.x.hd;
    c.nb = table->table_rows();
    c.p2c.resize(c.nb * hd.d), table->slice(h, c.p2c.data());
    const int64_t ld = c.by_key_ld;
    c.Rk.resize(c.nb * ld);  // (nb, lk): read by distance (indexed_rows.hpp), each key tile's reached rows alone
    for_each_reached_tile(*c.p2c_rows, /*by_query=*/false, hd.lq, hd.lk, 0, hd.lk,
                          [&](int64_t j0, int64_t n, RowSpan rows) {
                            gemm<T>(Trans::no, Trans::yes, rows.count(), n, hd.d, T(1),
                                    c.p2c.data() + rows.first * hd.d, hd.d, c.x.kp + j0 * c.x.ldk, c.x.ldk, T(0),
                                    c.Rk.data() + rows.first * ld + j0, ld);
                          });
  }
  c.axes = e.grid_axes();
  if (e.grid_bias) {
    const GridShape& g = c.axes->shape();
    c.grid.resize(g.rows_y() * g.rows_x()), e.grid_bias->values(h, c.grid.data());
  } else if (e.grid_embedding && c.grid.empty()) {  // shared by the heads: made for the worker's first
    const GridShape& g = c.axes->shape();
    c.grid.resize((g.rows_y() + g.rows_x()) * c.x.hd.d), e.grid_embedding->tables(c.grid.data());
  }
  c.stored = stored_bf16_rows(p, data, b, h, c.x.padded_keys_zeroed);
}

// A tile row's P where its logsumexp is NaN (the row saw a NaN): the
// exponentials of its masked logits are NaN too, and are set to 0, so that
// a key the row cannot see gets no gradient from it. shown, computed: the
// row's (TileCut); i the row, j0 its first key.
template <class F, class T>
void zero_masked(const AttentionForward<T>& p, const Head<T>& hd, int64_t i, int64_t j0, int64_t shown, T* row,
                 int64_t computed) {
  if (shown < computed) std::fill(row + shown, row + computed, T(0));
  if constexpr (F::padding)
    for (int64_t jj = 0; jj < computed; ++jj)
      if (pair_hidden(p, hd.b, i, j0 + jj)) row[jj] = T(0);
}

// Row ii of a tile, the keys [0, computed) from distance r0 on, by clipped-table
// bucket, with the key table's edge scores from Rq (BucketedRow); one part
// without a table.
template <class F, class T>
BucketedRow<T> bucketed_row(const HeadContext<T>& c, int64_t r0, int64_t computed, const T* Rq, int64_t ii,
                            T scale) {
  if constexpr (!F::table) {
    return BucketedRow<T>::whole(computed);
  } else {
    BucketedRow<T> row = BucketedRow<T>::clipped(r0, computed, c.k);
    // Under a causal mask the keys past +k are all masked: no shift (a NaN table row there must not reach the row).
    if (F::key_table && c.clip)
      row.below = scale * Rq[ii * c.nb], row.above = F::causal ? T(0) : scale * Rq[ii * c.nb + 2 * c.k];
    return row;
  }
}

// The query tile's scores against a table's rows: (bq, nb) for a clipped key
// table (read row by row), (nb, bq) for an indexed one (c2p, read by
// distance: indexed_rows.hpp), (bq, rows_y + rows_x) for grid tables.
template <class F, class T>
void query_tile_scores(const HeadContext<T>& c, int64_t i0, int64_t bq, Scratch<T>& Rq) {
  const Head<T>& hd = c.x.hd;
  const int64_t d = hd.d;
  if constexpr (F::grid_tables) {
    const int64_t rows = c.axes->shape().rows_y() + c.axes->shape().rows_x();
    Rq.resize(bq * rows);
    return gemm<T>(Trans::no, Trans::yes, bq, rows, d, T(1), hd.qp + i0 * d, d, c.grid.data(), d, T(0), Rq.data(),
                   rows);
  }
  Rq.resize(bq * c.nb);
  if constexpr (F::c2p) {  // the rows the tile's queries reach; the others are never read
    for_each_reached_tile(*c.c2p_rows, /*by_query=*/true, hd.lq, hd.lk, i0, i0 + bq,
                          [&](int64_t c0, int64_t n, RowSpan rows) {
                            gemm<T>(Trans::no, Trans::yes, rows.count(), n, d, T(1), c.c2p.data() + rows.first * d,
                                    d, hd.qp + c0 * d, d, T(0), Rq.data() + rows.first * bq + (c0 - i0), bq);
                          });
  } else
    gemm<T>(Trans::no, Trans::yes, bq, c.nb, d, T(1), hd.qp + i0 * d, d, c.wk.data(), d, T(0), Rq.data(), c.nb);
}

// Adds the indexed tables' scores to the tile's logits S (bq, bk): scale
// times RqT[c2p row, ii] (the query tile's scores against the c2p rows,
// (nb, bq): query_tile_scores) and Rk[p2c row, j], each pair's rows those of
// its distance (distance index of (ii, jj): m0 + (bq - 1 - ii) + jj).
// diagonals: scratch.
template <class F, class T>
void add_indexed_scores(const HeadContext<T>& c, T scale, const Tile& t, int64_t m0, const T* Rq, T* S,
                        Scratch<T>& diagonals) {
  IndexedScores<const T> c2p, p2c;
  if constexpr (F::c2p) c2p = {c.c2p_rows, Rq, t.bq};
  if constexpr (F::p2c) p2c = {c.p2c_rows, c.Rk.data() + t.j0, c.by_key_ld};
  add_indexed_picks(c2p, p2c, m0, t.bq, t.bk, scale, S, t.bk, diagonals);
}

// S (bq, bk) = the tile's logits, masked pairs -inf (cut: cut_of the tile), but for a clipped key
// table's edge scores (bucketed_row). Rq: the table's scores of the tile's queries
// (query_tile_scores: (bq, nb) for a clipped key table, (nb, bq) for c2p, (bq, rows) for grid tables).
// band: the query tile's key band scores. transposed, diagonals: scratch of the products and of
// the indexed tables' picks.
template <class F, class T>
void tile_logits(const AttentionForward<T>& p, const HeadContext<T>& c, T scale, const Tile& t, const TileCut& cut,
                 const T* Rq, KeyBand<T>& band, T* S, Scratch<T>& transposed, Scratch<T>& diagonals) {
  const Head<T>& hd = c.x.hd;
  if constexpr (F::band) band.reach_keys(t.j0, t.bk);
  const int64_t d = hd.d, bq = t.bq, bk = t.bk;
  product_of_rows(c.stored.q, c.stored.ldq, c.stored.k, c.stored.ldk, c.x.qrows, d, c.x.kp, c.x.ldk, t.i0, t.j0,
                  bq, bk, d, scale, S, cut, transposed);
  const int64_t m0 = hd.diagonal(t.i0 + bq - 1, t.j0);  // distance index of the tile's smallest distance
  if constexpr (F::indexed) add_indexed_scores<F>(c, scale, t, m0, Rq, S, diagonals);
  const Scratch<T>& bias = c.x.bias;
  for (int64_t ii = 0; ii < bq; ++ii) {
    T* row = S + ii * bk;
    const int64_t mrow = m0 + (bq - 1 - ii);  // distance index of (ii, jj = 0)
    const int64_t shown = cut.shown(ii);
    if constexpr (F::band)  // the band holds the shown keys' columns only, right to left
      rows::add_scaled_reversed(row, band.scores() + band.at(ii, t.j0, shown), scale, shown);
    if constexpr (F::key_table)  // the window's scores; the edges' are the softmax's (bucketed_row)
      add_window_by_row(row, bk, hd.rmin + mrow, c.k, Rq + ii * c.nb, scale);
    if constexpr (F::bias)
      rows::add_scaled(row, &bias[mrow], T(1), bk);
    if constexpr (F::grid_bias)
      add_grid_row<T>(*c.axes, t.i0 + ii, t.j0, bk, nullptr, c.grid.data(), c.axes->shape().rows_x(), row);
    if constexpr (F::grid_tables) {  // the query's scores against the y table, then the x table
      const T* scores = Rq + ii * (c.axes->shape().rows_y() + c.axes->shape().rows_x());
      add_grid_row(*c.axes, t.i0 + ii, t.j0, bk, scores, scores + c.axes->shape().rows_y(), 0, row);
    }
    if constexpr (F::causal)
      for (int64_t jj = shown; jj < bk; ++jj) row[jj] = kNegInf<T>;
    if constexpr (F::padding) {
      if (!p.key_padding.empty())
        for (int64_t jj = 0; jj < bk; ++jj)
          if (p.key_padding(hd.b, t.j0 + jj)) row[jj] = kNegInf<T>;
      if (!p.q_segments.empty()) {  // the keys of other segments than the row's, as a select over the row
        const int32_t segment = p.q_segments(hd.b, t.i0 + ii);
        const int32_t* keys = &p.k_segments(hd.b, t.j0);
        const int64_t step = p.k_segments.stride[1];
        for (int64_t jj = 0; jj < bk; ++jj) row[jj] = keys[jj * step] != segment ? kNegInf<T> : row[jj];
      }
    }
  }
}

// A head's query tiles in head-tail order 0, n-1, 1, n-2, ...: under a causal
// mask a tile's cost grows with its index, so the contiguous runs of items
// that the static split hands each thread cost about the same (one head on
// two threads: 1.34x faster than one thread in tile order, 1.81-1.98x in this).
inline int64_t head_tail(int64_t n, int64_t tiles) { return n % 2 == 0 ? n / 2 : tiles - 1 - n / 2; }

}  // namespace relpos::fused
