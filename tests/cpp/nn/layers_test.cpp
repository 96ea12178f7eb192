// Every layer of the model against central differences in double: the
// objective is f = sum(G * out) for a random G, the analytic gradients come
// from the layer's backward into buffers pre-filled with kGradFill: parameter
// gradients must be added to it, the input gradients of linear, GELU and the
// cross-entropy written over it (the model never zeroes those buffers).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "../../../src/nn/attention_layer.hpp"
#include "../../../src/nn/cross_entropy.hpp"
#include "../../../src/nn/embedding.hpp"
#include "../../../src/nn/gelu.hpp"
#include "../../../src/nn/layer_norm.hpp"
#include "../../../src/nn/linear.hpp"
#include "../../../src/nn/row_loop.hpp"
#include "nn/checks.hpp"

using namespace relpos;
using namespace relpos::nn;
using namespace relpos_nn_test;

namespace {

double dot(const std::vector<double>& a, const std::vector<double>& b) {
  double s = 0;
  for (std::size_t i = 0; i < a.size(); ++i) s += a[i] * b[i];
  return s;
}

std::vector<double> filled(std::size_t n) { return std::vector<double>(n, kGradFill); }

std::function<double(int64_t)> minus_fill(const std::vector<double>& g) {
  return [&g](int64_t c) { return g[c] - kGradFill; };
}

// The gradient a backward wrote over the fill.
std::function<double(int64_t)> written(const std::vector<double>& g) {
  return [&g](int64_t c) { return g[c]; };
}

std::vector<int64_t> all_of(const std::vector<double>& v) { return coordinates(v.size(), 0, 1 << 20); }

}  // namespace

TEST(NnLayers, LayerNormMatchesCentralDifferences) {
  const int64_t n = 3, w = 5;
  std::vector<double> x = random_values(n * w, 1, 2.0), gamma = random_values(w, 2), beta = random_values(w, 3);
  const std::vector<double> g = random_values(n * w, 4);
  std::vector<double> out(n * w), mean(n), rstd(n);
  auto f = [&] {
    layer_norm_forward(x.data(), gamma.data(), beta.data(), n, w, out.data(), mean.data(), rstd.data(), 1);
    return dot(g, out);
  };
  f();
  std::vector<double> dx = filled(n * w), dgamma = filled(w), dbeta = filled(w);
  layer_norm_backward(g.data(), x.data(), gamma.data(), mean.data(), rstd.data(), n, w, dx.data(), dgamma.data(),
                      dbeta.data(), 1);
  EXPECT_TRUE(matches_central_differences("x", x.data(), all_of(x), minus_fill(dx), f));
  EXPECT_TRUE(matches_central_differences("gamma", gamma.data(), all_of(gamma), minus_fill(dgamma), f));
  EXPECT_TRUE(matches_central_differences("beta", beta.data(), all_of(beta), minus_fill(dbeta), f));
}

TEST(NnLayers, LayerNormNormalisesEachRow) {
  const int64_t n = 2, w = 6;
  const std::vector<double> x = random_values(n * w, 5, 3.0), ones(w, 1.0), zeros(w, 0.0);
  std::vector<double> out(n * w), mean(n), rstd(n);
  layer_norm_forward(x.data(), ones.data(), zeros.data(), n, w, out.data(), mean.data(), rstd.data(), 1);
  for (int64_t r = 0; r < n; ++r) {
    double s = 0, sq = 0;
    for (int64_t c = 0; c < w; ++c) s += out[r * w + c], sq += out[r * w + c] * out[r * w + c];
    EXPECT_NEAR(s / w, 0.0, 1e-12);
    EXPECT_NEAR(sq / w, 1.0, 1e-4);  // eps = 1e-5 inside the root
  }
}

TEST(NnLayers, LinearMatchesCentralDifferencesAndDefinition) {
  const int64_t n = 3, in = 4, out_dim = 5;
  std::vector<double> x = random_values(n * in, 6), weight = random_values(out_dim * in, 7),
                      bias = random_values(out_dim, 8);
  const std::vector<double> g = random_values(n * out_dim, 9);
  std::vector<double> y(n * out_dim), seen(n * out_dim);
  std::vector<int> epilogue_calls(n, 0);
  auto f = [&] {
    linear_forward<double>({x.data()}, {weight.data()}, bias.data(), n, in, out_dim, y.data(), 1, false,
                           [&](int64_t r, double* row) {
                             // row r, in place, the bias already added
                             EXPECT_EQ(row, y.data() + r * out_dim);
                             std::copy_n(row, out_dim, seen.data() + r * out_dim);
                             ++epilogue_calls[r];
                           });
    return dot(g, y);
  };
  f();
  // y[r, o] = sum_i x[r, i] W[o, i] + b[o], the torch.nn.Linear convention.
  for (int64_t r = 0; r < n; ++r) {
    EXPECT_EQ(epilogue_calls[r], 1) << "row " << r;
    for (int64_t o = 0; o < out_dim; ++o) {
      double e = bias[o];
      for (int64_t i = 0; i < in; ++i) e += x[r * in + i] * weight[o * in + i];
      EXPECT_NEAR(y[r * out_dim + o], e, 1e-12);
    }
  }
  EXPECT_EQ(seen, y);
  std::vector<double> dx = filled(n * in), dw = filled(out_dim * in), db = filled(out_dim);
  linear_backward<double>({g.data()}, {x.data()}, {weight.data()}, n, in, out_dim, dx.data(), dw.data(), db.data());
  EXPECT_TRUE(matches_central_differences("x", x.data(), all_of(x), written(dx), f));
  EXPECT_TRUE(matches_central_differences("weight", weight.data(), all_of(weight), minus_fill(dw), f));
  EXPECT_TRUE(matches_central_differences("bias", bias.data(), all_of(bias), minus_fill(db), f));
}

TEST(NnLayers, GeluMatchesCentralDifferences) {
  const int64_t rows = 2, row = 7;
  std::vector<double> x = random_values(rows * row, 10, 2.0);
  const std::vector<double> g = random_values(rows * row, 11);
  std::vector<double> y(rows * row);
  auto f = [&] {
    gelu_row(x.data(), y.data(), static_cast<double*>(nullptr), rows * row);
    return dot(g, y);
  };
  // The training forward's slope, written over a copy of x (in place, as
  // the model keeps it); the backward multiplies by it.
  std::vector<double> slope = x, y_too(rows * row), dx = filled(rows * row);
  gelu_row(slope.data(), y_too.data(), slope.data(), rows * row);
  gelu_backward_row(slope.data(), g.data(), dx.data(), rows * row);
  f();
  EXPECT_EQ(y_too, y);
  EXPECT_TRUE(matches_central_differences("x", x.data(), all_of(x), written(dx), f));
}

// float GELU (polynomial erf) against the double one (std::erf) over the range
// activations reach, value and derivative.
TEST(NnLayers, FloatGeluWithinFloatResolutionOfDouble) {
  const int64_t n = 4001;
  std::vector<float> xf(n), yf(n), ones(n, 1.0f), dxf(n, 0.0f);
  std::vector<double> xd(n), yd(n), onesd(n, 1.0), dxd(n, 0.0);
  for (int64_t i = 0; i < n; ++i) xd[i] = xf[i] = -10.0f + 20.0f * i / (n - 1);
  std::vector<float> slope_f(n);
  std::vector<double> slope_d(n);
  gelu_row(xf.data(), yf.data(), slope_f.data(), n);
  gelu_row(xd.data(), yd.data(), slope_d.data(), n);
  gelu_backward_row(slope_f.data(), ones.data(), dxf.data(), n);
  gelu_backward_row(slope_d.data(), onesd.data(), dxd.data(), n);
  for (int64_t i = 0; i < n; ++i) {
    EXPECT_NEAR(yf[i], yd[i], 4e-7 * (1 + std::abs(xd[i]))) << "x = " << xd[i];
    EXPECT_NEAR(dxf[i], dxd[i], 1e-6 * (1 + std::abs(xd[i]))) << "x = " << xd[i];
  }
  EXPECT_NEAR(yd[n / 2 + 200], 1.0 * 0.5 * (1 + std::erf(1.0 / std::sqrt(2.0))), 1e-12);  // x = 1
}

// Scale 1 (learned positions) and a scale of sqrt(width)'s kind (the byte
// embedding under sinusoidal positions), forward and gradient.
TEST(NnLayers, EmbeddingGathersAddsAndScattersGradients) {
  const int64_t rows = 6, w = 3, n = 4;
  std::vector<double> table = random_values(rows * w, 12);
  const std::vector<int32_t> index = {1, 4, 1, 0};
  const std::vector<double> g = random_values(n * w, 13), base = random_values(n * w, 14);
  for (double scale : {1.0, 1.7}) {
    std::vector<double> out(n * w);
    auto f = [&] {
      out = base;
      embedding_forward(table.data(), w, index.data(), n, out.data(), true, 1, scale);
      return dot(g, out);
    };
    f();
    for (int64_t r = 0; r < n; ++r)
      for (int64_t c = 0; c < w; ++c)
        EXPECT_DOUBLE_EQ(out[r * w + c], base[r * w + c] + scale * table[index[r] * w + c]) << "scale " << scale;
    std::vector<double> dtable = filled(rows * w);
    embedding_backward(g.data(), w, index.data(), n, dtable.data(), scale);
    // Rows 2, 3, 5 are never looked up: their gradient stays at the fill.
    EXPECT_TRUE(matches_central_differences("table", table.data(), {0, 1, 2, 3, 4, 5, 12, 13, 14}, minus_fill(dtable), f))
        << "scale " << scale;
    for (int64_t c : {6, 7, 8, 9, 10, 11, 15, 16, 17}) EXPECT_EQ(dtable[c], kGradFill);
  }
}

TEST(NnLayers, CrossEntropyMatchesCentralDifferencesAndHandValue) {
  const int64_t n = 4, classes = 6;
  std::vector<double> logits = random_values(n * classes, 15, 2.0);
  const std::vector<uint8_t> targets = {0, 5, 2, 2};
  const std::vector<double> weight = {0.5, 0.0, 0.25, 1.0};
  auto f = [&] { return cross_entropy_forward(logits.data(), targets.data(), weight.data(), n, classes); };
  std::vector<double> d = filled(n * classes);
  cross_entropy_backward(logits.data(), targets.data(), weight.data(), n, classes, d.data(), 1);
  EXPECT_TRUE(matches_central_differences("logits", logits.data(), all_of(logits), written(d), f));
  const std::vector<double> uniform(classes, 3.0), one = {1.0};
  EXPECT_NEAR(cross_entropy_forward(uniform.data(), targets.data(), one.data(), 1, classes), std::log(6.0), 1e-12);
}

// The residual sum (the out- and down-projections' epilogue).
TEST(NnLayers, ResidualPassesGradientToBothPaths) {
  const int64_t n = 5;
  std::vector<double> skip = random_values(n, 16), branch = random_values(n, 17);
  const std::vector<double> g = random_values(n, 18);
  auto f = [&] {
    std::vector<double> out = branch;
    add_row(out.data(), skip.data(), n);
    return dot(g, out);
  };
  // Both receive dout itself (the model's backward relies on it).
  EXPECT_TRUE(matches_central_differences("skip", skip.data(), all_of(skip), [&](int64_t c) { return g[c]; }, f));
  EXPECT_TRUE(matches_central_differences("branch", branch.data(), all_of(branch),
                                          [&](int64_t c) { return g[c]; }, f));
}

// The attention layer with a memory in front: gradients of the projection
// output (queries, current keys and values) and of the Shaw tables; the
// memory is constant.
TEST(NnLayers, AttentionLayerWithMemoryMatchesCentralDifferences) {
  AttentionShape s{2, 3, 2, 2, 4};
  const int64_t n = s.batch * s.length, w = s.width(), key_size = s.batch * s.heads * s.keys() * s.head_dim;
  const int64_t k = 2, rows = 2 * k + 1;
  std::vector<double> qkv = random_values(n * 3 * w, 19), memory_k = random_values(key_size, 20),
                      memory_v = random_values(key_size, 21), wk = random_values(rows * s.head_dim, 22),
                      wv = random_values(rows * s.head_dim, 23);
  const std::vector<double> g = random_values(n * w, 24);
  std::vector<double> keys(key_size), values(key_size), out(n * w), lse(s.batch * s.heads * s.length);
  AttentionLayerArgs<double> a;
  a.shape = s;
  a.qkv = qkv.data(), a.keys = keys.data(), a.values = values.data(), a.out = out.data(), a.lse = lse.data();
  a.q_offset = 7, a.k_offset = 5;
  a.pos.scheme = Scheme::shaw;
  a.pos.shaw.k = k;
  a.pos.shaw.wk = View3<const double>::contiguous(wk.data(), {1, rows, s.head_dim});
  a.pos.shaw.wv = View3<const double>::contiguous(wv.data(), {1, rows, s.head_dim});
  auto f = [&] {
    keys = memory_k, values = memory_v;  // memory rows first; current rows overwritten below
    copy_current_keys(qkv.data(), s, 1, keys.data());
    copy_current_keys(qkv.data(), s, 2, values.data());
    attention_layer_forward(a);
    return dot(g, out);
  };
  f();
  std::vector<double> dqkv = filled(n * 3 * w), dwk = filled(wk.size()), dwv = filled(wv.size());
  PositionGrads<double> dpos;
  dpos.shaw_wk = View3<double>::contiguous(dwk.data(), {1, rows, s.head_dim});
  dpos.shaw_wv = View3<double>::contiguous(dwv.data(), {1, rows, s.head_dim});
  attention_layer_backward(a, g.data(), dqkv.data(), dpos);
  EXPECT_TRUE(matches_central_differences("qkv", qkv.data(), all_of(qkv), minus_fill(dqkv), f));
  EXPECT_TRUE(matches_central_differences("shaw.wk", wk.data(), all_of(wk), minus_fill(dwk), f));
  EXPECT_TRUE(matches_central_differences("shaw.wv", wv.data(), all_of(wv), minus_fill(dwv), f));
}

// Without memory the views point straight into qkv; RoPE uses the offsets.
TEST(NnLayers, AttentionLayerStridedViewsMatchCentralDifferences) {
  AttentionShape s{2, 4, 0, 2, 4};
  const int64_t n = s.batch * s.length, w = s.width();
  std::vector<double> qkv = random_values(n * 3 * w, 25);
  const std::vector<double> g = random_values(n * w, 26);
  std::vector<double> out(n * w), lse(s.batch * s.heads * s.length);
  AttentionLayerArgs<double> a;
  a.shape = s;
  a.qkv = qkv.data(), a.out = out.data(), a.lse = lse.data();
  a.q_offset = a.k_offset = 3;
  a.pos.scheme = Scheme::rope;
  auto f = [&] {
    attention_layer_forward(a);
    return dot(g, out);
  };
  f();
  // The first query of each row sees only its own key: out = v there.
  for (int64_t b = 0; b < s.batch; ++b)
    for (int64_t c = 0; c < w; ++c) EXPECT_NEAR(out[b * s.length * w + c], qkv[b * s.length * 3 * w + 2 * w + c], 1e-12);
  std::vector<double> dqkv = filled(n * 3 * w);
  attention_layer_backward<double>(a, g.data(), dqkv.data(), {});
  EXPECT_TRUE(matches_central_differences("qkv", qkv.data(), all_of(qkv), minus_fill(dqkv), f));
}
