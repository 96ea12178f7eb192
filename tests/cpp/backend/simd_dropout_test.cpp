// Attention dropout's generator and multipliers: Philox 4x32-10 against
// Random123's published known-answer vectors, and every SIMD target this
// machine runs (simd_dropout-inl.h compiled here once per target, as
// simd_test.cpp does for the other families) against the scalar layout of
// relpos/dropout.hpp entry by entry: the same bits on every target, at any
// start and length of a row (partial 64-key blocks, key positions wrapping
// past 2^32) and at the edges of the probability.
#include "../../../src/backend/simd_dispatch.h"  // first: every attainable target, as the library compiles

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "../../../src/backend/simd.hpp"
#include "relpos/dropout.hpp"

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "backend/simd_dropout_test.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>

#include "../../../src/backend/simd_dropout-inl.h"

#ifndef RELPOS_TEST_SIMD_DROPOUT_
#define RELPOS_TEST_SIMD_DROPOUT_
namespace relpos_test {
struct DropoutOps {
  const char* target;
  void (*dropout_row)(const relpos::simd::DropoutRow&, uint32_t, float*, int64_t);
  void (*dropout_times)(const relpos::simd::DropoutRow&, uint32_t, const float*, float*, float*, int64_t);
};
}  // namespace relpos_test
#endif

HWY_BEFORE_NAMESPACE();
namespace relpos_test::HWY_NAMESPACE {
DropoutOps TargetDropoutOps() {
  namespace s = relpos::simd::HWY_NAMESPACE;
  return {hwy::TargetName(HWY_TARGET), &s::DropoutRowOf, &s::DropoutTimesOf};
}
}  // namespace relpos_test::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace relpos_test {

HWY_EXPORT(TargetDropoutOps);

namespace {

using relpos::AttentionDropout;
using relpos::philox::Block;
using relpos::philox::philox4x32_10;

// Random123's tests/kat_vectors for philox4x32_10: counter, key, output.
TEST(Philox, KnownAnswerVectors) {
  struct Kat {
    Block counter;
    uint32_t k0, k1;
    Block out;
  };
  const Kat kats[] = {
      {{{0, 0, 0, 0}}, 0, 0, {{0x6627e8d5u, 0xe169c58du, 0xbc57ac4cu, 0x9b00dbd8u}}},
      {{{0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu}},
       0xffffffffu,
       0xffffffffu,
       {{0x408f276du, 0x41c83b0eu, 0xa20bc7c6u, 0x6d5451fdu}}},
      {{{0x243f6a88u, 0x85a308d3u, 0x13198a2eu, 0x03707344u}},
       0xa4093822u,
       0x299f31d0u,
       {{0xd16cfe09u, 0x94fdccebu, 0x5001e420u, 0x24126ea1u}}},
  };
  for (const Kat& k : kats) {
    const Block got = philox4x32_10(k.counter, k.k0, k.k1);
    for (int w = 0; w < 4; ++w) EXPECT_EQ(got.x[w], k.out.x[w]) << "word " << w;
  }
}

// The layout of relpos/dropout.hpp, restated: counter (kp / 64 * 16 + kp % 16,
// qp, batch * H + head, offset), word kp / 16 % 4, kept at or above the threshold.
TEST(Dropout, KeepBitsFollowTheCounterLayout) {
  AttentionDropout d{0.3, 0x0123456789abcdefull, 77, 0};
  const uint32_t threshold = uint32_t(0.3 * 4294967296.0);
  EXPECT_EQ(relpos::philox::keep_threshold(0.3), threshold);
  EXPECT_EQ(relpos::philox::keep_threshold(0.0), 0u);
  EXPECT_EQ(relpos::philox::keep_threshold(0.5), 0x80000000u);
  for (int64_t kp : {0, 1, 15, 16, 63, 64, 100, 1000003}) {
    const uint32_t c0 = uint32_t(kp / 64 * 16 + kp % 16);
    const Block x = philox4x32_10({{c0, 9, 2 * 4 + 3, 77}}, 0x89abcdefu, 0x01234567u);
    EXPECT_EQ(relpos::dropout_keeps(d, 4, 2, 3, 9, kp), x.x[kp / 16 % 4] >= threshold) << kp;
  }
  d.batch_offset = 5;  // batch row b of a slice is row b + 5 of the whole
  EXPECT_EQ(relpos::dropout_keeps(d, 4, 0, 1, 9, 40), relpos::dropout_keeps({0.3, d.seed, 77, 0}, 4, 5, 1, 9, 40));
}

// Every target's multipliers, bit for bit the scalar keep bits times the scale.
TEST(Dropout, EveryTargetDrawsTheScalarBits) {
  std::vector<std::string> names;
  for (int64_t targets = hwy::SupportedTargets() & HWY_TARGETS; targets != 0; targets &= targets - 1) {
    hwy::ChosenTarget one;
    one.Update(targets & -targets);
    const DropoutOps ops = relpos::simd::detail::table_entry(HWY_DISPATCH_TABLE(TargetDropoutOps), one)();
    SCOPED_TRACE(ops.target);
    names.push_back(ops.target);
    for (double p : {0.1, 0.5, 0.97, 1e-12}) {
      const AttentionDropout d{p, 0xfedcba9876543210ull, 3, 0};
      const relpos::simd::DropoutRow r{uint32_t(d.seed), uint32_t(d.seed >> 32), 41, 7, d.offset,
                                       relpos::philox::keep_threshold(p), float(relpos::dropout_scale(d))};
      for (auto [kp0, n] : {std::pair<uint32_t, int64_t>{0, 64}, {0, 1}, {5, 3}, {60, 10}, {64, 200}, {13, 333},
                            {0xffffffc0u, 128}, {0xfffffff0u, 40}, {7, 1000}, {0xfffff000u, 8192}}) {
        std::vector<float> z(n, -1.0f);
        ops.dropout_row(r, kp0, z.data(), n);
        int64_t kept = 0;
        for (int64_t jj = 0; jj < n; ++jj) {
          // kp0 + jj wraps past 2^32 as the layout's positions do (mod 2^32)
          const bool keep = relpos::dropout_keeps(d, 8, 0, 7, 41, int64_t(uint32_t(kp0 + uint32_t(jj))));
          ASSERT_EQ(z[jj], keep ? r.scale : 0.0f) << "p " << p << " kp0 " << kp0 << " jj " << jj;
          kept += keep;
        }
        // The applying form: x times the same multipliers, in place and beside z.
        std::vector<float> x(n), out(n), z2(n);
        for (int64_t jj = 0; jj < n; ++jj) x[jj] = 0.25f + float(jj % 7);
        ops.dropout_times(r, kp0, x.data(), out.data(), z2.data(), n);
        ASSERT_EQ(z2, z);
        for (int64_t jj = 0; jj < n; ++jj) ASSERT_EQ(out[jj], x[jj] * z[jj]) << jj;
        ops.dropout_times(r, kp0, x.data(), x.data(), nullptr, n);
        ASSERT_EQ(x, out);
        if (p == 0.5 && n >= 200) {
          EXPECT_NEAR(double(kept) / double(n), 0.5, 0.15) << kp0;
        }
        if (p == 1e-12) {
          EXPECT_EQ(kept, n);
        }
      }
    }
  }
  EXPECT_GE(names.size(), size_t((HWY_TARGETS & (HWY_TARGETS - 1)) ? 2 : 1)) << testing::PrintToString(names);
  EXPECT_EQ(std::count(names.begin(), names.end(), relpos::simd::active_target()), 1)
      << "the library dispatches to " << relpos::simd::active_target() << ", which was not checked";
}

// The library's dispatched function draws the same multipliers.
TEST(Dropout, TheLibrarysDispatchDrawsTheScalarBits) {
  const AttentionDropout d{0.25, 42, 0, 3};
  const relpos::simd::DropoutRow r{42, 0, 5, uint32_t((3 + 1) * 2 + 1), 0, relpos::philox::keep_threshold(0.25),
                                   float(relpos::dropout_scale(d))};
  std::vector<float> z(300);
  relpos::simd::dropout_row(r, 17, z.data(), 300);
  for (int64_t jj = 0; jj < 300; ++jj)
    ASSERT_EQ(z[jj], relpos::dropout_keeps(d, 2, 1, 1, 5, 17 + jj) ? r.scale : 0.0f) << jj;
}

}  // namespace
}  // namespace relpos_test
#endif  // HWY_ONCE
