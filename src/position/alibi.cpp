#include <cmath>
#include <stdexcept>
#include <string>

#include "relpos/position.hpp"

namespace relpos {

namespace {
std::vector<double> power_of_two_slopes(int64_t n) {
  const double start = std::pow(2.0, -std::pow(2.0, -(std::log2(static_cast<double>(n)) - 3.0)));
  std::vector<double> s(n);
  double m = start;
  for (int64_t i = 0; i < n; ++i, m *= start) s[i] = m;
  return s;
}
}  // namespace

std::vector<double> alibi_slopes(int64_t num_heads) {
  if (num_heads < 1 || num_heads > 65536)
    throw std::invalid_argument("relpos: alibi num_heads: must be in [1, 65536], got " + std::to_string(num_heads));
  int64_t pow2 = 1;
  while (pow2 * 2 <= num_heads) pow2 *= 2;
  std::vector<double> slopes = power_of_two_slopes(pow2);
  if (pow2 == num_heads) return slopes;
  const std::vector<double> finer = alibi_slopes(2 * pow2);
  for (int64_t i = 0; static_cast<int64_t>(slopes.size()) < num_heads; i += 2) slopes.push_back(finer[i]);
  return slopes;
}

}  // namespace relpos
