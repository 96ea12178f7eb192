// T5 (Raffel et al. 2020): a bias per (head, bucket), buckets of the distance
// exactly as HF transformers' _relative_position_bucket (position.hpp).
#pragma once

#include <vector>

#include "../backend/scratch.hpp"
#include "checks.hpp"
#include "scheme.hpp"

namespace relpos {

struct T5Scheme {
  static constexpr Scheme id = Scheme::t5;
  static constexpr const char* name = "t5";
  static constexpr AlgorithmSet algorithms = kBiasAlgorithms;

  template <class Params, class F, class... Grads>
  static void for_each_param(Params& pos, F&& f, Grads&... g) {
    f("t5_table", pos.t5.table, g.t5_table...);
  }

  static constexpr ModelOption kBuckets = {
      .key = "t5_buckets", .fallback = 32, .low = 1, .high = 1 << 16, .help = "T5 relative-position buckets"};
  static constexpr ModelOption kMaxDistance = {
      .key = "t5_max_distance", .fallback = 128, .low = 1, .high = 1 << 30, .help = "T5 distance of the last bucket"};
  static constexpr std::array<ModelOption, 2> model_options = {kBuckets, kMaxDistance};

  static void check_model(const SchemeModelConfig& c) {
    check_t5_config(false, int64_t(kBuckets.value_in(c)), int64_t(kMaxDistance.value_in(c)),
                    "ModelConfig.t5_buckets", "ModelConfig.t5_max_distance");
  }

  // The model: one table for all layers (as T5), causal buckets.
  template <class T>
  static std::vector<ModelTensor> model(PositionParams<T>& p, const SchemeModelConfig& c) {
    p.t5.bidirectional = false;
    p.t5.max_distance = int64_t(kMaxDistance.value_in(c));
    return {{"t5_table", {c.heads, int64_t(kBuckets.value_in(c))}, true}};
  }

  // Its options other than tensors, each once: f(its SchemeOption, the member of each of pos...).
  template <class F, class... Params>
  static void for_each_option(F&& f, Params&... pos) {
    f(SchemeOption{.name = "t5_bidirectional", .member = "t5.bidirectional"}, pos.t5.bidirectional...);
    // Its lower bound depends on the table's bucket count: check_t5_config.
    f(SchemeOption{.name = "t5_max_distance", .member = "t5.max_distance", .high = kMaxPosition},
      pos.t5.max_distance...);
  }

  template <class T>
  static void check(const AttentionForward<T>& p) {
    using namespace checks;
    const T5Params<T>& t = p.pos.t5;
    const int64_t H = p.q.shape[1];
    check_shape("t5.table", t.table, {H, -1}, "(" + dims("H", H) + ", num_buckets)");
    check_t5_config(t.bidirectional, t.table.shape[1], t.max_distance);
  }

  template <class T>
  class Bias final : public DistanceBias<T> {
   public:
    explicit Bias(const AttentionForward<T>& p) : DistanceBias<T>(p), table_(p.pos.t5.table), bucket_(this->count()) {
      const T5Params<T>& t = p.pos.t5;
      for (int64_t m = 0; m < this->count(); ++m)
        bucket_[m] = t5_bucket(this->rmin() + m, t.bidirectional, t.table.shape[1], t.max_distance);
    }
    void values(int64_t h, T* bias) const override {
      for (int64_t m = 0; m < this->count(); ++m) bias[m] = table_(h, bucket_[m]);
    }
    void add_grad(const PositionGrads<T>& g, int64_t h, const T* dbias) const override {
      if (g.t5_table.empty()) return;
      for (int64_t m = 0; m < this->count(); ++m) g.t5_table(h, bucket_[m]) += dbias[m];
    }

   private:
    View2<const T> table_;
    Scratch<int64_t> bucket_;  // per distance, counted: it grows with the lengths
  };

};

template <>
struct SchemeOf<Scheme::t5> : std::type_identity<T5Scheme> {};

}  // namespace relpos
