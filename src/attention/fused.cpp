// The fused streaming kernel: flash-style tiles with an online softmax; no
// (L, L) buffer anywhere. Per (batch, head) it keeps O((Lq + Lk) d) prepared
// inputs and, for Shaw, O(Lq (2k+1)) bucket matrices; per tile a (Bq, Bk) block.
//
// Relative terms per tile (docs/design.md section 2):
//   T5, ALiBi   one bias per distance, precomputed per head
//   RoPE        q and k rotated once, before the tiles
//   Shaw key    R = qp wk^T (Bq, 2k+1) per query tile, gathered by c(r)
//   Shaw value  per-row bucket sums of P, rescaled with the running max like
//               the output, then one (Bq, 2k+1) x (2k+1, dv) product
//   XL          (q + v) times the positional keys, once per query tile for
//               the band of distances its key tiles reach (Bq + keys - 1),
//               read skewed by each tile
//
// Backward recomputes P from the saved logsumexp, query tiles outer and key
// tiles inner; positional gradients go to per-thread partials summed in
// thread order, so results do not depend on thread timing.
#include "fused.hpp"

#include <algorithm>
#include <cmath>

#include "relpos/gemm.hpp"
#include "../backend/parallel.hpp"
#include "../backend/vexp.hpp"
#include "distance_table.hpp"
#include "grad_partials.hpp"
#include "head.hpp"

namespace relpos::fused {
namespace {

// Tile sizes from measurements (relpos bench attention, L=4096, d=64 and 128,
// 2 threads, two alternating rounds): 128 x 128 ran plain, T5 and
// Transformer-XL forwards 20-25% faster than 64 x 64 and 8-10% faster than
// 64 x 128; larger tiles amortise the GEMM library's per-call cost.
constexpr int64_t kBlockQ = 128;  // query rows per tile
constexpr int64_t kBlockK = 128;  // keys per tile

// One (batch, head), prepared once and shared by its tiles.
template <class T>
struct HeadContext {
  int64_t b = -1, h = -1;
  HeadData<T> x;
  int64_t nb = 0;           // Shaw table rows 2k+1
  bool clip = true;         // Shaw: distances beyond +-k use the edge rows (else a zero embedding)
  Scratch<T> wk, wv;        // Shaw table slices of this head (nb, d), (nb, dv)
  const T* E = nullptr;     // Transformer-XL W_R R per distance (distances, d), from XLKeys

  bool shaw_k() const { return !wk.empty(); }
  bool shaw_v() const { return !wv.empty(); }
  bool xl() const { return E != nullptr; }
};

// Transformer-XL's positional keys E_h = R W_R[h]^T of every head over the
// call's distances, the sinusoids R computed once: they depend on the head,
// not on the batch row, so all tiles of a call share them. Empty otherwise.
template <class T>
struct XLKeys {
  Scratch<T> R;
  std::vector<Scratch<T>> E;  // per head, (distances, d)

  explicit XLKeys(const AttentionForward<T>& p) {
    if (p.pos.scheme != Scheme::xl) return;
    const Head<T> first = head_geometry(p, 0, 0);
    const int64_t heads = p.q.shape[1];
    R = unfused::DistanceTable<T>::make_sinusoids(p.pos, first.rmin, first.distances(),
                                                  thread_count(p.num_threads, first.distances()));
    const unfused::DistanceTable<T> table(p.pos, nullptr, &R);
    E.resize(heads);
    // In a parallel region like every GEMM of the kernel: one thread per GEMM, not OpenMP's default team.
    parallel_for(
        heads, thread_count(p.num_threads, heads), [](int) {},
        [&](int, int64_t h) { E[h] = table.keys(head_geometry(p, 0, h), first.distances()); });
  }
};

template <class T>
void prepare(const AttentionForward<T>& p, const XLKeys<T>& xl, int64_t b, int64_t h, HeadContext<T>& c) {
  if (c.b == b && c.h == h) return;
  c.b = b, c.h = h;
  load_head(p, b, h, c.x);
  const PositionParams<T>& pos = p.pos;
  c.wk.clear(), c.wv.clear();
  if (pos.scheme == Scheme::shaw) {
    c.nb = 2 * pos.shaw.k + 1;
    c.clip = pos.shaw.beyond == Beyond::clip;
    if (!pos.shaw.wk.empty()) c.wk = unfused::table_slice(pos.shaw.wk, h);
    if (!pos.shaw.wv.empty()) c.wv = unfused::table_slice(pos.shaw.wv, h);
  }
  c.E = xl.E.empty() ? nullptr : xl.E[h].data();
}

// Shaw's table row of the keys of one row of a tile, whose distances are
// r0, r0 + 1, ..., r0 + bk - 1: a prefix below -k (row 0, or none with a zero
// embedding), a window where the row is r + k (consecutive), a suffix above k
// (row 2k, or none). The two loops below walk the three parts so that every
// inner loop is contiguous; tiles wholly beyond +-k reduce to one row sum.
struct ShawRow {
  int64_t lo, hi;  // window: jj in [lo, hi)
  int64_t first;   // table row of jj = lo
};

inline ShawRow shaw_row(int64_t r0, int64_t bk, int64_t k) {
  const int64_t lo = std::clamp<int64_t>(-k - r0, 0, bk), hi = std::clamp<int64_t>(k - r0 + 1, lo, bk);
  return {lo, hi, r0 + lo + k};
}

// row[jj] += alpha * table[c(r0 + jj)] for jj < bk; table holds 2k+1 entries.
template <class T>
void add_by_row(T* row, int64_t bk, int64_t r0, int64_t k, bool clip, const T* table, T alpha) {
  const ShawRow s = shaw_row(r0, bk, k);
  if (clip) {
    const T below = alpha * table[0], above = alpha * table[2 * k];
    for (int64_t jj = 0; jj < s.lo; ++jj) row[jj] += below;
    for (int64_t jj = s.hi; jj < bk; ++jj) row[jj] += above;
  }
  const T* window = table + s.first - s.lo;
  for (int64_t jj = s.lo; jj < s.hi; ++jj) row[jj] += alpha * window[jj];
}

// table[c(r0 + jj)] += alpha * row[jj] for jj < bk: bucket sums.
template <class T>
void sum_by_row(T* table, int64_t bk, int64_t r0, int64_t k, bool clip, const T* row, T alpha) {
  const ShawRow s = shaw_row(r0, bk, k);
  if (clip) {  // omp simd: the sums may be reassociated into vector lanes (a fixed order, so still deterministic)
    T below = 0, above = 0;
#pragma omp simd reduction(+ : below)
    for (int64_t jj = 0; jj < s.lo; ++jj) below += row[jj];
#pragma omp simd reduction(+ : above)
    for (int64_t jj = s.hi; jj < bk; ++jj) above += row[jj];
    table[0] += alpha * below;
    table[2 * k] += alpha * above;
  }
  T* window = table + s.first - s.lo;
  for (int64_t jj = s.lo; jj < s.hi; ++jj) window[jj] += alpha * row[jj];
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

// End of the keys a query tile visits: its key tiles up to the last one not
// wholly in the future (causal).
template <class T>
int64_t visited_keys(const AttentionForward<T>& p, const Head<T>& hd, int64_t i0, int64_t bq) {
  int64_t end = 0;
  for (int64_t j0 = 0; j0 < hd.lk; j0 += kBlockK) {
    const Tile t{i0, bq, j0, std::min(kBlockK, hd.lk - j0)};
    if (above_diagonal(p, hd, t)) break;  // later key tiles lie further in the future
    end = j0 + t.bk;
  }
  return end;
}

// Transformer-XL's positional scores of the query tile [i0, i0 + bq) against
// every distance its keys [0, keys) reach, computed by one product per query
// tile (a per-key-tile band would compute Bq + Bk - 1 columns for Bk keys):
// scores (bq, width), column c = distance index first + c; the pair (ii, j) is
// column j - ii + bq - 1.
template <class T>
struct XLBand {
  Scratch<T> scores;
  int64_t width = 0, first = 0;

  // Offset of the pair (ii, j0) in scores, and in any (bq, width) buffer like it.
  int64_t at(int64_t ii, int64_t bq, int64_t j0) const { return ii * width + (bq - 1 - ii) + j0; }
};

template <class T>
void xl_band(const HeadContext<T>& c, int64_t i0, int64_t bq, int64_t keys, XLBand<T>& band) {
  const Head<T>& hd = c.x.hd;
  band.width = keys + bq - 1;
  band.first = hd.diagonal(i0 + bq - 1, 0);
  band.scores.resize(bq * band.width);
  gemm<T>(Trans::no, Trans::yes, bq, band.width, hd.d, T(1), hd.qp + i0 * hd.d, hd.d, c.E + band.first * hd.d,
          hd.d, T(0), band.scores.data(), band.width);
}

// S (bq, bk) = the tile's logits, masked pairs -inf. Rq: the Shaw key scores
// of the tile's queries, (bq, nb). band: the query tile's Transformer-XL scores.
template <class T>
void tile_logits(const AttentionForward<T>& p, const HeadContext<T>& c, T scale, const Tile& t, const T* Rq,
                 const XLBand<T>& band, T* S) {
  const Head<T>& hd = c.x.hd;
  const int64_t d = hd.d, bq = t.bq, bk = t.bk;
  gemm<T>(Trans::no, Trans::yes, bq, bk, d, scale, c.x.qc.data() + t.i0 * d, d, c.x.k.data() + t.j0 * d, d, T(0), S,
          bk);
  const int64_t m0 = hd.diagonal(t.i0 + bq - 1, t.j0);  // distance index of the tile's smallest distance
  if (c.xl())
    for (int64_t ii = 0; ii < bq; ++ii) {
      const T* diagonal = band.scores.data() + band.at(ii, bq, t.j0);
      for (int64_t jj = 0; jj < bk; ++jj) S[ii * bk + jj] += scale * diagonal[jj];
    }
  const Scratch<T>& bias = c.x.bias;
  const bool padding = !p.key_padding.empty();
  for (int64_t ii = 0; ii < bq; ++ii) {
    T* row = S + ii * bk;
    const int64_t mrow = m0 + (bq - 1 - ii);  // distance index of (ii, jj = 0)
    if (c.shaw_k()) add_by_row(row, bk, hd.rmin + mrow, p.pos.shaw.k, c.clip, Rq + ii * c.nb, scale);
    if (!bias.empty())
      for (int64_t jj = 0; jj < bk; ++jj) row[jj] += bias[mrow + jj];
    if (p.causal) {  // keys with r > 0: jj > ii + (the distance index of r = 0) - mrow
      const int64_t first_future = std::max<int64_t>(0, -(hd.rmin + mrow) + 1);
      for (int64_t jj = first_future; jj < bk; ++jj) row[jj] = kNegInf<T>;
    }
    if (padding)
      for (int64_t jj = 0; jj < bk; ++jj)
        if (p.key_padding(hd.b, t.j0 + jj)) row[jj] = kNegInf<T>;
  }
}

template <class T>
struct ForwardScratch {
  HeadContext<T> head;
  Scratch<T> S, O, Rq, Pb, m, l;
  XLBand<T> band;
};

// One query tile of one head: all key tiles, online softmax, out and lse.
template <class T>
void forward_tile(const AttentionForward<T>& p, const XLKeys<T>& xl, int64_t b, int64_t h, int64_t i0,
                  ForwardScratch<T>& w) {
  HeadContext<T>& c = w.head;
  prepare(p, xl, b, h, c);
  const Head<T>& hd = c.x.hd;
  const int64_t d = hd.d, dv = hd.dv, bq = std::min(kBlockQ, hd.lq - i0);
  const T scale = T(effective_scale(p));
  w.O.assign(bq * dv, T(0));
  w.m.assign(bq, kNegInf<T>);
  w.l.assign(bq, T(0));
  if (c.shaw_k()) {
    w.Rq.resize(bq * c.nb);
    gemm<T>(Trans::no, Trans::yes, bq, c.nb, d, T(1), hd.qp + i0 * d, d, c.wk.data(), d, T(0), w.Rq.data(), c.nb);
  }
  if (c.shaw_v()) w.Pb.assign(bq * c.nb, T(0));
  w.S.resize(bq * kBlockK);
  const int64_t keys = visited_keys(p, hd, i0, bq);
  if (c.xl() && keys) xl_band(c, i0, bq, keys, w.band);
  for (int64_t j0 = 0; j0 < keys; j0 += kBlockK) {
    const Tile t{i0, bq, j0, std::min(kBlockK, keys - j0)};
    T* S = w.S.data();
    tile_logits(p, c, scale, t, w.Rq.data(), w.band, S);
    for (int64_t ii = 0; ii < bq; ++ii) {  // online softmax: S becomes P, O and Pb rescaled
      T* row = S + ii * t.bk;
      const T m_new = max_of(row, t.bk, w.m[ii]);
      if (m_new == kNegInf<T>) {  // nothing visible yet in this row
        for (int64_t jj = 0; jj < t.bk; ++jj) row[jj] = T(0);
        continue;
      }
      const T alpha = std::exp(w.m[ii] - m_new);
      w.l[ii] = w.l[ii] * alpha + exp_shifted_sum(row, m_new, row, t.bk);
      w.m[ii] = m_new;
      if (alpha != T(1)) {
        for (int64_t x = 0; x < dv; ++x) w.O[ii * dv + x] *= alpha;
        if (c.shaw_v())
          for (int64_t r = 0; r < c.nb; ++r) w.Pb[ii * c.nb + r] *= alpha;
      }
      if (c.shaw_v()) sum_by_row(&w.Pb[ii * c.nb], t.bk, hd.r(i0 + ii, j0), p.pos.shaw.k, c.clip, row, T(1));
    }
    gemm<T>(Trans::no, Trans::no, bq, dv, t.bk, T(1), S, t.bk, c.x.v.data() + j0 * dv, dv, T(1), w.O.data(), dv);
  }
  if (c.shaw_v())
    gemm<T>(Trans::no, Trans::no, bq, dv, c.nb, T(1), w.Pb.data(), c.nb, c.wv.data(), dv, T(1), w.O.data(), dv);
  for (int64_t ii = 0; ii < bq; ++ii) {
    const bool empty = w.l[ii] == T(0);  // fully masked row: zeros, lse -inf
    const T inv = empty ? T(0) : T(1) / w.l[ii];
    for (int64_t x = 0; x < dv; ++x) p.out(b, h, i0 + ii, x) = w.O[ii * dv + x] * inv;
    p.lse(b, h, i0 + ii) = empty ? kNegInf<T> : w.m[ii] + std::log(w.l[ii]);
  }
}

template <class T>
struct BackwardScratch {
  HeadContext<T> head;
  Scratch<T> dout, D, P, dP, dqc, dqp, dk, dv, Rq, G, dR, Pb, dE, dbias, dband;
  XLBand<T> band;
};

// All gradients of one head.
template <class T>
void backward_head(const AttentionBackward<T>& p, const XLKeys<T>& xl, const PositionGrads<T>& g, int64_t b,
                   int64_t h, BackwardScratch<T>& w) {
  HeadContext<T>& c = w.head;
  prepare(p, xl, b, h, c);
  const Head<T>& hd = c.x.hd;
  const int64_t lq = hd.lq, lk = hd.lk, d = hd.d, dv = hd.dv, nb = c.nb;
  const T scale = T(effective_scale(p));
  w.dout.resize(lq * dv), w.D.resize(lq);
  for (int64_t i = 0; i < lq; ++i) {
    T D = 0;
    for (int64_t x = 0; x < dv; ++x) {
      w.dout[i * dv + x] = p.dout(b, h, i, x);
      D += w.dout[i * dv + x] * p.out(b, h, i, x);
    }
    w.D[i] = D;
  }
  w.dqc.assign(lq * d, T(0)), w.dqp.assign(lq * d, T(0)), w.dk.assign(lk * d, T(0)), w.dv.assign(lk * dv, T(0));
  if (c.shaw_k()) {  // Shaw key scores of all queries and their gradient, (lq, nb)
    w.Rq.resize(lq * nb);
    gemm<T>(Trans::no, Trans::yes, lq, nb, d, T(1), hd.qp, d, c.wk.data(), d, T(0), w.Rq.data(), nb);
    w.dR.assign(lq * nb, T(0));
  }
  if (c.shaw_v()) {  // dout wv^T and the bucket sums of P, (lq, nb)
    w.G.resize(lq * nb);
    gemm<T>(Trans::no, Trans::yes, lq, nb, dv, T(1), w.dout.data(), dv, c.wv.data(), dv, T(0), w.G.data(), nb);
    w.Pb.assign(lq * nb, T(0));
  }
  if (c.xl()) w.dE.assign(hd.distances() * d, T(0));
  if (!c.x.bias.empty()) w.dbias.assign(hd.distances(), T(0));
  w.P.resize(kBlockQ * kBlockK), w.dP.resize(kBlockQ * kBlockK);

  for (int64_t i0 = 0; i0 < lq; i0 += kBlockQ) {
    const int64_t bq = std::min(kBlockQ, lq - i0), keys = visited_keys(p, hd, i0, bq);
    if (c.xl() && keys) {
      xl_band(c, i0, bq, keys, w.band);
      w.dband.assign(bq * w.band.width, T(0));
    }
    for (int64_t j0 = 0; j0 < keys; j0 += kBlockK) {
      const Tile t{i0, bq, j0, std::min(kBlockK, keys - j0)};
      const int64_t bk = t.bk;
      T *P = w.P.data(), *dS = w.dP.data();
      tile_logits(p, c, scale, t, c.shaw_k() ? w.Rq.data() + i0 * nb : nullptr, w.band, P);
      for (int64_t ii = 0; ii < bq; ++ii) {
        const T lse = p.lse(b, h, i0 + ii);
        T* row = P + ii * bk;
        if (lse == kNegInf<T>)
          std::fill(row, row + bk, T(0));
        else
          exp_shifted_sum(row, lse, row, bk);
      }
      gemm<T>(Trans::yes, Trans::no, bk, dv, bq, T(1), P, bk, w.dout.data() + i0 * dv, dv, T(1),
              w.dv.data() + j0 * dv, dv);
      gemm<T>(Trans::no, Trans::yes, bq, bk, dv, T(1), w.dout.data() + i0 * dv, dv, c.x.v.data() + j0 * dv, dv, T(0),
              dS, bk);
      const int64_t m0 = hd.diagonal(i0 + bq - 1, j0);
      for (int64_t ii = 0; ii < bq; ++ii) {
        const int64_t i = i0 + ii, mrow = m0 + (bq - 1 - ii);
        T* prow = P + ii * bk;
        T* srow = dS + ii * bk;
        const int64_t r0 = hd.rmin + mrow, k = p.pos.shaw.k;
        if (c.shaw_v()) {
          add_by_row(srow, bk, r0, k, c.clip, &w.G[i * nb], T(1));
          sum_by_row(&w.Pb[i * nb], bk, r0, k, c.clip, prow, T(1));
        }
        for (int64_t jj = 0; jj < bk; ++jj) srow[jj] = prow[jj] * (srow[jj] - w.D[i]);
        if (!w.dbias.empty())
          for (int64_t jj = 0; jj < bk; ++jj) w.dbias[mrow + jj] += srow[jj];
        if (c.shaw_k()) sum_by_row(&w.dR[i * nb], bk, r0, k, c.clip, srow, scale);
      }
      gemm<T>(Trans::no, Trans::no, bq, d, bk, scale, dS, bk, c.x.k.data() + j0 * d, d, T(1), w.dqc.data() + i0 * d,
              d);
      gemm<T>(Trans::yes, Trans::no, bk, d, bq, scale, dS, bk, c.x.qc.data() + i0 * d, d, T(1),
              w.dk.data() + j0 * d, d);
      if (c.xl())  // un-skew scale * dS onto the query tile's band (each (ii, j) owns one column of row ii)
        for (int64_t ii = 0; ii < bq; ++ii) {
          T* diagonal = w.dband.data() + w.band.at(ii, bq, j0);
          for (int64_t jj = 0; jj < bk; ++jj) diagonal[jj] = scale * dS[ii * bk + jj];
        }
    }
    if (c.xl() && keys) {  // the band's products backwards, once per query tile
      const int64_t width = w.band.width;
      const T* E = c.E + w.band.first * d;
      gemm<T>(Trans::no, Trans::no, bq, d, width, T(1), w.dband.data(), width, E, d, T(1), w.dqp.data() + i0 * d, d);
      gemm<T>(Trans::yes, Trans::no, width, d, bq, T(1), w.dband.data(), width, hd.qp + i0 * d, d, T(1),
              w.dE.data() + w.band.first * d, d);
    }
  }

  if (c.shaw_k()) {  // dqp += dR wk; dwk += dR^T qp
    gemm<T>(Trans::no, Trans::no, lq, d, nb, T(1), w.dR.data(), nb, c.wk.data(), d, T(1), w.dqp.data(), d);
    if (!g.shaw_wk.empty()) {
      Scratch<T> dwk(nb * d);
      gemm<T>(Trans::yes, Trans::no, nb, d, lq, T(1), w.dR.data(), nb, hd.qp, d, T(0), dwk.data(), d);
      unfused::add_to_table(g.shaw_wk, h, dwk);
    }
  }
  if (c.shaw_v() && !g.shaw_wv.empty()) {  // dwv += Pb^T dout
    Scratch<T> dwv(nb * dv);
    gemm<T>(Trans::yes, Trans::no, nb, dv, lq, T(1), w.Pb.data(), nb, w.dout.data(), dv, T(0), dwv.data(), dv);
    unfused::add_to_table(g.shaw_wv, h, dwv);
  }
  if (c.xl()) unfused::DistanceTable<T>(p.pos, &g, &xl.R).add_key_grad(hd, w.dE, hd.distances());
  if (!w.dbias.empty()) add_bias_grad(p.pos, g, hd, w.dbias);
  write_input_grads(p, c.x, g, w.dqc, w.dqp, w.dk, w.dv);
}

}  // namespace

template <class T>
void forward(const AttentionForward<T>& p) {
  const int64_t heads = p.q.shape[1], tiles = (p.q.shape[2] + kBlockQ - 1) / kBlockQ;
  const int64_t items = p.q.shape[0] * heads * tiles;
  const int threads = thread_count(p.num_threads, items);
  std::vector<ForwardScratch<T>> scratch(threads);
  const XLKeys<T> xl(p);
  parallel_for(
      items, threads, [](int) {},
      [&](int t, int64_t item) {
        const int64_t bh = item / tiles;
        forward_tile(p, xl, bh / heads, bh % heads, (item % tiles) * kBlockQ, scratch[t]);
      });
}

template <class T>
void backward(const AttentionBackward<T>& p) {
  const int64_t heads = p.q.shape[1];
  const int threads = thread_count(p.num_threads, p.q.shape[0] * heads);
  std::vector<std::unique_ptr<GradPartials<T>>> partials(threads);
  std::vector<BackwardScratch<T>> scratch(threads);
  const XLKeys<T> xl(p);
  parallel_for(
      p.q.shape[0] * heads, threads, [&](int t) { partials[t] = std::make_unique<GradPartials<T>>(p.dpos); },
      [&](int t, int64_t bh) { backward_head(p, xl, partials[t]->grads(), bh / heads, bh % heads, scratch[t]); });
  for (const auto& part : partials)  // fixed order: deterministic sums
    if (part) part->add_into(p.dpos);
}

template void forward<float>(const AttentionForward<float>&);
template void forward<double>(const AttentionForward<double>&);
template void backward<float>(const AttentionBackward<float>&);
template void backward<double>(const AttentionBackward<double>&);

}  // namespace relpos::fused
