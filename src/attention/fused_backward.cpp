// The fused kernel's backward: P recomputed from the saved logsumexp, query
// tiles outer and key tiles inner, a head's key tiles in groups where there
// are fewer heads than threads; positional gradients summed in a fixed
// order (fused_tile.hpp).
#include <algorithm>
#include <memory>
#include <utility>
#include <vector>

#include "dropout_rows.hpp"
#include "fused.hpp"
#include "fused_tile.hpp"
#include "grad_partials.hpp"

namespace relpos::fused {

// Key-tile groups per head in the backward. Fewer heads than threads would
// leave threads idle (B = 1, H = 1 ran on one thread), so each head's key
// tiles are split into contiguous groups that run as separate work items,
// each with its own query-side gradients (dq and the positional sums), added
// in group order. Two items per thread let the head-tail order balance a
// causal mask. Without one (and without padding or segments, which can leave
// a group of keys with little to do), every key costs its head the same, so where
// the heads divide the threads one item per thread is balanced already, and each
// group fewer is a query-length gradient fewer to hold and add (one head at
// L = 16384, d = 64: 4 MB). Groups cost copies and sums (one head at L = 8192
// on one thread in 8 groups: 8-20% slower), so one thread, or at least two
// heads per thread, keeps one group per head. The grouping depends on the
// thread count, so dq's rounding does too; the same thread count gives the
// same bits.

template <class T>
int64_t backward_key_groups(const AttentionForward<T>& p) {
  const int64_t heads = p.q.shape[0] * p.q.shape[1], tiles = (p.k.shape[2] + kBackwardKeys - 1) / kBackwardKeys;
  const int64_t threads = thread_count(p.num_threads, heads * tiles);
  if (threads == 1) return 1;
  const bool even_keys = !p.causal && p.key_padding.empty() && p.k_segments.empty();
  const int64_t items_per_thread = even_keys && threads % heads == 0 ? 1 : 2;
  return std::clamp<int64_t>((items_per_thread * threads + heads - 1) / heads, 1, std::max<int64_t>(tiles, 1));
}

namespace {

// The gradients of one head that sum over its key tiles, for one group of them.
// dqc and dqp hold the query rows from first_row on: under a causal mask the
// earlier rows see none of a later group's keys (first_row_visiting), so the
// groups' buffers add up to about half of a whole one per group. dqp only
// where a term reads the positional query qp (a key embedding, grid tables,
// query biases): plain attention and biases leave it empty.
template <class T>
struct QueryGrads {
  Scratch<T> dqc, dqp;  // dL/d(q + u) and dL/d(q + v), (lq - first_row, d)
  int64_t first_row = 0;
  Scratch<T> dR, Pb;    // clipped tables: key-score gradients and value bucket sums of P, (lq, 2k+1);
                        // an indexed table read by the query: its scores' gradients, (nb, lq)
  Scratch<T> dE;        // a key band: gradients of its rows, (distances, d)
  Scratch<T> dRk;       // an indexed table read by the key: gradients of the keys' scores, (nb, lk)
  Scratch<T> dbias;     // a bias per distance with learnable parameters: its gradient per distance
  Scratch<T> dgrid;     // grid tables: the queries' score gradients, (lq, rows_y + rows_x); a grid bias with
                        // learnable values: their gradient by offsets (rows_y rows_x)

  void reserve(const QueryGradsPlan& plan) {
    for (auto [buffer, size] : {std::pair{&dqc, plan.dqc}, {&dqp, plan.dqp}, {&dR, plan.dR}, {&Pb, plan.Pb},
                                {&dE, plan.dE}, {&dRk, plan.dRk}, {&dbias, plan.dbias}, {&dgrid, plan.dgrid}})
      buffer->reserve(size);
  }
  void reset(const HeadContext<T>& c, bool bias_grads, bool positional_queries, int64_t first) {
    const Head<T>& hd = c.x.hd;
    first_row = first;
    dqc.assign((hd.lq - first) * hd.d, T(0)), dqp.assign(positional_queries ? (hd.lq - first) * hd.d : 0, T(0));
    dR.assign(c.key_table() ? hd.lq * c.nb : !c.c2p.empty() ? c.nb * c.by_query_ld : 0, T(0));
    Pb.assign(c.value_table() ? hd.lq * c.nb : 0, T(0));
    dRk.assign(c.p2c.empty() ? 0 : c.nb * c.by_key_ld, T(0));
    dE.assign(c.band() ? hd.distances() * hd.d : 0, T(0));
    dbias.assign(c.x.bias.empty() || !bias_grads ? 0 : hd.distances(), T(0));
    dgrid.assign(grid_grad_size(c, hd, bias_grads), T(0));
  }

  // dgrid's size: every query's score gradients for grid tables (dq needs them), the
  // offsets' gradient for a grid bias whose values learn, else none.
  static int64_t grid_grad_size(const HeadContext<T>& c, const Head<T>& hd, bool bias_grads) {
    if (!c.axes) return 0;
    const GridShape& g = c.axes->shape();
    if (int64_t(c.grid.size()) == g.rows_y() * g.rows_x()) return bias_grads ? g.rows_y() * g.rows_x() : 0;
    return hd.lq * (g.rows_y() + g.rows_x());
  }

  // Rows of dqc and dqp from query row i on.
  T* dqc_from(int64_t i, int64_t d) { return dqc.data() + (i - first_row) * d; }
  T* dqp_from(int64_t i, int64_t d) { return dqp.data() + (i - first_row) * d; }

  // Adds to part `part` of `parts` of this one's elements (each sum's) o's
  // share of them; this one's dqc and dqp start at a row no later than o's.
  // The parts are the same for every o, so threads can add disjoint parts
  // at once, and each element's sum keeps its group order.
  void add_part(const QueryGrads& o, int64_t part, int64_t parts) {
    for (auto [mine, theirs] : {std::pair{&dqc, &o.dqc}, {&dqp, &o.dqp}, {&dR, &o.dR}, {&Pb, &o.Pb}, {&dE, &o.dE},
                                {&dbias, &o.dbias}, {&dRk, &o.dRk}, {&dgrid, &o.dgrid}}) {
      const int64_t size = int64_t(mine->size()), skipped = size - int64_t(theirs->size());  // o's are the last
      for (int64_t n = std::max(size * part / parts, skipped), end = size * (part + 1) / parts; n < end; ++n)
        (*mine)[n] += (*theirs)[n - skipped];
    }
  }
};

template <class T>
struct BackwardScratch {
  HeadContext<T> head;
  Scratch<T> dout, out_row, D, P, dP, Z, Pz, Rq, G, dband, transposed, diagonals;  // Z, Pz: dropout's
  const T* dout_rows = nullptr;  // the head's dout (lq, dv) the loops read: dout, or the caller's (load_dout)
  KeyBand<T> band;
  QueryGrads<T> query;  // one head's, when a head is one group
  Scratch<T> dk, dv;
  Scratch<T> dtable;    // a table's gradient of the head before it is added
  SplitBackward split;  // where splits_backward
  bool positional_queries = false;  // the plan's: key groups keep dL/d(q + v)

  void allocate(const BackwardPlan& plan, const AttentionForward<T>& p) {
    head.allocate(plan.head, p);
    positional_queries = plan.positional_queries;
    for (auto [buffer, size] :
         {std::pair{&dout, plan.dout}, {&out_row, plan.out_row}, {&D, plan.D}, {&P, plan.P}, {&dP, plan.dP},
          {&Z, plan.Z}, {&Pz, plan.Pz},
          {&Rq, plan.Rq}, {&G, plan.G}, {&dband, plan.band}, {&transposed, plan.transposed},
          {&diagonals, plan.diagonals}, {&dk, plan.dk}, {&dv, plan.dv}, {&dtable, plan.dtable}})
      buffer->reserve(size);
    band.reserve(plan.band);
    query.reserve(plan.query);
    split.reserve(plan.split);
  }
};

// The dense dout of the prepared head (the caller's where its rows are
// dense and of the compute type, else a copy) and D_i = dout_i . out_i.
template <class Stored, class T>
void load_dout(const AttentionBackward<Stored>& data, BackwardScratch<T>& w) {
  const Head<T>& hd = w.head.x.hd;
  const int64_t dv = hd.dv;
  w.dout_rows = nullptr;
  if constexpr (std::is_same_v<Stored, T>)
    if (dense_rows(data.dout)) w.dout.clear(), w.dout_rows = &data.dout(hd.b, hd.h, 0, 0);
  if (!w.dout_rows) {
    w.dout.resize(hd.lq * dv);
    for (int64_t i = 0; i < hd.lq; ++i) read_row(data.dout, hd.b, hd.h, i, &w.dout[i * dv]);
    w.dout_rows = w.dout.data();
  }
  w.out_row.resize(dv), w.D.resize(hd.lq);
  for (int64_t i = 0; i < hd.lq; ++i) {
    read_row(View4<const Stored>(data.out), hd.b, hd.h, i, w.out_row.data());
    T D = 0;
    for (int64_t x = 0; x < dv; ++x) D += w.dout_rows[i * dv + x] * w.out_row[x];
    w.D[i] = D;
  }
  if constexpr (std::is_same_v<Stored, bfloat16>)
    if (w.head.stored && data.dout.stride[3] == 1 && data.dout.stride[2] >= dv) {
      w.head.stored.dout = &data.dout(hd.b, hd.h, 0, 0);
      w.head.stored.lddout = data.dout.stride[2];
    }
}

// Where a head's dk (lk, d) and dv (lk, dv) are summed, in dense rows: the
// caller's tensors themselves where key_grads_in_place allows, else the
// scratch given, cleared, which write_input_grads then adds.
template <class T>
struct KeyGradRows {
  T* dk = nullptr;
  T* dv = nullptr;
  bool in_place = false;
};

template <class T, class Stored>
KeyGradRows<T> key_grad_rows(const AttentionBackward<Stored>& data, bool in_place, int64_t b, int64_t h,
                             Scratch<T>& dk, Scratch<T>& dv) {
  if constexpr (std::is_same_v<T, Stored>)
    if (in_place) return {&data.dk(b, h, 0, 0), &data.dv(b, h, 0, 0), true};
  const int64_t lk = data.k.shape[2];
  dk.assign(lk * data.k.shape[3], T(0)), dv.assign(lk * data.v.shape[3], T(0));
  return {dk.data(), dv.data(), false};
}

// Key tiles [group n / groups, (group + 1) n / groups) of the n of head
// (b, h) against every query tile that sees them: dk and dv of those keys
// (rows no other group writes) and the group's query-side sums in q.
template <class F, class T, class Stored>
void backward_key_group(const AttentionBackward<T>& p, const AttentionBackward<Stored>& data,
                        const CallEmbeddings<T>& e, int64_t b, int64_t h, int64_t group, int64_t groups,
                        QueryGrads<T>& q, const KeyGradRows<T>& key_grads, BackwardScratch<T>& w) {
  HeadContext<T>& c = w.head;
  prepare(p, data, e, b, h, c);
  load_dout(data, w);
  const Head<T>& hd = c.x.hd;
  const int64_t lq = hd.lq, d = hd.d, dvd = hd.dv, nb = c.nb;
  const T scale = T(effective_scale(p));
  const auto [begin, end] = group_keys(hd.lk, group, groups);
  // Group 0 holds every row: the others are added into it.
  q.reset(c, wants_scheme_grads(p), w.positional_queries, group == 0 ? 0 : first_row_visiting(p, hd, begin));
  w.P.resize(kBackwardRows * kBackwardKeys), w.dP.resize(kBackwardRows * kBackwardKeys);
  // With dropout the values' products take P z, the softmax's gradient P and z dP (z = 1 without).
  const DropoutRows<T> dropout(p, b, h);
  if (dropout.active()) w.Z.resize(kBackwardRows * kBackwardKeys), w.Pz.resize(kBackwardRows * kBackwardKeys);
  const bool split = std::is_same_v<T, float> && c.stored.splits_backward();
  if (split) w.split.start_group(end - begin, kBackwardKeys, c.stored.k + begin * c.stored.ldk, c.stored.ldk, d, dvd);
  const bool bias_grad = F::bias && !q.dbias.empty();  // a bias per distance whose gradient is asked for

  for (int64_t i0 = 0; i0 < lq; i0 += kBackwardRows) {
    const int64_t bq = std::min(kBackwardRows, lq - i0), keys = std::min(end, visited_keys(p, hd, i0, bq));
    if (keys <= begin) continue;
    if (split)
      w.split.start_query_tile(c.stored.q + i0 * c.stored.ldq, c.stored.ldq, c.stored.dout + i0 * c.stored.lddout,
                               c.stored.lddout, bq);
    if constexpr (F::key_table || F::c2p || F::grid_tables) query_tile_scores<F>(c, i0, bq, w.Rq);
    if constexpr (F::value_table) {  // dout wv^T of the query tile, (bq, nb)
      w.G.resize(bq * nb);
      gemm<T>(Trans::no, Trans::yes, bq, nb, dvd, T(1), w.dout_rows + i0 * dvd, dvd, c.wv.data(), dvd, T(0),
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
      T* kept = dropout.active() ? w.Pz.data() : P;  // P z
      const TileCut cut = cut_of(p, hd, t);
      // Keys before p.key_grads_from get no gradient: dv and dk of the tile's later keys only.
      const int64_t skip = std::clamp<int64_t>(p.key_grads_from - j0, 0, bk), graded = bk - skip;
      // Split products serve whole tiles; a tile the mask cuts small enough
      // for the staircase kernel keeps float32, which skips the hidden half
      // where the split would multiply three whole parts.
      // Nor a tile whose hidden part holds a non-finite row (tile_products.hpp).
      const bool split_tile = split && !cut.staircase && skip == 0 &&
                              !hides_nonfinite(cut, bq, c.x.kp + j0 * c.x.ldk, c.x.ldk, d, c.x.qrows + i0 * d,
                                               w.dout_rows + i0 * dvd, dvd);
      if (split_tile)
        for (SplitTile* tile : {&w.split.P, &w.split.dS}) tile->reshape(bq, bk, SplitTile::Layout::interleaved);
      tile_logits<F>(p, c, scale, t, cut, w.Rq.data(), w.band, P, w.transposed, w.diagonals);
      const int64_t m0 = hd.diagonal(i0 + bq - 1, j0);
      for (int64_t ii = 0; ii < bq; ++ii) {
        const T lse = data.lse(b, h, i0 + ii);
        T* row = P + ii * bk;
        const int64_t computed = lse == kNegInf<T> ? 0 : cut.computed(ii);
        const BucketedRow<T> buckets = bucketed_row<F>(c, hd.r(i0 + ii, j0), computed, w.Rq.data(), ii, scale);
        const auto sums = buckets.exp_shifted(row, lse);
        std::fill(row + computed, row + bk, T(0));
        if (std::isnan(lse)) zero_masked<F>(p, hd, i0 + ii, j0, cut.shown(ii), row, computed);
        T* kept_row = kept + ii * bk;
        if (dropout.active()) {
          T* z = w.Z.data() + ii * bk;
          dropout.apply(i0 + ii, j0, computed, row, kept_row, z);
          std::fill(z + computed, z + bk, T(0));  // a fully masked row's too: dS reads them below
          std::fill(kept_row + computed, kept_row + bk, T(0));
        }
        if constexpr (F::value_table)
          buckets.add_bucket_sums(&q.Pb[(i0 + ii) * nb], c.k, c.clip, kept_row,
                                  dropout.active() ? buckets.sums_of(kept_row) : sums);
        if (split_tile) split_row(w.split.P, ii, kept_row);
      }
      const TileCut graded_cut = cut_of(p, hd, Tile{i0, bq, j0 + skip, graded});
      if (graded > 0 && !split_tile)
        tile_transposed_times(graded_cut, bq, dvd, graded, T(1), kept + skip, bk, w.dout_rows + i0 * dvd, dvd, T(1),
                              key_grads.dv + (j0 + skip) * dvd, dvd);
      product_of_rows(c.stored.dout, c.stored.lddout, c.stored.v, c.stored.ldv, w.dout_rows, dvd, c.x.vp, c.x.ldv,
                      i0, j0, bq, bk, dvd, T(1), dS, cut, w.transposed);
      for (int64_t ii = 0; ii < bq; ++ii) {
        const int64_t i = i0 + ii, mrow = m0 + (bq - 1 - ii);
        T* prow = P + ii * bk;
        T* srow = dS + ii * bk;
        const int64_t r0 = hd.rmin + mrow, k = c.k;
        if constexpr (F::value_table)
          add_by_row(srow, bk, r0, k, c.clip, &w.G[ii * nb], T(1));
        const int64_t computed = cut.computed(ii);
        if (dropout.active()) rows::multiply(srow, w.Z.data() + ii * bk, srow, computed);
        rows::softmax_grad(prow, srow, w.D[i], computed);
        std::fill(srow + computed, srow + bk, T(0));
        if (split_tile) split_row(w.split.dS, ii, srow);
        if (bias_grad) rows::add_scaled(&q.dbias[mrow], srow, T(1), bk);
        if constexpr (F::grid_bias)
          if (!q.dgrid.empty())
            sum_grid_row<T>(*c.axes, i, j0, bk, srow, nullptr, q.dgrid.data(), c.axes->shape().rows_x());
        if constexpr (F::grid_tables) {  // unscaled, as the term is
          T* dscores = &q.dgrid[i * (c.axes->shape().rows_y() + c.axes->shape().rows_x())];
          sum_grid_row(*c.axes, i, j0, bk, srow, dscores, dscores + c.axes->shape().rows_y(), 0);
        }
        if constexpr (F::key_table) sum_by_row(&q.dR[i * nb], bk, r0, k, c.clip, srow, scale);
        if constexpr (F::band) {  // un-skew scale * dS onto the band: each shown (ii, j) owns one column of row ii
          const int64_t shown = cut.shown(ii);
          rows::add_scaled_reversed(w.dband.data() + w.band.at(ii, j0, shown), srow, scale, shown);
        }
      }
      if constexpr (F::indexed) add_indexed_grads<F>(c, t, m0, dS, scale, q, w.diagonals);
      if (split_tile) {
        split_products(w.split, j0 - begin, bk, scale, q.dqc_from(i0, d));
        continue;
      }
      tile_times(cut, bq, d, bk, scale, dS, c.x.kp + j0 * c.x.ldk, c.x.ldk, T(1), q.dqc_from(i0, d), d);
      if (graded > 0)
        tile_transposed_times(graded_cut, bq, d, graded, scale, dS + skip, bk, c.x.qrows + i0 * d, d, T(1),
                              key_grads.dk + (j0 + skip) * d, d);
    }
    if constexpr (F::band) {  // the band's products backwards, once per query tile
      const KeyBand<T>& band = w.band;
      const int64_t rows = band.row_offset(hd);
      tile_times(band.cut(), bq, d, band.width(), T(1), w.dband.data(), c.E + rows, d, T(1), q.dqp_from(i0, d), d);
      tile_transposed_times(band.cut(), bq, d, band.width(), T(1), w.dband.data(), band.width(), hd.qp + i0 * d, d,
                            T(1), q.dE.data() + rows, d);
    }
  }
  if (split) finish_split(w.split, key_grads.dk, key_grads.dv, begin, d, dvd);
}

// The indexed tables' share of a tile's scale * dS (bq, bk), add_indexed_scores
// backwards: into each query's c2p score gradients dR and each key's p2c
// score gradients dRk by each pair's row. diagonals: scratch.
template <class F, class T>
void add_indexed_grads(const HeadContext<T>& c, const Tile& t, int64_t m0, const T* dS, T scale, QueryGrads<T>& q,
                       Scratch<T>& diagonals) {
  IndexedScores<T> c2p, p2c;
  if constexpr (F::c2p) c2p = {c.c2p_rows, q.dR.data() + t.i0, c.by_query_ld};
  if constexpr (F::p2c) p2c = {c.p2c_rows, q.dRk.data() + t.j0, c.by_key_ld};
  sum_indexed_picks(c2p, p2c, m0, t.bq, t.bk, scale, dS, t.bk, diagonals);
}

// An indexed table's share of a head's gradients from its scores' gradients
// dS (nb rows by query, c2p's dR, or by key, p2c's dRk), tile by tile of
// columns over the rows each reaches (reached_rows; dS is 0 elsewhere): dx
// (columns, d) += dS^T table, and, where dtable, dtable (nb, d) = dS x (x:
// the queries qp or the keys k), its tiles added in column order.
template <class T>
void indexed_table_grads(const HeadContext<T>& c, bool by_query, const T* dS, T* dx, T* dtable) {
  const Head<T>& hd = c.x.hd;
  const int64_t columns = by_query ? hd.lq : hd.lk, ld = by_query ? c.by_query_ld : c.by_key_ld, d = hd.d;
  const T *table = by_query ? c.c2p.data() : c.p2c.data(), *x = by_query ? hd.qp : c.x.kp;
  const int64_t ldx = by_query ? d : c.x.ldk;
  if (dtable) std::fill(dtable, dtable + c.nb * d, T(0));
  const RowRuns& runs = by_query ? *c.c2p_rows : *c.p2c_rows;
  for_each_reached_tile(runs, by_query, hd.lq, hd.lk, 0, columns, [&](int64_t c0, int64_t n, RowSpan rows) {
    const T* tile = dS + rows.first * ld + c0;
    weights_times<T>(Trans::yes, n, d, rows.count(), T(1), tile, ld, table + rows.first * d, d, T(1), dx + c0 * d, d);
    if (dtable)
      weights_times<T>(Trans::no, rows.count(), d, n, T(1), tile, ld, x + c0 * ldx, ldx, T(1),
                       dtable + rows.first * d, d);
  });
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
                 QueryGrads<T>& q, const KeyGradRows<T>& keys, BandRowSum<T>& band_rows, BackwardScratch<T>& w) {
  const HeadContext<T>& c = w.head;
  const Head<T>& hd = c.x.hd;
  const int64_t lq = hd.lq, d = hd.d, dvd = hd.dv, nb = c.nb;
  if (c.key_table()) {  // dqp += dR wk; dwk += dR^T qp
    weights_times<T>(Trans::no, lq, d, nb, T(1), q.dR.data(), nb, c.wk.data(), d, T(1), q.dqp.data(), d);
    if (e.key_table()->wants_grad(g)) {
      w.dtable.resize(nb * d);
      weights_times<T>(Trans::yes, nb, d, lq, T(1), q.dR.data(), nb, hd.qp, d, T(0), w.dtable.data(), d);
      e.key_table()->add_slice_grad(g, hd.h, w.dtable.data());
    }
  }
  if (!c.c2p.empty()) {  // dR (nb, lq) by distance: dqp += dR^T c2p; dc2p = dR qp
    const bool table_grad = e.indexed_keys()->wants_grad(g);
    if (table_grad) w.dtable.resize(nb * d);
    indexed_table_grads(c, /*by_query=*/true, q.dR.data(), q.dqp.data(), table_grad ? w.dtable.data() : nullptr);
    if (table_grad) e.indexed_keys()->add_slice_grad(g, hd.h, w.dtable.data());
  }
  // dRk (nb, lk): dk += dRk^T p2c; dp2c = dRk k (a padded key's row of k is zero or finite: load_head)
  if (!c.p2c.empty()) {
    const bool table_grad = e.indexed_queries()->wants_grad(g);
    if (table_grad) w.dtable.resize(nb * d);
    indexed_table_grads(c, /*by_query=*/false, q.dRk.data(), keys.dk, table_grad ? w.dtable.data() : nullptr);
    if (table_grad) e.indexed_queries()->add_slice_grad(g, hd.h, w.dtable.data());
  }
  if (c.value_table() && e.value_table()->wants_grad(g)) {  // dwv += Pb^T dout
    w.dtable.resize(nb * dvd);
    weights_times<T>(Trans::yes, nb, dvd, lq, T(1), q.Pb.data(), nb, w.dout_rows, dvd, T(0), w.dtable.data(),
                     dvd);
    e.value_table()->add_slice_grad(g, hd.h, w.dtable.data());
  }
  if constexpr (F::band) band_rows.add(F{}, e, g, hd, q.dE);
  if (!q.dbias.empty()) add_bias_grad(g, c.x, q.dbias);
  if (e.grid_bias && !q.dgrid.empty()) e.grid_bias->add_grad(g, hd.h, q.dgrid.data());
  if (e.grid_embedding) {  // dgrid (lq, rows) of the scores qp ryx^T: dqp += dgrid ryx; dryx = dgrid^T qp
    const int64_t rows = c.axes->shape().rows_y() + c.axes->shape().rows_x();
    weights_times<T>(Trans::no, lq, d, rows, T(1), q.dgrid.data(), rows, c.grid.data(), d, T(1), q.dqp.data(), d);
    if (e.grid_embedding->wants_grad(g)) {
      w.dtable.resize(rows * d);
      weights_times<T>(Trans::yes, rows, d, lq, T(1), q.dgrid.data(), rows, hd.qp, d, T(0), w.dtable.data(), d);
      e.grid_embedding->add_grad(g, w.dtable.data());
    }
  }
  write_input_grads(data, c.x, g, q.dqc, q.dqp, keys.in_place ? nullptr : keys.dk, keys.dv);
}

// Heads that are one group each run whole on one thread; otherwise the
// (batch, head, group) items run first, then the groups' sums are added in
// group order (each head's in parts over the threads) and each head finished. Positional-parameter gradients
// go to per-thread partials added in thread order.
template <class F, class T, class Stored>
void backward_with(const AttentionBackward<T>& p, const AttentionBackward<Stored>& data, const CallEmbeddings<T>& e) {
  // Its key groups and threads, and every worker's buffers.
  const FusedPlan plan = fused::plan(data, &data.dpos, &data);
  const int64_t batch = p.q.shape[0], heads = p.q.shape[1], count = batch * heads, groups = plan.groups;
  const int threads = plan.backward_threads;
  const bool keys_in_place = plan.backward.keys_in_place;
  std::vector<BackwardScratch<T>> scratch(threads);
  std::vector<std::unique_ptr<GradPartials<T>>> partials(threads);
  std::vector<BandRowSum<T>> band_rows(threads);
  const auto make_partials = [&](int t) { partials[t] = std::make_unique<GradPartials<T>>(p.dpos); };
  const auto make_scratch = [&](int t) { scratch[t].allocate(plan.backward, p); };
  if (groups == 1) {
    const auto make_both = [&](int t) { make_scratch(t), make_partials(t); };
    parallel_for(count, threads, make_both, [&](int t, int64_t item) {
      const auto [b, h] = head_major(item, batch);
      BackwardScratch<T>& w = scratch[t];
      const KeyGradRows<T> keys = key_grad_rows(data, keys_in_place, b, h, w.dk, w.dv);
      backward_key_group<F>(p, data, e, b, h, 0, 1, w.query, keys, w);
      finish_head(F{}, data, e, partials[t]->grads(), w.query, keys, band_rows[t], w);
    });
  } else {
    std::vector<QueryGrads<T>> query(count * groups);
    std::vector<Scratch<T>> dk(count), dvs(count);  // where keys_in_place, empty
    std::vector<KeyGradRows<T>> keys(count);
    for (int64_t bh = 0; bh < count; ++bh)
      keys[bh] = key_grad_rows(data, keys_in_place, bh / heads, bh % heads, dk[bh], dvs[bh]);
    parallel_for(count * groups, threads, make_scratch, [&](int t, int64_t item) {
      const int64_t bh = item / groups;
      const int64_t group = head_tail(item % groups, groups);  // causal: early key groups cost more
      backward_key_group<F>(p, data, e, bh / heads, bh % heads, group, groups, query[bh * groups + group], keys[bh],
                            scratch[t]);
    });
    // Each head's groups added in group order into its first, in parts over the threads
    // (one head on 16 threads has 32 groups, whose sums one thread took a large part of
    // the backward's time to add).
    const int64_t parts = (threads + count - 1) / count;
    parallel_for(count * parts, threads, [](int) {}, [&](int, int64_t item) {
      const int64_t bh = item / parts;
      for (int64_t g = 1; g < groups; ++g) query[bh * groups].add_part(query[bh * groups + g], item % parts, parts);
    });
    parallel_for(count, plan.finishing_threads, make_partials, [&](int t, int64_t item) {
      const auto [b, h] = head_major(item, batch);
      const int64_t bh = b * heads + h;
      QueryGrads<T>& sum = query[bh * groups];
      BackwardScratch<T>& w = scratch[t];
      prepare(p, data, e, b, h, w.head);
      load_dout(data, w);
      finish_head(F{}, data, e, partials[t]->grads(), sum, keys[bh], band_rows[t], w);
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
void backward(const AttentionBackward<T>& p) {
  run_backward(p, p);
}
template <class S>
void backward_stored(const AttentionBackward<compute_t<S>>& twin, const AttentionBackward<S>& data) {
  run_backward(twin, data);
}

template void backward<float>(const AttentionBackward<float>&);
template void backward<double>(const AttentionBackward<double>&);
template void backward_stored<bfloat16>(const AttentionBackward<float>&, const AttentionBackward<bfloat16>&);
template void backward_stored<float16>(const AttentionBackward<float>&, const AttentionBackward<float16>&);
template int64_t backward_key_groups<float>(const AttentionForward<float>&);
template int64_t backward_key_groups<double>(const AttentionForward<double>&);
template int64_t backward_key_groups<bfloat16>(const AttentionForward<bfloat16>&);
template int64_t backward_key_groups<float16>(const AttentionForward<float16>&);

}  // namespace relpos::fused
