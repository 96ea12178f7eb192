// The trainer's step: a run that diverges stops with the step it reached and
// what to change, whether its loss or, first, its attention scores overflow.
#include <gtest/gtest.h>

#include <stdexcept>
#include <string>

#include "relpos/train/trainer.hpp"
#include "train/test_files.hpp"

namespace {

using relpos::nn::ModelConfig;
using relpos::train::TrainConfig;
using relpos::train::Trainer;

// The message of the step that stopped a run at `lr` within 40 steps, or "".
std::string divergence(double lr) {
  ModelConfig m;
  m.layers = 1, m.width = 32, m.heads = 2, m.ffn = 32, m.context = 16, m.position = "shaw";
  TrainConfig t;
  t.steps = 40, t.batch = 2, t.warmup = 0, t.lr = lr, t.clip = 0;
  const auto data = relpos_train_test::sample_text(2000);  // the trainer reads it, not a copy
  Trainer trainer(m, t, data);
  trainer.set_threads(1);
  try {
    for (int i = 0; i < 40; ++i) trainer.step();
  } catch (const std::runtime_error& e) {
    return e.what();
  }
  return "";
}

TEST(TrainStep, ADivergingRunStopsNamingItsStepAndTheLearningRate) {
  const std::string message = divergence(1e6);
  EXPECT_NE(message.find("the run diverged at step "), std::string::npos) << message;
  EXPECT_NE(message.find("(try a lower --lr): relpos: q, k: the attention scores overflow float32"), std::string::npos)
      << message;
  EXPECT_EQ(divergence(1e-3), "");  // a learning rate that trains
}

}  // namespace
