// Scratch memory of the algorithms (docs/design.md section 2's "extra memory per
// head" column), from the library's own counters (relpos/memory.hpp). Shaw
// K+V, causal self-attention, L = 128, d = dv = 16, k = 4, double, one head
// on one thread (the peak is then one head's, on any machine):
//  * reference materialises A^K (L, L, d) and A^V (L, L, dv): at least
//    L^2 (d + dv) elements, and split (Shaw's own form) the same;
//  * gather holds O(L (2k+1)) beside the logits and the per-head copies of
//    q, k, v: a few (L, L) matrices (logits, P, dS in backward) plus O(L d);
//  * skew and generalized skew hold R = Q E^T, (L, L) resp. (L, 2L - 1),
//    beside the logits: O(L^2) too, independent of d;
//  * fused holds no (L, L) buffer at all: O(L d) and tiles.
// The bounds below count elements from those formulas with a generous
// constant; d-independence is checked by running at d = 16 and d = 64, and
// fused's linearity in L by doubling L. Last, the fused kernel's allocations
// against its plan, whose total validation refuses calls by.
#include <algorithm>
#include <type_traits>

#include "algorithm_cases.hpp"
#include "../../../src/attention/fused_plan.hpp"
#include "relpos/memory.hpp"

namespace relpos_test {
namespace {

constexpr int64_t kL = 128, kWindow = 4;

Spec shaw_problem(Algorithm a, int64_t d, int64_t L) {
  Spec s;
  s.label = "shaw_L" + std::to_string(L);
  s.scheme = Scheme::shaw;
  s.mask = MaskKind::causal;
  s.B = 1, s.H = 1, s.Lq = s.Lk = L, s.d = s.dv = d, s.shaw_k = kWindow;
  s.shaw_wk_per_head = true;
  s.algorithm = a;
  s.num_threads = 1;  // each thread holds its own scratch: measure one
  return s;
}

// Most scratch bytes held at once during p's forward and during its backward.
template <class T>
int64_t peak_scratch(Problem<T>& p) {
  int64_t peak = 0;
  for (int pass = 0; pass < 2; ++pass) {
    const int64_t before = relpos::memory_stats().current_bytes;
    relpos::reset_peak_memory();
    pass == 0 ? p.forward() : p.backward();
    peak = std::max(peak, relpos::memory_stats().peak_bytes - before);
    EXPECT_EQ(relpos::memory_stats().current_bytes, before) << "scratch left allocated after the call";
  }
  return peak;
}

int64_t peak_scratch(Algorithm a, int64_t d, int64_t L = kL) {
  Problem<double> p(shaw_problem(a, d, L));
  return peak_scratch(p);
}

constexpr int64_t kBytes = sizeof(double);

TEST(ScratchMemory, ReferenceAndSplitMaterialiseTheRelativeTensors) {
  const int64_t d = 16, relative_tensors = kL * kL * (d + d) * kBytes;  // A^K and A^V
  EXPECT_GE(peak_scratch(Algorithm::reference, d), relative_tensors);
  EXPECT_GE(peak_scratch(Algorithm::split, d), relative_tensors);
}

TEST(ScratchMemory, TheOtherAlgorithmsStayFarBelowTheReference) {
  const int64_t d = 16, L = kL, reference = peak_scratch(Algorithm::reference, d);
  ASSERT_GE(reference, 8 * d * L * L);
  // (L, width) buffers: per-head copies of q, k, v, dout, out, dq, dk, dqp, E,
  // (L, 2k+1) products and sums; 32 of them at once is generous.
  const auto linear = [L](int64_t d) { return 32 * L * (d + 2 * kWindow + 1) * kBytes; };
  const struct {
    Algorithm algorithm;
    int64_t l_by_l;   // (L, L) buffers held at once, generously: logits, P, dS, R, its copies
    int64_t divisor;  // peak < reference / divisor
  } bounds[] = {{Algorithm::gather, 4, 4},
                {Algorithm::skew, 8, 3},
                {Algorithm::generalized_skew, 10, 3},
                {Algorithm::fused, 0, 8}};
  for (const auto& b : bounds) {
    SCOPED_TRACE(relpos::to_string(b.algorithm));
    const int64_t peak = peak_scratch(b.algorithm, d);
    EXPECT_LT(peak, reference / b.divisor);
    EXPECT_LE(peak, b.l_by_l * L * L * kBytes + linear(d));
    // Quadrupling d grows only the (L, d) buffers, never an (L, L, d) tensor:
    // the reference grows by 2 L^2 (4d - d) elements, these by O(L d).
    EXPECT_LE(peak_scratch(b.algorithm, 4 * d) - peak, linear(4 * d) - linear(d));
  }
}

// Doubling L at most doubles fused's scratch (plus slack), where an (L, L)
// buffer would quadruple it; at L = 1024 the whole peak is below one (L, L)
// matrix (lengths well above the 128 x 128 tile, whose fixed buffers dominate
// at small L).
TEST(ScratchMemory, FusedHoldsNoLByLBuffer) {
  const int64_t d = 16, at_512 = peak_scratch(Algorithm::fused, d, 512);
  const int64_t at_1024 = peak_scratch(Algorithm::fused, d, 1024);
  EXPECT_LE(at_1024, at_512 * 5 / 2);
  EXPECT_LT(at_1024, 1024 * 1024 * kBytes);
  EXPECT_GT(peak_scratch(Algorithm::gather, d, 1024), 3 * peak_scratch(Algorithm::gather, d, 512))
      << "the doubling test would not tell an (L, L) buffer";
}

// The fused kernel's scratch plan (src/attention/fused_plan.hpp) against
// what it allocates: its forward and its backward each hold exactly the
// bytes their plan lists, across schemes, masks, shapes (one tile to
// several, cross-attention, a decode step; the forward's tiles of 512 keys
// and the backward's key groups), threads, float32, float64, bfloat16 and float16 storage; and
// the scratch estimate that validation refuses calls by
// (relpos::estimated_scratch_bytes) is the larger of the two with every
// gradient wanted. This catches a buffer that outgrows its plan and an
// allocation outside it; a plan larger than the kernel needs would be
// reserved and pass, which is why each size in the plan is the bound of the
// kernel's own loops (fused_plan.cpp calls the kernel's functions), not a
// bound of its own.
template <class T>
const char* storage_name() {
  if constexpr (std::is_same_v<T, float>) return "float32";
  if constexpr (std::is_same_v<T, double>) return "float64";
  if constexpr (std::is_same_v<T, relpos::bfloat16>) return "bfloat16";
  return "float16";
}

template <class T>
void expect_plan_is_what_fused_allocates(Spec s) {
  s.algorithm = Algorithm::fused;
  Problem<T> p(s);
  const relpos::AttentionBackward<T> args = p.backward_args();
  const relpos::fused::FusedPlan plan = relpos::fused::plan(p.forward_args(), &args.dpos, &args);
  const std::string label = s.label + " " + storage_name<T>();
  int64_t peak[2];
  for (int pass = 0; pass < 2; ++pass) {
    const int64_t before = relpos::memory_stats().current_bytes;
    relpos::reset_peak_memory();
    pass == 0 ? p.forward() : p.backward();
    peak[pass] = relpos::memory_stats().peak_bytes - before;
  }
  EXPECT_EQ(plan.forward_bytes(), double(peak[0])) << label << ": forward";
  EXPECT_EQ(plan.backward_bytes(), double(peak[1])) << label << ": backward";
  const relpos::fused::FusedPlan most = relpos::fused::plan(p.forward_args());  // every gradient wanted
  EXPECT_EQ(relpos::estimated_scratch_bytes(p.forward_args()), std::max(most.forward_bytes(), most.backward_bytes()))
      << label;
  EXPECT_GE(most.backward_bytes(), plan.backward_bytes()) << label;
}

// One scheme's case per instance (the schemes' cases are the test's bulk: sharded runs share them out).
struct PlanKind {
  const char* name;
  Scheme scheme;
  ShawTables tables;
};

class FusedAllocatesItsPlan : public ::testing::TestWithParam<PlanKind> {
 protected:
  // The kind's scheme with its parameters, one batch entry of two heads of 64.
  Spec spec(MaskKind mask, int64_t lq, int64_t lk, int threads) const {
    Spec s;
    s.scheme = GetParam().scheme, s.shaw_tables = GetParam().tables, s.mask = mask;
    s.B = 1, s.H = 2, s.Lq = lq, s.Lk = lk, s.d = s.dv = 64, s.num_threads = threads;
    s.q_offset = lk - lq;  // queries end-aligned with the keys, as a causal decode step is
    s.shaw_k = 16, s.xl_pos_dim = 64, s.t5_num_buckets = 32, s.t5_max_distance = 128;
    s.deberta_position_buckets = 64, s.deberta_max_relative_positions = 256;
    s.label = std::string(GetParam().name) + " mask " + std::to_string(int(mask)) + " Lq=" + std::to_string(lq) +
              " Lk=" + std::to_string(lk) + " threads=" + std::to_string(threads);
    return s;
  }
};

TEST_P(FusedAllocatesItsPlan, EveryMaskShapeAndStorage) {
  const std::pair<int64_t, int64_t> lengths[] = {{100, 100}, {300, 300}, {300, 700}, {1, 700}};
  for (MaskKind mask : {MaskKind::none, MaskKind::causal, MaskKind::padding})
    for (const auto& [lq, lk] : lengths)
      for (int threads : {1, 2}) {
        const Spec s = spec(mask, lq, lk, threads);
        expect_plan_is_what_fused_allocates<float>(s);
        expect_plan_is_what_fused_allocates<double>(s);
        expect_plan_is_what_fused_allocates<relpos::bfloat16>(s);
        expect_plan_is_what_fused_allocates<relpos::float16>(s);
      }
}

// Causal tiles too wide for the staircase (dv past simd::kStaircaseMaxSize) beside a key band that
// still takes it (d within it).
TEST_P(FusedAllocatesItsPlan, ValuesTooWideForTheStaircase) {
  Spec s = spec(MaskKind::causal, 300, 300, 1);
  s.dv = 160;
  s.label += " d=64 dv=160";
  expect_plan_is_what_fused_allocates<float>(s);
  expect_plan_is_what_fused_allocates<relpos::bfloat16>(s);
}

// Dropout's multipliers: a tile row's in the forward, a tile's z and P z in the backward.
TEST_P(FusedAllocatesItsPlan, WithDropout) {
  for (MaskKind mask : {MaskKind::none, MaskKind::causal})
    for (const auto& [lq, lk] : {std::pair<int64_t, int64_t>{300, 300}, {1, 700}})
      for (int threads : {1, 2}) {
        const Spec s = with_dropout(spec(mask, lq, lk, threads));
        expect_plan_is_what_fused_allocates<float>(s);
        expect_plan_is_what_fused_allocates<double>(s);
        expect_plan_is_what_fused_allocates<relpos::bfloat16>(s);
      }
}

INSTANTIATE_TEST_SUITE_P(EveryScheme, FusedAllocatesItsPlan,
                         ::testing::Values(PlanKind{"none", Scheme::none, ShawTables::k_and_v},
                                           PlanKind{"t5", Scheme::t5, ShawTables::k_and_v},
                                           PlanKind{"alibi", Scheme::alibi, ShawTables::k_and_v},
                                           PlanKind{"shaw_kv", Scheme::shaw, ShawTables::k_and_v},
                                           PlanKind{"shaw_k", Scheme::shaw, ShawTables::k_only},
                                           PlanKind{"xl", Scheme::xl, ShawTables::k_and_v},
                                           PlanKind{"rope", Scheme::rope, ShawTables::k_and_v},
                                           PlanKind{"deberta", Scheme::deberta, ShawTables::k_and_v}),
                         [](const ::testing::TestParamInfo<PlanKind>& info) { return std::string(info.param.name); });

// Positions on a grid: SAM's tables (queries and pooled keys), Swin's bias; with and without
// their gradients wanted; one and two threads.
TEST(ScratchMemory, FusedAllocatesItsPlanOnGrids) {
  for (const Spec& grid : grid_cases())
    for (int threads : {1, 2}) {
      Spec s = grid;
      s.grid_qh *= 10, s.grid_kh *= 10;  // past one tile
      s.Lq = s.grid_qh * s.grid_qw, s.Lk = s.key_grid_h() * s.key_grid_w();
      s.B = 1, s.H = 2, s.d = s.dv = 64, s.num_threads = threads;
      s.label += " x10 threads=" + std::to_string(threads);
      expect_plan_is_what_fused_allocates<float>(s);
      expect_plan_is_what_fused_allocates<double>(s);
      expect_plan_is_what_fused_allocates<relpos::bfloat16>(s);
    }
}

}  // namespace
}  // namespace relpos_test
