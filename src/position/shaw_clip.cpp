#include "relpos/position.hpp"

#include <algorithm>

namespace relpos {

int64_t shaw_index(int64_t r, int64_t k, Beyond beyond) {
  if (beyond == Beyond::zero && (r > k || r < -k)) return -1;
  return std::clamp(r, -k, k) + k;
}

}  // namespace relpos
