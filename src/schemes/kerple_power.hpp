// KERPLE (Chi et al. 2022), its power variant: the bias -r1_h |r|^r2_h,
// r1 > 0 and 0 < r2 <= 2 learnable per head (the range in which the paper's
// kernel is conditionally positive definite). Checks, bias and gradient are
// KERPLE's (kerple.hpp) with this kernel.
#pragma once

#include <cmath>
#include <limits>
#include <utility>
#include <vector>

#include "kerple.hpp"

namespace relpos {

struct KerplePowerKernel {
  static constexpr const char* name = "kerple_power";
  static constexpr double r2_ceiling = 2;
  template <class P>
  static auto& params(P& pos) { return pos.kerple_power; }
  template <class G>
  static auto& r1_grad(G& g) { return g.kerple_power_r1; }
  template <class G>
  static auto& r2_grad(G& g) { return g.kerple_power_r2; }
  static double value(double a, double r1, double r2) { return -r1 * std::pow(a, r2); }
  // d/d r2 = -r1 |r|^r2 log|r|, whose limit at r = 0 is 0.
  static std::pair<double, double> gradient(double a, double r1, double r2) {
    if (a == 0) return {0, 0};
    const double power = std::pow(a, r2);
    return {-power, -r1 * power * std::log(a)};
  }
};

struct KerplePowerScheme : KerpleKernelScheme<KerplePowerKernel> {
  static constexpr Scheme id = Scheme::kerple_power;
  static constexpr const char* name = "kerple_power";
  static constexpr AlgorithmSet algorithms = kBiasAlgorithms;

  template <class Params, class F, class... Grads>
  static void for_each_param(Params& pos, F&& f, Grads&... g) {
    f("kerple_power_r1", pos.kerple_power.r1, g.kerple_power_r1...);
    f("kerple_power_r2", pos.kerple_power.r2, g.kerple_power_r2...);
  }

  // The model: r1, r2 per layer, initialised to 1 and read clamped to
  // [0.01, inf) and [0.01, 2] (an entry outside gets no gradient), as the
  // paper's code clamps them.
  template <class T>
  static std::vector<ModelTensor> model(PositionParams<T>&, const SchemeModelConfig& c) {
    constexpr double floor = 0.01, inf = std::numeric_limits<double>::infinity();
    return {{"kerple_power_r1", {c.heads}, false, true, floor, inf},
            {"kerple_power_r2", {c.heads}, false, true, floor, KerplePowerKernel::r2_ceiling}};
  }
};

template <>
struct SchemeOf<Scheme::kerple_power> : std::type_identity<KerplePowerScheme> {};

}  // namespace relpos
