// Input validation at the API boundary: every bad argument throws
// std::invalid_argument whose message starts "relpos: <argument>:", through
// attention_forward and attention_backward alike, and valid calls do not throw.
#include <cmath>
#include <functional>
#include <limits>
#include <stdexcept>

#include "problem.hpp"

namespace relpos_test {
namespace {

using Args = relpos::AttentionBackward<double>;

// Valid problems of each scheme, with a key-padding mask so key_padding is set.
Spec base(Scheme scheme) {
  Spec s;
  s.scheme = scheme;
  s.mask = MaskKind::causal_padding;
  s.shaw_wk_per_head = s.shaw_wv_per_head = true;
  s.alibi_explicit_slopes = true;
  return s;
}

struct BadInput {
  std::string label;
  Scheme scheme;
  std::function<void(Problem<double>&, Args&)> spoil;
  std::string argument;        // what the message must name
  bool backward_only = false;  // a backward argument: forward has nothing to reject
};

void PrintTo(const BadInput& b, std::ostream* os) { *os << b.label; }

// Memory for gradients requested where none belongs; never written, since the
// call must throw first.
double scratch[256];

std::vector<BadInput> bad_inputs() {
  using S = Scheme;
  const double nan = std::numeric_limits<double>::quiet_NaN(), inf = std::numeric_limits<double>::infinity();
  return {
      // q, k, v, out, lse, key_padding
      {"q_missing", S::none, [](auto&, Args& a) { a.q.data = nullptr; }, "q"},
      {"q_empty_dimension", S::none, [](auto&, Args& a) { a.q.shape[2] = 0; }, "q"},
      {"k_batch_mismatch", S::none, [](auto&, Args& a) { a.k.shape[0] = 1; }, "k"},
      {"k_heads_mismatch", S::none, [](auto&, Args& a) { a.k.shape[1] = 2; }, "k"},
      {"k_head_dim_mismatch", S::none, [](auto&, Args& a) { a.k.shape[3] -= 1; }, "k"},
      {"v_length_mismatch", S::none, [](auto&, Args& a) { a.v.shape[2] -= 1; }, "v"},
      {"v_batch_mismatch", S::none, [](auto&, Args& a) { a.v.shape[0] = 1; }, "v"},
      {"out_value_dim_mismatch", S::none, [](auto&, Args& a) { a.out.shape[3] -= 1; }, "out"},
      {"out_length_mismatch", S::none, [](auto&, Args& a) { a.out.shape[2] -= 1; }, "out"},
      {"lse_length_mismatch", S::none, [](auto&, Args& a) { a.lse.shape[2] -= 1; }, "lse"},
      {"lse_heads_mismatch", S::none, [](auto&, Args& a) { a.lse.shape[1] -= 1; }, "lse"},
      {"key_padding_length_mismatch", S::none, [](auto&, Args& a) { a.key_padding.shape[1] -= 1; }, "key_padding"},
      {"key_padding_batch_mismatch", S::none, [](auto&, Args& a) { a.key_padding.shape[0] = 1; }, "key_padding"},
      // offsets and scale
      {"q_offset_negative", S::none, [](auto&, Args& a) { a.q_offset = -1; }, "q_offset"},
      {"k_offset_negative", S::none, [](auto&, Args& a) { a.k_offset = -3; }, "k_offset"},
      {"q_offset_huge", S::none, [](auto&, Args& a) { a.q_offset = int64_t(1) << 41; }, "q_offset"},
      {"scale_zero", S::none, [](auto&, Args& a) { a.scale = 0.0; }, "scale"},
      {"scale_negative", S::none, [](auto&, Args& a) { a.scale = -0.5; }, "scale"},
      {"scale_nan", S::none, [nan](auto&, Args& a) { a.scale = nan; }, "scale"},
      {"scale_infinite", S::none, [inf](auto&, Args& a) { a.scale = inf; }, "scale"},
      // outputs whose strides overlap
      {"out_stride_zero", S::none, [](auto&, Args& a) { a.out.stride[2] = 0; }, "out"},
      {"out_rows_overlap", S::none, [](auto&, Args& a) { a.out.stride[2] = 1; }, "out"},
      {"lse_stride_zero", S::none, [](auto&, Args& a) { a.lse.stride[2] = 0; }, "lse"},
      // backward's own arguments
      {"dout_shape_mismatch", S::none, [](auto&, Args& a) { a.dout.shape[3] -= 1; }, "dout", true},
      {"dq_stride_zero", S::none, [](auto&, Args& a) { a.dq.stride[3] = 0; }, "dq", true},
      {"dk_shape_mismatch", S::none, [](auto&, Args& a) { a.dk.shape[2] -= 1; }, "dk", true},
      {"dv_stride_zero", S::none, [](auto&, Args& a) { a.dv.stride[0] = 0; }, "dv", true},
      // Shaw
      {"shaw_k_negative", S::shaw, [](auto&, Args& a) { a.pos.shaw.k = -1; }, "shaw.k"},
      // 2k+1 would overflow int64 and match any table if k were not bounded first
      {"shaw_k_overflowing_2k_plus_1", S::shaw, [](auto&, Args& a) { a.pos.shaw.k = (int64_t(1) << 62) + (int64_t(1) << 50); }, "shaw.k"},
      {"shaw_without_tables", S::shaw, [](auto&, Args& a) { a.pos.shaw.wk = {}, a.pos.shaw.wv = {}; }, "shaw"},
      {"shaw_wk_rows_not_2k_plus_1", S::shaw, [](auto&, Args& a) { a.pos.shaw.wk.shape[1] -= 1; }, "shaw.wk"},
      {"shaw_wk_width_not_d", S::shaw, [](auto&, Args& a) { a.pos.shaw.wk.shape[2] -= 1; }, "shaw.wk"},
      {"shaw_wk_heads_neither_1_nor_H", S::shaw, [](auto&, Args& a) { a.pos.shaw.wk.shape[0] = 2; }, "shaw.wk"},
      {"shaw_wv_width_not_dv", S::shaw, [](auto&, Args& a) { a.pos.shaw.wv.shape[2] -= 1; }, "shaw.wv"},
      {"shaw_k_larger_than_table", S::shaw, [](auto&, Args& a) { a.pos.shaw.k += 1; }, "shaw.wk"},
      // T5
      {"t5_table_heads_mismatch", S::t5, [](auto&, Args& a) { a.pos.t5.table.shape[0] -= 1; }, "t5.table"},
      {"t5_table_missing", S::t5, [](auto&, Args& a) { a.pos.t5.table = {}; }, "t5.table"},
      {"t5_bidirectional_three_buckets", S::t5, [](auto&, Args& a) { a.pos.t5.table.shape[1] = 3; }, "t5.num_buckets"},
      {"t5_causal_one_bucket", S::t5,
       [](auto&, Args& a) { a.pos.t5.bidirectional = false, a.pos.t5.table.shape[1] = 1; }, "t5.num_buckets"},
      {"t5_max_distance_within_exact_range", S::t5, [](auto&, Args& a) { a.pos.t5.max_distance = 2; },
       "t5.max_distance"},
      {"t5_max_distance_zero", S::t5, [](auto&, Args& a) { a.pos.t5.max_distance = 0; }, "t5.max_distance"},
      // ALiBi
      {"alibi_slopes_wrong_length", S::alibi, [](auto&, Args& a) { a.pos.alibi.slopes.shape[0] -= 1; }, "alibi.slopes"},
      {"alibi_slope_nan", S::alibi, [nan](Problem<double>& p, Args&) { p.alibi_slopes(1) = nan; }, "alibi.slopes"},
      // RoPE
      {"rope_rotary_dims_odd", S::rope, [](auto&, Args& a) { a.pos.rope.rotary_dims = 3; }, "rope.rotary_dims"},
      {"rope_rotary_dims_above_d", S::rope, [](auto&, Args& a) { a.pos.rope.rotary_dims = 8; }, "rope.rotary_dims"},
      {"rope_rotary_dims_negative", S::rope, [](auto&, Args& a) { a.pos.rope.rotary_dims = -2; }, "rope.rotary_dims"},
      {"rope_odd_head_dim_by_default", S::rope, [](auto&, Args& a) { a.q.shape[3] = a.k.shape[3] = 5; },
       "rope.rotary_dims"},
      {"rope_base_one", S::rope, [](auto&, Args& a) { a.pos.rope.base = 1.0; }, "rope.base"},
      {"rope_base_below_one", S::rope, [](auto&, Args& a) { a.pos.rope.base = 0.5; }, "rope.base"},
      {"rope_base_nan", S::rope, [nan](auto&, Args& a) { a.pos.rope.base = nan; }, "rope.base"},
      // Transformer-XL
      {"xl_w_r_odd_pos_dim", S::xl, [](auto&, Args& a) { a.pos.xl.w_r.shape[2] = 3; }, "xl.w_r"},
      {"xl_w_r_width_not_d", S::xl, [](auto&, Args& a) { a.pos.xl.w_r.shape[1] -= 1; }, "xl.w_r"},
      {"xl_u_heads_mismatch", S::xl, [](auto&, Args& a) { a.pos.xl.u.shape[0] -= 1; }, "xl.u"},
      {"xl_v_missing", S::xl, [](auto&, Args& a) { a.pos.xl.v = {}; }, "xl.v"},
      {"xl_clamp_len_negative", S::xl, [](auto&, Args& a) { a.pos.xl.clamp_len = -1; }, "xl.clamp_len"},
      {"xl_clamp_len_huge", S::xl, [](auto&, Args& a) { a.pos.xl.clamp_len = int64_t(1) << 50; }, "xl.clamp_len"},
      // gradients of parameters the call does not have
      {"t5_gradient_for_plain_attention", S::none,
       [](auto&, Args& a) { a.dpos.t5_table = relpos::View2<double>::contiguous(scratch, {3, 10}); }, "dpos.t5_table",
       true},
      {"shaw_gradient_for_t5", S::t5,
       [](auto&, Args& a) { a.dpos.shaw_wk = relpos::View3<double>::contiguous(scratch, {3, 5, 6}); }, "dpos.shaw",
       true},
      {"xl_gradient_for_shaw", S::shaw,
       [](auto&, Args& a) { a.dpos.xl_u = relpos::View2<double>::contiguous(scratch, {3, 6}); }, "dpos.xl", true},
      {"alibi_gradient_for_rope", S::rope,
       [](auto&, Args& a) { a.dpos.alibi_slopes = relpos::View1<double>::contiguous(scratch, {3}); },
       "dpos.alibi_slopes", true},
      {"alibi_gradient_of_default_slopes", S::alibi, [](auto&, Args& a) { a.pos.alibi.slopes = {}; },
       "dpos.alibi_slopes", true},
      {"shaw_wv_gradient_without_wv", S::shaw, [](auto&, Args& a) { a.pos.shaw.wv = {}; }, "dpos.shaw_wv", true},
      {"t5_gradient_shape_mismatch", S::t5, [](auto&, Args& a) { a.dpos.t5_table.shape[1] -= 1; }, "dpos.t5_table",
       true},
      {"xl_w_r_gradient_stride_zero", S::xl, [](auto&, Args& a) { a.dpos.xl_w_r.stride[2] = 0; }, "dpos.xl_w_r", true},
  };
}

// Passes when `call` throws std::invalid_argument whose message starts with
// "relpos: <argument>:".
::testing::AssertionResult throws_naming(const std::function<void()>& call, const std::string& argument) {
  const std::string prefix = "relpos: " + argument + ":";
  try {
    call();
  } catch (const std::invalid_argument& e) {
    if (std::string(e.what()).rfind(prefix, 0) == 0) return ::testing::AssertionSuccess();
    return ::testing::AssertionFailure() << "message \"" << e.what() << "\" does not start with \"" << prefix << "\"";
  } catch (const std::exception& e) {
    return ::testing::AssertionFailure() << "threw something other than std::invalid_argument: " << e.what();
  }
  return ::testing::AssertionFailure() << "did not throw";
}

class RejectsBadInput : public ::testing::TestWithParam<BadInput> {};

TEST_P(RejectsBadInput, ThrowsInvalidArgumentNamingIt) {
  const BadInput& bad = GetParam();
  Problem<double> p(base(bad.scheme));
  Args a = p.backward_args();
  bad.spoil(p, a);
  const relpos::AttentionForward<double>& f = a;
  if (bad.backward_only) {
    EXPECT_NO_THROW(relpos::validate_forward(f)) << "a forward argument was spoiled";
  } else {
    EXPECT_THROW(relpos::attention_forward(f), std::invalid_argument);
    EXPECT_TRUE(throws_naming([&] { relpos::attention_forward(f); }, bad.argument)) << "forward";
    EXPECT_TRUE(throws_naming([&] { relpos::validate_forward(f); }, bad.argument)) << "validate_forward";
  }
  EXPECT_THROW(relpos::attention_backward(a), std::invalid_argument);
  EXPECT_TRUE(throws_naming([&] { relpos::attention_backward(a); }, bad.argument)) << "backward";
}

INSTANTIATE_TEST_SUITE_P(AllArguments, RejectsBadInput, ::testing::ValuesIn(bad_inputs()),
                         [](const ::testing::TestParamInfo<BadInput>& i) { return i.param.label; });

// The valid problems the bad inputs start from pass, and so does every case
// the other test files use.
TEST(AcceptsValidInput, BaseProblemsOfEveryScheme) {
  for (Scheme s : {Scheme::none, Scheme::shaw, Scheme::t5, Scheme::alibi, Scheme::rope, Scheme::xl}) {
    Problem<double> p(base(s));
    EXPECT_NO_THROW(p.forward()) << relpos::to_string(s);
    EXPECT_NO_THROW(p.backward()) << relpos::to_string(s);
  }
}

TEST(AcceptsValidInput, BroadcastRowsAndSingleElementDimensions) {
  // A stride of 0 is fine on a dimension of extent 1, and on inputs.
  Spec s = base(Scheme::none);
  s.B = 1;
  Problem<double> p(s);
  Args a = p.backward_args();
  a.out.stride[0] = 0;
  a.k.stride[2] = 0;  // every key the same row: a read-only broadcast
  EXPECT_NO_THROW(relpos::attention_forward<double>(a));
  EXPECT_NO_THROW(relpos::attention_backward(a));
}

// ---- names of schemes and algorithms ------------------------------------------

TEST(Names, SchemesAndAlgorithmsRoundTrip) {
  for (Scheme s : {Scheme::none, Scheme::shaw, Scheme::t5, Scheme::alibi, Scheme::rope, Scheme::xl})
    EXPECT_EQ(relpos::parse_scheme(relpos::to_string(s)), s);
  EXPECT_EQ(relpos::parse_scheme("t5"), Scheme::t5);
  EXPECT_STREQ(relpos::to_string(Scheme::xl), "xl");
  for (relpos::Algorithm a : {relpos::Algorithm::automatic, relpos::Algorithm::reference})
    EXPECT_EQ(relpos::parse_algorithm(relpos::to_string(a)), a);
  EXPECT_EQ(relpos::parse_algorithm("auto"), relpos::Algorithm::automatic);
}

TEST(Names, UnknownNamesThrowNamingTheKindAndTheName) {
  for (const std::string bad : {"shaww", "", "T5", "rel-shift"})
    EXPECT_TRUE(throws_naming([&] { relpos::parse_scheme(bad); }, "unknown scheme '" + bad + "' (known")) << bad;
  for (const std::string bad : {"fast", "", "Reference"})
    EXPECT_TRUE(throws_naming([&] { relpos::parse_algorithm(bad); }, "unknown algorithm '" + bad + "' (known")) << bad;
}

}  // namespace
}  // namespace relpos_test
