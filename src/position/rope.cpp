#include <cmath>

#include "relpos/position.hpp"

namespace relpos {

std::vector<double> rope_inv_freq(int64_t rotary_dims, double base) {
  std::vector<double> f(rotary_dims / 2);
  for (int64_t i = 0; i < rotary_dims / 2; ++i)
    f[i] = 1.0 / std::pow(base, static_cast<double>(2 * i) / static_cast<double>(rotary_dims));
  return f;
}

template <class T>
void rope_rotate(T* x, int64_t stride, double pos, const std::vector<double>& inv_freq, RopeStyle style,
                 int direction) {
  const int64_t dims = 2 * static_cast<int64_t>(inv_freq.size());
  for (int64_t i = 0; i < dims / 2; ++i) {
    const double angle = pos * inv_freq[i];
    const double c = std::cos(angle), s = direction * std::sin(angle);
    const auto [a, b] = rope_pair(i, dims, style);
    const double x1 = x[a * stride], x2 = x[b * stride];
    x[a * stride] = static_cast<T>(x1 * c - x2 * s);
    x[b * stride] = static_cast<T>(x2 * c + x1 * s);
  }
}

template void rope_rotate<float>(float*, int64_t, double, const std::vector<double>&, RopeStyle, int);
template void rope_rotate<double>(double*, int64_t, double, const std::vector<double>&, RopeStyle, int);

}  // namespace relpos
