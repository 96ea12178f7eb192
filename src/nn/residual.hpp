// Residual connection: stream = skip + branch, computed in place on the branch
// output (the branch writes into the buffer that becomes the sum). Its
// backward is the identity on both paths: the model keeps one buffer for the
// stream's gradient, which every branch reads and every LayerNorm adds into.
#pragma once

#include <cstdint>

#include "row_loop.hpp"

namespace relpos::nn {

// skip (n), inout (n): inout = skip + inout.
template <class T>
void residual_forward(const T* skip, T* inout, int64_t rows, int64_t row, int threads) {
  for_each_row(threads, rows, row, [&](int64_t r) {
    for (int64_t c = r * row; c < (r + 1) * row; ++c) inout[c] += skip[c];
  });
}

}  // namespace relpos::nn
