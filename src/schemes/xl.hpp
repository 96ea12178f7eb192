// Transformer-XL (Dai et al. 2019): a content bias u added to the query, and a
// per-distance key embedding W_R R(-r) (R the sinusoid, clamped at clamp_len)
// read by q + v. Memory is expressed by the offsets.
#pragma once

#include <algorithm>
#include <cmath>
#include <vector>

#include "../backend/parallel.hpp"
#include "../backend/row_ops.hpp"
#include "../backend/scratch.hpp"
#include "checks.hpp"
#include "relpos/gemm.hpp"
#include "scheme.hpp"

namespace relpos {

struct XLScheme {
  static constexpr Scheme id = Scheme::xl;
  static constexpr const char* name = "xl";
  static constexpr AlgorithmSet algorithms = {Algorithm::reference, Algorithm::generalized_skew, Algorithm::relshift,
                                              Algorithm::fused};

  template <class Params, class F, class... Grads>
  static void for_each_param(Params& pos, F&& f, Grads&... g) {
    f("xl_u", pos.xl.u, g.xl_u...);
    f("xl_v", pos.xl.v, g.xl_v...);
    f("xl_w_r", pos.xl.w_r, g.xl_w_r...);
  }

  static void check_model(const SchemeModelConfig& c) {
    if (c.width % 2 != 0) model_config_error("width", "Transformer-XL's sinusoid needs an even width, got " + std::to_string(c.width));
  }

  // The model: u, v shared by all layers, W_R per layer, a sinusoid of size
  // width; no absolute embeddings.
  template <class T>
  static std::vector<ModelTensor> model(PositionParams<T>&, const SchemeModelConfig& c) {
    const int64_t dh = c.width / c.heads;
    return {{"xl_u", {c.heads, dh}, true}, {"xl_v", {c.heads, dh}, true}, {"xl_w_r", {c.heads, dh, c.width}}};
  }

  // Its options other than tensors, each once: f(its SchemeOption, the member of each of pos...).
  template <class F, class... Params>
  static void for_each_option(F&& f, Params&... pos) {
    f(SchemeOption{
          .name = "xl_clamp_len", .member = "xl.clamp_len", .low = 0, .high = kMaxPosition, .note = "0 = unclamped"},
      pos.xl.clamp_len...);
  }

  // The positional keys W_R[h] R(xl_distance(r)), a row per distance; the
  // sinusoids R of the call's distances are made once, with the call.
  template <class T>
  class KeyEmbedding final : public DistanceEmbedding<T> {
   public:
    explicit KeyEmbedding(const AttentionForward<T>& p)
        : DistanceEmbedding<T>(p, p.q.shape[3]),
          xl_(p.pos.xl),
          R_(sinusoids(xl_, this->rmin(), this->count(), thread_count(p.num_threads, this->count()))) {}

    void rows(int64_t h, int64_t n, T* E) const override {  // E = R W_R^T
      Scratch<T> own;
      const Scratch<T>& R = sinusoids_of(n, own);
      const std::vector<T> w = dense_w_r(h);
      const int64_t d = this->width(), pd = pos_dim();
      gemm<T>(Trans::no, Trans::yes, n, d, pd, T(1), R.data(), pd, w.data(), pd, T(0), E, d);
    }
    void add_rows_grad(const PositionGrads<T>& g, int64_t h, int64_t n, const T* dE) const override {
      if (g.xl_w_r.empty()) return;
      Scratch<T> own;
      const Scratch<T>& R = sinusoids_of(n, own);
      const int64_t d = this->width(), pd = pos_dim();
      std::vector<T> dW(d * pd);  // dE^T R
      gemm<T>(Trans::yes, Trans::no, d, pd, n, T(1), dE, d, R.data(), pd, T(0), dW.data(), pd);
      for (int64_t x = 0; x < d; ++x)
        for (int64_t e = 0; e < pd; ++e) g.xl_w_r(h, x, e) += dW[x * pd + e];
    }

    // (n, pos_dim) sinusoids R(xl_distance(rmin + m)), m < n, on `threads`
    // threads. Consecutive rows differ by one position (or none, where
    // clamped), so a row follows from the one before by the angle-addition
    // formulas in double; every kAnchorRows-th row is computed exactly, which
    // keeps the error within ~1e-14 and lets chunks of rows run in parallel.
    // Exact sin and cos for every entry cost more than the attention itself
    // at pos_dim 512.
    static Scratch<T> sinusoids(const XLParams<T>& xl, int64_t rmin, int64_t n, int threads) {
      constexpr int64_t kAnchorRows = 32;
      const int64_t pd = xl.w_r.shape[2], half = pd / 2;
      Scratch<T> R(n * pd);
      const std::vector<double> inv_freq = sinusoid_inv_freq(pd);
      std::vector<double> step_sin(half), step_cos(half);
      for (int64_t i = 0; i < half; ++i) step_sin[i] = std::sin(inv_freq[i]), step_cos[i] = std::cos(inv_freq[i]);
      const auto distance = [&](int64_t m) { return xl_distance(rmin + m, xl.clamp_len); };
      const int64_t chunks = (n + kAnchorRows - 1) / kAnchorRows;
      parallel_for(
          chunks, std::max(1, std::min<int>(threads, int(chunks))), [](int) {},
          [&](int, int64_t chunk) {
            std::vector<double> sn(half), cs(half);
            const int64_t first = chunk * kAnchorRows, last = std::min(n, first + kAnchorRows);
            for (int64_t m = first; m < last; ++m) {
              const int64_t step = m == first ? 0 : distance(m) - distance(m - 1);
              if (m == first || (step != 0 && step != 1 && step != -1)) {
                for (int64_t i = 0; i < half; ++i) {
                  const double angle = double(distance(m)) * inv_freq[i];
                  sn[i] = std::sin(angle), cs[i] = std::cos(angle);
                }
              } else if (step != 0) {  // sin(a +- b), cos(a +- b)
                const double sign = double(step);
                for (int64_t i = 0; i < half; ++i) {
                  const double s0 = sn[i], c0 = cs[i];
                  sn[i] = s0 * step_cos[i] + sign * c0 * step_sin[i];
                  cs[i] = c0 * step_cos[i] - sign * s0 * step_sin[i];
                }
              }
              T* row = &R[m * pd];
              for (int64_t i = 0; i < half; ++i) row[i] = T(sn[i]), row[half + i] = T(cs[i]);
            }
          });
      return R;
    }

   private:
    int64_t pos_dim() const { return xl_.w_r.shape[2]; }
    // The sinusoids of the first n distances: the call's (whose first rows
    // they are) when n does not pass them, else made in `own`.
    const Scratch<T>& sinusoids_of(int64_t n, Scratch<T>& own) const {
      if (n <= this->count()) return R_;
      own = sinusoids(xl_, this->rmin(), n, 1);
      return own;
    }
    std::vector<T> dense_w_r(int64_t h) const {
      const int64_t d = this->width(), pd = pos_dim();
      std::vector<T> w(d * pd);
      for (int64_t x = 0; x < d; ++x)
        for (int64_t e = 0; e < pd; ++e) w[x * pd + e] = xl_.w_r(h, x, e);
      return w;
    }

    XLParams<T> xl_;
    Scratch<T> R_;  // (count, pos_dim), counted: it grows with the lengths
  };

  // u and v: q + u multiplies the keys, q + v the positional keys.
  template <class T>
  class QueryBias final : public QueryBiases<T> {
   public:
    explicit QueryBias(const AttentionForward<T>& p) : xl_(p.pos.xl) {}
    void apply(int64_t h, int64_t lq, int64_t d, T* qc, T* qp) const override {
      for (int64_t i = 0; i < lq; ++i)
        for (int64_t c = 0; c < d; ++c) {
          qp[i * d + c] = qc[i * d + c] + xl_.v(h, c);
          qc[i * d + c] += xl_.u(h, c);
        }
    }
    void add_grad(const PositionGrads<T>& g, int64_t h, int64_t lq, int64_t d, const T* dqc,
                  const T* dqp) const override {
      // Column sums of the (lq, d) gradient, a vector pass per row, then one add per parameter entry.
      const auto add_column_sums = [&](const View2<T>& grad, const T* rows) {
        if (grad.empty()) return;
        std::vector<T> sum(d, T(0));
        for (int64_t i = 0; i < lq; ++i) rows::add_scaled(sum.data(), rows + i * d, T(1), d);
        for (int64_t c = 0; c < d; ++c) grad(h, c) += sum[c];
      };
      add_column_sums(g.xl_u, dqc);
      add_column_sums(g.xl_v, dqp);
    }

   private:
    XLParams<T> xl_;
  };

  template <class T>
  static EmbeddingSizes embedding_sizes(const AttentionForward<T>& p) {
    return {.key_width = p.q.shape[3], .per_distance = p.pos.xl.w_r.shape[2]};
  }

  template <class T>
  static void check(const AttentionForward<T>& p) {
    using namespace checks;
    const XLParams<T>& x = p.pos.xl;
    const int64_t H = p.q.shape[1], d = p.q.shape[3];
    const std::string hd = "(" + dims("H", H) + ", " + dims("d", d) + ")";
    check_shape("xl.u", x.u, {H, d}, hd);
    check_shape("xl.v", x.v, {H, d}, hd);
    check_shape("xl.w_r", x.w_r, {H, d, -1}, "(" + dims("H", H) + ", " + dims("d", d) + ", pos_dim)");
    if (x.w_r.shape[2] % 2 != 0) fail("xl.w_r: pos_dim (last dimension) must be even for [sin, cos]");
  }
};

template <>
struct SchemeOf<Scheme::xl> : std::type_identity<XLScheme> {};

}  // namespace relpos
