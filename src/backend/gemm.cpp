// A portable blocked GEMM: loops ordered so the innermost one runs over
// contiguous memory and vectorises. It is correct for every shape and
// transpose; the fused kernel brings its own tuned tile GEMM.
#include "gemm.hpp"

#include <algorithm>
#include "scratch.hpp"

namespace relpos {

template <class T>
void gemm(Trans ta, Trans tb, int64_t m, int64_t n, int64_t k, T alpha, const T* a, int64_t lda, const T* b,
          int64_t ldb, T beta, T* c, int64_t ldc) {
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j) c[i * ldc + j] = beta == T(0) ? T(0) : beta * c[i * ldc + j];
  if (k == 0 || alpha == T(0)) return;
  // B^T is copied once to row-major k x n so the inner loop is contiguous in j.
  Scratch<T> bt;
  if (tb == Trans::yes) {
    bt.resize(k * n);
    for (int64_t j = 0; j < n; ++j)
      for (int64_t p = 0; p < k; ++p) bt[p * n + j] = b[j * ldb + p];
    b = bt.data();
    ldb = n;
  }
  constexpr int64_t kBlock = 256;
  for (int64_t p0 = 0; p0 < k; p0 += kBlock) {
    const int64_t p1 = std::min(k, p0 + kBlock);
    for (int64_t i = 0; i < m; ++i) {
      T* ci = c + i * ldc;
      for (int64_t p = p0; p < p1; ++p) {
        const T aip = alpha * (ta == Trans::no ? a[i * lda + p] : a[p * lda + i]);
        if (aip == T(0)) continue;
        const T* bp = b + p * ldb;
        for (int64_t j = 0; j < n; ++j) ci[j] += aip * bp[j];
      }
    }
  }
}

template void gemm<float>(Trans, Trans, int64_t, int64_t, int64_t, float, const float*, int64_t, const float*, int64_t,
                          float, float*, int64_t);
template void gemm<double>(Trans, Trans, int64_t, int64_t, int64_t, double, const double*, int64_t, const double*,
                           int64_t, double, double*, int64_t);

}  // namespace relpos
