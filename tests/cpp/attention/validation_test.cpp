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
  s.grid_qh = s.grid_qw = 2;  // the default 4 rows on a 2 x 2 grid (SAM, Swin)
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
// call must throw first. And segment ids for the base problems' rows (B = 2, L = 4).
double scratch[256];
const int32_t segments[8] = {0, 0, 1, 1, 0, 1, 1, 1};

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
      {"shaw_beyond_no_such_value", S::shaw, [](auto&, Args& a) { a.pos.shaw.beyond = relpos::Beyond(7); },
       "shaw.beyond"},
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
      // KERPLE
      {"kerple_r1_wrong_length", S::kerple, [](auto&, Args& a) { a.pos.kerple.r1.shape[0] -= 1; }, "kerple.r1"},
      {"kerple_r2_missing", S::kerple, [](auto&, Args& a) { a.pos.kerple.r2 = {}; }, "kerple.r2"},
      {"kerple_r1_zero", S::kerple, [](Problem<double>& p, Args&) { p.kerple_r1(0) = 0; }, "kerple.r1"},
      {"kerple_r2_negative", S::kerple, [](Problem<double>& p, Args&) { p.kerple_r2(1) = -0.5; }, "kerple.r2"},
      {"kerple_r2_nan", S::kerple, [nan](Problem<double>& p, Args&) { p.kerple_r2(2) = nan; }, "kerple.r2"},
      {"kerple_bias_overflows", S::kerple,
       [](Problem<double>& p, Args&) { p.kerple_r1(0) = 1e308, p.kerple_r2(0) = 1e300; }, "kerple.r1"},
      // KERPLE, power variant: r2 in (0, 2]
      {"deberta_without_tables", S::deberta, [](auto&, Args& a) { a.pos.deberta.c2p = {}, a.pos.deberta.p2c = {}; },
       "deberta"},
      {"deberta_c2p_rows_not_2_span", S::deberta, [](auto&, Args& a) { a.pos.deberta.c2p.shape[1] -= 1; }, "deberta.c2p"},
      {"deberta_p2c_width_not_d", S::deberta, [](auto&, Args& a) { a.pos.deberta.p2c.shape[2] -= 1; }, "deberta.p2c"},
      {"deberta_p2c_heads_neither_1_nor_H", S::deberta, [](auto&, Args& a) { a.pos.deberta.p2c.shape[0] = 2; },
       "deberta.p2c"},
      {"deberta_one_bucket", S::deberta, [](auto&, Args& a) { a.pos.deberta.position_buckets = 1; },
       "deberta.position_buckets"},
      {"deberta_max_within_exact_range", S::deberta, [](auto&, Args& a) { a.pos.deberta.max_relative_positions = 3; },
       "deberta.max_relative_positions"},
      {"deberta_log_ratio_one_in_float32", S::deberta,  // (2^25 + 1) / 2^25 rounds to 1 in float32
       [](auto&, Args& a) {
         a.pos.deberta.position_buckets = int64_t(1) << 26, a.pos.deberta.max_relative_positions = (int64_t(1) << 25) + 2;
       },
       "deberta.max_relative_positions"},
      {"deberta_max_zero_without_buckets", S::deberta,
       [](auto&, Args& a) { a.pos.deberta.position_buckets = 0, a.pos.deberta.max_relative_positions = 0; },
       "deberta.max_relative_positions"},
      {"kerple_power_r1_wrong_length", S::kerple_power, [](auto&, Args& a) { a.pos.kerple_power.r1.shape[0] -= 1; },
       "kerple_power.r1"},
      {"kerple_power_r1_zero", S::kerple_power, [](Problem<double>& p, Args&) { p.kerple_power_r1(0) = 0; },
       "kerple_power.r1"},
      {"kerple_power_r2_zero", S::kerple_power, [](Problem<double>& p, Args&) { p.kerple_power_r2(1) = 0; },
       "kerple_power.r2"},
      {"kerple_power_r2_above_two", S::kerple_power,
       [](Problem<double>& p, Args&) { p.kerple_power_r2(1) = 2.0000001; }, "kerple_power.r2"},
      {"kerple_power_r2_nan", S::kerple_power, [nan](Problem<double>& p, Args&) { p.kerple_power_r2(2) = nan; },
       "kerple_power.r2"},
      {"kerple_power_bias_overflows", S::kerple_power,
       [](Problem<double>& p, Args&) { p.kerple_power_r1(0) = 1e308, p.kerple_power_r2(0) = 2; }, "kerple_power.r1"},
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
       [](auto&, Args& a) { a.dpos.shaw_wk = relpos::View3<double>::contiguous(scratch, {3, 5, 6}); }, "dpos.shaw_wk",
       true},
      {"xl_gradient_for_shaw", S::shaw,
       [](auto&, Args& a) { a.dpos.xl_u = relpos::View2<double>::contiguous(scratch, {3, 6}); }, "dpos.xl_u", true},
      {"alibi_gradient_for_rope", S::rope,
       [](auto&, Args& a) { a.dpos.alibi_slopes = relpos::View1<double>::contiguous(scratch, {3}); },
       "dpos.alibi_slopes", true},
      {"alibi_gradient_of_default_slopes", S::alibi, [](auto&, Args& a) { a.pos.alibi.slopes = {}; },
       "dpos.alibi_slopes", true},
      {"kerple_gradient_for_alibi", S::alibi,
       [](auto&, Args& a) { a.dpos.kerple_r2 = relpos::View1<double>::contiguous(scratch, {3}); }, "dpos.kerple_r2",
       true},
      {"shaw_wv_gradient_without_wv", S::shaw, [](auto&, Args& a) { a.pos.shaw.wv = {}; }, "dpos.shaw_wv", true},
      {"t5_gradient_shape_mismatch", S::t5, [](auto&, Args& a) { a.dpos.t5_table.shape[1] -= 1; }, "dpos.t5_table",
       true},
      {"xl_w_r_gradient_stride_zero", S::xl, [](auto&, Args& a) { a.dpos.xl_w_r.stride[2] = 0; }, "dpos.xl_w_r", true},
      // outputs sharing memory with inputs or with each other (out = v raced on several threads)
      {"out_aliases_v", S::none,
       [](auto&, Args& a) { a.out.data = const_cast<double*>(a.v.data), a.out.stride = a.v.stride; }, "out"},
      {"lse_inside_q", S::none, [](auto&, Args& a) { a.lse.data = const_cast<double*>(a.q.data) + 5; }, "lse"},
      {"out_aliases_shaw_table", S::shaw, [](auto&, Args& a) { a.out.data = const_cast<double*>(a.pos.shaw.wv.data); },
       "out"},
      {"dq_aliases_k", S::none, [](auto&, Args& a) { a.dq.data = const_cast<double*>(a.k.data); }, "dq", true},
      {"dv_aliases_dout", S::none, [](auto&, Args& a) { a.dv.data = const_cast<double*>(a.dout.data); }, "dv", true},
      {"dq_overlaps_dk", S::none, [](auto&, Args& a) { a.dk.data = a.dq.data + 7; }, "dq", true},
      {"dpos_table_aliases_out", S::t5,
       [](auto&, Args& a) { a.dpos.t5_table.data = a.out.data, a.dpos.t5_table.stride = {1, 1}; }, "dpos.t5_table",
       true},
      // segments: both or neither, one per row
      {"q_segments_without_k_segments", S::none,
       [](auto&, Args& a) { a.q_segments = relpos::View2<const int32_t>::contiguous(segments, {2, 4}); },
       "k_segments"},
      {"k_segments_length", S::none,
       [](auto&, Args& a) {
         a.q_segments = relpos::View2<const int32_t>::contiguous(segments, {2, 4});
         a.k_segments = relpos::View2<const int32_t>::contiguous(segments, {2, 3});
       },
       "k_segments"},
      // positions on a grid: cells that are not the rows, tables of the wrong size
      {"sam_query_grid_not_lq", S::sam, [](auto&, Args& a) { a.pos.sam.q_width = 3; }, "sam.q_height x sam.q_width"},
      {"sam_key_grid_not_lk", S::sam, [](auto&, Args& a) { a.pos.sam.k_height = 3, a.pos.sam.k_width = 2; },
       "sam.k_height x sam.k_width"},
      {"sam_no_query_grid", S::sam, [](auto&, Args& a) { a.pos.sam.q_height = 0; }, "sam.q_height"},
      {"sam_rel_h_rows", S::sam, [](auto&, Args& a) { a.pos.sam.rel_h.shape[0] += 1; }, "sam.rel_h"},
      {"sam_rel_w_width_not_d", S::sam, [](auto&, Args& a) { a.pos.sam.rel_w.shape[1] -= 1; }, "sam.rel_w"},
      {"sam_rel_w_missing", S::sam, [](auto&, Args& a) { a.pos.sam.rel_w = {}; }, "sam.rel_w"},
      {"sam_by_gather", S::sam, [](auto&, Args& a) { a.algorithm = relpos::Algorithm::gather; }, "algorithm"},
      {"swin_window_not_l", S::swin, [](auto&, Args& a) { a.pos.swin.window_height = 1; },
       "swin.window_height x swin.window_width"},
      {"swin_table_offsets", S::swin, [](auto&, Args& a) { a.pos.swin.table.shape[1] -= 1; }, "swin.table"},
      {"swin_table_heads", S::swin, [](auto&, Args& a) { a.pos.swin.table.shape[0] = 1; }, "swin.table"},
      // extents that overflow the address computation
      {"k_strides_beyond_address_space", S::none,
       [](auto&, Args& a) { a.k.stride[0] = std::numeric_limits<int64_t>::max() / 2; }, "k"},
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
  for (Scheme s : {Scheme::none, Scheme::shaw, Scheme::t5, Scheme::alibi, Scheme::rope, Scheme::xl, Scheme::kerple,
                   Scheme::kerple_power, Scheme::deberta, Scheme::sam, Scheme::swin}) {
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

// dq, dk and dv interleaved in one (B, L, 3, H, d) buffer (a fused QKV
// projection's gradient) share no element: accepted, and equal to separate buffers.
TEST(AcceptsValidInput, InterleavedGradientBuffers) {
  Spec s = base(Scheme::shaw);
  s.dv = s.d;
  Problem<double> p(s);
  p.forward();
  p.backward();
  const int64_t B = s.B, H = s.H, L = s.Lq, d = s.d;
  std::vector<double> dqkv(size_t(B * L * 3 * H * d), 0.0);
  Args a = p.backward_args();
  for (int part = 0; part < 3; ++part) {
    relpos::View4<double> g{dqkv.data() + part * H * d, {B, H, L, d}, {L * 3 * H * d, d, 3 * H * d, 1}};
    (part == 0 ? a.dq : part == 1 ? a.dk : a.dv) = g;
  }
  a.dpos = {};
  ASSERT_NO_THROW(relpos::attention_backward(a));
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t i = 0; i < L; ++i)
        for (int64_t x = 0; x < d; ++x) {
          const size_t at = size_t(((b * L + i) * 3 * H + h) * d + x);
          EXPECT_DOUBLE_EQ(dqkv[at], p.dq(b, h, i, x));
          EXPECT_DOUBLE_EQ(dqkv[at + size_t(H * d)], p.dk(b, h, i, x));
          EXPECT_DOUBLE_EQ(dqkv[at + size_t(2 * H * d)], p.dv(b, h, i, x));
        }
}

// ---- limits of the inputs' precision --------------------------------------------

// A scale finite in double can overflow float32 (scale = 1e300 gave NaN).
TEST(Float32Limits, ScaleMustBeFiniteInFloat) {
  Problem<float> f(base(Scheme::none));
  relpos::AttentionForward<float> a = f.forward_args();
  a.scale = 1e300;
  EXPECT_TRUE(throws_naming([&] { relpos::attention_forward(a); }, "scale"));
  a.scale = 1e-300;  // rounds to 0 in float
  EXPECT_TRUE(throws_naming([&] { relpos::attention_forward(a); }, "scale"));
  Problem<double> p(base(Scheme::none));
  relpos::AttentionForward<double> ad = p.forward_args();
  ad.scale = 1e300;
  EXPECT_NO_THROW(relpos::validate_forward(ad));
}

// slope * |r| must stay finite in float: slopes 1e30 at distances near 2^39
// turned every bias into -inf, and rows into zeros with lse -inf.
TEST(Float32Limits, AlibiSlopeTimesFarthestDistanceMustBeFinite) {
  Spec s = base(Scheme::alibi);
  s.q_offset = int64_t(1) << 39;
  Problem<float> f(s);
  for (int64_t h = 0; h < s.H; ++h) f.alibi_slopes(h) = 1e30f;
  EXPECT_TRUE(throws_naming([&] { f.forward(); }, "alibi.slopes"));
  // In double the same call is exact: every query attends to its nearest unpadded key only.
  Problem<double> p(s);
  for (int64_t h = 0; h < s.H; ++h) p.alibi_slopes(h) = 1e30;
  ASSERT_NO_THROW(p.forward());
  for (int64_t b = 0; b < s.B; ++b) {
    int64_t nearest = s.Lk - 1;
    while (s.padded(b, nearest)) --nearest;
    for (int64_t h = 0; h < s.H; ++h)
      for (int64_t i = 0; i < s.Lq; ++i)
        for (int64_t x = 0; x < s.dv; ++x) EXPECT_DOUBLE_EQ(p.out(b, h, i, x), p.v(b, h, nearest, x));
  }
}

// ---- memory estimated before any work -------------------------------------------

// An L^2 algorithm at L = 10^6 needs terabytes: refused with the size, not std::bad_alloc.
TEST(ScratchEstimate, QuadraticAlgorithmsAtAMillionKeysAreRefusedWithTheSize) {
  const int64_t L = 1000000, d = 4;
  std::vector<float> row(d, 0.5f), out(size_t(L * d)), lse(static_cast<size_t>(L));
  relpos::AttentionForward<float> a;
  const relpos::View4<const float> broadcast{row.data(), {1, 1, L, d}, {0, 0, 0, 1}};  // every row the same
  a.q = a.k = a.v = broadcast;
  a.out = relpos::View4<float>::contiguous(out.data(), {1, 1, L, d});
  a.lse = relpos::View3<float>::contiguous(lse.data(), {1, 1, L});
  for (relpos::Algorithm alg : {relpos::Algorithm::reference, relpos::Algorithm::gather}) {
    a.algorithm = alg;
    EXPECT_TRUE(throws_naming([&] { relpos::attention_forward(a); }, "algorithm"));
    try {
      relpos::validate_forward(a);
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find("GB of scratch memory"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("Lk=1000000"), std::string::npos) << e.what();
    }
  }
  EXPECT_GT(relpos::estimated_scratch_bytes(a), 1e13);
  a.algorithm = relpos::Algorithm::fused;  // no (L, L) buffer: fits
  EXPECT_LT(relpos::estimated_scratch_bytes(a), 1e9);
  EXPECT_NO_THROW(relpos::validate_forward(a));
}

// A Shaw table of 2^41 + 1 rows broadcast from one row (stride 0) takes no
// memory, but the kernels' per-distance buffers would: refused up front.
TEST(ScratchEstimate, HugeBroadcastShawTableIsRefusedWithTheSize) {
  Problem<float> f(base(Scheme::shaw));
  relpos::AttentionForward<float> a = f.forward_args();
  a.pos.shaw.k = int64_t(1) << 40;
  for (relpos::View3<const float>* t : {&a.pos.shaw.wk, &a.pos.shaw.wv}) t->shape[1] = 2 * a.pos.shaw.k + 1, t->stride[1] = 0;
  for (relpos::Algorithm alg : {relpos::Algorithm::fused, relpos::Algorithm::gather}) {
    a.algorithm = alg;
    EXPECT_TRUE(throws_naming([&] { relpos::attention_forward(a); }, "algorithm")) << relpos::to_string(alg);
  }
}

// ---- names of schemes and algorithms ------------------------------------------

TEST(Names, SchemesAndAlgorithmsRoundTrip) {
  for (Scheme s : {Scheme::none, Scheme::shaw, Scheme::t5, Scheme::alibi, Scheme::rope, Scheme::xl, Scheme::kerple,
                   Scheme::kerple_power, Scheme::deberta, Scheme::sam, Scheme::swin})
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

// Finite inputs whose scores overflow float32 (q.k = +-4e38 here: a NaN row;
// -4e38 for every key: a zero row, as if masked) are refused by name by every
// algorithm serving the call; a row whose keys are all padded keeps its -inf,
// a NaN input propagates as in PyTorch, and float64 computes the true result.
// One query against three keys of width 4, over the callers' buffers.
template <class T>
relpos::AttentionForward<T> one_query_three_keys(const T* q, const T* k, const T* v, T* out, T* lse) {
  relpos::AttentionForward<T> a;
  a.q = relpos::View4<const T>::contiguous(q, {1, 1, 1, 4});
  a.k = relpos::View4<const T>::contiguous(k, {1, 1, 3, 4});
  a.v = relpos::View4<const T>::contiguous(v, {1, 1, 3, 4});
  a.out = relpos::View4<T>::contiguous(out, {1, 1, 1, 4});
  a.lse = relpos::View3<T>::contiguous(lse, {1, 1, 1});
  return a;
}

TEST(ScoresOverflow, FiniteInputsPastFloat32AreRefusedNaNInputsPropagate) {
  float q[4] = {1e19f, 1e19f, 1e19f, 1e19f}, v[12];
  float k[12] = {1e19f, 1e19f, 1e19f, 1e19f, 1e19f, 1e19f, 1e19f, -1e19f, -1e19f, -1e19f, -1e19f, -1e19f};
  for (int i = 0; i < 12; ++i) v[i] = float(i);
  float out[4], lse[1];
  relpos::AttentionForward<float> a = one_query_three_keys(q, k, v, out, lse);
  // Scores of +-4e38 (NaN rows), then every score -4e38 (zero rows, as if masked).
  for (const float sign : {1.0f, -1.0f}) {
    for (float& x : q) x = sign * 1e19f;
    if (sign < 0)
      for (int i = 0; i < 12; ++i) k[i] = 1e19f;
    const std::vector<relpos::Algorithm> serving = relpos::available_algorithms(a);
    EXPECT_GE(serving.size(), 3u);
    for (const relpos::Algorithm algorithm : serving) {
      a.algorithm = algorithm;
      try {
        relpos::attention_forward(a);
        ADD_FAILURE() << relpos::to_string(algorithm) << " returned lse " << lse[0] << " for sign " << sign;
      } catch (const relpos::ScoresOverflow& e) {  // an std::invalid_argument of its own type
        EXPECT_EQ(std::string(e.what()).rfind("relpos: q, k: the attention scores overflow float32", 0), 0u)
            << e.what();
      }
    }
  }
  // A row with no visible key (its key padded) is -inf by right, whatever its scores.
  const uint8_t padded[3] = {1, 1, 1};
  a.key_padding = relpos::View2<const uint8_t>::contiguous(padded, {1, 3});
  a.algorithm = relpos::Algorithm::automatic;
  EXPECT_NO_THROW(relpos::attention_forward(a));
  EXPECT_EQ(lse[0], -std::numeric_limits<float>::infinity());
  a.key_padding = {};
  for (int i = 0; i < 12; ++i) k[i] = i < 7 ? 1e19f : -1e19f;
  q[0] = std::numeric_limits<float>::quiet_NaN();
  a.algorithm = relpos::Algorithm::automatic;
  EXPECT_NO_THROW(relpos::attention_forward(a));
  EXPECT_TRUE(std::isnan(lse[0]) && std::isnan(out[0]));
  double q64[4] = {1e19, 1e19, 1e19, 1e19}, k64[12], v64[12], out64[4], lse64[1];
  for (int i = 0; i < 12; ++i) k64[i] = double(k[i]), v64[i] = double(v[i]);
  relpos::attention_forward(one_query_three_keys(q64, k64, v64, out64, lse64));
  for (int c = 0; c < 4; ++c) EXPECT_EQ(out64[c], v64[c]) << c;  // the first key's score leads by 8e38
}

// The inputs read are the overflowing row's own: a NaN in another batch
// entry's query, or in a padded key, hides no overflow; a NaN row beside
// finite ones is computed.
TEST(ScoresOverflow, ANaNElsewhereInTheCallHidesNoOverflow) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  // Two batch entries of one query against three keys of width 4; entry 0's
  // third key padded. Entry 0's scores +-4e38, entry 1's small.
  std::vector<float> q(8, 1e19f), k(24, 1.0f), v(24, 0.5f), out(8), lse(2);
  for (int i = 0; i < 12; ++i) k[i] = i < 7 ? 1e19f : -1e19f;
  for (int c = 4; c < 8; ++c) q[c] = 0.25f;
  uint8_t padding[6] = {0, 0, 1, 0, 0, 0};
  relpos::AttentionForward<float> a;
  a.q = relpos::View4<const float>::contiguous(q.data(), {2, 1, 1, 4});
  a.k = relpos::View4<const float>::contiguous(k.data(), {2, 1, 3, 4});
  a.v = relpos::View4<const float>::contiguous(v.data(), {2, 1, 3, 4});
  a.out = relpos::View4<float>::contiguous(out.data(), {2, 1, 1, 4});
  a.lse = relpos::View3<float>::contiguous(lse.data(), {2, 1, 1});
  a.key_padding = relpos::View2<const uint8_t>::contiguous(padding, {2, 3});
  q[5] = nan;        // entry 1's query
  k[8 + 1] = nan;    // entry 0's padded key
  EXPECT_THROW(relpos::attention_forward(a), relpos::ScoresOverflow);
  for (int c = 0; c < 4; ++c) q[c] = 0.25f;  // entry 0 small: entry 1's NaN row is computed
  EXPECT_NO_THROW(relpos::attention_forward(a));
  EXPECT_TRUE(std::isfinite(lse[0]) && std::isnan(lse[1]));
}

}  // namespace
}  // namespace relpos_test
