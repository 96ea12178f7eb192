// Helpers of the nn tests: random tensors, and central differences in double
// of a scalar objective against analytic gradients.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <algorithm>
#include <functional>
#include <random>
#include <string>
#include <vector>

namespace relpos_nn_test {

// n random bytes (token ids), seeded.
inline std::vector<uint8_t> random_tokens(std::size_t n, uint32_t seed) {
  std::mt19937 gen(seed);
  std::vector<uint8_t> t(n);
  for (uint8_t& x : t) x = static_cast<uint8_t>(gen() % 256);
  return t;
}

inline std::vector<double> random_values(std::size_t n, uint32_t seed, double scale = 1.0) {
  std::mt19937 gen(seed);
  std::normal_distribution<double> normal(0.0, scale);
  std::vector<double> v(n);
  for (double& x : v) x = normal(gen);
  return v;
}

// Coordinates to check: all of them for a tensor of at most `all_up_to`
// elements, else `samples` distinct random ones.
inline std::vector<int64_t> coordinates(int64_t size, uint32_t seed, int64_t all_up_to = 64, int64_t samples = 24) {
  std::vector<int64_t> c;
  if (size <= all_up_to) {
    for (int64_t i = 0; i < size; ++i) c.push_back(i);
    return c;
  }
  std::vector<int64_t> all(size);
  for (int64_t i = 0; i < size; ++i) all[i] = i;
  std::shuffle(all.begin(), all.end(), std::mt19937(seed));
  return {all.begin(), all.begin() + samples};
}

// Backward adds into gradient buffers that start at this value.
constexpr double kGradFill = 0.25;

// Compares analytic(c) (the caller subtracts its gradient fill) with
// (f(x + h) - f(x - h)) / 2h for every coordinate c of `coords`.
inline ::testing::AssertionResult matches_central_differences(const std::string& name, double* x,
                                                              const std::vector<int64_t>& coords,
                                                              const std::function<double(int64_t)>& analytic,
                                                              const std::function<double()>& objective,
                                                              double step = 1e-6, double rtol = 1e-5,
                                                              double atol = 1e-8) {
  int bad = 0;
  double largest = 0;
  ::testing::AssertionResult failure = ::testing::AssertionFailure();
  for (int64_t c : coords) {
    const double x0 = x[c];
    x[c] = x0 + step;
    const double plus = objective();
    x[c] = x0 - step;
    const double minus = objective();
    x[c] = x0;
    const double numeric = (plus - minus) / (2 * step), a = analytic(c);
    largest = std::max(largest, std::abs(numeric));
    if (!(std::abs(a - numeric) <= atol + rtol * std::abs(numeric)) && bad++ < 5)
      failure << "d" << name << "[" << c << "] = " << a << ", central difference " << numeric << "\n";
  }
  if (bad > 0) return failure << bad << " of " << coords.size() << " coordinates of d" << name << " differ";
  if (largest < 1e-7) return ::testing::AssertionFailure() << name << " barely moves the objective: the check proves nothing";
  return ::testing::AssertionSuccess();
}

}  // namespace relpos_nn_test
