// AdamW, the learning-rate schedule and gradient clipping against
// double-precision references written from their definitions.
#include <gtest/gtest.h>

#include <cmath>
#include <numbers>
#include <random>

#include "relpos/train/optimizer.hpp"

namespace {

using namespace relpos::train;
using relpos::nn::ParameterInfo;

std::vector<float> random_floats(size_t n, uint32_t seed) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> normal(0.f, 1.f);
  std::vector<float> v(n);
  for (float& x : v) x = normal(gen);
  return v;
}

TEST(TrainOptimizer, AdamWMatchesADoubleReferenceWithDecayOnlyOnDecayedSlices) {
  // Three slices: a decayed matrix, a bias, a decayed matrix.
  const std::vector<ParameterInfo> table = {
      {"a.weight", 0, 12, {3, 4}, true}, {"a.bias", 12, 3, {3}, false}, {"b.weight", 15, 6, {2, 3}, true}};
  const size_t n = 21;
  AdamWConfig cfg;
  cfg.beta1 = 0.8, cfg.beta2 = 0.95, cfg.eps = 1e-6, cfg.weight_decay = 0.3;
  AdamW opt(table, n, cfg);
  std::vector<float> p = random_floats(n, 1);
  std::vector<double> ref(p.begin(), p.end()), m(n, 0), v(n, 0);
  for (int t = 1; t <= 5; ++t) {
    const std::vector<float> g = random_floats(n, 100 + t);
    const double lr = 0.01 * t;
    opt.step(p, g, lr);
    for (size_t i = 0; i < n; ++i) {
      const bool decay = i < 12 || i >= 15;
      if (decay) ref[i] -= lr * cfg.weight_decay * ref[i];
      m[i] = cfg.beta1 * m[i] + (1 - cfg.beta1) * g[i];
      v[i] = cfg.beta2 * v[i] + (1 - cfg.beta2) * double(g[i]) * g[i];
      const double mhat = m[i] / (1 - std::pow(cfg.beta1, t)), vhat = v[i] / (1 - std::pow(cfg.beta2, t));
      ref[i] -= lr * mhat / (std::sqrt(vhat) + cfg.eps);
    }
    for (size_t i = 0; i < n; ++i) EXPECT_NEAR(p[i], ref[i], 1e-5 * (1 + std::fabs(ref[i]))) << "step " << t << " i " << i;
  }
  EXPECT_EQ(opt.t, 5);
  EXPECT_EQ(opt.decay_mask()[11], 1);
  EXPECT_EQ(opt.decay_mask()[12], 0);
  EXPECT_EQ(opt.decay_mask()[15], 1);
}

TEST(TrainOptimizer, AdamWFirstStepMovesEachWeightByTheLearningRate) {
  // Hand-computed: at t = 1 the bias-corrected ratio m/sqrt(v) is sign(g)
  // (eps aside), so an undecayed weight moves by exactly -lr * sign(g).
  const std::vector<ParameterInfo> table = {{"bias", 0, 3, {3}, false}};
  AdamW opt(table, 3, AdamWConfig{0.9, 0.999, 1e-12, 0.5});
  std::vector<float> p = {1.f, -2.f, 0.5f};
  opt.step(p, std::vector<float>{0.3f, -4.f, 1e-3f}, 0.125);
  EXPECT_NEAR(p[0], 0.875, 1e-6);
  EXPECT_NEAR(p[1], -1.875, 1e-6);
  EXPECT_NEAR(p[2], 0.375, 1e-6);
}

TEST(TrainOptimizer, AdamWIsBitwiseTheSameOnOneAndTwoThreads) {
  const size_t n = 100000;  // above the size where the loop goes parallel
  const std::vector<ParameterInfo> table = {{"w", 0, int64_t(n / 2), {int64_t(n / 2)}, true},
                                            {"b", int64_t(n / 2), int64_t(n - n / 2), {int64_t(n - n / 2)}, false}};
  AdamW one(table, n), two(table, n);
  one.num_threads = 1, two.num_threads = 2;
  std::vector<float> p1 = random_floats(n, 3), p2 = p1;
  for (int t = 0; t < 3; ++t) {
    const auto g = random_floats(n, 50 + t);
    one.step(p1, g, 1e-2);
    two.step(p2, g, 1e-2);
  }
  EXPECT_EQ(p1, p2);
}

TEST(TrainOptimizer, AdamWRefusesMismatchedBuffersAndBadSettings) {
  const std::vector<ParameterInfo> table = {{"w", 0, 4, {4}, true}};
  AdamW opt(table, 4);
  std::vector<float> p(4), g(5);
  EXPECT_THROW(opt.step(p, g, 0.1), std::invalid_argument);
  EXPECT_THROW(AdamW(table, 3), std::invalid_argument);  // slice outside the buffer
  EXPECT_THROW(AdamW(table, 4, AdamWConfig{1.0, 0.9, 1e-8, 0}), std::invalid_argument);
}

TEST(TrainOptimizer, ScheduleWarmsUpLinearlyThenDecaysByCosine) {
  // warmup 4, total 14, peak 1, floor 0.1: steps 0..3 ramp 0.25..1, step 3 is
  // the peak, steps 4..13 follow 0.1 + 0.9 * (1 + cos(pi * (s - 4) / 9)) / 2.
  EXPECT_DOUBLE_EQ(learning_rate(0, 4, 14, 1.0, 0.1), 0.25);
  EXPECT_DOUBLE_EQ(learning_rate(1, 4, 14, 1.0, 0.1), 0.5);
  EXPECT_DOUBLE_EQ(learning_rate(3, 4, 14, 1.0, 0.1), 1.0);
  EXPECT_DOUBLE_EQ(learning_rate(4, 4, 14, 1.0, 0.1), 1.0);
  EXPECT_NEAR(learning_rate(7, 4, 14, 1.0, 0.1), 0.1 + 0.45 * (1 + std::cos(std::numbers::pi / 3)), 1e-15);
  EXPECT_NEAR(learning_rate(13, 4, 14, 2.0, 0.1), 0.2, 1e-15);
  EXPECT_NEAR(learning_rate(50, 4, 14, 2.0, 0.1), 0.2, 1e-15);
  EXPECT_DOUBLE_EQ(learning_rate(0, 0, 1, 0.5, 0.1), 0.5);  // a single step runs at the peak
  // Halfway through the decay the rate is halfway between peak and floor.
  EXPECT_NEAR(learning_rate(104, 4, 205, 1.0, 0.0), 0.5, 1e-12);
}

TEST(TrainOptimizer, ClippingScalesToTheLimitAndReportsTheNorm) {
  const std::vector<float> g = {3.f, 4.f, 0.f, -12.f};  // norm 13
  EXPECT_NEAR(gradient_norm(g), 13.0, 1e-12);
  EXPECT_NEAR(clip_factor(13.0, 6.5), 0.5, 1e-7);
  EXPECT_EQ(clip_factor(0.5, 1.0), 1.0f);   // below the limit: unchanged
  EXPECT_EQ(clip_factor(50.0, 0.0), 1.0f);  // limit 0: no clipping
}

// Clipping inside the step is the step on gradients clipped beforehand, bit for bit.
TEST(TrainOptimizer, StepWithAGradientScaleEqualsTheStepOnScaledGradients) {
  const std::vector<ParameterInfo> table = {{"w", 0, 5000, {50, 100}, true}, {"b", 5000, 1001, {1001}, false}};
  const std::vector<float> g = random_floats(6001, 12), start = random_floats(6001, 13);
  const float scale = clip_factor(gradient_norm(g), 0.25);
  ASSERT_LT(scale, 1.0f);
  std::vector<float> scaled = g, p1 = start, p2 = start;
  for (float& x : scaled) x *= scale;
  AdamW folded(table, 6001), separate(table, 6001);
  for (int s = 0; s < 3; ++s) {
    folded.step(p1, g, 1e-2, scale);
    separate.step(p2, scaled, 1e-2);
  }
  EXPECT_EQ(p1, p2);
  EXPECT_EQ(folded.m, separate.m);
  EXPECT_EQ(folded.v, separate.v);
}

TEST(TrainOptimizer, GradientNormDoesNotDependOnThreads) {
  const auto g = random_floats(300001, 9);
  double reference = 0;
  for (float x : g) reference += double(x) * x;
  const double n1 = gradient_norm(g, 1), n2 = gradient_norm(g, 2);
  EXPECT_EQ(n1, n2);
  EXPECT_NEAR(n1, std::sqrt(reference), 1e-9 * std::sqrt(reference));
}

}  // namespace
