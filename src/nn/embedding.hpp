// Embedding lookup: out row n = scale * table row index[n]. Used for the byte
// embedding (scaled by sqrt(width) under sinusoidal positions, see
// relpos/nn/model.hpp) and for the learned absolute position table.
#pragma once

#include <cstdint>

#include "row_loop.hpp"

namespace relpos::nn {

// table (rows, width), index (n) in [0, rows), out (n, width).
// accumulate = false writes out, true adds into it (a second embedding summed
// onto the first).
template <class T>
void embedding_forward(const T* table, int64_t width, const int32_t* index, int64_t n, T* out, bool accumulate,
                       int threads, T scale = T(1)) {
  for_each_row(threads, n, width, [&](int64_t r) {
    const T* src = table + static_cast<int64_t>(index[r]) * width;
    T* dst = out + r * width;
    if (accumulate)
      for (int64_t c = 0; c < width; ++c) dst[c] += scale * src[c];
    else
      for (int64_t c = 0; c < width; ++c) dst[c] = scale * src[c];
  });
}

// dout (n, width); dtable (rows, width) += scale * scatter of dout by index.
// Serial: rows repeat, and the loop is a small part of a training step.
template <class T>
void embedding_backward(const T* dout, int64_t width, const int32_t* index, int64_t n, T* dtable, T scale = T(1)) {
  for (int64_t r = 0; r < n; ++r) {
    T* dst = dtable + static_cast<int64_t>(index[r]) * width;
    const T* src = dout + r * width;
    for (int64_t c = 0; c < width; ++c) dst[c] += scale * src[c];
  }
}

}  // namespace relpos::nn
