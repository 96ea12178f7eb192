#include <cmath>

#include "relpos/position.hpp"

namespace relpos {

template <class T>
void sinusoid(double p, int64_t dim, T* out) {
  const int64_t half = dim / 2;
  for (int64_t i = 0; i < half; ++i) {
    const double f = 1.0 / std::pow(10000.0, static_cast<double>(2 * i) / static_cast<double>(dim));
    out[i] = static_cast<T>(std::sin(p * f));
    out[half + i] = static_cast<T>(std::cos(p * f));
  }
}

template void sinusoid<float>(double, int64_t, float*);
template void sinusoid<double>(double, int64_t, double*);

}  // namespace relpos
