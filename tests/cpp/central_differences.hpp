// The central-difference gradient check shared by the reference's and the
// algorithms' gradient tests: f = sum(G * out) for the random G = dout; every
// analytic gradient element of every input and learnable parameter against
// (f(x+h) - f(x-h)) / 2h, in double.
#pragma once

#include <algorithm>
#include <cmath>

#include "problem.hpp"

namespace relpos_test {

constexpr double kStep = 1e-6;
// Central differences in double at h = 1e-6 are good to ~1e-10 here; a wrong
// term in a gradient is off by far more than the tolerance.
constexpr double kRelTol = 1e-6, kAbsTol = 1e-8;
// Gradient buffers start at this value: backward must add into them.
constexpr double kGradFill = 0.25;

inline double objective(Problem<double>& p) {
  p.forward();
  const std::vector<double> out = p.out.values(), g = p.dout.values();
  double f = 0;
  for (std::size_t n = 0; n < out.size(); ++n) f += g[n] * out[n];
  return f;
}

// Runs backward into buffers filled with kGradFill, then perturbs every
// parameter element with `difference_threads` threads (the thousands of tiny
// forward calls are fastest on one; heads are independent in forward).
inline void expect_gradients_match_central_differences(Problem<double>& p, int difference_threads) {
  p.forward();
  p.fill_grads(kGradFill);
  p.backward();
  p.spec.num_threads = difference_threads;
  for (Param<double>& param : p.params()) {
    std::vector<double> analytic, numeric;
    for (std::size_t n = 0; n < param.value.size(); ++n) {
      double& x = *param.value[n];
      const double x0 = x;
      x = x0 + kStep;
      const double f_plus = objective(p);
      x = x0 - kStep;
      const double f_minus = objective(p);
      x = x0;
      numeric.push_back((f_plus - f_minus) / (2 * kStep));
      analytic.push_back(*param.grad[n] - kGradFill);
    }
    EXPECT_TRUE(all_near("d" + param.name, analytic, numeric, kAbsTol, kRelTol));
    double largest = 0;
    for (double g : numeric) largest = std::max(largest, std::abs(g));
    EXPECT_GT(largest, 1e-3) << param.name << " barely moves f: the check would prove nothing";
  }
}

}  // namespace relpos_test
