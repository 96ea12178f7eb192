// The fused kernel's scratch plan (fused_plan.hpp): each buffer sized as the
// kernel's loops size it, over the call's query tiles and key groups.
#include "fused_plan.hpp"

#include <algorithm>
#include <type_traits>

#include "../backend/parallel.hpp"
#include "../backend/simd.hpp"
#include "bf16_split.hpp"
#include "causal_cut.hpp"
#include "fused.hpp"
#include "head.hpp"
#include "indexed_rows.hpp"
#include "key_band.hpp"
#include "tiles.hpp"
#include "../schemes/registry.hpp"

namespace relpos::fused {
namespace {

using tiles::kBackwardKeys;
using tiles::kBackwardRows;

// Elements of the positional parameters whose gradients dpos wants (null:
// every parameter's).
template <class S>
int64_t gradient_elements(const AttentionForward<S>& p, const PositionGrads<S>* dpos) {
  int64_t n = 0;
  if (!dpos)
    for_each_scheme_param(p.pos, [&](const char*, const auto& x) { n += x.empty() ? 0 : x.numel(); });
  else
    for_each_scheme_param(
        p.pos, [&](const char*, const auto&, const auto& g) { n += g.empty() ? 0 : g.numel(); }, *dpos);
  return n;
}

template <class S>
int64_t parameter_elements(const AttentionForward<S>& p) {
  return gradient_elements(p, static_cast<const PositionGrads<S>*>(nullptr));
}

// What a call's tiles add, from its scheme's embeddings (fused_tile.hpp's TileTerm).
struct Terms {
  bool key_table, value_table, c2p, p2c, band, bias, query_bias, rotation;
  int64_t nb;  // a table's rows
  bool grid_bias, grid_tables;
  GridShape grid;
  int64_t grid_rows() const { return grid.rows_y() + grid.rows_x(); }  // grid tables' rows
  int64_t grid_offsets() const { return grid.rows_y() * grid.rows_x(); }  // a grid bias's values
};

template <class S>
Terms terms_of(const AttentionForward<S>& p) {
  using C = compute_t<S>;
  const EmbeddingSizes e = embedding_sizes(p);
  const bool clipped = e.table_rows > 0 && !e.indexed;
  return {.key_table = clipped && e.key_width > 0,
          .value_table = clipped && e.value_width > 0,
          .c2p = e.indexed && e.key_width > 0,
          .p2c = e.indexed && e.query_width > 0,
          .band = e.key_width > 0 && e.table_rows == 0,
          .bias = scheme_has<BiasOf, C>(p.pos.scheme),
          .query_bias = scheme_has<QueryBiasOf, C>(p.pos.scheme),
          .rotation = scheme_has<RotationOf, C>(p.pos.scheme),
          .nb = e.table_rows,
          .grid_bias = scheme_has<GridBiasOf, C>(p.pos.scheme),
          .grid_tables = scheme_has<GridEmbeddingOf, C>(p.pos.scheme),
          .grid = grid_shape(p)};
}

template <class S>
HeadPlan head_plan(const AttentionForward<S>& p, const Terms& t) {
  using C = compute_t<S>;
  const int64_t lq = p.q.shape[2], lk = p.k.shape[2], d = p.q.shape[3], dv = p.v.shape[3];
  const int64_t distances = lq + lk - 1;
  bool copies_queries = true, copies_keys = true;  // half storage always widens them
  if constexpr (std::is_same_v<S, C>)
    copies_queries = !queries_readable_in_place(p), copies_keys = !keys_readable_in_place(p);
  HeadPlan h;
  h.qc = copies_queries ? lq * d : 0;
  h.qp = t.query_bias ? lq * d : 0;
  h.k = copies_keys ? lk * d : 0, h.v = copies_keys ? lk * dv : 0;
  h.bias = t.bias ? distances : 0;
  h.wk = t.key_table ? t.nb * d : 0, h.wv = t.value_table ? t.nb * dv : 0;
  h.c2p = t.c2p ? t.nb * d : 0, h.p2c = t.p2c ? t.nb * d : 0, h.Rk = t.p2c ? indexed_stride(lk) * t.nb : 0;
  h.grid = t.grid_bias ? t.grid_offsets() : t.grid_tables ? t.grid_rows() * d : 0;
  if (t.rotation) {  // RoPE's cosines and sines of every query's and key's position (rope.hpp's Angles)
    const int64_t rotated = p.pos.rope.rotary_dims ? p.pos.rope.rotary_dims : d;
    h.scheme_bytes += (lq + lk) * 2 * (rotated / 2) * int64_t(sizeof(C));
  }
  if (p.pos.scheme == Scheme::t5) h.scheme_bytes += distances * int64_t(sizeof(int64_t));  // t5.hpp's buckets
  return h;
}

// The transposed operand of a product of rows by rows over `width` features
// and bk columns (rows_by_rows) where its cut takes the staircase: float32 only.
template <class S>
int64_t staircase_operand(const TileCut& cut, int64_t width, int64_t bk) {
  return std::is_same_v<compute_t<S>, float> && cut.staircase ? width * bk : 0;
}

// The largest staircase operand of the tiles of the query tile (i0, bq)
// against keys [begin, end) in steps of `step` keys, over `width` features.
// The cut tiles are the last ones (a tile's last key lies further from the
// diagonal than the last key of any tile to its right), so they are walked
// from the last until one is not cut.
template <class S>
int64_t staircase_of_tiles(const AttentionForward<S>& p, const Head<S>& hd, int64_t i0, int64_t bq, int64_t begin,
                           int64_t end, int64_t step, int64_t width) {
  int64_t most = 0;
  for (int64_t j0 = end > begin ? begin + (end - 1 - begin) / step * step : begin - 1; j0 >= begin; j0 -= step) {
    const Tile tile{i0, bq, j0, std::min(step, end - j0)};
    const TileCut cut = cut_of(p, hd, tile);
    if (!cut.causal || cut.delta >= tile.bk - 1) break;  // not cut, nor any tile left of it
    most = std::max(most, staircase_operand<S>(cut, width, tile.bk));
  }
  return most;
}

// The (key group, query tile) pairs whose bands and tiles the backward's plan
// walks one by one. Past this many (thousands of key groups, for thousands of
// threads, by thousands of query tiles) it takes bounds instead, so that
// validation sizes any call at once: a band as wide as without a causal cut,
// and the staircase's largest operand wherever a causal cut may take it.
constexpr int64_t kPairsWalked = int64_t(1) << 16;

// A key band's scores and its staircase operand, for the band of queries
// [i0, i0 + bq) against keys [start, end) (KeyBand::reset).
template <class S>
void plan_band(const AttentionForward<S>& p, const Head<S>& hd, int64_t i0, int64_t bq, int64_t start, int64_t end,
               int64_t& scores, int64_t& transposed) {
  const int64_t width = KeyBand<S>::width_of(hd, p.causal, i0, bq, start, end);
  scores = std::max(scores, bq * width);
  transposed = std::max(transposed, staircase_operand<S>(KeyBand<S>::cut_of(p.causal, bq, width, hd.d), hd.d, width));
}

template <class S>
bool splits(const AttentionForward<S>& p) {
  if constexpr (std::is_same_v<S, bfloat16>)
    return splits_stored_bf16(p.pos.scheme, p);
  else
    return false;
}

template <class S>
ForwardPlan forward_plan(const AttentionForward<S>& p, const tiles::ForwardTiles& f, const Terms& t,
                         const HeadPlan& head) {
  const Head<S> hd = head_geometry(p, 0, 0);
  ForwardPlan w;
  w.head = head;
  for (int64_t i0 = 0; i0 < hd.lq; i0 += f.rows) {  // as forward_tile sizes them
    const int64_t bq = std::min(f.rows, hd.lq - i0), keys = visited_keys(p, hd, i0, bq);
    const int64_t block = std::min(tiles::forward_key_block(f, bq), keys);
    w.S = std::max(w.S, bq * block);
    w.transposed = std::max(w.transposed, staircase_of_tiles(p, hd, i0, bq, 0, keys, block, hd.d));  // q k^T
    if (t.band && keys) plan_band(p, hd, i0, bq, 0, keys, w.band, w.transposed);
    if (t.c2p || t.p2c)  // add_indexed_picks: two blocks by distance and by query
      w.diagonals = std::max(w.diagonals, diagonal_scratch(bq, std::min(tiles::kDiagonalKeys, block)));
  }
  const int64_t rows = std::min(f.rows, hd.lq);
  w.O = rows * hd.dv, w.softmax_rows = rows;
  w.Rq = t.key_table || t.c2p ? rows * t.nb : t.grid_tables ? rows * t.grid_rows() : 0;
  w.Pb = t.value_table ? rows * t.nb : 0;
  w.split = splits(p) ? 3 * w.S : 0;
  return w;
}

// Whether a term reads the positional query q + v (a key embedding, grid
// tables, query vectors), so that its gradient can be non-zero.
bool reads_positional_queries(const Terms& t) {
  return t.key_table || t.c2p || t.band || t.grid_tables || t.query_bias;
}

// A key group's query-side gradients, whose dqc and dqp start at query row first_row.
template <class S>
QueryGradsPlan query_grads_plan(const AttentionForward<S>& p, const Terms& t, bool bias_grads, int64_t first_row) {
  const int64_t lq = p.q.shape[2], lk = p.k.shape[2], d = p.q.shape[3], distances = lq + lk - 1;
  QueryGradsPlan q;
  q.dqc = (lq - first_row) * d;
  q.dqp = reads_positional_queries(t) ? q.dqc : 0;
  q.dR = t.key_table ? lq * t.nb : t.c2p ? indexed_stride(lq) * t.nb : 0;
  q.Pb = t.value_table ? lq * t.nb : 0;
  q.dRk = t.p2c ? indexed_stride(lk) * t.nb : 0;
  q.dE = t.band ? distances * d : 0;
  q.dbias = t.bias && bias_grads ? distances : 0;
  q.dgrid = t.grid_tables ? lq * t.grid_rows() : t.grid_bias && bias_grads ? t.grid_offsets() : 0;
  return q;
}

template <class S>
BackwardPlan backward_plan(const AttentionForward<S>& p, const Terms& t, const HeadPlan& head, int64_t groups,
                           bool grads, const AttentionBackward<S>* backward) {
  const Head<S> hd = head_geometry(p, 0, 0);
  const int64_t lq = hd.lq, lk = hd.lk, d = hd.d, dv = hd.dv;
  const int64_t rows = std::min(kBackwardRows, lq), keys = std::min(kBackwardKeys, lk);
  const int64_t query_tiles = (lq + kBackwardRows - 1) / kBackwardRows;
  BackwardPlan w;
  w.head = head;
  w.dout = std::is_same_v<S, compute_t<S>> && backward && dense_rows(backward->dout) ? 0 : lq * dv;  // load_dout
  w.out_row = dv, w.D = lq;
  w.positional_queries = reads_positional_queries(t);
  w.keys_in_place = backward && key_grads_in_place<compute_t<S>>(*backward);
  w.P = w.dP = kBackwardRows * kBackwardKeys;
  if (p.dropout.active()) w.Z = w.Pz = kBackwardRows * kBackwardKeys;
  w.Rq = t.key_table || t.c2p ? rows * t.nb : t.grid_tables ? rows * t.grid_rows() : 0;
  w.G = t.value_table ? rows * t.nb : 0;
  // A tile's indexed picks, forward and backward: two blocks by distance and by query (indexed_rows.hpp).
  w.diagonals = t.c2p || t.p2c ? diagonal_scratch(rows, std::min(tiles::kDiagonalKeys, keys)) : 0;
  const bool walked = groups * query_tiles <= kPairsWalked;
  int64_t group_keys_most = 0;
  for (int64_t group = 0; group < groups; ++group) {
    const auto [begin, end] = group_keys(lk, group, groups);
    group_keys_most = std::max(group_keys_most, end - begin);
    for (int64_t i0 = 0; walked && i0 < lq; i0 += kBackwardRows) {
      const int64_t bq = std::min(kBackwardRows, lq - i0), seen = std::min(end, visited_keys(p, hd, i0, bq));
      if (seen <= begin) continue;  // as backward_key_group visits its tiles
      if (t.band) plan_band(p, hd, i0, bq, begin, seen, w.band, w.transposed);
      w.transposed = std::max(  // q k^T and dout v^T
          w.transposed, staircase_of_tiles(p, hd, i0, bq, begin, seen, kBackwardKeys, std::max(d, dv)));
    }
  }
  if (!walked) {
    w.band = t.band ? rows * (group_keys_most + rows - 1) : 0;
    w.transposed = staircase_operand<S>(TileCut{.causal = p.causal, .staircase = p.causal}, std::max(d, dv),
                                        simd::kStaircaseMaxSize);
  }
  const bool table = t.key_table || t.value_table || t.c2p || t.p2c;
  w.dtable = table && grads             ? t.nb * (t.value_table ? std::max(d, dv) : d)
             : t.grid_tables && grads ? t.grid_rows() * d
                                      : 0;
  if (groups == 1) {
    w.query = query_grads_plan(p, t, grads, 0);
    if (!w.keys_in_place) w.dk = lk * d, w.dv = lk * dv;
  }
  if (splits(p)) {
    w.split.tile = 3 * rows * keys;
    w.split.qT3 = 3 * rows * d, w.split.doutT3 = 3 * rows * dv, w.split.k3 = 3 * group_keys_most * d;
    w.split.dkT = d * group_keys_most, w.split.dvT = dv * group_keys_most;
  }
  return w;
}

}  // namespace

template <class S>
FusedPlan plan(const AttentionForward<S>& p, const PositionGrads<S>* dpos, const AttentionBackward<S>* backward) {
  using C = compute_t<S>;
  const Terms t = terms_of(p);
  const int64_t lq = p.q.shape[2], lk = p.k.shape[2], d = p.q.shape[3], distances = lq + lk - 1;
  const int64_t heads = p.q.shape[0] * p.q.shape[1], grads = gradient_elements(p, dpos);
  FusedPlan f;
  f.compute_bytes = sizeof(C);
  f.heads = heads;
  const HeadPlan head = head_plan(p, t);
  f.tiles = tiles::forward(d, p.v.shape[3], t.p2c);
  f.forward_threads = thread_count(p.num_threads, heads * ((lq + f.tiles.rows - 1) / f.tiles.rows));
  f.forward = forward_plan(p, f.tiles, t, head);
  f.groups = backward_key_groups(p);
  f.backward_threads = thread_count(p.num_threads, heads * f.groups);
  f.finishing_threads = f.groups == 1 ? f.backward_threads : thread_count(p.num_threads, heads);
  f.backward = backward_plan(p, t, head, f.groups, grads > 0, backward);
  if (f.groups > 1) {  // group 0 holds every query row; a later one those from the first that sees its keys
    const Head<S> hd = head_geometry(p, 0, 0);
    for (int64_t group = 0; group < f.groups; ++group) {
      const int64_t first_row = group == 0 ? 0 : first_row_visiting(p, hd, group_keys(lk, group, f.groups).first);
      f.group_elements += query_grads_plan(p, t, grads > 0, first_row).elements();
    }
    if (!f.backward.keys_in_place) f.key_grads = lk * (d + p.v.shape[3]);
  }
  if (t.band)  // BandRowSum: under a causal mask the rows of distances <= 0
    f.band_row_sums = (p.causal ? std::clamp<int64_t>(1 - head_geometry(p, 0, 0).rmin, 0, distances) : distances) * d;
  f.partials = grads;
  // CallEmbeddings: a key band's rows per head and the embedding's own
  // (Transformer-XL's sinusoids, per_distance each); an indexed table's
  // RowRuns, an int32 row and run end per distance.
  const EmbeddingSizes e = embedding_sizes(p);
  if (t.band) f.call_bytes += (p.q.shape[1] * d + e.per_distance) * distances * int64_t(sizeof(C));
  f.call_bytes += (int64_t(t.c2p) + int64_t(t.p2c)) * distances * int64_t(2 * sizeof(int32_t));
  if (t.grid_bias || t.grid_tables) f.call_bytes += GridAxes::bytes(t.grid);  // CallEmbeddings' grid term
  if constexpr (is_half_v<S>) {  // half_storage.cpp's WideParams and WideGrads
    f.wide_params_bytes = parameter_elements(p) * int64_t(sizeof(float));
    f.wide_grads_bytes = grads * int64_t(sizeof(float));
  }
  return f;
}

double FusedPlan::forward_bytes() const {
  const double worker = double(forward.elements() * compute_bytes + forward.head.scheme_bytes) +
                       double(forward.split * int64_t(sizeof(bfloat16)));
  return double(call_bytes + wide_params_bytes) + forward_threads * worker;
}

double FusedPlan::backward_bytes() const {
  const double worker =
      double(backward.elements() * compute_bytes + backward.head.scheme_bytes) + double(backward.split.bytes());
  // Several key groups: each group's query-side gradients, each head's dk and dv.
  const double grouped =
      double(heads) * double(groups > 1 ? group_elements + key_grads : 0);
  return double(call_bytes + wide_params_bytes + wide_grads_bytes) + backward_threads * worker +
         (grouped + double(finishing_threads) * double(band_row_sums + partials)) * double(compute_bytes);
}

template FusedPlan plan<float>(const AttentionForward<float>&, const PositionGrads<float>*,
                               const AttentionBackward<float>*);
template FusedPlan plan<double>(const AttentionForward<double>&, const PositionGrads<double>*,
                                const AttentionBackward<double>*);
template FusedPlan plan<bfloat16>(const AttentionForward<bfloat16>&, const PositionGrads<bfloat16>*,
                                  const AttentionBackward<bfloat16>*);
template FusedPlan plan<float16>(const AttentionForward<float16>&, const PositionGrads<float16>*,
                                 const AttentionBackward<float16>*);

}  // namespace relpos::fused
