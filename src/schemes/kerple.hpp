// KERPLE (Chi et al. 2022): a bias that is a kernel of the distance with two
// learnable parameters per head, r1 > 0 and r2 > 0. This file's scheme is the
// logarithmic variant, -r1_h log(1 + r2_h |r|); KerpleKernelScheme, the checks,
// bias and gradient every variant shares, serves the power variant too
// (kerple_power.hpp). Biases and parameter gradients are evaluated in double
// and rounded once.
#pragma once

#include <cmath>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "checks.hpp"
#include "scheme.hpp"

namespace relpos {

// The parts of a KERPLE variant that a kernel policy K gives:
//   name                  the argument prefix ("kerple": "kerple.r1")
//   params(pos), r1_grad(g), r2_grad(g)   its members of PositionParams / PositionGrads
//   r2_ceiling            the largest r2 allowed (infinity: none)
//   value(a, r1, r2)      the bias at distance magnitude a
//   gradient(a, r1, r2)   {d value / d r1, d value / d r2}
template <class K>
struct KerpleKernelScheme {
  template <class T>
  static void check(const AttentionForward<T>& p) {
    using namespace checks;
    const auto& k = K::params(p.pos);
    const int64_t H = p.q.shape[1];
    const std::string r1_name = std::string(K::name) + ".r1", r2_name = std::string(K::name) + ".r2";
    check_shape(r1_name.c_str(), k.r1, {H}, "(" + dims("H", H) + ")");
    check_shape(r2_name.c_str(), k.r2, {H}, "(" + dims("H", H) + ")");
    const double far = double(farthest_distance(p));
    const bool bounded = K::r2_ceiling < std::numeric_limits<double>::infinity();
    for (int64_t h = 0; h < H; ++h) {
      const double r1 = double(k.r1(h)), r2 = double(k.r2(h));
      const std::string head = ", head " + std::to_string(h) + " has ";
      if (!(std::isfinite(r1) && r1 > 0))
        fail(r1_name + ": every entry must be finite and > 0" + head + std::to_string(r1));
      if (!(std::isfinite(r2) && r2 > 0 && r2 <= K::r2_ceiling))
        fail(r2_name + (bounded ? ": every entry must lie in (0, " + std::to_string(int(K::r2_ceiling)) + "]"
                                : ": every entry must be finite and > 0") +
             head + std::to_string(r2));
      if (!std::isfinite(static_cast<compute_t<T>>(K::value(far, r1, r2))))
        fail(r1_name + ": the bias of head " + std::to_string(h) + " at the farthest distance " +
             std::to_string(int64_t(far)) + " overflows " + precision_name<compute_t<T>>());
    }
  }

  template <class T>
  class Bias final : public DistanceBias<T> {
   public:
    explicit Bias(const AttentionForward<T>& p)
        : DistanceBias<T>(p), r1_(K::params(p.pos).r1), r2_(K::params(p.pos).r2) {}

    void values(int64_t h, T* bias) const override {
      const double r1 = double(r1_(h)), r2 = double(r2_(h));
      for (int64_t m = 0; m < this->count(); ++m)
        bias[m] = static_cast<T>(K::value(double(this->distance_magnitude(m)), r1, r2));
    }

    void add_grad(const PositionGrads<T>& g, int64_t h, const T* dbias) const override {
      const View1<T>&dr1 = K::r1_grad(g), &dr2 = K::r2_grad(g);
      if (dr1.empty() && dr2.empty()) return;
      const double r1 = double(r1_(h)), r2 = double(r2_(h));
      double d1 = 0, d2 = 0;
      for (int64_t m = 0; m < this->count(); ++m) {
        const auto [g1, g2] = K::gradient(double(this->distance_magnitude(m)), r1, r2);
        d1 += double(dbias[m]) * g1;
        d2 += double(dbias[m]) * g2;
      }
      if (!dr1.empty()) dr1(h) += static_cast<T>(d1);
      if (!dr2.empty()) dr2(h) += static_cast<T>(d2);
    }

   private:
    View1<const T> r1_, r2_;
  };
};

struct KerpleLogKernel {
  static constexpr const char* name = "kerple";
  static constexpr double r2_ceiling = std::numeric_limits<double>::infinity();
  template <class P>
  static auto& params(P& pos) { return pos.kerple; }
  template <class G>
  static auto& r1_grad(G& g) { return g.kerple_r1; }
  template <class G>
  static auto& r2_grad(G& g) { return g.kerple_r2; }
  static double value(double a, double r1, double r2) { return -r1 * std::log1p(r2 * a); }
  static std::pair<double, double> gradient(double a, double r1, double r2) {
    return {-std::log1p(r2 * a), -r1 * a / (1 + r2 * a)};
  }
};

struct KerpleScheme : KerpleKernelScheme<KerpleLogKernel> {
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
  static std::vector<ModelTensor> model(PositionParams<T>&, const SchemeModelConfig& c) {
    constexpr double floor = 0.01;
    return {{"kerple_r1", {c.heads}, false, true, floor}, {"kerple_r2", {c.heads}, false, true, floor}};
  }
};

template <>
struct SchemeOf<Scheme::kerple> : std::type_identity<KerpleScheme> {};

}  // namespace relpos
