// The fused kernel (and `auto`, which runs it) against the reference in double
// at sizes that span several of its 128 x 128 tiles in both directions: the
// online-softmax rescale across key tiles, the causal tile skip, Transformer-XL's
// band offsets across tiles, Shaw's bucket sums and T5's far buckets spanning
// tiles. Every scheme variant x mask x multi-tile geometry, forward and every
// gradient; errors judged per head and per parameter entry, so a small head or
// a rarely reached bucket cannot be wrong unseen behind a large one.
#include <algorithm>
#include <cmath>
#include <string>

#include "problem.hpp"

namespace relpos_test {
namespace {

constexpr double kTol = 1e-12;

// Sizes beyond one tile (128) in queries, keys or both.
const std::vector<Geometry>& multi_tile_geometries() {
  static const std::vector<Geometry> g = {
      {"L129", [](Spec& s) { s.Lq = s.Lk = 129; }},
      {"L300_offsets_strided",
       [](Spec& s) { s.Lq = s.Lk = 300, s.q_offset = s.k_offset = 7, s.layout = Layout::strided; }},
      // 130 memory keys before 200 current ones (k_offset = 0, q_offset = mem_len)
      {"cross_200x330_memory", [](Spec& s) { s.Lq = 200, s.Lk = 330, s.q_offset = 130, s.k_offset = 0; }},
  };
  return g;
}

// Positional options widened so that their structure spans tiles too: a Shaw
// window wider than a tile, T5 buckets distinct up to distance 200, a
// Transformer-XL clamp inside the sequence, DeBERTa's log buckets from
// distance 32 on and its table's edge rows reached past distance 100.
Spec multi_tile(Spec s) {
  s.B = 1, s.H = 2, s.d = 8, s.dv = 4;
  s.shaw_k = 70;
  s.t5_num_buckets = s.t5_bidirectional ? 32 : 16, s.t5_max_distance = 200;
  if (s.xl_clamp_len > 0) s.xl_clamp_len = 150;
  if (s.deberta_position_buckets > 0) s.deberta_position_buckets = 64, s.deberta_max_relative_positions = 100;
  else s.deberta_max_relative_positions = 100;
  return s;
}

// Positions on a grid over several tiles: SAM on 16 x 20 cells (strided), its
// queries on 18 x 18 against keys pooled to 9 x 9, Swin in a 12 x 12 window.
std::vector<Spec> multi_tile_grids() {
  struct Grid {
    const char* name;
    Scheme scheme;
    int64_t qh, qw, kh, kw;
  };
  std::vector<Spec> out;
  for (const Grid& g : {Grid{"grid_sam_16x20", Scheme::sam, 16, 20, 0, 0},
                        Grid{"grid_sam_18x18_keys_9x9", Scheme::sam, 18, 18, 9, 9},
                        Grid{"grid_swin_12x12", Scheme::swin, 12, 12, 0, 0}}) {
    Spec s;
    s.label = g.name, s.scheme = g.scheme, s.B = 1, s.H = 2, s.d = 8, s.dv = 4;
    s.grid_qh = g.qh, s.grid_qw = g.qw, s.grid_kh = g.kh, s.grid_kw = g.kw;
    s.Lq = g.qh * g.qw, s.Lk = s.key_grid_h() * s.key_grid_w();
    s.layout = g.scheme == Scheme::sam && g.kh == 0 ? Layout::strided : Layout::dense;
    out.push_back(s);
  }
  return out;
}

// Every variant x mask x geometry, and with dropout under two masks on the
// strided geometry with offsets; the grids under every mask, and with dropout.
std::vector<Spec> multi_tile_cases() {
  std::vector<Spec> out;
  for (const Spec& variant : scheme_variants()) {
    for (const NamedMask& m : masks())
      for (const Geometry& g : multi_tile_geometries()) out.push_back(with_mask_and_geometry(multi_tile(variant), m, g));
    for (const NamedMask& m : {masks()[0], masks()[3]})
      out.push_back(with_dropout(with_mask_and_geometry(multi_tile(variant), m, multi_tile_geometries()[1])));
    Spec packed = with_mask_and_geometry(multi_tile(variant), masks()[1], multi_tile_geometries()[1]);
    packed.segment_length = 70;  // documents across tile edges, some rows' segments wholly in their future
    packed.label += "__segments";
    out.push_back(packed);
  }
  for (const Spec& grid : multi_tile_grids()) {
    for (const NamedMask& m : masks()) out.push_back(with_mask_and_geometry(grid, m, {"", [](Spec&) {}}));
    out.push_back(with_dropout(with_mask_and_geometry(grid, masks()[2], {"", [](Spec&) {}})));
  }
  return out;
}

// out, lse, dq, dk, dv: each (batch, head) slice within kTol of its own largest
// value; parameter gradients: each entry within kTol of its own magnitude
// (plus kTol: entries that cancel to about zero).
::testing::AssertionResult equal_per_head(const Outcome& actual, const Outcome& expected, int64_t heads,
                                          double tol = kTol) {
  if (actual.size() != expected.size()) return ::testing::AssertionFailure() << "different tensors";
  for (std::size_t n = 0; n < expected.size(); ++n) {
    const auto& [name, values] = expected[n];
    const std::vector<double>& got = actual[n].second;
    if (actual[n].first != name || got.size() != values.size())
      return ::testing::AssertionFailure() << actual[n].first << " vs " << name;
    const bool per_head = name == "out" || name == "lse" || name == "dq" || name == "dk" || name == "dv";
    const std::size_t slice = per_head ? values.size() / std::size_t(heads) : 1;
    for (std::size_t start = 0; start < values.size(); start += slice) {
      double scale = 0;
      for (std::size_t i = start; i < start + slice; ++i)
        if (std::isfinite(values[i])) scale = std::max(scale, std::abs(values[i]));
      const std::vector<double> a(got.begin() + long(start), got.begin() + long(start + slice));
      const std::vector<double> e(values.begin() + long(start), values.begin() + long(start + slice));
      const std::string where = name + (per_head ? " head " + std::to_string(start / slice) : "");
      if (auto r = all_near(where, a, e, tol * std::max(1.0, scale), tol); !r) return r;
    }
  }
  return ::testing::AssertionSuccess();
}

class FusedMultiTile : public ::testing::TestWithParam<Spec> {};

TEST_P(FusedMultiTile, EqualsTheReferenceInDouble) {
  Spec spec = GetParam();
  spec.algorithm = relpos::Algorithm::reference;
  Problem<double> reference(spec);
  const Outcome expected = run_forward_backward(reference);
  for (relpos::Algorithm a : {relpos::Algorithm::fused, relpos::Algorithm::automatic}) {
    spec.algorithm = a;
    Problem<double> fused(spec);
    EXPECT_TRUE(equal_per_head(run_forward_backward(fused), expected, spec.B * spec.H)) << relpos::to_string(a);
  }
}

INSTANTIATE_TEST_SUITE_P(AllVariants, FusedMultiTile, ::testing::ValuesIn(multi_tile_cases()), spec_name);

// L = 1100 (nine tiles each way), one variant per scheme, causal with padding.
TEST(FusedMultiTile, NineTilesEachWay) {
  for (const Spec& variant : scheme_variants()) {
    if (variant.label != "none" && variant.label != "shaw_kv_per_head_zero" && variant.label != "t5_causal" &&
        variant.label != "alibi_explicit_slopes" && variant.label != "rope_interleaved_rot4" &&
        variant.label != "xl_clamp2" && variant.label != "kerple" && variant.label != "kerple_power" &&
        variant.label != "deberta_both_shared")
      continue;
    Spec spec = with_mask_and_geometry(multi_tile(variant), masks()[3], {"L1100", [](Spec& s) { s.Lq = s.Lk = 1100; }});
    spec.H = 1;
    SCOPED_TRACE(spec.label);
    spec.algorithm = relpos::Algorithm::reference;
    Problem<double> reference(spec);
    const Outcome expected = run_forward_backward(reference);
    spec.algorithm = relpos::Algorithm::fused;
    Problem<double> fused(spec);
    EXPECT_TRUE(equal_per_head(run_forward_backward(fused), expected, 1));
  }
}

// DeBERTa in float32, where its picks by distance take the vector paths
// (transposes by 8 x 8 blocks): every variant across tiles, and a decode-like
// call (3 queries, 700 keys) whose forward steps hold several steps of
// tiles::kDiagonalKeys keys. Against the reference in double, within
// float32's rounding.
TEST(FusedMultiTile, DeBERTaInFloat32) {
  const Geometry decode{"decode_3x700", [](Spec& s) { s.Lq = 3, s.Lk = 700, s.q_offset = 697, s.k_offset = 0; }};
  for (const Spec& variant : scheme_variants()) {
    if (variant.label.rfind("deberta", 0) != 0) continue;
    for (const Geometry& g : {multi_tile_geometries()[1], multi_tile_geometries()[2], decode})
      for (const NamedMask& m : {masks()[0], masks()[3]}) {
        Spec spec = with_mask_and_geometry(multi_tile(variant), m, g);
        SCOPED_TRACE(spec.label);
        spec.algorithm = relpos::Algorithm::reference;
        Problem<double> reference(spec);
        const Outcome expected = run_forward_backward(reference);
        spec.algorithm = relpos::Algorithm::fused;
        Problem<float> fused(spec);
        EXPECT_TRUE(equal_per_head(run_forward_backward(fused), expected, spec.B * spec.H, 2e-4));
      }
  }
}

// One head (B * H = 1) split over threads: the forward's query tiles, the
// backward's key-tile groups (their number follows the thread count). The
// forward equals one thread's bit for bit (each tile is computed by one
// thread, whatever the count); the backward adds dq and the positional sums
// over the groups, so it equals one thread's within rounding, and a second
// run with the same thread count repeats its bits.
// Fewer heads than threads: each head's key tiles in groups, the groups' sums added in
// parts over the threads (7 threads: more parts than some sums have elements).
TEST(FusedMultiTile, FewHeadsSplitOverThreads) {
  std::vector<Spec> cases;
  for (const Spec& variant : scheme_variants())
    cases.push_back(with_mask_and_geometry(multi_tile(variant), masks()[3], multi_tile_geometries()[1]));
  for (const Spec& grid : multi_tile_grids())
    cases.push_back(with_mask_and_geometry(grid, masks()[3], {"", [](Spec&) {}}));
  for (const Spec& c : cases)
    for (int64_t heads : {1, 2}) {
      Spec spec = c;
      spec.H = heads;
      spec.algorithm = relpos::Algorithm::fused;
      SCOPED_TRACE(spec.label + ", " + std::to_string(heads) + " heads");
      spec.num_threads = 1;
      Problem<double> one(spec);
      const Outcome expected = run_forward_backward(one);
      for (int threads : {2, 3, 7}) {
        spec.num_threads = threads;
        Problem<double> first(spec), second(spec);
        const Outcome many = run_forward_backward(first);
        const Outcome forward(many.begin(), many.begin() + 2), forward_one(expected.begin(), expected.begin() + 2);
        EXPECT_TRUE(same_outcome(forward, forward_one, 0.0)) << threads << " threads, forward";
        EXPECT_TRUE(equal_per_head(many, expected, 1)) << threads << " threads";
        EXPECT_TRUE(same_outcome(run_forward_backward(second), many, 0.0)) << threads << " threads, run twice";
      }
    }
}

// dq, dk, dv and every parameter's gradient are added into what the caller's
// tensors hold, both where the backward sums dk and dv in scratch and adds
// them at the end (strided rows, padded keys, RoPE's rotation) and where it
// sums them straight in the tensors (dense rows of each head's own keys:
// key_grads_in_place; DeBERTa's p2c adds into them there too), with one key
// group per head and with several (3 threads, 1 head), for every scheme.
TEST(FusedMultiTile, GradientsAddIntoTheCallersValues) {
  for (const Spec& variant : scheme_variants()) {
    for (const Geometry& g : {multi_tile_geometries()[0], multi_tile_geometries()[1]})
      for (const NamedMask& m : {masks()[1], masks()[3]})
        for (int threads : {1, 3}) {
          Spec spec = with_mask_and_geometry(multi_tile(variant), m, g);
          spec.H = 1, spec.algorithm = relpos::Algorithm::fused, spec.num_threads = threads;
          SCOPED_TRACE(spec.label + ", " + std::to_string(threads) + " threads");
          Problem<float> p(spec);
          const Outcome fresh = run_forward_backward(p);  // into zeros
          p.fill_grads(1.0f);
          p.backward();
          const std::vector<Param<float>> params = p.params();
          for (std::size_t n = 0; n < params.size(); ++n) {
            std::vector<double> got, expected;
            for (std::size_t e = 0; e < params[n].grad.size(); ++e)
              got.push_back(*params[n].grad[e]), expected.push_back(1.0 + fresh[n + 2].second[e]);
            EXPECT_TRUE(all_near("d" + params[n].name, got, expected, 1e-6, 1e-6));
          }
        }
  }
}

}  // namespace
}  // namespace relpos_test
