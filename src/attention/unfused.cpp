// The shared pipeline of the unfused algorithms (see unfused.hpp).
#include "unfused.hpp"

#include <algorithm>
#include <cmath>
#include <exception>
#include <limits>
#include <stdexcept>

#include "relpos/gemm.hpp"
#include "../backend/parallel.hpp"
#include "../backend/vexp.hpp"
#include "dropout_rows.hpp"
#include "grad_partials.hpp"
#include "tile_products.hpp"

namespace relpos::unfused {
namespace {

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


// The head as one tile of tile_products.hpp for the products of P and dS:
// gemm as ever, but where a causal mask hides a non-finite key or query row
// from some rows, the visible pairs only.
template <class T>
TileCut head_cut(const AttentionForward<T>& p, const Head<T>& hd) {
  return {p.causal, /*staircase=*/false, -hd.r(0, 0), hd.lk};
}

// Row i of P where its shift (maximum or logsumexp) is NaN, the row having
// seen a NaN: exp(-inf - NaN) made its masked pairs NaN too, and they are set
// to 0, so that no other row (the skews move P's entries between rows) and
// no key the row cannot see is reached from them.
template <class T>
void zero_masked_pairs(const AttentionForward<T>& p, const Head<T>& hd, int64_t i, T* row) {
  for (int64_t j = 0; j < hd.lk; ++j)
    if (masked(p, hd, i, j)) row[j] = T(0);
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
    const T m = max_of(row, hd.lk, kNegInf<T>);
    if (m == kNegInf<T>) {  // fully masked row: P = 0, out = 0
      for (int64_t j = 0; j < hd.lk; ++j) row[j] = T(0);
      p.lse(b, h, i) = m;
      continue;
    }
    const T sum = exp_shifted_sum(row, m, row, hd.lk);
    for (int64_t j = 0; j < hd.lk; ++j) row[j] /= sum;
    if (std::isnan(sum)) zero_masked_pairs(p, hd, i, row);
    p.lse(b, h, i) = m + std::log(sum);
  }
  const DropoutRows<T> dropout(p, b, h);
  if (dropout.active())  // S becomes P z, each row times its multipliers
    for (int64_t i = 0; i < hd.lq; ++i) dropout.apply(i, 0, hd.lk, &S[i * hd.lk], &S[i * hd.lk], nullptr);
  w.out.resize(hd.lq * hd.dv);
  tile_times(head_cut(p, hd), hd.lq, hd.dv, hd.lk, T(1), S.data(), x.v.data(), hd.dv, T(0), w.out.data(), hd.dv);
  term.add_values(hd, S.data(), w.out.data());
  for (int64_t i = 0; i < hd.lq; ++i)
    for (int64_t c = 0; c < hd.dv; ++c) p.out(b, h, i, c) = w.out[i * hd.dv + c];
}

// Per-thread buffers of the backward pass.
template <class T>
struct BackwardScratch {
  HeadData<T> x;
  Scratch<T> P, dS, dout, dv, dqc, dqp, dk, dbias;
  Scratch<T> Z, Pz;  // with dropout: the multipliers z and P z, (lq, lk)
};

// Gradients of one head; positional parameter gradients go to g (this
// thread's partials), q, k, v gradients straight to p (heads are disjoint).
template <class T>
void backward_head(const AttentionBackward<T>& p, RelativeTerm<T>& term, const PositionGrads<T>& g, int64_t b,
                   int64_t h, BackwardScratch<T>& w) {
  const T scale = T(effective_scale(p));
  auto& [x, P, dS, dout, dv, dqc, dqp, dk, dbias, Z, Pz] = w;
  load_head(p, b, h, x);
  const Head<T>& hd = x.hd;
  const int64_t lq = hd.lq, lk = hd.lk, d = hd.d, dvd = hd.dv;
  logits(p, x, term, scale, P);
  for (int64_t i = 0; i < lq; ++i) {  // P from the saved logsumexp
    const T lse = p.lse(b, h, i);
    if (lse == kNegInf<T>)
      std::fill(&P[i * lk], &P[i * lk] + lk, T(0));
    else
      exp_shifted_sum(&P[i * lk], lse, &P[i * lk], lk);
    if (std::isnan(lse)) zero_masked_pairs(p, hd, i, &P[i * lk]);
  }
  // The forward's output took P z (z = 1 without dropout): the values' products take it too.
  const DropoutRows<T> dropout(p, b, h);
  const T* kept = P.data();
  if (dropout.active()) {
    Z.resize(lq * lk), Pz.resize(lq * lk);
    for (int64_t i = 0; i < lq; ++i) dropout.apply(i, 0, lk, &P[i * lk], &Pz[i * lk], &Z[i * lk]);
    kept = Pz.data();
  }
  dout.resize(lq * dvd);
  for (int64_t i = 0; i < lq; ++i)
    for (int64_t c = 0; c < dvd; ++c) dout[i * dvd + c] = p.dout(b, h, i, c);
  // dP = dout (v + rv)^T, then dS = P * (z dP - rowsum(dout * out))
  dS.resize(lq * lk);
  gemm<T>(Trans::no, Trans::yes, lq, lk, dvd, T(1), dout.data(), dvd, x.v.data(), dvd, T(0), dS.data(), lk);
  term.backward_values(hd, kept, dout.data(), dS.data());
  if (dropout.active()) rows::multiply(dS.data(), Z.data(), dS.data(), lq * lk);
  dv.resize(lk * dvd);
  const TileCut cut = head_cut(p, hd);
  tile_transposed_times(cut, lq, dvd, lk, T(1), kept, lk, dout.data(), dvd, T(0), dv.data(), dvd);
  for (int64_t i = 0; i < lq; ++i) {
    T D = 0;
    for (int64_t c = 0; c < dvd; ++c) D += dout[i * dvd + c] * p.out(b, h, i, c);
    rows::softmax_grad(&P[i * lk], &dS[i * lk], D, lk);
  }
  if (!x.bias.empty() && wants_scheme_grads(p)) {  // bias gradient: per distance, then per bucket / slope
    dbias.assign(hd.distances(), T(0));
    for (int64_t i = 0; i < lq; ++i)
      for (int64_t j = 0; j < lk; ++j) dbias[hd.diagonal(i, j)] += dS[i * lk + j];
    add_bias_grad(g, x, dbias);
  }
  dqc.resize(lq * d), dk.resize(lk * d);
  tile_times(cut, lq, d, lk, scale, dS.data(), x.k.data(), d, T(0), dqc.data(), d);
  tile_transposed_times(cut, lq, d, lk, scale, dS.data(), lk, x.qc.data(), d, T(0), dk.data(), d);
  dqp.assign(lq * d, T(0));
  term.backward_scores(hd, scale, dS.data(), dqp.data());
  write_input_grads(p, x, g, dqc, dqp, dk.data(), dv.data());
}

}  // namespace

template <class T>
void forward(const AttentionForward<T>& p) {
  const int threads = thread_count(p.num_threads, p.q.shape[0] * p.q.shape[1]);
  std::vector<std::unique_ptr<RelativeTerm<T>>> terms(threads);
  std::vector<ForwardScratch<T>> scratch(threads);
  const int64_t heads = p.q.shape[1];
  parallel_for(
      p.q.shape[0] * heads, threads, [&](int t) { terms[t] = make_term<T>(p.algorithm, p, nullptr); },
      [&](int t, int64_t bh) { forward_head(p, *terms[t], bh / heads, bh % heads, scratch[t]); });
}

template <class T>
void backward(const AttentionBackward<T>& p) {
  const int threads = thread_count(p.num_threads, p.q.shape[0] * p.q.shape[1]);
  std::vector<std::unique_ptr<GradPartials<T>>> partials(threads);
  std::vector<std::unique_ptr<RelativeTerm<T>>> terms(threads);
  std::vector<BackwardScratch<T>> scratch(threads);
  const int64_t heads = p.q.shape[1];
  parallel_for(
      p.q.shape[0] * heads, threads,
      [&](int t) {
        partials[t] = std::make_unique<GradPartials<T>>(p.dpos);
        terms[t] = make_term<T>(p.algorithm, p, &partials[t]->grads());
      },
      [&](int t, int64_t bh) {
        backward_head(p, *terms[t], partials[t]->grads(), bh / heads, bh % heads, scratch[t]);
      });
  for (const auto& part : partials)  // fixed order: deterministic sums
    if (part) part->add_into(p.dpos);
}

template <class T>
std::unique_ptr<RelativeTerm<T>> make_term(Algorithm algorithm, const AttentionForward<T>& p,
                                           const PositionGrads<T>* grads) {
  switch (algorithm) {  // check_algorithm has established that `algorithm` serves p
    case Algorithm::gather:
      return make_table_gather(p, grads);  // biases are gathered per distance by the pipeline itself
    case Algorithm::split:
      return make_table_split(p, grads);
    case Algorithm::skew:
      return make_skew(p, grads);
    case Algorithm::generalized_skew:
      return make_generalized_skew(p, grads);
    case Algorithm::relshift:
      return make_relshift(p, grads);
    case Algorithm::automatic:
    case Algorithm::reference:
    case Algorithm::fused:
      break;
  }
  throw std::logic_error(std::string("relpos: unfused pipeline asked to run '") + to_string(algorithm) + "'");
}

template void forward<float>(const AttentionForward<float>&);
template void forward<double>(const AttentionForward<double>&);
template void backward<float>(const AttentionBackward<float>&);
template void backward<double>(const AttentionBackward<double>&);

}  // namespace relpos::unfused
