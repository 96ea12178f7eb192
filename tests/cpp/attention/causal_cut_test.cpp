// The causal cut of a query tile (src/attention/causal_cut.hpp): visited_keys
// in closed form against its definition, key tile by key tile (a tile is
// visited up to the last one that holds a pair the tile's last query may see).
#include <gtest/gtest.h>

#include <algorithm>

#include "../../../src/attention/causal_cut.hpp"

namespace relpos::fused {
namespace {

// The end of the visited key tiles, by walking them: a key tile whose
// nearest pair (the last query against its first key) lies in the future
// (distance r > 0), and every tile after it, is not visited.
int64_t visited_by_walking(const AttentionForward<float>& p, const Head<float>& hd, int64_t i0, int64_t bq) {
  int64_t end = 0;
  for (int64_t j0 = 0; j0 < hd.lk; j0 += tiles::kBackwardKeys) {
    if (p.causal && hd.r(i0 + bq - 1, j0) > 0) break;
    end = std::min(hd.lk, j0 + tiles::kBackwardKeys);
  }
  return end;
}

TEST(CausalCut, VisitedKeysInClosedFormIsTheWalkOfTheKeyTiles) {
  int64_t checked = 0;
  for (bool causal : {false, true})
    for (int64_t lq : {1, 5, 128, 129, 300})
      for (int64_t lk : {1, 127, 128, 300, 700})
        for (int64_t q_offset : {0, 3, 200, 1000})
          for (int64_t k_offset : {0, 7, 400}) {
            AttentionForward<float> p;
            p.q = {nullptr, {1, 1, lq, 4}, {0, 0, 4, 1}};
            p.k = {nullptr, {1, 1, lk, 4}, {0, 0, 4, 1}};
            p.v = p.k;
            p.causal = causal, p.q_offset = q_offset, p.k_offset = k_offset;
            const Head<float> hd = head_geometry(p, 0, 0);
            for (int64_t bq : {1, 16, 128})
              for (int64_t i0 = 0; i0 < lq; i0 += bq) {
                const int64_t rows = std::min(bq, lq - i0);
                ASSERT_EQ(visited_keys(p, hd, i0, rows), visited_by_walking(p, hd, i0, rows))
                    << "causal " << causal << " lq " << lq << " lk " << lk << " offsets " << q_offset << ", "
                    << k_offset << " i0 " << i0 << " bq " << rows;
                ++checked;
              }
          }
  EXPECT_GT(checked, 10000);
}

}  // namespace
}  // namespace relpos::fused
