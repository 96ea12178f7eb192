// relpos/dropout.hpp's dropout_mask: a call's whole keep mask, row by row
// through the kernels' own drawing (DropoutRows), for tests and debugging.
#include <algorithm>
#include <stdexcept>
#include <string>
#include <vector>

#include "dropout_rows.hpp"
#include "relpos/dropout.hpp"

namespace relpos {

void dropout_mask(const AttentionDropout& d, int64_t B, int64_t H, int64_t Lq, int64_t Lk, int64_t q_offset,
                  int64_t k_offset, uint8_t* keep) {
  if (!(d.p >= 0 && d.p < 1)) throw std::invalid_argument("relpos: dropout.p: must be in [0, 1)");
  if (B < 0 || H < 0 || Lq < 0 || Lk < 0) throw std::invalid_argument("relpos: dropout_mask: sizes must be >= 0");
  if (!d.active()) return std::fill(keep, keep + B * H * Lq * Lk, uint8_t(1));  // p = 0 keeps everything
  AttentionForward<float> call;  // the shapes and offsets DropoutRows reads
  call.q.shape = {B, H, Lq, 1};
  call.q_offset = q_offset, call.k_offset = k_offset;
  call.dropout = d;
  std::vector<float> z(Lk);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h) {
      const DropoutRows<float> rows(call, b, h);
      for (int64_t i = 0; i < Lq; ++i) {
        uint8_t* out = keep + ((b * H + h) * Lq + i) * Lk;
        rows.fill(i, 0, Lk, z.data());
        for (int64_t j = 0; j < Lk; ++j) out[j] = z[j] != 0;
      }
    }
}

}  // namespace relpos
