#include "tiles.hpp"

#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <stdexcept>

namespace relpos::tiles {

namespace {

// "32K", "512K", "32768K", "1M" as sysfs writes a cache's size; 0 if unreadable.
int64_t sysfs_size(const std::string& path) {
  std::ifstream in(path);
  int64_t value = 0;
  char unit = 0;
  if (!(in >> value)) return 0;
  in >> unit;
  return unit == 'K' ? value << 10 : unit == 'M' ? value << 20 : unit == 'G' ? value << 30 : value;
}

std::string sysfs_text(const std::string& path) {
  std::ifstream in(path);
  std::string text;
  in >> text;
  return text;
}

// The size of cpu0's cache of this level holding data ("Data" or "Unified").
int64_t sysfs_cache(int level) {
  for (int index = 0; index < 8; ++index) {
    const std::string dir = "/sys/devices/system/cpu/cpu0/cache/index" + std::to_string(index) + "/";
    const std::string type = sysfs_text(dir + "type");
    if (type.empty()) break;
    if (sysfs_text(dir + "level") == std::to_string(level) && type != "Instruction") return sysfs_size(dir + "size");
  }
  return 0;
}

// sysfs first: it lists the cache cpu0 shares (an AMD L3 of one core complex),
// where glibc's sysconf may add up a socket's.
int64_t cache_size(int sysconf_name, int level) {
  if (const int64_t listed = sysfs_cache(level); listed > 0) return listed;
  const long reported = sysconf(sysconf_name);
  return reported > 0 ? int64_t(reported) : 0;
}

std::string kib(int64_t bytes) {
  return bytes >= (8 << 20) ? std::to_string(bytes >> 20) + " MiB" : std::to_string(bytes >> 10) + " KiB";
}

}  // namespace

const CacheSizes& this_cpu() {
  static const CacheSizes caches{cache_size(_SC_LEVEL1_DCACHE_SIZE, 1), cache_size(_SC_LEVEL2_CACHE_SIZE, 2),
                                 cache_size(_SC_LEVEL3_CACHE_SIZE, 3)};
  return caches;
}

ForwardTiles forward_rule(const CacheSizes& caches, int64_t d, int64_t dv, bool table_read_by_key) {
  if (table_read_by_key) return {kRows, 128};
  const int64_t budget = (caches.l2 > 0 ? caches.l2 : kAssumedL2) / 4 * 3;
  for (const int64_t keys : {512, 256}) {
    const int64_t bytes = 4 * (kRows * keys + keys * (d + dv));  // the logits, the key and value blocks
    if (bytes <= budget) return {kRows, keys};
  }
  return {kRows, 128};
}

ForwardTiles parse_override(const std::string& text) {
  ForwardTiles t;
  std::size_t used = 0, x = text.find('x');
  try {
    if (x == std::string::npos) throw std::invalid_argument("no x");
    t.rows = std::stoll(text.substr(0, x), &used);
    if (used != x) throw std::invalid_argument("rows");
    t.keys = std::stoll(text.substr(x + 1), &used);
    if (used != text.size() - x - 1) throw std::invalid_argument("keys");
  } catch (const std::logic_error&) {
    throw std::invalid_argument("relpos: RELPOS_FORWARD_TILES='" + text + "' is not ROWSxKEYS (e.g. 128x256)");
  }
  if (t.rows < 16 || t.rows > 512 || t.keys < 128 || t.keys > 4096 || t.keys % 128 != 0)
    throw std::invalid_argument("relpos: RELPOS_FORWARD_TILES='" + text +
                                "': rows must be 16 to 512 and keys a multiple of 128 from 128 to 4096");
  return t;
}

namespace {
// RELPOS_FORWARD_TILES, parsed once; rows == 0 when unset.
const ForwardTiles& override_tiles() {
  static const ForwardTiles t = [] {
    const char* text = std::getenv("RELPOS_FORWARD_TILES");
    return text && *text ? parse_override(text) : ForwardTiles{};
  }();
  return t;
}
}  // namespace

ForwardTiles forward(int64_t d, int64_t dv, bool table_read_by_key) {
  const ForwardTiles& forced = override_tiles();
  return forced.rows ? forced : forward_rule(this_cpu(), d, dv, table_read_by_key);
}

std::string describe() {
  const auto shown = [](ForwardTiles t) { return std::to_string(t.rows) + " x " + std::to_string(t.keys); };
  try {
    if (override_tiles().rows) return shown(override_tiles()) + " (RELPOS_FORWARD_TILES)";
  } catch (const std::invalid_argument& e) {  // reported, not thrown: relpos info and import still work
    return std::string("none: ") + e.what();
  }
  const CacheSizes& c = this_cpu();
  return shown(forward(64, 64)) + " (d = 64), " + shown(forward(128, 128)) + " (d = 128), " +
         shown(forward(64, 64, true)) + " with a table read by the key; rule for " +
         (c.l2 > 0 ? kib(c.l2) + " of L2" : "an unreported L2, taken as " + kib(kAssumedL2));
}

}  // namespace relpos::tiles
