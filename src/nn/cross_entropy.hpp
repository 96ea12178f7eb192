// Softmax cross-entropy over the byte vocabulary, each row weighted (the model
// weights scored rows by 1 / count and the rest by 0, which gives the mean
// over scored positions). The exponentials go through the attention kernels'
// vectorisable exp (std::exp for double).
#pragma once

#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "../backend/vexp.hpp"
#include "row_loop.hpp"

namespace relpos::nn {

// logits (n, classes), targets (n), weight (n) -> sum_r weight[r] * -log softmax(logits_r)[target_r].
template <class T>
double cross_entropy_forward(const T* logits, const uint8_t* targets, const T* weight, int64_t n, int64_t classes) {
  std::vector<T> scratch(classes);
  double total = 0;
  for (int64_t r = 0; r < n; ++r) {
    if (weight[r] == T(0)) continue;
    const T* row = logits + r * classes;
    const T top = max_of(row, classes, -std::numeric_limits<T>::infinity());
    const double lse = top + std::log(static_cast<double>(exp_shifted_sum(row, top, scratch.data(), classes)));
    total += weight[r] * (lse - row[targets[r]]);
  }
  return total;
}

// Writes dlogits (n, classes) = weight[r] * (softmax(logits_r) - onehot(target_r)).
template <class T>
void cross_entropy_backward(const T* logits, const uint8_t* targets, const T* weight, int64_t n, int64_t classes,
                            T* dlogits, int threads) {
  for_each_row(threads, n, 4 * classes, [&](int64_t r) {
    T* d = dlogits + r * classes;
    if (weight[r] == T(0)) {
      std::fill_n(d, classes, T(0));
      return;
    }
    const T* row = logits + r * classes;
    const T top = max_of(row, classes, -std::numeric_limits<T>::infinity());
    const T scale = weight[r] / exp_shifted_sum(row, top, d, classes);
#pragma omp simd
    for (int64_t c = 0; c < classes; ++c) d[c] *= scale;
    d[targets[r]] -= weight[r];
  });
}

}  // namespace relpos::nn
