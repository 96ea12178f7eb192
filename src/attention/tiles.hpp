// The fused kernel's forward tile: how many query rows and keys one step of
// its online softmax takes, chosen per call from the CPU's cache sizes and the
// head dimensions (the rule below), or as RELPOS_FORWARD_TILES says.
//
// One forward step reads a block of keys and values and writes the logits of
// the tile's rows against them; the rule keeps those three buffers (float32:
// the compute type of every storage type) within three quarters of the L2
// cache of one core, with the most keys that fit of 512, 256 and 128. 128 query
// rows throughout. Measured with the plain forward (B = 1, H = 8, 2 threads):
//   - Zen 5 and an Intel AMX Xeon (1-2 MiB L2): 512 keys 6-7% faster than 128
//     and 0-3% faster than 256; 64 or 256 rows slower than 128;
//   - Zen 3 (512 KiB L2): 256, 512 and 1024 keys within the machine's noise
//     (+-3%), 64 rows 3-10% and 32 rows up to 25% slower than 128
//     (docs/benchmarks.md, "Forward tiles").
// The backward's tiles stay 128 x 128 (its P and dP, 64 KiB each, fit every L2).
// A call with a table read by the key (DeBERTa's p2c) takes 128 keys whatever
// the L2. When its pairs were picked key by key from the keys' scores (keys x
// rows, 1 MiB for 512 keys of DeBERTa-v3's 512 rows), on Zen 5 (B = 2, H = 12,
// L = 2048, d = 64, 2 threads) its forward took 144-150 ms with 128 keys,
// 180-188 with 256 and 208 with 512. With the picks by distance
// (indexed_rows.hpp) on Zen 4, 256 and 512 keys measured within the noise of
// 128 (795-822 ms forward + backward, separate processes), so the rule stayed.
//
// The rule is deterministic per machine, and so are the results: the tile
// decides where the online softmax rescales, which changes the last bits of
// the output. No timing-based tuning picks tiles, since it would make the bits
// of a result depend on how busy the machine was when it was chosen.
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>

namespace relpos::tiles {

// Cache sizes in bytes as the CPU reports them (0 = not reported); l2 is one core's.
struct CacheSizes {
  int64_t l1d = 0, l2 = 0, l3 = 0;
};

// Read once: /sys/devices/system/cpu/cpu0/cache, then sysconf where sysfs lists nothing.
const CacheSizes& this_cpu();

struct ForwardTiles {
  int64_t rows = 0;  // query rows per tile
  int64_t keys = 0;  // keys per step of a full query tile
  bool operator==(const ForwardTiles&) const = default;
};

constexpr int64_t kRows = 128;

// The backward's tile, from measurements (relpos bench attention, L=4096,
// d=64 and 128, 2 threads, two alternating rounds): 128 x 128 ran plain, T5
// and Transformer-XL 20-25% faster than 64 x 64 and 8-10% faster than
// 64 x 128; larger tiles amortise the GEMM library's per-call cost. Its keys
// are also the granularity at which the causal mask skips key tiles, forward
// and backward.
constexpr int64_t kBackwardRows = 128, kBackwardKeys = 128;
constexpr int64_t kAssumedL2 = 1 << 20;  // where the CPU reports no L2: the size the tiles were tuned on

// A causal tile row's computed keys are its shown keys rounded up to this, so
// that the vector loops run whole vectors (a tail runs lane by lane, and a
// third of the plain forward at L = 64 went to it); the masked keys among them
// are -inf logits and come out 0 (causal_cut.hpp).
constexpr int64_t kCausalKeyRounding = 16;

// Keys per step of an indexed table's picks (DeBERTa's c2p and p2c): a tile's
// pairs are laid out by distance this many keys at a time, in a block of
// rows x (rows + keys - 1) (indexed_rows.hpp; the scratch plan, fused_plan.hpp,
// sizes it): 127 KiB in float32 at 128 rows (the rule's rows), within every L2.
constexpr int64_t kDiagonalKeys = 128;

// Keys per step of a forward query tile of bq rows: a full query tile takes
// the keys of its tiles, a query tile of few rows (a decode step)
// proportionally more, up to kDecodeBlockK keys per GEMM call (Lq = 1,
// Lk = 32768, B = 8, H = 8, ALiBi, two threads: 34.0 ms instead of 40.0 with
// 128 keys per call).
constexpr int64_t kDecodeBlockK = 4096;
inline int64_t forward_key_block(const ForwardTiles& f, int64_t bq) {
  return std::clamp<int64_t>(f.rows * f.keys / bq / kBackwardKeys * kBackwardKeys, f.keys, kDecodeBlockK);
}

// The rule (see above) for these caches and head dimensions, with or
// without a table read by the key.
ForwardTiles forward_rule(const CacheSizes& caches, int64_t d, int64_t dv, bool table_read_by_key = false);

// "ROWSxKEYS" as RELPOS_FORWARD_TILES takes it: rows 16 to 512, keys a multiple
// of 128 from 128 to 4096; std::invalid_argument naming the variable otherwise.
ForwardTiles parse_override(const std::string& text);

// This call's tiles: RELPOS_FORWARD_TILES (read once) if set, else the rule
// for this CPU.
ForwardTiles forward(int64_t d, int64_t dv, bool table_read_by_key = false);

// "128 x 256 (d = 64), 128 x 256 (d = 128), rule for 512 KiB of L2" for relpos info;
// a malformed RELPOS_FORWARD_TILES is described, not thrown (the attention calls refuse it).
std::string describe();

}  // namespace relpos::tiles
