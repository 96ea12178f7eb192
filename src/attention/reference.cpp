// The reference algorithm: the formulas of docs/design.md section 1 written out
// literally, one (batch, head) at a time, materialising every relative term
// as an (Lq, Lk, ...) tensor. It is the oracle every other algorithm is tested
// against, so it favours obviousness over speed and is kept forever.
//
// All schemes are one formula here:
//   logits(i,j) = scale * (qc_i . k_j + qp_i . rk(i,j)) + bias(i,j)
//   out_i       = sum_j P(i,j) * (v_j + rv(i,j))
// with qc = q + u and qp = q + v for Transformer-XL (qc = qp = q otherwise),
// rk = Shaw A^K or Transformer-XL's W_R R(-r), rv = Shaw A^V, bias = the
// scheme's bias per distance (T5, ALiBi, KERPLE), and q, k rotated first for RoPE.
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
  Scratch<T> rv;            // (Lq, Lk, dv), empty when no relative value term
  Scratch<T> bias;          // (Lq, Lk)
  std::unique_ptr<DistanceBias<T>> distance_bias;  // the scheme's bias per distance, if its term is one
  Scratch<uint8_t> masked;  // (Lq, Lk)
  std::unique_ptr<PositionRotation<T>> rotation;  // the scheme's rotation of q and k, if it has one
  // The call's distances are r = rmin + m, m < Lq + Lk - 1. Transformer-XL: R
  // and W_R R for each (each distance's embedding is computed once, then
  // copied to its pairs).
  int64_t rmin = 0;
  Scratch<T> xl_r, xl_e;  // (Lq + Lk - 1, pos_dim), (Lq + Lk - 1, d)
};


template <class T>
int64_t rel(const AttentionForward<T>& p, int64_t i, int64_t j) {
  return (p.k_offset + j) - (p.q_offset + i);
}

// The Shaw table slice of head h (a shared table has one slice).
template <class T>
int64_t table_head(const View3<const T>& table, int64_t h) {
  return table.shape[0] == 1 ? 0 : h;
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
  const PositionParams<T>& pos = p.pos;
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
  if (pos.scheme == Scheme::xl) {
    for (int64_t i = 0; i < t.lq; ++i)
      for (int64_t x = 0; x < t.d; ++x) {
        t.qc[i * t.d + x] += pos.xl.u(h, x);
        t.qp[i * t.d + x] += pos.xl.v(h, x);
      }
  }

  t.masked.assign(t.lq * t.lk, 0);
  t.bias.assign(t.lq * t.lk, T(0));
  const bool shaw_k = pos.scheme == Scheme::shaw && !pos.shaw.wk.empty();
  const bool shaw_v = pos.scheme == Scheme::shaw && !pos.shaw.wv.empty();
  const bool xl = pos.scheme == Scheme::xl;
  if (shaw_k || xl) t.rk.assign(t.lq * t.lk * t.d, T(0));
  if (shaw_v) t.rv.assign(t.lq * t.lk * t.dv, T(0));
  t.rmin = rel(p, t.lq - 1, 0);
  Scratch<T> bias_per_distance;
  t.distance_bias = make_distance_bias(p);
  if (t.distance_bias) {
    bias_per_distance.resize(t.lq + t.lk - 1);
    t.distance_bias->values(h, bias_per_distance.data());
  }
  if (xl) {
    const int64_t pos_dim = pos.xl.w_r.shape[2], n = t.lq + t.lk - 1;
    t.xl_r.resize(n * pos_dim);
    t.xl_e.assign(n * t.d, T(0));
    for (int64_t m = 0; m < n; ++m) {
      sinusoid(double(xl_distance(t.rmin + m, pos.xl.clamp_len)), pos_dim, &t.xl_r[m * pos_dim]);
      for (int64_t x = 0; x < t.d; ++x)
        for (int64_t e = 0; e < pos_dim; ++e) t.xl_e[m * t.d + x] += pos.xl.w_r(h, x, e) * t.xl_r[m * pos_dim + e];
    }
  }

  for (int64_t i = 0; i < t.lq; ++i) {
    for (int64_t j = 0; j < t.lk; ++j) {
      const int64_t r = rel(p, i, j);
      const int64_t ij = i * t.lk + j;
      t.masked[ij] = (p.causal && r > 0) || (!p.key_padding.empty() && p.key_padding(b, j) != 0);
      if (shaw_k || shaw_v) {
        const int64_t c = shaw_index(r, pos.shaw.k, pos.shaw.beyond);
        if (c >= 0 && shaw_k) {
          const int64_t ht = table_head(pos.shaw.wk, h);
          for (int64_t x = 0; x < t.d; ++x) t.rk[ij * t.d + x] = pos.shaw.wk(ht, c, x);
        }
        if (c >= 0 && shaw_v) {
          const int64_t ht = table_head(pos.shaw.wv, h);
          for (int64_t x = 0; x < t.dv; ++x) t.rv[ij * t.dv + x] = pos.shaw.wv(ht, c, x);
        }
      }
      if (xl)
        for (int64_t x = 0; x < t.d; ++x) t.rk[ij * t.d + x] = t.xl_e[(r - t.rmin) * t.d + x];
      if (t.distance_bias) t.bias[ij] = bias_per_distance[r - t.rmin];
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
  return scale * s + t.bias[ij];
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
          if (row[j] > m) m = row[j];
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
          const T pij = std::exp(row[j] - lse);
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
  const PositionParams<T>& pos = p.pos;
  const PositionGrads<T>& g = p.dpos;
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t h = 0; h < H; ++h) {
      const HeadTerms<T> t = build_terms(p, b, h);
      const int64_t d = t.d, dv = t.dv;
      // Gradients with respect to the rotated q and k, un-rotated at the end.
      Scratch<T> dq(t.lq * d, T(0)), dk(t.lk * d, T(0));
      Scratch<T> P(t.lk), dS(t.lk);
      Scratch<T> dxl_e(t.xl_e.size(), T(0));  // gradient of W_R R per distance
      Scratch<T> dbias(t.distance_bias ? t.lq + t.lk - 1 : 0, T(0));  // gradient of the bias per distance
      for (int64_t i = 0; i < t.lq; ++i) {
        const T lse = p.lse(b, h, i);
        if (lse == -std::numeric_limits<T>::infinity()) continue;  // fully masked: zero gradients
        // D_i = sum_j P_ij dP_ij = dout_i . out_i
        T D = 0;
        for (int64_t x = 0; x < dv; ++x) D += p.dout(b, h, i, x) * p.out(b, h, i, x);
        for (int64_t j = 0; j < t.lk; ++j) {
          const int64_t ij = i * t.lk + j;
          if (t.masked[ij]) {
            P[j] = dS[j] = 0;
            continue;
          }
          P[j] = std::exp(logit(t, scale, i, j) - lse);
          T dP = 0;  // dout_i . (v_j + rv_ij)
          for (int64_t x = 0; x < dv; ++x) {
            T val = t.v[j * dv + x];
            if (!t.rv.empty()) val += t.rv[ij * dv + x];
            dP += p.dout(b, h, i, x) * val;
          }
          dS[j] = P[j] * (dP - D);
        }
        const int64_t r0 = rel(p, i, 0);
        for (int64_t j = 0; j < t.lk; ++j) {
          if (t.masked[i * t.lk + j]) continue;
          const int64_t ij = i * t.lk + j, r = r0 + j;
          const T ds = scale * dS[j];
          for (int64_t x = 0; x < d; ++x) {
            dq[i * d + x] += ds * t.k[j * d + x];
            dk[j * d + x] += ds * t.qc[i * d + x];
            if (!g.xl_u.empty()) g.xl_u(h, x) += ds * t.k[j * d + x];
          }
          if (!p.dv.empty())
            for (int64_t x = 0; x < dv; ++x) p.dv(b, h, j, x) += P[j] * p.dout(b, h, i, x);
          if (!t.rk.empty()) {
            for (int64_t x = 0; x < d; ++x) {
              dq[i * d + x] += ds * t.rk[ij * d + x];
              if (!g.xl_v.empty()) g.xl_v(h, x) += ds * t.rk[ij * d + x];
            }
          }
          if (pos.scheme == Scheme::shaw) {
            const int64_t c = shaw_index(r, pos.shaw.k, pos.shaw.beyond);
            if (c >= 0 && !g.shaw_wk.empty()) {
              const int64_t ht = table_head(pos.shaw.wk, h);
              for (int64_t x = 0; x < d; ++x) g.shaw_wk(ht, c, x) += ds * t.qp[i * d + x];
            }
            if (c >= 0 && !g.shaw_wv.empty()) {
              const int64_t ht = table_head(pos.shaw.wv, h);
              for (int64_t x = 0; x < dv; ++x) g.shaw_wv(ht, c, x) += P[j] * p.dout(b, h, i, x);
            }
          }
          if (pos.scheme == Scheme::xl)
            for (int64_t x = 0; x < d; ++x) dxl_e[(r - t.rmin) * d + x] += ds * t.qp[i * d + x];
          if (t.distance_bias) dbias[r - t.rmin] += dS[j];
        }
      }
      if (t.distance_bias) t.distance_bias->add_grad(g, h, dbias.data());
      if (pos.scheme == Scheme::xl && !g.xl_w_r.empty()) {  // dW_R = sum over distances of dE_m R_m^T
        const int64_t pos_dim = pos.xl.w_r.shape[2];
        for (int64_t m = 0; m < t.lq + t.lk - 1; ++m)
          for (int64_t x = 0; x < d; ++x)
            for (int64_t e = 0; e < pos_dim; ++e) g.xl_w_r(h, x, e) += dxl_e[m * d + x] * t.xl_r[m * pos_dim + e];
      }
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
