// Affine layer through relpos::gemm: y = x W^T + b, W stored (out, in) as in
// torch.nn.Linear.
#pragma once

#include <cstdint>

#include "relpos/gemm.hpp"
#include "row_loop.hpp"

namespace relpos::nn {

// x (n, in), weight (out, in), bias (out) -> y (n, out), written.
template <class T>
void linear_forward(const T* x, const T* weight, const T* bias, int64_t n, int64_t in, int64_t out, T* y,
                    int threads) {
  gemm<T>(Trans::no, Trans::yes, n, out, in, T(1), x, in, weight, in, T(0), y, out);
  for_each_row(threads, n, out, [&](int64_t r) {
    T* yr = y + r * out;
    for (int64_t c = 0; c < out; ++c) yr[c] += bias[c];
  });
}

// dy (n, out); writes dx (n, in) = dy W, adds dweight (out, in) += dy^T x
// and dbias (out) += column sums of dy (parameter gradients accumulate).
template <class T>
void linear_backward(const T* dy, const T* x, const T* weight, int64_t n, int64_t in, int64_t out, T* dx,
                     T* dweight, T* dbias) {
  gemm<T>(Trans::no, Trans::no, n, in, out, T(1), dy, out, weight, in, T(0), dx, in);
  gemm<T>(Trans::yes, Trans::no, out, in, n, T(1), dy, out, x, in, T(1), dweight, in);
  for (int64_t r = 0; r < n; ++r) {
    const T* dr = dy + r * out;
    for (int64_t c = 0; c < out; ++c) dbias[c] += dr[c];
  }
}

}  // namespace relpos::nn
