// One (batch, head) of a call, densely copied and prepared: the inputs every
// per-head algorithm (unfused pipeline, fused kernel) starts from.
#pragma once

#include <algorithm>
#include <cmath>
#include <limits>
#include <memory>
#include <type_traits>
#include <vector>

#include "../backend/convert.hpp"
#include "../backend/row_ops.hpp"
#include "../backend/scratch.hpp"
#include "../schemes/registry.hpp"
#include "relpos/attention.hpp"

namespace relpos {

// One head, dense and row-major, after the scheme's rotation (RoPE).
template <class T>
struct Head {
  int64_t b = 0, h = 0, lq = 0, lk = 0, d = 0, dv = 0;
  int64_t rmin = 0;
  const T* qp = nullptr;  // (lq, d) query of the key embedding: q, or q plus a QueryBiases position vector

  int64_t distances() const { return lq + lk - 1; }
  int64_t diagonal(int64_t i, int64_t j) const { return j - i + lq - 1; }
  int64_t r(int64_t i, int64_t j) const { return rmin + diagonal(i, j); }
};

template <class T>
constexpr T kNegInf = -std::numeric_limits<T>::infinity();

// One head's inputs (rotated for RoPE; query biases added: Transformer-XL's u
// and v) and its bias per distance (T5, ALiBi, KERPLE). One per thread and
// call: what depends only on the call (RoPE's angles, T5's buckets, ALiBi's
// slopes) is computed for its first head and kept.
template <class T>
struct HeadData {
  Head<T> hd;
  Scratch<T> qc, qp, k, v;    // qp is filled only with query biases; qc and k, v where not read in place
  const T* qrows = nullptr;   // the query rows (lq, d) of q + u the kernels read: qc, or the caller's q in place
  Scratch<T> bias;            // (distances) for a scheme whose term is a bias per distance; empty otherwise
  std::unique_ptr<DistanceBias<T>> distance_bias;  // the scheme's bias per (head, distance), made for the first head
  std::unique_ptr<PositionRotation<T>> rotation;   // the scheme's rotation of q and k, made for the first head
  std::unique_ptr<QueryBiases<T>> query_bias;      // the scheme's vectors added to the query, made for the first head

  // Keys and values as the kernels read them: row j of k at kp + j * ldk (of
  // v at vp + j * ldv), the caller's tensors in place or the copies k, v.
  const T *kp = nullptr, *vp = nullptr;
  int64_t ldk = 0, ldv = 0;
  bool padded_keys_zeroed = false;  // the copies differ from the caller's keys (zero_padded_keys)
};

// The shape and distances of head (b, h) of a call, no data.
template <class T>
inline Head<T> head_geometry(const AttentionForward<T>& p, int64_t b, int64_t h) {
  Head<T> hd;
  hd.b = b, hd.h = h, hd.lq = p.q.shape[2], hd.lk = p.k.shape[2], hd.d = p.q.shape[3], hd.dv = p.v.shape[3];
  hd.rmin = p.k_offset - (p.q_offset + hd.lq - 1);
  return hd;
}

// True when a head's keys and values can be read where the caller holds them:
// rows of contiguous features at a stride a GEMM accepts, and no rotation.
template <class T>
inline bool keys_readable_in_place(const AttentionForward<T>& p) {
  return !scheme_has<RotationOf, T>(p.pos.scheme) && p.k.stride[3] == 1 && p.v.stride[3] == 1 && p.k.stride[2] >= p.k.shape[3] &&
         p.v.stride[2] >= p.v.shape[3];
}

// True when each head of x is dense rows (features contiguous, rows one
// after the other), as the kernels read the copies they make of queries and
// dout: they can read it where the caller holds it.
template <class T>
inline bool dense_rows(const View4<const T>& x) {
  return x.stride[3] == 1 && x.stride[2] == x.shape[3];
}

// True when a head's queries can be read where the caller holds them: dense
// rows, nothing rotated or added to them.
template <class T>
inline bool queries_readable_in_place(const AttentionForward<T>& p) {
  return !scheme_has<RotationOf, T>(p.pos.scheme) && !scheme_has<QueryBiasOf, T>(p.pos.scheme) && dense_rows(p.q);
}

// Rows of a call's stored tensors as the kernels read and write them: in
// the compute type T, from and to the storage type S (float32 / float64
// themselves, or bfloat16 / float16 widened on load and rounded once on store).
template <class T, class S>
inline void read_row(const View4<const S>& x, int64_t b, int64_t h, int64_t i, T* dst) {
  convert::row(&x(b, h, i, 0), x.stride[3], dst, 1, x.shape[3]);
}
template <class T, class S>
inline void write_row(const View4<S>& x, int64_t b, int64_t h, int64_t i, const T* src) {
  convert::row(src, 1, &x(b, h, i, 0), x.stride[3], x.shape[3]);
}
// x[b, h, i, :] += src, the sum formed in T.
template <class T, class S>
inline void add_row(const View4<S>& x, int64_t b, int64_t h, int64_t i, const T* src) {
  convert::add_into(&x(b, h, i, 0), x.stride[3], src, x.shape[3]);
}

template <class T>
inline bool key_padded(const AttentionForward<T>& p, int64_t b, int64_t j) {
  return !p.key_padding.empty() && p.key_padding(b, j) != 0;
}

// Keys that key padding hides from every query contribute nothing, but the
// products multiply their rows by the padded pairs' zero probabilities, and
// 0 x inf is NaN: where a padded key's k or v holds a non-finite value (the
// uninitialised slot of a KV cache), the head reads copies in which every
// padded key is zero. Every finite call reads what it always did.
template <class T>
void zero_padded_keys(const AttentionForward<T>& p, HeadData<T>& x) {
  const Head<T>& hd = x.hd;
  bool nonfinite = false;
  for (int64_t j = 0; j < hd.lk && !nonfinite; ++j)
    nonfinite = key_padded(p, hd.b, j) && !(rows::rows_finite(x.kp + j * x.ldk, 1, hd.d, x.ldk) &&
                                        rows::rows_finite(x.vp + j * x.ldv, 1, hd.dv, x.ldv));
  if (!nonfinite) return;
  if (x.kp != x.k.data()) {  // read in place so far: copy
    x.k.resize(hd.lk * hd.d), x.v.resize(hd.lk * hd.dv);
    for (int64_t j = 0; j < hd.lk; ++j) {
      std::copy_n(x.kp + j * x.ldk, hd.d, &x.k[j * hd.d]);
      std::copy_n(x.vp + j * x.ldv, hd.dv, &x.v[j * hd.dv]);
    }
    x.kp = x.k.data(), x.ldk = hd.d;
    x.vp = x.v.data(), x.ldv = hd.dv;
  }
  for (int64_t j = 0; j < hd.lk; ++j)
    if (key_padded(p, hd.b, j)) {
      std::fill_n(&x.k[j * hd.d], hd.d, T(0));
      std::fill_n(&x.v[j * hd.dv], hd.dv, T(0));
    }
  x.padded_keys_zeroed = true;
}

// Prepares head (b, h) in x. p is the call; its tensors are read from
// `data`: p itself, or for a call stored in a half type the stored call
// whose float32 twin p is (positional parameters widened, no tensor data;
// src/attention/half_storage.cpp). Queries, keys and values are copied
// densely unless in_place allows reading them from the caller's tensors
// (queries_readable_in_place, keys_readable_in_place, never for half
// storage): a decode step then touches each cached key once, and a long
// head's workers hold no copy of it.
template <class T, class S>
inline void load_head(const AttentionForward<T>& p, const AttentionForward<S>& data, int64_t b, int64_t h,
                      HeadData<T>& x, bool in_place = false) {
  Head<T>& hd = x.hd;
  hd = head_geometry(p, b, h);
  const int64_t lq = hd.lq, lk = hd.lk, d = hd.d, dv = hd.dv;
  bool read_in_place = false;
  x.qrows = nullptr;
  if constexpr (std::is_same_v<S, T>) {
    if (in_place && queries_readable_in_place(p)) x.qc.clear(), x.qrows = &data.q(b, h, 0, 0);
    read_in_place = in_place && keys_readable_in_place(p);
    if (read_in_place) {
      x.k.clear(), x.v.clear();
      x.kp = &data.k(b, kv_head(p, h), 0, 0), x.ldk = data.k.stride[2];
      x.vp = &data.v(b, kv_head(p, h), 0, 0), x.ldv = data.v.stride[2];
    }
  }
  if (!x.qrows) {
    x.qc.resize(lq * d);
    for (int64_t i = 0; i < lq; ++i) read_row(data.q, b, h, i, &x.qc[i * d]);
    x.qrows = x.qc.data();
  }
  if (!read_in_place) {
    x.k.resize(lk * d), x.v.resize(lk * dv);
    const int64_t hk = kv_head(p, h);
    for (int64_t j = 0; j < lk; ++j) {
      read_row(data.k, b, hk, j, &x.k[j * d]);
      read_row(data.v, b, hk, j, &x.v[j * dv]);
    }
    x.kp = x.k.data(), x.ldk = d;
    x.vp = x.v.data(), x.ldv = dv;
  }
  x.padded_keys_zeroed = false;
  if (!p.key_padding.empty()) zero_padded_keys(p, x);
  if (!x.rotation) x.rotation = make_rotation(p);  // the same angles for every head of the call
  if (x.rotation) {
    x.rotation->queries(x.qc.data(), 1);
    x.rotation->keys(x.k.data(), 1);  // rotated keys are always copies (keys_readable_in_place)
  }
  hd.qp = x.qrows;
  if (!x.query_bias) x.query_bias = make_query_bias(p);
  if (x.query_bias) {
    x.qp.resize(lq * d);
    x.query_bias->apply(h, lq, d, x.qc.data(), x.qp.data());
    hd.qp = x.qp.data();
  }
  x.bias.clear();
  if (!x.distance_bias) x.distance_bias = make_distance_bias(p);
  if (x.distance_bias) {
    x.bias.resize(hd.distances());
    x.distance_bias->values(h, x.bias.data());
  }
}

template <class T>
inline void load_head(const AttentionForward<T>& p, int64_t b, int64_t h, HeadData<T>& x, bool in_place = false) {
  load_head(p, p, b, h, x, in_place);
}

// Whether segments hide key j from query row i of batch row b.
template <class T>
inline bool segments_differ(const AttentionForward<T>& p, int64_t b, int64_t i, int64_t j) {
  return !p.q_segments.empty() && p.q_segments(b, i) != p.k_segments(b, j);
}

// Whether key padding or segments hide key j from query row i of batch row b
// (the masks per pair beside the causal one).
template <class T>
inline bool pair_hidden(const AttentionForward<T>& p, int64_t b, int64_t i, int64_t j) {
  return key_padded(p, b, j) || segments_differ(p, b, i, j);
}

template <class T>
inline bool masked(const AttentionForward<T>& p, const Head<T>& hd, int64_t i, int64_t j) {
  return (p.causal && hd.r(i, j) > 0) || pair_hidden(p, hd.b, i, j);
}

// Whether the call wants a gradient of any of its scheme's parameters. A bias
// whose parameters are fixed (ALiBi's paper slopes) needs no per-distance sums
// of the logits' gradient in the backward.
template <class T>
bool wants_scheme_grads(const AttentionBackward<T>& p) {
  bool wanted = false;
  for_each_scheme_param(
      p.pos, [&](const char*, const auto&, const auto& grad) { wanted = wanted || !grad.empty(); }, p.dpos);
  return wanted;
}

// The gradients of the scheme's parameters from the gradient of the bias per
// distance, dbias (distances), of the head load_head prepared in x.
template <class T>
inline void add_bias_grad(const PositionGrads<T>& g, const HeadData<T>& x, const Scratch<T>& dbias) {
  x.distance_bias->add_grad(g, x.hd.h, dbias.data());
}

// True when a backward can sum dk and dv straight into the caller's
// tensors, T being its compute type: both wanted, dense rows of T, each
// head's own (no key head shared by query heads), every key's (key_grads_from
// 0, no padded key left out: write_input_grads) and nothing to undo (RoPE).
template <class T, class S>
inline bool key_grads_in_place(const AttentionBackward<S>& data) {
  if constexpr (!std::is_same_v<T, S>) {
    return false;
  } else {
    return !data.dk.empty() && !data.dv.empty() && data.k.shape[1] == data.q.shape[1] && data.key_grads_from == 0 &&
           data.key_padding.empty() && !scheme_has<RotationOf, T>(data.pos.scheme) &&
           dense_rows(View4<const T>(data.dk)) && dense_rows(View4<const T>(data.dv));
  }
}

// The end of every per-head backward: from the gradients of the content query
// dqc = dL/d(q + u), the positional query dqp = dL/d(q + v) (zero, or
// empty, without a key embedding), dk and dv (dense, rotated frame), add the query biases'
// gradients, undo RoPE's rotation, and add into the caller's dq, dk, dv;
// dk and dv null where they were summed in the caller's tensors
// (key_grads_in_place). dqc is overwritten. The caller's tensors are data's
// (see load_head).
template <class T, class S>
inline void write_input_grads(const AttentionBackward<S>& data, const HeadData<T>& x, const PositionGrads<T>& g,
                              Scratch<T>& dqc, const Scratch<T>& dqp, T* dk, const T* dv) {
  const Head<T>& hd = x.hd;
  const int64_t b = hd.b, h = hd.h, lq = hd.lq, lk = hd.lk, d = hd.d, dvd = hd.dv;
  if (x.query_bias) x.query_bias->add_grad(g, h, lq, d, dqc.data(), dqp.data());
  if (!dqp.empty())
    for (int64_t n = 0; n < lq * d; ++n) dqc[n] += dqp[n];
  if (x.rotation) {
    x.rotation->queries(dqc.data(), -1);
    x.rotation->keys(dk, -1);
  }
  if (!data.dq.empty())
    for (int64_t i = 0; i < lq; ++i) add_row(data.dq, b, h, i, &dqc[i * d]);
  if (!dk) return;
  // dk, dv rows are keys from .. lk - 1. A padded key's are zero, as no query
  // sees it: not added, where dS^T q and P^T dout would make 0 x inf of a non-finite query row.
  const int64_t from = data.key_grads_from;
  for (int64_t j = from; j < lk; ++j) {
    if (key_padded(data, b, j)) continue;
    if (!data.dk.empty()) add_row(data.dk, b, h, j - from, &dk[j * d]);
    if (!data.dv.empty()) add_row(data.dv, b, h, j - from, &dv[j * dvd]);
  }
}

}  // namespace relpos
