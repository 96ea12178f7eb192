// The OpenMP loop of the elementwise layers: rows split statically over
// `threads`, and run serially when the work is too small to pay for waking them.
#pragma once

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

}  // namespace relpos::nn
