// Resuming from a checkpoint continues the run exactly: the losses after the
// resume are bitwise those of an uninterrupted run with the same seed (one
// thread), for a randomly sampled model and for Transformer-XL's streams
// with memory carried across the checkpoint.
#include <gtest/gtest.h>

#include "relpos/train/trainer.hpp"
#include "train/test_files.hpp"

namespace {

using namespace relpos::train;
using relpos::nn::ModelConfig;
using relpos::nn::PositionKind;

ModelConfig tiny_model(PositionKind position) {
  ModelConfig m;
  m.layers = 2, m.width = 16, m.heads = 2, m.ffn = 32, m.context = 8, m.position = position;
  m.scheme_options["shaw_k"] = 4;
  return m;
}

std::vector<float> run(Trainer& t) {
  std::vector<float> losses;
  while (!t.done()) losses.push_back(t.step());
  return losses;
}

class Resume : public ::testing::TestWithParam<PositionKind> {};

TEST_P(Resume, LossesEqualAnUninterruptedRunBitwise) {
  relpos_train_test::TempDir dir;
  // 600 bytes, batch 4 -> XL streams of 150 bytes: 18 segments of 8 each, so
  // 24 steps also cross a restart of the streams (memory cleared).
  const auto data = relpos_train_test::sample_text(600);
  TrainConfig cfg;
  cfg.steps = 24, cfg.batch = 4, cfg.warmup = 3, cfg.lr = 5e-3, cfg.seed = 11;
  Trainer whole(tiny_model(GetParam()), cfg, data);
  whole.set_threads(1);
  const std::vector<float> expected = run(whole);
  ASSERT_EQ(expected.size(), 24u);

  std::vector<float> resumed;
  {
    Trainer first(tiny_model(GetParam()), cfg, data);
    first.set_threads(1);
    for (int i = 0; i < 10; ++i) resumed.push_back(first.step());
    first.save(dir.file("mid.ckpt"));
  }
  Trainer second(tiny_model(GetParam()), cfg, data);
  second.set_threads(1);
  second.resume(dir.file("mid.ckpt"));
  EXPECT_EQ(second.steps_taken(), 10);
  for (float l : run(second)) resumed.push_back(l);
  ASSERT_EQ(resumed.size(), expected.size());
  for (size_t i = 0; i < expected.size(); ++i)
    EXPECT_EQ(resumed[i], expected[i]) << "step " << i + 1;  // bitwise, not approximately
  EXPECT_TRUE(std::equal(whole.model().parameters().begin(), whole.model().parameters().end(),
                         second.model().parameters().begin()));
  // And training did something: the late losses are below the first ones.
  EXPECT_LT(expected.back(), expected.front());
}

INSTANTIATE_TEST_SUITE_P(Train, Resume, ::testing::Values("alibi", "learned", "xl"),
                         [](const auto& info) { return info.param; });

TEST(TrainResume, CheckpointOfAFinishedRunResumesAsDone) {
  relpos_train_test::TempDir dir;
  const auto data = relpos_train_test::sample_text(300);
  TrainConfig cfg;
  cfg.steps = 2, cfg.batch = 2;
  Trainer t(tiny_model("none"), cfg, data);
  run(t);
  t.save(dir.file("done.ckpt"));
  Trainer again(tiny_model("none"), cfg, data);
  again.resume(dir.file("done.ckpt"));
  EXPECT_TRUE(again.done());
}

}  // namespace
