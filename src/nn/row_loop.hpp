// The OpenMP loop of the elementwise layers: rows split statically over
// `threads`, and run serially when the work is too small to pay for waking them.
#pragma once

#include <algorithm>
#include <cstdint>

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

}  // namespace relpos::nn
