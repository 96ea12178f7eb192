// ALiBi (Press et al. 2022): the bias -m_h |r|, slopes given (learnable) or
// the paper's for the head count (fixed).
#pragma once

#include <cmath>
#include <vector>

#include "checks.hpp"
#include "scheme.hpp"

namespace relpos {

struct AlibiScheme {
  static constexpr Scheme id = Scheme::alibi;
  static constexpr const char* name = "alibi";
  static constexpr AlgorithmSet algorithms = kBiasAlgorithms;

  template <class Params, class F, class... Grads>
  static void for_each_param(Params& pos, F&& f, Grads&... g) {
    f("alibi_slopes", pos.alibi.slopes, g.alibi_slopes...);
  }

  static void check_model(const SchemeModelConfig& c) {
    if (c.heads > 65536) model_config_error("heads", "ALiBi's slopes take at most 65536 heads, got " + std::to_string(c.heads));
  }

  // The model: the paper's slopes, fixed.
  template <class T>
  static std::vector<ModelTensor> model(PositionParams<T>&, const SchemeModelConfig&) {
    return {};
  }

  template <class T>
  static void check(const AttentionForward<T>& p) {
    using namespace checks;
    const View1<const T>& slopes = p.pos.alibi.slopes;
    if (slopes.empty()) return;  // the paper's slopes
    const int64_t H = p.q.shape[1];
    check_shape("alibi.slopes", slopes, {H}, "(" + dims("H", H) + ")");
    // The bias -m |r| is computed in compute_t<T>; the farthest distance of the call must not overflow it.
    const double far = double(farthest_distance(p));
    for (int64_t h = 0; h < H; ++h) {
      const double m = double(slopes(h));
      if (!std::isfinite(m)) fail("alibi.slopes: every slope must be finite");
      if (!std::isfinite(static_cast<compute_t<T>>(std::abs(m) * far)))
        fail("alibi.slopes: slope " + std::to_string(m) + " of head " + std::to_string(h) +
             " times the farthest distance " + std::to_string(int64_t(far)) + " overflows " + precision_name<compute_t<T>>());
    }
  }

  template <class T>
  class Bias final : public DistanceBias<T> {
   public:
    explicit Bias(const AttentionForward<T>& p) : DistanceBias<T>(p), slopes_(p.pos.alibi.slopes) {
      if (slopes_.empty()) paper_slopes_ = alibi_slopes(p.q.shape[1]);
    }
    void values(int64_t h, T* bias) const override {
      const T slope = slopes_.empty() ? T(paper_slopes_[h]) : slopes_(h);
      for (int64_t m = 0; m < this->count(); ++m) bias[m] = -slope * T(this->distance_magnitude(m));
    }
    void add_grad(const PositionGrads<T>& g, int64_t h, const T* dbias) const override {
      if (g.alibi_slopes.empty()) return;
      for (int64_t m = 0; m < this->count(); ++m) g.alibi_slopes(h) -= dbias[m] * T(this->distance_magnitude(m));
    }

   private:
    View1<const T> slopes_;
    std::vector<double> paper_slopes_;
  };

};

template <>
struct SchemeOf<Scheme::alibi> : std::type_identity<AlibiScheme> {};

}  // namespace relpos
