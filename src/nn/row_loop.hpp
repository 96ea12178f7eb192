// The OpenMP loop of the elementwise layers: rows split statically over
// `threads`, and run serially when the work is too small to pay for waking them.
// And the row sum they share (bias, residual, bias gradient).
#pragma once

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "../backend/simd.hpp"

namespace relpos::nn {

// Below this many element operations a parallel region costs more than it saves.
constexpr int64_t kMinParallelWork = 1 << 15;

template <class Body>
void for_each_row(int threads, int64_t rows, int64_t row_work, Body body) {
  const bool parallel = threads > 1 && rows > 1 && rows * row_work >= kMinParallelWork;
#pragma omp parallel for num_threads(threads) schedule(static) if (parallel)
  for (int64_t r = 0; r < rows; ++r) body(r);
}

// body(begin, size) for [0, count) cut into blocks of `block` elements (the
// last may be shorter), the blocks split over `threads` as rows are.
template <class Body>
void for_each_block(int threads, int64_t count, int64_t block, Body body) {
  for_each_row(threads, (count + block - 1) / block, block,
               [&](int64_t b) { body(b * block, std::min(block, count - b * block)); });
}

// y += x over n elements; float through the dispatched vector loop (a
// multiply-add by 1 is the sum, rounded once).
template <class T>
void add_row(T* y, const T* x, int64_t n) {
  if constexpr (std::is_same_v<T, float>) return simd::add_scaled(y, x, 1.0f, n);
  for (int64_t c = 0; c < n; ++c) y[c] += x[c];
}

}  // namespace relpos::nn
