// KERPLE (Chi et al. 2022), its logarithmic variant: the bias
// -r1_h * log(1 + r2_h |r|), r1, r2 > 0 learnable per head. The bias and its
// parameter gradients are evaluated in double and rounded once.
#pragma once

#include <cmath>
#include <string>
#include <utility>

#include "checks.hpp"
#include "scheme.hpp"

namespace relpos {

struct KerpleScheme {
  static constexpr Scheme id = Scheme::kerple;
  static constexpr const char* name = "kerple";
  static constexpr AlgorithmSet algorithms = kBiasAlgorithms;

  template <class Params, class F, class... Grads>
  static void for_each_param(Params& pos, F&& f, Grads&... g) {
    f("kerple_r1", pos.kerple.r1, g.kerple_r1...);
    f("kerple_r2", pos.kerple.r2, g.kerple_r2...);
  }

  // The model: r1, r2 per layer, initialised to 1 and read clamped at 0.01
  // (a parameter below it gets no gradient), as the paper's code clamps them.
  template <class T>
  static std::vector<ModelTensor> model(PositionParams<T>&, const nn::ModelConfig& c) {
    constexpr double floor = 0.01;
    return {{"kerple_r1", {c.heads}, false, true, floor}, {"kerple_r2", {c.heads}, false, true, floor}};
  }

  template <class T>
  static void check(const AttentionForward<T>& p) {
    using namespace checks;
    const KerpleParams<T>& k = p.pos.kerple;
    const int64_t H = p.q.shape[1];
    check_shape("kerple.r1", k.r1, {H}, "(" + dims("H", H) + ")");
    check_shape("kerple.r2", k.r2, {H}, "(" + dims("H", H) + ")");
    const double far = double(farthest_distance(p));
    for (int64_t h = 0; h < H; ++h) {
      const double r1 = double(k.r1(h)), r2 = double(k.r2(h));
      for (const auto& [name, value] : {std::pair{"kerple.r1", r1}, std::pair{"kerple.r2", r2}})
        if (!(std::isfinite(value) && value > 0))
          fail(std::string(name) + ": every entry must be finite and > 0, head " + std::to_string(h) + " has " +
               std::to_string(value));
      if (!std::isfinite(static_cast<compute_t<T>>(r1 * std::log1p(r2 * far))))
        fail("kerple.r1: the bias of head " + std::to_string(h) + " at the farthest distance " +
             std::to_string(int64_t(far)) + " overflows " + precision_name<compute_t<T>>());
    }
  }

  template <class T>
  class Bias final : public DistanceBias<T> {
   public:
    explicit Bias(const AttentionForward<T>& p) : DistanceBias<T>(p), r1_(p.pos.kerple.r1), r2_(p.pos.kerple.r2) {}

    void values(int64_t h, T* bias) const override {
      const double r1 = double(r1_(h)), r2 = double(r2_(h));
      for (int64_t m = 0; m < this->count(); ++m)
        bias[m] = static_cast<T>(-r1 * std::log1p(r2 * double(this->distance_magnitude(m))));
    }

    // d bias / d r1 = -log(1 + r2 |r|), d bias / d r2 = -r1 |r| / (1 + r2 |r|).
    void add_grad(const PositionGrads<T>& g, int64_t h, const T* dbias) const override {
      if (g.kerple_r1.empty() && g.kerple_r2.empty()) return;
      const double r1 = double(r1_(h)), r2 = double(r2_(h));
      double d1 = 0, d2 = 0;
      for (int64_t m = 0; m < this->count(); ++m) {
        const double a = double(this->distance_magnitude(m)), db = double(dbias[m]);
        d1 -= db * std::log1p(r2 * a);
        d2 -= db * r1 * a / (1 + r2 * a);
      }
      if (!g.kerple_r1.empty()) g.kerple_r1(h) += static_cast<T>(d1);
      if (!g.kerple_r2.empty()) g.kerple_r2(h) += static_cast<T>(d2);
    }

   private:
    View1<const T> r1_, r2_;
  };

};

}  // namespace relpos
