// The fused forward's tiles (src/attention/tiles.hpp): the rule for given
// cache sizes, the caches read from this CPU, and RELPOS_FORWARD_TILES's parser.
#include <gtest/gtest.h>

#include <fstream>
#include <stdexcept>
#include <string>

#include "../../../src/attention/tiles.hpp"

namespace relpos::tiles {
namespace {

constexpr int64_t KiB = 1024, MiB = 1024 * KiB;

TEST(ForwardTiles, RuleKeepsTheLogitsAndTheKeyAndValueBlocksInThreeQuartersOfL2) {
  // Zen 3 (512 KiB): 512 keys need 512 KiB (d = 64) or 768 KiB (d = 128) > 384 KiB; 256 keys fit.
  EXPECT_EQ(forward_rule({32 * KiB, 512 * KiB, 32 * MiB}, 64, 64), (ForwardTiles{128, 256}));
  EXPECT_EQ(forward_rule({32 * KiB, 512 * KiB, 32 * MiB}, 128, 128), (ForwardTiles{128, 256}));
  // Zen 5 (1 MiB): 512 keys, 512 KiB at d = 64 and exactly the 768 KiB budget at d = 128.
  EXPECT_EQ(forward_rule({48 * KiB, MiB, 32 * MiB}, 64, 64), (ForwardTiles{128, 512}));
  EXPECT_EQ(forward_rule({48 * KiB, MiB, 32 * MiB}, 128, 128), (ForwardTiles{128, 512}));
  EXPECT_EQ(forward_rule({48 * KiB, MiB, 32 * MiB}, 128, 129), (ForwardTiles{128, 256}));
  // An Intel Xeon with 2 MiB of L2; d = 256 on 1 MiB; a small L2 (256 KiB) at d = 128.
  EXPECT_EQ(forward_rule({48 * KiB, 2 * MiB, 0}, 128, 128), (ForwardTiles{128, 512}));
  EXPECT_EQ(forward_rule({0, MiB, 0}, 256, 256), (ForwardTiles{128, 256}));
  EXPECT_EQ(forward_rule({0, 256 * KiB, 0}, 128, 128), (ForwardTiles{128, 128}));
  EXPECT_EQ(forward_rule({0, 64 * KiB, 0}, 64, 64), (ForwardTiles{128, 128}));  // never fewer than 128 keys
  // No L2 reported: the size the tiles were tuned on.
  EXPECT_EQ(forward_rule({}, 64, 64), forward_rule({0, kAssumedL2, 0}, 64, 64));
  // A table read by the key (DeBERTa's p2c): 128 keys on every L2.
  for (const int64_t l2 : {int64_t(0), 512 * KiB, MiB, 2 * MiB})
    EXPECT_EQ(forward_rule({48 * KiB, l2, 0}, 64, 64, true), (ForwardTiles{128, 128}));
}

// This CPU's L2 as sysfs lists it, where it does.
int64_t sysfs_l2() {
  for (int index = 0; index < 8; ++index) {
    const std::string dir = "/sys/devices/system/cpu/cpu0/cache/index" + std::to_string(index) + "/";
    std::ifstream level(dir + "level"), size(dir + "size");
    int l = 0;
    int64_t kib = 0;
    if (!(level >> l)) break;
    if (l == 2 && (size >> kib)) return kib * KiB;
  }
  return 0;
}

TEST(ForwardTiles, ThisCpusCachesAreTheOnesItReports) {
  const CacheSizes& c = this_cpu();
  if (const int64_t l2 = sysfs_l2(); l2 > 0) {
    EXPECT_EQ(c.l2, l2);
  }
  EXPECT_GE(c.l2, 0);
  EXPECT_EQ(forward(64, 64), getenv("RELPOS_FORWARD_TILES") ? parse_override(getenv("RELPOS_FORWARD_TILES"))
                                                            : forward_rule(c, 64, 64));
  EXPECT_NE(describe().find(" x "), std::string::npos);
}

TEST(ForwardTiles, OverrideIsParsedAndBadTextRefusedByName) {
  EXPECT_EQ(parse_override("128x256"), (ForwardTiles{128, 256}));
  EXPECT_EQ(parse_override("16x4096"), (ForwardTiles{16, 4096}));
  for (const char* bad : {"", "128", "128x", "x256", "128x250", "8x256", "1024x256", "128x8192", "128x256x1", "a x b",
                          "128 x 256"}) {
    try {
      parse_override(bad);
      ADD_FAILURE() << "accepted '" << bad << "'";
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find("RELPOS_FORWARD_TILES"), std::string::npos) << e.what();
    }
  }
}

}  // namespace
}  // namespace relpos::tiles
