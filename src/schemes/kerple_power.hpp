// KERPLE (Chi et al. 2022), its power variant: the bias -r1_h |r|^r2_h,
// r1 > 0 and 0 < r2 <= 2 learnable per head (the range in which the paper's
// kernel is conditionally positive definite). The bias and its parameter
// gradients are evaluated in double and rounded once.
#pragma once

#include <cmath>
#include <string>
#include <limits>
#include <vector>

#include "checks.hpp"
#include "scheme.hpp"

namespace relpos {

struct KerplePowerScheme {
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
  static std::vector<ModelTensor> model(PositionParams<T>&, const nn::ModelConfig& c) {
    constexpr double floor = 0.01, inf = std::numeric_limits<double>::infinity();
    return {{"kerple_power_r1", {c.heads}, false, true, floor, inf},
            {"kerple_power_r2", {c.heads}, false, true, floor, 2.0}};
  }

  template <class T>
  static void check(const AttentionForward<T>& p) {
    using namespace checks;
    const KerplePowerParams<T>& k = p.pos.kerple_power;
    const int64_t H = p.q.shape[1];
    check_shape("kerple_power.r1", k.r1, {H}, "(" + dims("H", H) + ")");
    check_shape("kerple_power.r2", k.r2, {H}, "(" + dims("H", H) + ")");
    const double far = double(farthest_distance(p));
    for (int64_t h = 0; h < H; ++h) {
      const double r1 = double(k.r1(h)), r2 = double(k.r2(h));
      if (!(std::isfinite(r1) && r1 > 0))
        fail("kerple_power.r1: every entry must be finite and > 0, head " + std::to_string(h) + " has " +
             std::to_string(r1));
      if (!(r2 > 0 && r2 <= 2))
        fail("kerple_power.r2: every entry must lie in (0, 2], head " + std::to_string(h) + " has " +
             std::to_string(r2));
      if (!std::isfinite(static_cast<compute_t<T>>(r1 * std::pow(far, r2))))
        fail("kerple_power.r1: the bias of head " + std::to_string(h) + " at the farthest distance " +
             std::to_string(int64_t(far)) + " overflows " + precision_name<compute_t<T>>());
    }
  }

  template <class T>
  class Bias final : public DistanceBias<T> {
   public:
    explicit Bias(const AttentionForward<T>& p)
        : DistanceBias<T>(p), r1_(p.pos.kerple_power.r1), r2_(p.pos.kerple_power.r2) {}

    void values(int64_t h, T* bias) const override {
      const double r1 = double(r1_(h)), r2 = double(r2_(h));
      for (int64_t m = 0; m < this->count(); ++m)
        bias[m] = static_cast<T>(-r1 * std::pow(double(this->distance_magnitude(m)), r2));
    }

    // d bias / d r1 = -|r|^r2, d bias / d r2 = -r1 |r|^r2 log|r| (0 at r = 0).
    void add_grad(const PositionGrads<T>& g, int64_t h, const T* dbias) const override {
      if (g.kerple_power_r1.empty() && g.kerple_power_r2.empty()) return;
      const double r1 = double(r1_(h)), r2 = double(r2_(h));
      double d1 = 0, d2 = 0;
      for (int64_t m = 0; m < this->count(); ++m) {
        const double a = double(this->distance_magnitude(m));
        if (a == 0) continue;
        const double power = std::pow(a, r2), db = double(dbias[m]);
        d1 -= db * power;
        d2 -= db * r1 * power * std::log(a);
      }
      if (!g.kerple_power_r1.empty()) g.kerple_power_r1(h) += static_cast<T>(d1);
      if (!g.kerple_power_r2.empty()) g.kerple_power_r2(h) += static_cast<T>(d2);
    }

   private:
    View1<const T> r1_, r2_;
  };
};

}  // namespace relpos
