// AttentionBackward::key_grads_from: dk and dv of keys key_grads_from .. Lk - 1
// only (a Transformer-XL memory gets none). Every algorithm that serves a
// call gives, in double, dk and dv equal to the rows from there on of the same
// call with every key's gradient, and the same dq and positional gradients;
// float32 and bfloat16 calls agree with their own full calls within their
// rounding; grouped-query attention too; bad values are refused by name.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "algorithm_cases.hpp"
#include "relpos/half.hpp"

namespace relpos_test {
namespace {

using namespace relpos;

// dk and dv shaped for keys from .. Lk - 1, zeroed.
template <class T>
struct GradedKeys {
  Tensor<T, 4> dk, dv;
  GradedKeys(const Spec& s, int64_t from) : dk({s.B, s.H, s.Lk - from, s.d}, s.layout), dv({s.B, s.H, s.Lk - from, s.dv}, s.layout) {
    dk.fill(T(0.0f)), dv.fill(T(0.0f));
  }
};

// The rows j >= from of a (B, H, Lk, w) tensor's values, in (b, h, j, c) order.
std::vector<double> rows_from(const std::vector<double>& all, const Spec& s, int64_t width, int64_t from) {
  std::vector<double> tail;
  for (int64_t bh = 0; bh < s.B * s.H; ++bh)
    for (int64_t j = from; j < s.Lk; ++j)
      for (int64_t c = 0; c < width; ++c) tail.push_back(all[(bh * s.Lk + j) * width + c]);
  return tail;
}

struct Split {
  Outcome every_key;                  // the call with key_grads_from = 0
  Outcome later_keys;                 // with key_grads_from = from: dk and dv of the later keys only
  std::vector<double> dk_tail, dv_tail;  // every_key's dk, dv rows from `from` on
};

template <class T>
Split run_split(const Spec& s, int64_t from) {
  Split r;
  Problem<T> all(s);
  r.every_key = run_forward_backward(all);
  for (const auto& [name, values] : r.every_key) {
    if (name == "dk") r.dk_tail = rows_from(values, s, s.d, from);
    if (name == "dv") r.dv_tail = rows_from(values, s, s.dv, from);
  }
  Problem<T> later(s);
  later.forward();
  later.fill_grads(T(0.0f));
  GradedKeys<T> graded(s, from);
  AttentionBackward<T> a = later.backward_args();
  a.dk = graded.dk.view(), a.dv = graded.dv.view();
  a.key_grads_from = from;
  attention_backward(a);
  for (Param<T>& param : later.params()) {
    std::vector<double> g;
    for (T* e : param.grad) g.push_back(static_cast<double>(*e));
    if (param.name == "k") g = graded.dk.values();
    if (param.name == "v") g = graded.dv.values();
    r.later_keys.push_back({"d" + param.name, g});
  }
  return r;
}

// later_keys against every_key: dk, dv against the tail rows, the rest whole.
::testing::AssertionResult later_keys_match(const Split& r, double rtol) {
  for (const auto& [name, values] : r.later_keys) {
    const std::vector<double>* expected = nullptr;
    if (name == "dk") expected = &r.dk_tail;
    if (name == "dv") expected = &r.dv_tail;
    for (const auto& [full_name, full] : r.every_key)
      if (!expected && full_name == name) expected = &full;
    double scale = 1;
    for (double v : *expected) scale = std::max(scale, std::abs(v));
    if (auto ok = all_near(name, values, *expected, rtol * scale); !ok) return ok;
  }
  return ::testing::AssertionSuccess();
}

Spec memory_case(Scheme scheme, MaskKind mask, const std::string& label) {
  Spec s;
  s.label = label;
  s.scheme = scheme;
  s.B = 2, s.H = 2, s.d = 8, s.dv = 5;
  s.Lq = 200, s.Lk = 330, s.q_offset = 130;  // 130 memory keys, then the queries' own
  s.mask = mask;
  s.shaw_k = 40, s.t5_num_buckets = 16, s.t5_max_distance = 100, s.xl_pos_dim = 6;
  return s;
}

std::vector<Spec> split_cases() {
  std::vector<Spec> cases;
  for (Scheme scheme : {Scheme::none, Scheme::shaw, Scheme::t5, Scheme::rope, Scheme::xl, Scheme::kerple})
    for (MaskKind mask : {MaskKind::causal, MaskKind::none, MaskKind::causal_padding}) {
      const std::string name = std::string(to_string(scheme)) + "_" +
                               (mask == MaskKind::causal ? "causal" : mask == MaskKind::none ? "full" : "causal_padding");
      for (Algorithm a : every_algorithm()) {
        Spec s = with_algorithm(memory_case(scheme, mask, name), a);
        if (a != Algorithm::automatic && serves(a, s)) {
          s.label = name + "_" + to_string(a);
          cases.push_back(s);
        }
      }
    }
  return cases;
}

class KeyGradsFrom : public ::testing::TestWithParam<Spec> {};

TEST_P(KeyGradsFrom, DoubleEqualsTheTailOfEveryKeysGradients) {
  for (int64_t from : {int64_t(130), int64_t(129), int64_t(1), int64_t(300), int64_t(330)}) {
    SCOPED_TRACE("key_grads_from = " + std::to_string(from));
    EXPECT_TRUE(later_keys_match(run_split<double>(GetParam(), from), 1e-12));
  }
}

INSTANTIATE_TEST_SUITE_P(Algorithms, KeyGradsFrom, ::testing::ValuesIn(split_cases()), spec_name);

// Float32 and bfloat16 through the fused kernel (automatic): the skipped
// keys change no sum of the others, so the tail agrees with the full call's
// within a few ulps of each tensor's scale.
TEST(KeyGradsFrom, Float32AndBfloat16AgreeWithTheirFullCalls) {
  for (Scheme scheme : {Scheme::none, Scheme::xl, Scheme::shaw})
    for (int64_t from : {int64_t(130), int64_t(129)}) {
      const Spec s = memory_case(scheme, MaskKind::causal, "half");
      SCOPED_TRACE(std::string(to_string(scheme)) + ", key_grads_from = " + std::to_string(from));
      EXPECT_TRUE(later_keys_match(run_split<float>(s, from), 8 * 1.2e-7));
      EXPECT_TRUE(later_keys_match(run_split<relpos::bfloat16>(s, from), 2 * 0.0079));
    }
}

// Grouped-query attention (2 key heads for 4 query heads) sums each group's
// gradients over the later keys only.
TEST(KeyGradsFrom, GroupedQueryAttention) {
  constexpr int64_t B = 2, H = 4, Hkv = 2, Lq = 150, Lk = 200, D = 8, from = 50;
  std::mt19937_64 rng(5);
  std::normal_distribution<double> normal;
  const auto random = [&](int64_t n) {
    std::vector<double> x(static_cast<size_t>(n));
    for (double& v : x) v = normal(rng);
    return x;
  };
  const std::vector<double> q = random(B * H * Lq * D), k = random(B * Hkv * Lk * D), v = random(B * Hkv * Lk * D),
                            dout = random(B * H * Lq * D);
  for (Algorithm algorithm : {Algorithm::fused, Algorithm::reference, Algorithm::gather}) {
    SCOPED_TRACE(to_string(algorithm));
    std::vector<double> out(B * H * Lq * D), lse(B * H * Lq), dq(B * H * Lq * D);
    AttentionBackward<double> p;
    p.q = View4<const double>::contiguous(q.data(), {B, H, Lq, D});
    p.k = View4<const double>::contiguous(k.data(), {B, Hkv, Lk, D});
    p.v = View4<const double>::contiguous(v.data(), {B, Hkv, Lk, D});
    p.out = View4<double>::contiguous(out.data(), {B, H, Lq, D});
    p.lse = View3<double>::contiguous(lse.data(), {B, H, Lq});
    p.causal = true, p.q_offset = Lk - Lq;
    p.pos.scheme = Scheme::alibi;
    p.algorithm = algorithm;
    attention_forward<double>(p);
    p.dout = View4<const double>::contiguous(dout.data(), {B, H, Lq, D});
    std::vector<double> dk_all(B * Hkv * Lk * D, 0.0), dv_all(dk_all.size(), 0.0);
    p.dk = View4<double>::contiguous(dk_all.data(), {B, Hkv, Lk, D});
    p.dv = View4<double>::contiguous(dv_all.data(), {B, Hkv, Lk, D});
    attention_backward<double>(p);
    std::vector<double> dk(B * Hkv * (Lk - from) * D, 0.0), dv(dk.size(), 0.0);
    p.dk = View4<double>::contiguous(dk.data(), {B, Hkv, Lk - from, D});
    p.dv = View4<double>::contiguous(dv.data(), {B, Hkv, Lk - from, D});
    p.key_grads_from = from;
    attention_backward<double>(p);
    for (int64_t bh = 0; bh < B * Hkv; ++bh)
      for (int64_t j = from; j < Lk; ++j)
        for (int64_t c = 0; c < D; ++c) {
          const int64_t all = (bh * Lk + j) * D + c, tail = (bh * (Lk - from) + j - from) * D + c;
          ASSERT_NEAR(dk[tail], dk_all[all], 1e-12) << bh << ", " << j << ", " << c;
          ASSERT_NEAR(dv[tail], dv_all[all], 1e-12) << bh << ", " << j << ", " << c;
        }
  }
}

// A value outside [0, Lk], or dk / dv not shaped for the later keys, is refused by name.
TEST(KeyGradsFrom, BadValuesAndShapesAreRefused) {
  const Spec s = memory_case(Scheme::none, MaskKind::causal, "refused");
  Problem<double> p(s);
  p.forward();
  const auto refused = [&](const AttentionBackward<double>& a, const std::string& name) {
    try {
      attention_backward(a);
    } catch (const std::invalid_argument& e) {
      return std::string(e.what()).find(name) != std::string::npos
                 ? ::testing::AssertionSuccess()
                 : ::testing::AssertionFailure() << "message does not name " << name << ": " << e.what();
    }
    return ::testing::AssertionFailure() << "accepted";
  };
  AttentionBackward<double> a = p.backward_args();
  a.key_grads_from = -1;
  EXPECT_TRUE(refused(a, "key_grads_from"));
  a.key_grads_from = s.Lk + 1;
  EXPECT_TRUE(refused(a, "key_grads_from"));
  a.key_grads_from = 10;  // dk, dv still of every key
  EXPECT_TRUE(refused(a, "dk"));
  GradedKeys<double> graded(s, 10);
  a.dk = graded.dk.view();
  EXPECT_TRUE(refused(a, "dv"));
  a.dv = graded.dv.view();
  EXPECT_NO_THROW(attention_backward(a));
}

}  // namespace
}  // namespace relpos_test
