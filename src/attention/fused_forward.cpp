// The fused kernel's forward: per query tile of a head, its key tiles with
// an online softmax (online_softmax.hpp); the output and each row's
// logsumexp, which the backward recomputes P from (fused_tile.hpp).
#include <algorithm>
#include <vector>

#include "dropout_rows.hpp"
#include "fused.hpp"
#include "fused_tile.hpp"
#include "online_softmax.hpp"

namespace relpos::fused {
namespace {

using tiles::forward_key_block;

template <class T>
struct ForwardScratch {
  HeadContext<T> head;
  Scratch<T> S, O, Rq, Pb, transposed, diagonals;
  OnlineSoftmax<T> softmax;
  KeyBand<T> band;
  SplitTile split;  // P, where split_row splits it

  void allocate(const ForwardPlan& plan, const AttentionForward<T>& p) {
    head.allocate(plan.head, p);
    for (auto [buffer, size] : {std::pair{&S, plan.S}, {&O, plan.O}, {&Rq, plan.Rq}, {&Pb, plan.Pb},
                                {&transposed, plan.transposed}, {&diagonals, plan.diagonals}})
      buffer->reserve(size);
    softmax.reserve(plan.softmax_rows);
    band.reserve(plan.band);
    split.reserve(plan.split);
  }
};

// One query tile of one head: all key tiles, online softmax, out and lse.
template <class F, class T, class Stored>
void forward_tile(const AttentionForward<T>& p, const AttentionForward<Stored>& data, const CallEmbeddings<T>& e,
                  const tiles::ForwardTiles& f, int64_t b, int64_t h, int64_t i0, ForwardScratch<T>& w) {
  HeadContext<T>& c = w.head;
  prepare(p, data, e, b, h, c);
  const Head<T>& hd = c.x.hd;
  const int64_t dv = hd.dv, bq = std::min(f.rows, hd.lq - i0);
  const T scale = T(effective_scale(p));
  w.O.assign(bq * dv, T(0));
  w.softmax.reset(bq);
  if constexpr (F::key_table || F::c2p || F::grid_tables) query_tile_scores<F>(c, i0, bq, w.Rq);
  if constexpr (F::value_table) w.Pb.assign(bq * c.nb, T(0));
  const int64_t keys = visited_keys(p, hd, i0, bq), block = std::min(forward_key_block(f, bq), keys);
  w.S.resize(bq * block);
  const DropoutRows<T> dropout(p, b, h);
  if (F::band && keys) w.band.reset(hd, c.E, F::causal, i0, bq, 0, keys, w.transposed);
  for (int64_t j0 = 0; j0 < keys; j0 += block) {
    const Tile t{i0, bq, j0, std::min(block, keys - j0)};
    T* S = w.S.data();
    const TileCut cut = cut_of(p, hd, t);
    tile_logits<F>(p, c, scale, t, cut, w.Rq.data(), w.band, S, w.transposed, w.diagonals);
    if (c.stored.split) w.split.reshape(bq, t.bk, SplitTile::Layout::stacked);
    for (int64_t ii = 0; ii < bq; ++ii) {  // S becomes P; O and Pb rescaled where the row's maximum rose
      T* row = S + ii * t.bk;
      const int64_t computed = cut.computed(ii);
      std::fill(row + computed, row + t.bk, T(0));
      const BucketedRow<T> buckets = bucketed_row<F>(c, hd.r(i0 + ii, j0), computed, w.Rq.data(), ii, scale);
      const auto step = w.softmax.step(ii, buckets, row);
      if (step.rescale != T(1)) {
        rows::scale(&w.O[ii * dv], step.rescale, dv);
        if constexpr (F::value_table) rows::scale(&w.Pb[ii * c.nb], step.rescale, c.nb);
      }
      const bool dropped = dropout.active() && step.visible;  // P z from here on; the sums above are P's
      if (dropped) dropout.apply(i0 + ii, j0, computed, row, row, nullptr);
      if (F::value_table && step.visible)
        buckets.add_bucket_sums(&w.Pb[ii * c.nb], c.k, c.clip, row, dropped ? buckets.sums_of(row) : step.sums);
      if (c.stored.split) split_row(w.split, ii, row);
    }
    times_values(c.stored, w.split, cut, S, bq, t.bk, j0, dv, c.x.vp + j0 * c.x.ldv, c.x.ldv, w.O.data());
  }
  if constexpr (F::value_table)
    weights_times<T>(Trans::no, bq, dv, c.nb, T(1), w.Pb.data(), c.nb, c.wv.data(), dv, T(1), w.O.data(), dv);
  for (int64_t ii = 0; ii < bq; ++ii) {
    rows::scale(&w.O[ii * dv], w.softmax.normaliser(ii), dv);
    write_row(data.out, b, h, i0 + ii, &w.O[ii * dv]);
    data.lse(b, h, i0 + ii) = w.softmax.logsumexp(ii);
  }
}

template <class T, class Stored>
void run_forward(const AttentionForward<T>& p, const AttentionForward<Stored>& data) {
  const FusedPlan plan = fused::plan(data);  // its tiles and threads, and every worker's buffers
  const CallEmbeddings<T> e(p);
  const tiles::ForwardTiles& f = plan.tiles;
  const int64_t heads = p.q.shape[1], query_tiles = (p.q.shape[2] + f.rows - 1) / f.rows;
  const int64_t items = p.q.shape[0] * heads * query_tiles;
  const int threads = plan.forward_threads;
  std::vector<ForwardScratch<T>> scratch(threads);
  with_tile_features(p, e, [&](auto features) {
    parallel_for(
        items, threads, [&](int t) { scratch[t].allocate(plan.forward, p); },
        [&](int t, int64_t item) {
          const int64_t bh = item / query_tiles;
          forward_tile<decltype(features)>(p, data, e, f, bh / heads, bh % heads,
                                           head_tail(item % query_tiles, query_tiles) * f.rows, scratch[t]);
        });
  });
}

}  // namespace

template <class T>
void forward(const AttentionForward<T>& p) {
  run_forward(p, p);
}
template <class S>
void forward_stored(const AttentionForward<compute_t<S>>& twin, const AttentionForward<S>& data) {
  run_forward(twin, data);
}

template void forward<float>(const AttentionForward<float>&);
template void forward<double>(const AttentionForward<double>&);
template void forward_stored<bfloat16>(const AttentionForward<float>&, const AttentionForward<bfloat16>&);
template void forward_stored<float16>(const AttentionForward<float>&, const AttentionForward<float16>&);

}  // namespace relpos::fused
