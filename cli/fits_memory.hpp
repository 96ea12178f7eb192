// The one check, before any allocation or GEMM, that what a command will hold
// at once fits this machine. Each command adds up the bytes of its buffers
// from its option values, in double: a product of option values cannot
// overflow there, and one beyond int64 is far more than any machine's memory,
// so it is refused with the rest. Without the check, sizes that could never
// be allocated ended in std::vector's length_error or bad_alloc after minutes
// of other work, or a GEMM ran on them for minutes before the allocation.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace relpos::cli {

// An option (or another source of a size) and the value that went into it:
// {"--lengths", 8192}, {"checkpoint width", 128}.
struct SizeOption {
  std::string name;
  int64_t value;
};

// This machine's physical memory in bytes (0 when unknown).
double physical_memory_bytes();

// Throws UsageError "--lengths 8192 x --dims 64 x ... needs about N GB, more
// than this machine's M GB" when `bytes` exceeds the physical memory (or,
// where that is unknown, int64).
void check_fits_memory(double bytes, const std::vector<SizeOption>& sizes);

}  // namespace relpos::cli
