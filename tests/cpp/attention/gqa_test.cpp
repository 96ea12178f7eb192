// Grouped-query attention in the C++ API: k and v with Hkv heads equal, in
// double, multi-head attention on k and v repeated per query head, with dk and
// dv the sums of that call's gradients over each group, with dropout too (its
// mask is keyed by the query head) (multi-head attention
// is checked against the oracle everywhere else). Sizes span several tiles; the
// Python suite checks every scheme and algorithm against the torch oracle.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <utility>
#include <vector>

#include "relpos/attention.hpp"

namespace {

using namespace relpos;

constexpr int64_t B = 2, H = 4, L = 150, D = 8;

std::vector<double> random(int64_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> normal;
  std::vector<double> x(static_cast<size_t>(n));
  for (double& v : x) v = normal(rng);
  return x;
}

struct Result {
  std::vector<double> out, dq, dk, dv;
};

// Forward and backward with k, v of `hkv` heads, dropout at probability
// `dropout` (its mask keyed by query head); dout fixed.
Result run(Algorithm algorithm, Scheme scheme, int64_t hkv, const std::vector<double>& q, const std::vector<double>& k,
           const std::vector<double>& v, int threads, double dropout) {
  Result r{std::vector<double>(B * H * L * D), std::vector<double>(B * H * L * D, 0.0),
           std::vector<double>(B * hkv * L * D, 0.0), std::vector<double>(B * hkv * L * D, 0.0)};
  std::vector<double> lse(B * H * L);
  const std::vector<double> dout = random(B * H * L * D, 99);
  AttentionBackward<double> p;
  p.q = View4<const double>::contiguous(q.data(), {B, H, L, D});
  p.k = View4<const double>::contiguous(k.data(), {B, hkv, L, D});
  p.v = View4<const double>::contiguous(v.data(), {B, hkv, L, D});
  p.out = View4<double>::contiguous(r.out.data(), {B, H, L, D});
  p.lse = View3<double>::contiguous(lse.data(), {B, H, L});
  p.causal = true;
  p.pos.scheme = scheme;
  p.dropout = {dropout, 0xabcdef, 3, 0};
  p.algorithm = algorithm;
  p.num_threads = threads;
  attention_forward<double>(p);
  p.dout = View4<const double>::contiguous(dout.data(), {B, H, L, D});
  p.dq = View4<double>::contiguous(r.dq.data(), {B, H, L, D});
  p.dk = View4<double>::contiguous(r.dk.data(), {B, hkv, L, D});
  p.dv = View4<double>::contiguous(r.dv.data(), {B, hkv, L, D});
  attention_backward<double>(p);
  return r;
}

// x (B, hkv, L, D) with every head repeated `group` times: (B, hkv * group, L, D).
std::vector<double> repeat_heads(const std::vector<double>& x, int64_t hkv, int64_t group) {
  std::vector<double> out;
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < hkv; ++h)
      for (int64_t g = 0; g < group; ++g) {
        const auto first = x.begin() + (b * hkv + h) * L * D;
        out.insert(out.end(), first, first + L * D);
      }
  return out;
}

// (B, hkv * group, L, D) summed over each group of heads.
std::vector<double> sum_groups(const std::vector<double>& x, int64_t hkv, int64_t group) {
  std::vector<double> out(static_cast<size_t>(B * hkv * L * D), 0.0);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < hkv * group; ++h)
      for (int64_t n = 0; n < L * D; ++n) out[(b * hkv + h / group) * L * D + n] += x[(b * hkv * group + h) * L * D + n];
  return out;
}

void expect_near(const std::vector<double>& a, const std::vector<double>& e, const char* what) {
  ASSERT_EQ(a.size(), e.size()) << what;
  for (size_t n = 0; n < a.size(); ++n) ASSERT_NEAR(a[n], e[n], 1e-12 * (1 + std::abs(e[n]))) << what << " " << n;
}

TEST(GroupedQueryAttention, EqualsMultiHeadAttentionOnRepeatedKeys) {
  const std::vector<double> q = random(B * H * L * D, 1);
  for (int64_t hkv : {1, 2}) {
    const std::vector<double> k = random(B * hkv * L * D, 2), v = random(B * hkv * L * D, 3);
    const int64_t group = H / hkv;
    for (Scheme scheme : {Scheme::none, Scheme::alibi})
      for (Algorithm algorithm : {Algorithm::reference, Algorithm::gather, Algorithm::fused})
        for (auto [threads, dropout] : {std::pair{1, 0.0}, {2, 0.0}, {2, 0.2}}) {
          SCOPED_TRACE(std::string(to_string(scheme)) + " " + to_string(algorithm) + " Hkv=" + std::to_string(hkv) +
                       " threads=" + std::to_string(threads) + " dropout=" + std::to_string(dropout));
          const Result grouped = run(algorithm, scheme, hkv, q, k, v, threads, dropout);
          const Result full = run(algorithm, scheme, H, q, repeat_heads(k, hkv, group), repeat_heads(v, hkv, group),
                                  threads, dropout);
          expect_near(grouped.out, full.out, "out");
          expect_near(grouped.dq, full.dq, "dq");
          expect_near(grouped.dk, sum_groups(full.dk, hkv, group), "dk");
          expect_near(grouped.dv, sum_groups(full.dv, hkv, group), "dv");
          const Result again = run(algorithm, scheme, hkv, q, k, v, threads, dropout);
          EXPECT_EQ(again.dk, grouped.dk) << "a second run differs";
        }
  }
}

TEST(GroupedQueryAttention, KeyHeadsMustDivideQueryHeads) {
  std::vector<double> q(1 * 4 * 2 * 2), k(1 * 3 * 2 * 2), out(1 * 4 * 2 * 2), lse(4 * 2);
  AttentionForward<double> p;
  p.q = View4<const double>::contiguous(q.data(), {1, 4, 2, 2});
  p.k = p.v = View4<const double>::contiguous(k.data(), {1, 3, 2, 2});
  p.out = View4<double>::contiguous(out.data(), {1, 4, 2, 2});
  p.lse = View3<double>::contiguous(lse.data(), {1, 4, 2});
  try {
    attention_forward<double>(p);
    FAIL() << "accepted 3 key heads for 4 query heads";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("Hkv=3 must divide q's H=4"), std::string::npos) << e.what();
  }
}

}  // namespace
