// The shared pipeline of the unfused algorithms (see unfused.hpp).
#include "unfused.hpp"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <exception>
#include <limits>
#include <stdexcept>

#include "../backend/gemm.hpp"
#include "grad_partials.hpp"

namespace relpos::unfused {
namespace {

template <class T>
constexpr T kNegInf = -std::numeric_limits<T>::infinity();

// One head's dense inputs and the per-distance bias.
template <class T>
struct HeadData {
  Head<T> hd;
  Scratch<T> qc, qp, k, v;    // qp is filled only for Transformer-XL (q + v)
  Scratch<T> bias;            // (distances), T5 / ALiBi; empty otherwise
  std::vector<double> inv_freq;  // RoPE
};

template <class T>
void load_head(const AttentionForward<T>& p, int64_t b, int64_t h, HeadData<T>& x) {
  Head<T>& hd = x.hd;
  hd.b = b, hd.h = h, hd.lq = p.q.shape[2], hd.lk = p.k.shape[2], hd.d = p.q.shape[3], hd.dv = p.v.shape[3];
  hd.rmin = p.k_offset - (p.q_offset + hd.lq - 1);
  const int64_t lq = hd.lq, lk = hd.lk, d = hd.d, dv = hd.dv;
  x.qc.resize(lq * d), x.k.resize(lk * d), x.v.resize(lk * dv);
  for (int64_t i = 0; i < lq; ++i)
    for (int64_t c = 0; c < d; ++c) x.qc[i * d + c] = p.q(b, h, i, c);
  for (int64_t j = 0; j < lk; ++j) {
    for (int64_t c = 0; c < d; ++c) x.k[j * d + c] = p.k(b, h, j, c);
    for (int64_t c = 0; c < dv; ++c) x.v[j * dv + c] = p.v(b, h, j, c);
  }
  const PositionParams<T>& pos = p.pos;
  if (pos.scheme == Scheme::rope) {
    x.inv_freq = rope_inv_freq(pos.rope.rotary_dims ? pos.rope.rotary_dims : d, pos.rope.base);
    for (int64_t i = 0; i < lq; ++i) rope_rotate(&x.qc[i * d], 1, double(p.q_offset + i), x.inv_freq, pos.rope.style);
    for (int64_t j = 0; j < lk; ++j) rope_rotate(&x.k[j * d], 1, double(p.k_offset + j), x.inv_freq, pos.rope.style);
  }
  hd.qp = x.qc.data();
  if (pos.scheme == Scheme::xl) {
    x.qp.resize(lq * d);
    for (int64_t i = 0; i < lq; ++i)
      for (int64_t c = 0; c < d; ++c) {
        x.qp[i * d + c] = x.qc[i * d + c] + pos.xl.v(h, c);
        x.qc[i * d + c] += pos.xl.u(h, c);
      }
    hd.qp = x.qp.data();
  }
  x.bias.clear();
  if (pos.scheme == Scheme::t5 || pos.scheme == Scheme::alibi) {
    x.bias.resize(hd.distances());
    const std::vector<double> slopes = pos.scheme == Scheme::alibi && pos.alibi.slopes.empty()
                                           ? alibi_slopes(p.q.shape[1])
                                           : std::vector<double>{};
    for (int64_t m = 0; m < hd.distances(); ++m) {
      const int64_t r = hd.rmin + m;
      if (pos.scheme == Scheme::t5) {
        x.bias[m] = pos.t5.table(h, t5_bucket(r, pos.t5.bidirectional, pos.t5.table.shape[1], pos.t5.max_distance));
      } else {
        const T slope = slopes.empty() ? pos.alibi.slopes(h) : T(slopes[h]);
        x.bias[m] = -slope * T(r < 0 ? -r : r);
      }
    }
  }
}

template <class T>
bool masked(const AttentionForward<T>& p, const Head<T>& hd, int64_t i, int64_t j) {
  return (p.causal && hd.r(i, j) > 0) || (!p.key_padding.empty() && p.key_padding(hd.b, j) != 0);
}

// S = scale * qc k^T + relative scores + bias, masked entries -inf.
template <class T>
void logits(const AttentionForward<T>& p, HeadData<T>& x, RelativeTerm<T>& term, T scale, Scratch<T>& S) {
  const Head<T>& hd = x.hd;
  S.resize(hd.lq * hd.lk);
  gemm<T>(Trans::no, Trans::yes, hd.lq, hd.lk, hd.d, scale, x.qc.data(), hd.d, x.k.data(), hd.d, T(0), S.data(),
          hd.lk);
  term.add_scores(hd, scale, S.data());
  for (int64_t i = 0; i < hd.lq; ++i)
    for (int64_t j = 0; j < hd.lk; ++j) {
      T& s = S[i * hd.lk + j];
      if (masked(p, hd, i, j))
        s = kNegInf<T>;
      else if (!x.bias.empty())
        s += x.bias[hd.diagonal(i, j)];
    }
}


// Per-thread buffers of the forward pass.
template <class T>
struct ForwardScratch {
  HeadData<T> x;
  Scratch<T> S, out;
};

template <class T>
void forward_head(const AttentionForward<T>& p, RelativeTerm<T>& term, int64_t b, int64_t h, ForwardScratch<T>& w) {
  HeadData<T>& x = w.x;
  Scratch<T>& S = w.S;
  const T scale = T(effective_scale(p));
  load_head(p, b, h, x);
  const Head<T>& hd = x.hd;
  logits(p, x, term, scale, S);
  for (int64_t i = 0; i < hd.lq; ++i) {  // softmax in place: S becomes P
    T* row = &S[i * hd.lk];
    T m = kNegInf<T>;
    for (int64_t j = 0; j < hd.lk; ++j) m = row[j] > m ? row[j] : m;
    if (m == kNegInf<T>) {  // fully masked row: P = 0, out = 0
      for (int64_t j = 0; j < hd.lk; ++j) row[j] = T(0);
      p.lse(b, h, i) = m;
      continue;
    }
    T sum = 0;
    for (int64_t j = 0; j < hd.lk; ++j) sum += (row[j] = std::exp(row[j] - m));
    for (int64_t j = 0; j < hd.lk; ++j) row[j] /= sum;
    p.lse(b, h, i) = m + std::log(sum);
  }
  w.out.resize(hd.lq * hd.dv);
  gemm<T>(Trans::no, Trans::no, hd.lq, hd.dv, hd.lk, T(1), S.data(), hd.lk, x.v.data(), hd.dv, T(0), w.out.data(),
          hd.dv);
  term.add_values(hd, S.data(), w.out.data());
  for (int64_t i = 0; i < hd.lq; ++i)
    for (int64_t c = 0; c < hd.dv; ++c) p.out(b, h, i, c) = w.out[i * hd.dv + c];
}

// Per-thread buffers of the backward pass.
template <class T>
struct BackwardScratch {
  HeadData<T> x;
  Scratch<T> P, dS, dout, dv, dqc, dqp, dk, dbias;
};

// Gradients of one head; positional parameter gradients go to g (this
// thread's partials), q, k, v gradients straight to p (heads are disjoint).
template <class T>
void backward_head(const AttentionBackward<T>& p, RelativeTerm<T>& term, const PositionGrads<T>& g, int64_t b,
                   int64_t h, BackwardScratch<T>& w) {
  const T scale = T(effective_scale(p));
  const PositionParams<T>& pos = p.pos;
  auto& [x, P, dS, dout, dv, dqc, dqp, dk, dbias] = w;
  load_head(p, b, h, x);
  const Head<T>& hd = x.hd;
  const int64_t lq = hd.lq, lk = hd.lk, d = hd.d, dvd = hd.dv;
  logits(p, x, term, scale, P);
  for (int64_t i = 0; i < lq; ++i) {  // P from the saved logsumexp
    const T lse = p.lse(b, h, i);
    for (int64_t j = 0; j < lk; ++j)
      P[i * lk + j] = lse == kNegInf<T> ? T(0) : std::exp(P[i * lk + j] - lse);
  }
  dout.resize(lq * dvd);
  for (int64_t i = 0; i < lq; ++i)
    for (int64_t c = 0; c < dvd; ++c) dout[i * dvd + c] = p.dout(b, h, i, c);
  // dP = dout (v + rv)^T, then dS = P * (dP - rowsum(dout * out))
  dS.resize(lq * lk);
  gemm<T>(Trans::no, Trans::yes, lq, lk, dvd, T(1), dout.data(), dvd, x.v.data(), dvd, T(0), dS.data(), lk);
  term.backward_values(hd, P.data(), dout.data(), dS.data());
  if (!p.dv.empty()) {
    dv.resize(lk * dvd);
    gemm<T>(Trans::yes, Trans::no, lk, dvd, lq, T(1), P.data(), lk, dout.data(), dvd, T(0), dv.data(), dvd);
    for (int64_t j = 0; j < lk; ++j)
      for (int64_t c = 0; c < dvd; ++c) p.dv(b, h, j, c) += dv[j * dvd + c];
  }
  for (int64_t i = 0; i < lq; ++i) {
    T D = 0;
    for (int64_t c = 0; c < dvd; ++c) D += dout[i * dvd + c] * p.out(b, h, i, c);
    for (int64_t j = 0; j < lk; ++j) dS[i * lk + j] = P[i * lk + j] * (dS[i * lk + j] - D);
  }
  if (!x.bias.empty()) {  // bias gradient: per distance, then per bucket / slope
    dbias.assign(hd.distances(), T(0));
    for (int64_t i = 0; i < lq; ++i)
      for (int64_t j = 0; j < lk; ++j) dbias[hd.diagonal(i, j)] += dS[i * lk + j];
    for (int64_t m = 0; m < hd.distances(); ++m) {
      const int64_t r = hd.rmin + m;
      if (pos.scheme == Scheme::t5 && !g.t5_table.empty())
        g.t5_table(h, t5_bucket(r, pos.t5.bidirectional, pos.t5.table.shape[1], pos.t5.max_distance)) += dbias[m];
      if (pos.scheme == Scheme::alibi && !g.alibi_slopes.empty()) g.alibi_slopes(h) -= dbias[m] * T(r < 0 ? -r : r);
    }
  }
  dqc.resize(lq * d), dk.resize(lk * d);
  gemm<T>(Trans::no, Trans::no, lq, d, lk, scale, dS.data(), lk, x.k.data(), d, T(0), dqc.data(), d);
  gemm<T>(Trans::yes, Trans::no, lk, d, lq, scale, dS.data(), lk, x.qc.data(), d, T(0), dk.data(), d);
  dqp.assign(lq * d, T(0));
  term.backward_scores(hd, scale, dS.data(), dqp.data());
  for (int64_t i = 0; i < lq; ++i)
    for (int64_t c = 0; c < d; ++c) {
      if (!g.xl_u.empty()) g.xl_u(h, c) += dqc[i * d + c];
      if (!g.xl_v.empty()) g.xl_v(h, c) += dqp[i * d + c];
      dqc[i * d + c] += dqp[i * d + c];
    }
  if (pos.scheme == Scheme::rope) {
    for (int64_t i = 0; i < lq; ++i)
      rope_rotate(&dqc[i * d], 1, double(p.q_offset + i), x.inv_freq, pos.rope.style, -1);
    for (int64_t j = 0; j < lk; ++j)
      rope_rotate(&dk[j * d], 1, double(p.k_offset + j), x.inv_freq, pos.rope.style, -1);
  }
  if (!p.dq.empty())
    for (int64_t i = 0; i < lq; ++i)
      for (int64_t c = 0; c < d; ++c) p.dq(b, h, i, c) += dqc[i * d + c];
  if (!p.dk.empty())
    for (int64_t j = 0; j < lk; ++j)
      for (int64_t c = 0; c < d; ++c) p.dk(b, h, j, c) += dk[j * d + c];
}

// Runs body(thread, b, h) for every (batch, head) on `threads` OpenMP threads
// (static split: the same heads go to the same thread on every call), after
// init(thread) built each thread's state. GEMMs inside run on the calling
// thread only. An exception on any thread is rethrown here, never lost.
template <class Init, class Body>
void parallel_over_heads(int64_t batch, int64_t heads, int threads, Init init, Body body) {
  std::exception_ptr error;
#pragma omp parallel num_threads(threads)
  {
    omp_set_num_threads(1);  // this thread's nested regions (the GEMM library's) stay on it
    const int t = omp_get_thread_num();
    bool ready = false;
    try {
      init(t);
      ready = true;
    } catch (...) {
#pragma omp critical(relpos_error)
      if (!error) error = std::current_exception();
    }
#pragma omp for schedule(static)
    for (int64_t bh = 0; bh < batch * heads; ++bh) {
      if (!ready) continue;
      try {
        body(t, bh / heads, bh % heads);
      } catch (...) {
#pragma omp critical(relpos_error)
        if (!error) error = std::current_exception();
      }
    }
  }
  if (error) std::rethrow_exception(error);
}

template <class T>
int thread_count(const AttentionForward<T>& p) {
  const int64_t work = p.q.shape[0] * p.q.shape[1];
  const int64_t want = p.num_threads > 0 ? p.num_threads : omp_get_max_threads();
  return static_cast<int>(std::max<int64_t>(1, std::min(want, work)));
}

}  // namespace

template <class T>
void forward(const AttentionForward<T>& p) {
  const int threads = thread_count(p);
  std::vector<std::unique_ptr<RelativeTerm<T>>> terms(threads);
  std::vector<ForwardScratch<T>> scratch(threads);
  parallel_over_heads(
      p.q.shape[0], p.q.shape[1], threads, [&](int t) { terms[t] = make_term<T>(p.algorithm, p, nullptr); },
      [&](int t, int64_t b, int64_t h) { forward_head(p, *terms[t], b, h, scratch[t]); });
}

template <class T>
void backward(const AttentionBackward<T>& p) {
  const int threads = thread_count(p);
  std::vector<std::unique_ptr<GradPartials<T>>> partials(threads);
  std::vector<std::unique_ptr<RelativeTerm<T>>> terms(threads);
  std::vector<BackwardScratch<T>> scratch(threads);
  parallel_over_heads(
      p.q.shape[0], p.q.shape[1], threads,
      [&](int t) {
        partials[t] = std::make_unique<GradPartials<T>>(p.dpos);
        terms[t] = make_term<T>(p.algorithm, p, &partials[t]->grads());
      },
      [&](int t, int64_t b, int64_t h) { backward_head(p, *terms[t], partials[t]->grads(), b, h, scratch[t]); });
  for (const auto& part : partials)  // fixed order: deterministic sums
    if (part) part->add_into(p.dpos);
}

template <class T>
std::unique_ptr<RelativeTerm<T>> make_term(Algorithm algorithm, const AttentionForward<T>& p,
                                           const PositionGrads<T>* grads) {
  const Scheme s = p.pos.scheme;
  auto unsupported = [&]() -> std::unique_ptr<RelativeTerm<T>> {
    throw std::invalid_argument(std::string("relpos: algorithm: '") + to_string(algorithm) +
                                "' does not serve scheme '" + to_string(s) + "'");
  };
  switch (algorithm) {  // each make_* checks that it serves p
    case Algorithm::gather:
      if (s == Scheme::shaw) return make_shaw_gather(p, grads);
      if (s == Scheme::xl) return unsupported();
      return std::make_unique<RelativeTerm<T>>();  // no relative embedding; biases are gathered per distance
    case Algorithm::split:
      return make_shaw_split(p, grads);
    case Algorithm::skew:
      return make_skew(p, grads);
    case Algorithm::generalized_skew:
      return make_generalized_skew(p, grads);
    case Algorithm::relshift:
      return make_relshift(p, grads);
    case Algorithm::automatic:
    case Algorithm::reference:
      break;
  }
  return unsupported();
}

template void forward<float>(const AttentionForward<float>&);
template void forward<double>(const AttentionForward<double>&);
template void backward<float>(const AttentionBackward<float>&);
template void backward<double>(const AttentionBackward<double>&);

}  // namespace relpos::unfused
