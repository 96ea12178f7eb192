// Offsets on a grid (relpos/position.hpp): SAM's get_rel_pos, one pair at a time.
#include <algorithm>

#include "relpos/position.hpp"

namespace relpos {

int64_t grid_offset_index(int64_t yq, int64_t yk, int64_t q_size, int64_t k_size) {
  // torch.arange(q_size)[:, None] * max(k_size / q_size, 1.0): the scale a Python float, the
  // product, the difference and the shift's sum in float32 (the default dtype); .long() truncates.
  const double q_scale = std::max(double(k_size) / double(q_size), 1.0);
  const double k_scale = std::max(double(q_size) / double(k_size), 1.0);
  const float q_coord = float(yq) * float(q_scale), k_coord = float(yk) * float(k_scale);
  const float shift = float(double(k_size - 1) * k_scale);
  return int64_t((q_coord - k_coord) + shift);
}

}  // namespace relpos
