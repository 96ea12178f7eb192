// The reference algorithm: the formulas of docs/design.md section 1 written out
// literally, one (batch, head) at a time, materialising every relative term
// as an (Lq, Lk, ...) tensor. It is the oracle every other algorithm is tested
// against, so it favours obviousness over speed and is kept forever.
//
// All schemes are one formula here:
//   logits(i,j) = scale * (qc_i . k_j + qp_i . rk(i,j) + k_j . rq(i,j)) + bias(i,j)
//   out_i       = sum_j P(i,j) z(i,j) * (v_j + rv(i,j))
// with z the dropout multiplier (keep bit / (1 - p), entry by entry from
// relpos/dropout.hpp's dropout_keeps; 1 without dropout)
// with the scheme's terms (src/schemes/scheme.hpp): qc = q + u and qp = q + v
// for query biases (qc = qp = q otherwise), rk, rq and rv its key, query and
// value embeddings per distance (Shaw's A^K, A^V; Transformer-XL's W_R R(-r);
// DeBERTa's c2p and p2c tables by bucket), bias
// its bias per distance (T5, ALiBi, KERPLE), and q, k rotated first (RoPE).
// On a grid, bias(i, j) holds a bias per offset pair (Swin's) and the logit
// gains, unscaled, qc_i . (ry[y(i, j)] + rx[x(i, j)]) (SAM's tables).
#include "reference.hpp"

#include <cmath>
#include <limits>
#include <memory>
#include <vector>

#include "../backend/scratch.hpp"
#include "../schemes/registry.hpp"

namespace relpos::reference {
namespace {

template <class T>
struct HeadTerms {
  int64_t lq = 0, lk = 0, d = 0, dv = 0;
  Scratch<T> qc, qp, k, v;  // (Lq, d), (Lq, d), (Lk, d), (Lk, dv)
  Scratch<T> rk;            // (Lq, Lk, d), empty when no relative score term
  Scratch<T> rq;            // (Lq, Lk, d), empty when no relative score term read by the key
  Scratch<T> rv;            // (Lq, Lk, dv), empty when no relative value term
  Scratch<T> bias;          // (Lq, Lk)
  std::unique_ptr<DistanceBias<T>> distance_bias;  // the scheme's bias per distance, if its term is one
  Scratch<uint8_t> masked;  // (Lq, Lk)
  std::unique_ptr<PositionRotation<T>> rotation;  // the scheme's rotation of q and k, if it has one
  std::unique_ptr<QueryBiases<T>> query_bias;     // its vectors added to the query, if any
  // The call's distances are r = rmin + m, m < Lq + Lk - 1; each distance's
  // embeddings are computed once, then copied to its pairs.
  int64_t rmin = 0;
  std::unique_ptr<DistanceEmbedding<T>> key_embedding, query_embedding, value_embedding;
  std::unique_ptr<GridBias<T>> grid_bias;            // the scheme's bias per offsets on a grid, if any
  std::unique_ptr<GridEmbedding<T>> grid_embedding;  // its tables per axis on a grid, if any
  Scratch<T> ryx;  // the grid embedding's tables, (rows_y + rows_x, d)
};

// The offsets' indices of pair (i, j) on the call's grids, per axis.
struct GridPair {
  int64_t y, x;
};
inline GridPair grid_pair(const GridAxes& a, int64_t i, int64_t j) {
  const GridShape& g = a.shape();
  return {a.y(i / g.qw, j / g.kw), a.x_of(i % g.qw)[j % g.kw]};
}


template <class T>
int64_t rel(const AttentionForward<T>& p, int64_t i, int64_t j) {
  return (p.k_offset + j) - (p.q_offset + i);
}

// The dropout multiplier of (b, h, i, j): 1 without dropout.
template <class T>
T dropout_multiplier(const AttentionForward<T>& p, int64_t b, int64_t h, int64_t i, int64_t j) {
  if (!p.dropout.active()) return T(1);
  const bool kept = dropout_keeps(p.dropout, p.q.shape[1], b, h, p.q_offset + i, p.k_offset + j);
  return kept ? T(dropout_scale(p.dropout)) : T(0);
}

template <class T>
T dot(const T* a, const T* b, int64_t n) {
  T s = 0;
  for (int64_t x = 0; x < n; ++x) s += a[x] * b[x];
  return s;
}

template <class T>
HeadTerms<T> build_terms(const AttentionForward<T>& p, int64_t b, int64_t h) {
  HeadTerms<T> t;
  t.lq = p.q.shape[2];
  t.lk = p.k.shape[2];
  t.d = p.q.shape[3];
  t.dv = p.v.shape[3];
  t.qc.resize(t.lq * t.d);
  t.k.resize(t.lk * t.d);
  t.v.resize(t.lk * t.dv);
  for (int64_t i = 0; i < t.lq; ++i)
    for (int64_t x = 0; x < t.d; ++x) t.qc[i * t.d + x] = p.q(b, h, i, x);
  const int64_t hk = kv_head(p, h);
  for (int64_t j = 0; j < t.lk; ++j) {
    for (int64_t x = 0; x < t.d; ++x) t.k[j * t.d + x] = p.k(b, hk, j, x);
    for (int64_t x = 0; x < t.dv; ++x) t.v[j * t.dv + x] = p.v(b, hk, j, x);
  }
  t.rotation = make_rotation(p);
  if (t.rotation) {
    t.rotation->queries(t.qc.data(), 1);
    t.rotation->keys(t.k.data(), 1);
  }
  t.qp = t.qc;
  t.query_bias = make_query_bias(p);
  if (t.query_bias) t.query_bias->apply(h, t.lq, t.d, t.qc.data(), t.qp.data());

  t.masked.assign(t.lq * t.lk, 0);
  t.bias.assign(t.lq * t.lk, T(0));
  t.key_embedding = make_key_embedding(p);
  t.query_embedding = make_query_embedding(p);
  t.value_embedding = make_value_embedding(p);
  if (t.key_embedding) t.rk.assign(t.lq * t.lk * t.d, T(0));
  if (t.query_embedding) t.rq.assign(t.lq * t.lk * t.d, T(0));
  if (t.value_embedding) t.rv.assign(t.lq * t.lk * t.dv, T(0));
  t.rmin = rel(p, t.lq - 1, 0);
  const int64_t n = t.lq + t.lk - 1;
  Scratch<T> key_rows(t.key_embedding ? n * t.d : 0), value_rows(t.value_embedding ? n * t.dv : 0);
  Scratch<T> query_rows(t.query_embedding ? n * t.d : 0);
  if (t.key_embedding) t.key_embedding->rows(h, n, key_rows.data());
  if (t.query_embedding) t.query_embedding->rows(h, n, query_rows.data());
  if (t.value_embedding) t.value_embedding->rows(h, n, value_rows.data());
  t.grid_bias = make_grid_bias(p);
  t.grid_embedding = make_grid_embedding(p);
  Scratch<T> offset_bias;  // the grid bias's values, by (y, x) offsets
  if (t.grid_bias) {
    offset_bias.resize(t.grid_bias->axes().shape().rows_y() * t.grid_bias->axes().shape().rows_x());
    t.grid_bias->values(h, offset_bias.data());
  }
  if (t.grid_embedding) {
    const GridShape& g = t.grid_embedding->axes().shape();
    t.ryx.resize((g.rows_y() + g.rows_x()) * t.d);
    t.grid_embedding->tables(t.ryx.data());
  }
  Scratch<T> bias_per_distance;
  t.distance_bias = make_distance_bias(p);
  if (t.distance_bias) {
    bias_per_distance.resize(t.lq + t.lk - 1);
    t.distance_bias->values(h, bias_per_distance.data());
  }

  for (int64_t i = 0; i < t.lq; ++i) {
    for (int64_t j = 0; j < t.lk; ++j) {
      const int64_t r = rel(p, i, j);
      const int64_t ij = i * t.lk + j;
      t.masked[ij] = (p.causal && r > 0) || (!p.key_padding.empty() && p.key_padding(b, j) != 0) ||
                     (!p.q_segments.empty() && p.q_segments(b, i) != p.k_segments(b, j));
      if (t.key_embedding)
        for (int64_t x = 0; x < t.d; ++x) t.rk[ij * t.d + x] = key_rows[(r - t.rmin) * t.d + x];
      if (t.query_embedding)
        for (int64_t x = 0; x < t.d; ++x) t.rq[ij * t.d + x] = query_rows[(r - t.rmin) * t.d + x];
      if (t.value_embedding)
        for (int64_t x = 0; x < t.dv; ++x) t.rv[ij * t.dv + x] = value_rows[(r - t.rmin) * t.dv + x];
      if (t.distance_bias) t.bias[ij] = bias_per_distance[r - t.rmin];
      if (t.grid_bias) {
        const GridPair at = grid_pair(t.grid_bias->axes(), i, j);
        t.bias[ij] = offset_bias[at.y * t.grid_bias->axes().shape().rows_x() + at.x];
      }
    }
  }
  return t;
}

// logits(i, j); only meaningful where not masked.
template <class T>
T logit(const HeadTerms<T>& t, T scale, int64_t i, int64_t j) {
  const int64_t ij = i * t.lk + j;
  T s = dot(&t.qc[i * t.d], &t.k[j * t.d], t.d);
  if (!t.rk.empty()) s += dot(&t.qp[i * t.d], &t.rk[ij * t.d], t.d);
  if (!t.rq.empty()) s += dot(&t.k[j * t.d], &t.rq[ij * t.d], t.d);
  T unscaled = t.bias[ij];
  if (t.grid_embedding) {
    const GridPair at = grid_pair(t.grid_embedding->axes(), i, j);
    const int64_t x = t.grid_embedding->axes().shape().rows_y() + at.x;  // rx follows ry in ryx
    unscaled += dot(&t.qc[i * t.d], &t.ryx[at.y * t.d], t.d) + dot(&t.qc[i * t.d], &t.ryx[x * t.d], t.d);
  }
  return scale * s + unscaled;
}

}  // namespace

template <class T>
void forward(const AttentionForward<T>& p) {
  const T scale = T(effective_scale(p));
  const int64_t B = p.q.shape[0], H = p.q.shape[1];
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t h = 0; h < H; ++h) {
      const HeadTerms<T> t = build_terms(p, b, h);
      Scratch<T> row(t.lk);
      for (int64_t i = 0; i < t.lq; ++i) {
        T m = -std::numeric_limits<T>::infinity();
        for (int64_t j = 0; j < t.lk; ++j) {
          row[j] = t.masked[i * t.lk + j] ? -std::numeric_limits<T>::infinity() : logit(t, scale, i, j);
          if (row[j] > m || std::isnan(row[j])) m = row[j];  // a NaN logit makes the row NaN (NaN > x is false: it stays)
        }
        for (int64_t x = 0; x < t.dv; ++x) p.out(b, h, i, x) = T(0);
        if (m == -std::numeric_limits<T>::infinity()) {  // fully masked row
          p.lse(b, h, i) = m;
          continue;
        }
        T sum = 0;
        for (int64_t j = 0; j < t.lk; ++j) sum += std::exp(row[j] - m);
        const T lse = m + std::log(sum);
        p.lse(b, h, i) = lse;
        for (int64_t j = 0; j < t.lk; ++j) {
          if (t.masked[i * t.lk + j]) continue;
          const T pij = std::exp(row[j] - lse) * dropout_multiplier(p, b, h, i, j);
          for (int64_t x = 0; x < t.dv; ++x) {
            T val = t.v[j * t.dv + x];
            if (!t.rv.empty()) val += t.rv[(i * t.lk + j) * t.dv + x];
            p.out(b, h, i, x) += pij * val;
          }
        }
      }
    }
  }
}

template <class T>
void backward(const AttentionBackward<T>& p) {
  const T scale = T(effective_scale(p));
  const int64_t B = p.q.shape[0], H = p.q.shape[1];
  const PositionGrads<T>& g = p.dpos;
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t h = 0; h < H; ++h) {
      const HeadTerms<T> t = build_terms(p, b, h);
      const int64_t d = t.d, dv = t.dv;
      // Gradients with respect to the rotated q and k (through qc and qp),
      // un-rotated at the end.
      const int64_t n = t.lq + t.lk - 1;
      Scratch<T> dqc(t.lq * d, T(0)), dqp(t.lq * d, T(0)), dk(t.lk * d, T(0));
      Scratch<T> P(t.lk), Pd(t.lk), dS(t.lk);  // P, P after dropout, the logits' gradient
      Scratch<T> dkey_rows(t.key_embedding ? n * d : 0), dvalue_rows(t.value_embedding ? n * dv : 0);
      Scratch<T> dquery_rows(t.query_embedding ? n * d : 0);
      Scratch<T> dbias(t.distance_bias ? t.lq + t.lk - 1 : 0, T(0));  // gradient of the bias per distance
      const GridShape grid = t.grid_bias ? t.grid_bias->axes().shape()
                             : t.grid_embedding ? t.grid_embedding->axes().shape()
                                                : GridShape{};
      Scratch<T> doffset_bias(t.grid_bias ? grid.rows_y() * grid.rows_x() : 0, T(0));
      Scratch<T> dryx(t.ryx.size(), T(0));
      for (int64_t i = 0; i < t.lq; ++i) {
        const T lse = p.lse(b, h, i);
        if (lse == -std::numeric_limits<T>::infinity()) continue;  // fully masked: zero gradients
        // D_i = sum_j P_ij z_ij dP_ij = dout_i . out_i
        T D = 0;
        for (int64_t x = 0; x < dv; ++x) D += p.dout(b, h, i, x) * p.out(b, h, i, x);
        for (int64_t j = 0; j < t.lk; ++j) {
          const int64_t ij = i * t.lk + j;
          if (t.masked[ij]) {
            P[j] = Pd[j] = dS[j] = 0;
            continue;
          }
          P[j] = std::exp(logit(t, scale, i, j) - lse);
          const T z = dropout_multiplier(p, b, h, i, j);
          Pd[j] = P[j] * z;
          T dP = 0;  // dout_i . (v_j + rv_ij)
          for (int64_t x = 0; x < dv; ++x) {
            T val = t.v[j * dv + x];
            if (!t.rv.empty()) val += t.rv[ij * dv + x];
            dP += p.dout(b, h, i, x) * val;
          }
          dS[j] = P[j] * (z * dP - D);
        }
        const int64_t r0 = rel(p, i, 0);
        for (int64_t j = 0; j < t.lk; ++j) {
          if (t.masked[i * t.lk + j]) continue;
          const int64_t ij = i * t.lk + j, r = r0 + j;
          const T ds = scale * dS[j];
          for (int64_t x = 0; x < d; ++x) {
            dqc[i * d + x] += ds * t.k[j * d + x];
            dk[j * d + x] += ds * t.qc[i * d + x];
          }
          if (!p.dv.empty())
            for (int64_t x = 0; x < dv; ++x) p.dv(b, h, j, x) += Pd[j] * p.dout(b, h, i, x);
          if (!t.rk.empty())
            for (int64_t x = 0; x < d; ++x) {
              dqp[i * d + x] += ds * t.rk[ij * d + x];
              dkey_rows[(r - t.rmin) * d + x] += ds * t.qp[i * d + x];
            }
          if (!t.rq.empty())
            for (int64_t x = 0; x < d; ++x) {
              dk[j * d + x] += ds * t.rq[ij * d + x];
              dquery_rows[(r - t.rmin) * d + x] += ds * t.k[j * d + x];
            }
          if (!t.rv.empty())
            for (int64_t x = 0; x < dv; ++x) dvalue_rows[(r - t.rmin) * dv + x] += Pd[j] * p.dout(b, h, i, x);
          if (t.distance_bias) dbias[r - t.rmin] += dS[j];
          if (t.grid_bias) {
            const GridPair at = grid_pair(t.grid_bias->axes(), i, j);
            doffset_bias[at.y * grid.rows_x() + at.x] += dS[j];
          }
          if (t.grid_embedding) {  // unscaled: qc_i . (ry + rx)
            const GridPair at = grid_pair(t.grid_embedding->axes(), i, j);
            for (const int64_t row : {at.y, grid.rows_y() + at.x})
              for (int64_t x = 0; x < d; ++x) {
                dqc[i * d + x] += dS[j] * t.ryx[row * d + x];
                dryx[row * d + x] += dS[j] * t.qc[i * d + x];
              }
          }
        }
      }
      if (t.distance_bias) t.distance_bias->add_grad(g, h, dbias.data());
      if (t.grid_bias) t.grid_bias->add_grad(g, h, doffset_bias.data());
      if (t.grid_embedding) t.grid_embedding->add_grad(g, dryx.data());
      if (t.key_embedding) t.key_embedding->add_rows_grad(g, h, n, dkey_rows.data());
      if (t.query_embedding) t.query_embedding->add_rows_grad(g, h, n, dquery_rows.data());
      if (t.value_embedding) t.value_embedding->add_rows_grad(g, h, n, dvalue_rows.data());
      if (t.query_bias) t.query_bias->add_grad(g, h, t.lq, d, dqc.data(), dqp.data());
      Scratch<T> dq(t.lq * d);
      for (int64_t x = 0; x < t.lq * d; ++x) dq[x] = dqc[x] + dqp[x];
      if (t.rotation) {
        t.rotation->queries(dq.data(), -1);
        t.rotation->keys(dk.data(), -1);
      }
      if (!p.dq.empty())
        for (int64_t i = 0; i < t.lq; ++i)
          for (int64_t x = 0; x < d; ++x) p.dq(b, h, i, x) += dq[i * d + x];
      if (!p.dk.empty())
        for (int64_t j = 0; j < t.lk; ++j)
          for (int64_t x = 0; x < d; ++x) p.dk(b, h, j, x) += dk[j * d + x];
    }
  }
}

template void forward<float>(const AttentionForward<float>&);
template void forward<double>(const AttentionForward<double>&);
template void backward<float>(const AttentionBackward<float>&);
template void backward<double>(const AttentionBackward<double>&);

}  // namespace relpos::reference
