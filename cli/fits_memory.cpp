#include "fits_memory.hpp"

#include <unistd.h>

#include <cstdio>
#include <limits>

#include "options.hpp"

namespace relpos::cli {

double physical_memory_bytes() {
  const long pages = sysconf(_SC_PHYS_PAGES), page_size = sysconf(_SC_PAGE_SIZE);
  return pages > 0 && page_size > 0 ? double(pages) * double(page_size) : 0;
}

void check_fits_memory(double bytes, const std::vector<SizeOption>& sizes) {
  const double physical = physical_memory_bytes();
  const double limit = physical > 0 ? physical : double(std::numeric_limits<int64_t>::max());
  if (bytes <= limit) return;
  std::string product;
  for (const SizeOption& s : sizes) product += (product.empty() ? "" : " x ") + s.name + " " + std::to_string(s.value);
  char amounts[128];
  if (physical > 0)
    std::snprintf(amounts, sizeof amounts, " needs about %.3g GB, more than this machine's %.3g GB", bytes / 1e9,
                  physical / 1e9);
  else
    std::snprintf(amounts, sizeof amounts, " needs about %.3g GB, more than int64 counts", bytes / 1e9);
  throw UsageError{product + amounts};
}

}  // namespace relpos::cli
