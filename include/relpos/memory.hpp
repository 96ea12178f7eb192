// Bytes the library itself holds in scratch buffers, for the memory benchmark:
// every algorithm allocates its temporaries through a tracking allocator, so
// the peak says what an algorithm needs beyond its inputs and outputs.
#pragma once

#include <cstdint>

namespace relpos {

struct MemoryStats {
  int64_t current_bytes = 0;  // scratch held now
  int64_t peak_bytes = 0;     // most scratch held at once since the last reset
};

MemoryStats memory_stats();
// Starts a new measurement: peak := current.
void reset_peak_memory();

}  // namespace relpos
