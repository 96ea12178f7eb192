#include <cmath>

#include "relpos/position.hpp"

namespace relpos {

std::vector<double> sinusoid_inv_freq(int64_t dim) {
  std::vector<double> f(dim / 2);
  for (int64_t i = 0; i < dim / 2; ++i)
    f[i] = 1.0 / std::pow(10000.0, static_cast<double>(2 * i) / static_cast<double>(dim));
  return f;
}

template <class T>
void sinusoid(double p, const std::vector<double>& inv_freq, T* out) {
  const int64_t half = static_cast<int64_t>(inv_freq.size());
  for (int64_t i = 0; i < half; ++i) {
    out[i] = static_cast<T>(std::sin(p * inv_freq[i]));
    out[half + i] = static_cast<T>(std::cos(p * inv_freq[i]));
  }
}

template <class T>
void sinusoid(double p, int64_t dim, T* out) {
  sinusoid(p, sinusoid_inv_freq(dim), out);
}

template void sinusoid<float>(double, int64_t, float*);
template void sinusoid<double>(double, int64_t, double*);
template void sinusoid<float>(double, const std::vector<double>&, float*);
template void sinusoid<double>(double, const std::vector<double>&, double*);

}  // namespace relpos
