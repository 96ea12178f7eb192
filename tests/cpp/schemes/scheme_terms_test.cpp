// The relative terms the schemes give the kernels (src/schemes/scheme.hpp),
// each against its definition written out here: Shaw's clipped tables
// (rows, slices and their gradients, clip and zero beyond k, shared and
// per-head tables), Transformer-XL's positional keys W_R R(xl_distance(r))
// (exact double sinusoids, with and without clamp_len, more rows than the
// call's distances) and its query biases u, v; and which terms a call gets.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "../../../src/schemes/registry.hpp"
#include "relpos/position.hpp"

namespace relpos {
namespace {

std::vector<double> random_values(int64_t n, unsigned seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<double> normal;
  std::vector<double> x(n);
  for (double& e : x) e = normal(rng);
  return x;
}

// A call's geometry: H heads, Lq queries at q_offset, Lk keys, head size d;
// only shapes and offsets matter to the terms (no tensor data is read).
struct Call {
  AttentionForward<double> p;
  explicit Call(int64_t H, int64_t Lq, int64_t Lk, int64_t d, int64_t q_offset) {
    p.q = View4<const double>::contiguous(nullptr, {1, H, Lq, d});
    p.k = View4<const double>::contiguous(nullptr, {1, H, Lk, d});
    p.v = View4<const double>::contiguous(nullptr, {1, H, Lk, d});
    p.q_offset = q_offset;
  }
  int64_t rmin() const { return p.k_offset - (p.q_offset + p.q.shape[2] - 1); }
};

TEST(SchemeTerms, ShawTablesReadAndReduceTheirRowsByClippedDistance) {
  const int64_t H = 3, d = 4, k = 2, rows = 2 * k + 1;
  for (Beyond beyond : {Beyond::clip, Beyond::zero})
    for (int64_t table_heads : {int64_t(1), H}) {
      Call call(H, 5, 7, d, 3);
      const std::vector<double> wk = random_values(table_heads * rows * d, 1);
      call.p.pos.scheme = Scheme::shaw;
      call.p.pos.shaw.k = k, call.p.pos.shaw.beyond = beyond;
      call.p.pos.shaw.wk = View3<const double>::contiguous(wk.data(), {table_heads, rows, d});
      const auto keys = make_key_embedding(call.p);
      ASSERT_TRUE(keys && keys->clipped());
      EXPECT_EQ(make_value_embedding(call.p), nullptr) << "K-only: no value table";
      const int64_t n = keys->count() + 3;  // past the call's distances too
      std::vector<double> E(n * d), dE = random_values(n * d, 2);
      std::vector<double> grad(table_heads * rows * d, 0.0), want(grad.size(), 0.0);
      PositionGrads<double> g;
      g.shaw_wk = View3<double>::contiguous(grad.data(), {table_heads, rows, d});
      for (int64_t h = 0; h < H; ++h) {
        const int64_t ht = table_heads == 1 ? 0 : h;
        keys->rows(h, n, E.data());
        keys->add_rows_grad(g, h, n, dE.data());
        for (int64_t m = 0; m < n; ++m) {
          const int64_t r = call.rmin() + m;
          int64_t c = std::min(std::max(r, -k), k) + k;
          if (beyond == Beyond::zero && std::abs(r) > k) c = -1;
          for (int64_t x = 0; x < d; ++x) {
            EXPECT_EQ(E[m * d + x], c < 0 ? 0.0 : wk[(ht * rows + c) * d + x]) << "r " << r;
            if (c >= 0) want[(ht * rows + c) * d + x] += dE[m * d + x];
          }
        }
      }
      for (std::size_t e = 0; e < grad.size(); ++e) EXPECT_NEAR(grad[e], want[e], 1e-12);
      // The dense slice and its gradient, as the gather and the fused kernel read them.
      const ClippedTable<double>& table = *keys->clipped();
      std::vector<double> slice(rows * d), dslice = random_values(rows * d, 3), before = grad;
      table.slice(H - 1, slice.data());
      table.add_slice_grad(g, H - 1, dslice.data());
      const int64_t last = table_heads == 1 ? 0 : H - 1;
      for (int64_t e = 0; e < rows * d; ++e) {
        EXPECT_EQ(slice[e], wk[last * rows * d + e]);
        EXPECT_EQ(grad[last * rows * d + e], before[last * rows * d + e] + dslice[e]);
      }
    }
}

TEST(SchemeTerms, TransformerXLKeysAreWRTimesExactSinusoids) {
  const int64_t H = 2, d = 3, pos_dim = 6;
  for (int64_t clamp_len : {0, 4}) {
    Call call(H, 6, 9, d, 3);
    const std::vector<double> w_r = random_values(H * d * pos_dim, 4), u = random_values(H * d, 5),
                              v = random_values(H * d, 6);
    call.p.pos.scheme = Scheme::xl;
    call.p.pos.xl.u = View2<const double>::contiguous(u.data(), {H, d});
    call.p.pos.xl.v = View2<const double>::contiguous(v.data(), {H, d});
    call.p.pos.xl.w_r = View3<const double>::contiguous(w_r.data(), {H, d, pos_dim});
    call.p.pos.xl.clamp_len = clamp_len;
    const auto keys = make_key_embedding(call.p);
    ASSERT_TRUE(keys);
    EXPECT_EQ(keys->clipped(), nullptr) << "a row per distance";
    EXPECT_EQ(make_value_embedding(call.p), nullptr);
    for (int64_t n : {keys->count(), keys->count() + 5}) {
      std::vector<double> E(n * d), dE = random_values(n * d, 7), grad(H * d * pos_dim, 0.0),
                                    want(grad.size(), 0.0), R(pos_dim);
      PositionGrads<double> g;
      g.xl_w_r = View3<double>::contiguous(grad.data(), {H, d, pos_dim});
      for (int64_t h = 0; h < H; ++h) {
        keys->rows(h, n, E.data());
        keys->add_rows_grad(g, h, n, dE.data());
        for (int64_t m = 0; m < n; ++m) {
          sinusoid(double(xl_distance(call.rmin() + m, clamp_len)), pos_dim, R.data());
          for (int64_t x = 0; x < d; ++x) {
            double e = 0;
            for (int64_t c = 0; c < pos_dim; ++c) {
              e += w_r[(h * d + x) * pos_dim + c] * R[c];
              want[(h * d + x) * pos_dim + c] += dE[m * d + x] * R[c];
            }
            EXPECT_NEAR(E[m * d + x], e, 1e-12) << "clamp " << clamp_len << " m " << m;
          }
        }
      }
      for (std::size_t e = 0; e < grad.size(); ++e) EXPECT_NEAR(grad[e], want[e], 1e-11);
    }
    // u and v: qc = q + u, qp = q + v; their gradients sum dqc, dqp over the rows.
    const auto biases = make_query_bias(call.p);
    ASSERT_TRUE(biases);
    const int64_t lq = 4, h = 1;
    const std::vector<double> q = random_values(lq * d, 8), dqc = random_values(lq * d, 9),
                              dqp = random_values(lq * d, 10);
    std::vector<double> qc = q, qp(lq * d), du(H * d, 0.0), dv(H * d, 0.0);
    biases->apply(h, lq, d, qc.data(), qp.data());
    PositionGrads<double> g;
    g.xl_u = View2<double>::contiguous(du.data(), {H, d});
    g.xl_v = View2<double>::contiguous(dv.data(), {H, d});
    biases->add_grad(g, h, lq, d, dqc.data(), dqp.data());
    for (int64_t x = 0; x < d; ++x) {
      double su = 0, sv = 0;
      for (int64_t i = 0; i < lq; ++i) {
        EXPECT_EQ(qc[i * d + x], q[i * d + x] + u[h * d + x]);
        EXPECT_EQ(qp[i * d + x], q[i * d + x] + v[h * d + x]);
        su += dqc[i * d + x], sv += dqp[i * d + x];
      }
      EXPECT_NEAR(du[h * d + x], su, 1e-12);
      EXPECT_NEAR(dv[h * d + x], sv, 1e-12);
      EXPECT_EQ(du[x], 0.0) << "head 0 untouched";
    }
  }
}

TEST(SchemeTerms, EachCallGetsTheTermsOfItsScheme) {
  Call call(2, 3, 3, 4, 0);
  const std::vector<double> table(2 * 8);
  call.p.pos.scheme = Scheme::t5;
  call.p.pos.t5.table = View2<const double>::contiguous(table.data(), {2, 8});
  EXPECT_NE(make_distance_bias(call.p), nullptr);
  EXPECT_EQ(make_key_embedding(call.p), nullptr);
  EXPECT_EQ(make_value_embedding(call.p), nullptr);
  EXPECT_EQ(make_query_bias(call.p), nullptr);
  EXPECT_EQ(make_rotation(call.p), nullptr);
  call.p.pos.scheme = Scheme::rope;
  EXPECT_NE(make_rotation(call.p), nullptr);
  EXPECT_EQ(make_distance_bias(call.p), nullptr);
  // Shaw V-only: a value table and no key table.
  const std::vector<double> wv(3 * 4);
  call.p.pos.scheme = Scheme::shaw;
  call.p.pos.shaw.k = 1;
  call.p.pos.shaw.wv = View3<const double>::contiguous(wv.data(), {1, 3, 4});
  EXPECT_EQ(make_key_embedding(call.p), nullptr);
  const auto values = make_value_embedding(call.p);
  ASSERT_TRUE(values && values->clipped());
  EXPECT_EQ(values->clipped()->table_rows(), 3);
  // The options that are not tensors travel between element types.
  PositionParams<float> wide;
  call.p.pos.shaw.beyond = Beyond::zero;
  copy_scheme_options(call.p.pos, wide);
  EXPECT_EQ(wide.scheme, Scheme::shaw);
  EXPECT_EQ(wide.shaw.k, 1);
  EXPECT_EQ(wide.shaw.beyond, Beyond::zero);
  EXPECT_TRUE(wide.shaw.wv.empty()) << "tensors are not copied";
}

}  // namespace
}  // namespace relpos
