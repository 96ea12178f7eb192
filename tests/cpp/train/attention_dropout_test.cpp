// Training with attention dropout (TrainConfig::attention_dropout): runs are
// deterministic and resume bit for bit (Transformer-XL's memory and a batch
// split into micro-batches on two threads included); evaluation never drops;
// the setting survives checkpoints (one written without it trained without
// dropout) and a resume must ask for the same; bad values are refused.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

#include "relpos/train/checkpoint.hpp"
#include "relpos/train/evaluate.hpp"
#include "relpos/train/trainer.hpp"
#include "train/test_files.hpp"

namespace {

using namespace relpos::train;
using relpos::nn::ModelConfig;
using relpos::nn::PositionKind;
using relpos_train_test::TempDir;

ModelConfig tiny_model(PositionKind position) {
  ModelConfig m;
  m.layers = 2, m.width = 16, m.heads = 2, m.ffn = 32, m.context = 8, m.position = position;
  return m;
}

TrainConfig dropout_training(double p) {
  TrainConfig t;
  t.steps = 24, t.batch = 4, t.warmup = 3, t.lr = 5e-3, t.seed = 11;
  t.attention_dropout = p;
  return t;
}

std::vector<float> steps(Trainer& t, int64_t count) {
  std::vector<float> losses;
  for (int64_t i = 0; i < count && !t.done(); ++i) losses.push_back(t.step());
  return losses;
}

struct ResumeCase {
  PositionKind position;
  int64_t batch;        // 128 sequences of 8: two micro-batches of 512 tokens
  int resumed_threads;  // the resumed part's: 2 runs the micro-batches side by side
};

class TrainDropoutResume : public ::testing::TestWithParam<ResumeCase> {};

// 600 bytes: Transformer-XL's 4 streams of 150 bytes restart within 24 steps
// (memory cleared), as in resume_test.cpp.
TEST_P(TrainDropoutResume, StoppedAndResumedRunHasTheLossesOfOneRunBitwise) {
  const ResumeCase& c = GetParam();
  TempDir dir;
  const auto data = relpos_train_test::sample_text(600);
  TrainConfig cfg = dropout_training(0.1);
  cfg.batch = c.batch;
  Trainer whole(tiny_model(c.position), cfg, data);
  whole.set_threads(1);
  const std::vector<float> expected = steps(whole, cfg.steps);
  Trainer again(tiny_model(c.position), cfg, data);
  again.set_threads(1);
  EXPECT_EQ(steps(again, cfg.steps), expected) << "a second run of the same seed";

  std::vector<float> resumed;
  {
    Trainer first(tiny_model(c.position), cfg, data);
    first.set_threads(1);
    resumed = steps(first, 10);
    first.save(dir.file("mid.ckpt"));
  }
  Trainer second(tiny_model(c.position), cfg, data);
  second.set_threads(c.resumed_threads);
  second.resume(dir.file("mid.ckpt"));
  for (float l : steps(second, cfg.steps)) resumed.push_back(l);
  ASSERT_EQ(resumed.size(), expected.size());
  for (size_t i = 0; i < expected.size(); ++i) EXPECT_EQ(resumed[i], expected[i]) << "step " << i + 1;
  EXPECT_TRUE(std::equal(whole.model().parameters().begin(), whole.model().parameters().end(),
                         second.model().parameters().begin()));

  // Dropout changed the run: its losses are not those of the run without it.
  TrainConfig plain_cfg = cfg;
  plain_cfg.attention_dropout = 0;
  Trainer plain(tiny_model(c.position), plain_cfg, data);
  plain.set_threads(1);
  EXPECT_NE(steps(plain, 1).front(), expected.front());
}

INSTANTIATE_TEST_SUITE_P(Train, TrainDropoutResume,
                         ::testing::Values(ResumeCase{"alibi", 4, 1}, ResumeCase{"xl", 4, 1},
                                           ResumeCase{"shaw", 128, 2}),
                         [](const auto& info) {
                           return info.param.position + "_batch" + std::to_string(info.param.batch);
                         });

// After training with dropout, evaluation (Model::loss, evaluate_windows) is
// the model's plain forward: the same numbers as a model rebuilt from the
// checkpoint, where no dropout setting exists.
TEST(TrainAttentionDropout, EvaluationNeverDrops) {
  const auto data = relpos_train_test::sample_text(600);
  TrainConfig cfg = dropout_training(0.5);
  cfg.steps = 3;
  Trainer trainer(tiny_model("alibi"), cfg, data);
  trainer.set_threads(1);
  steps(trainer, 3);
  relpos::nn::Model rebuilt = model_from_checkpoint(trainer.checkpoint());
  rebuilt.num_threads = 1;
  const std::span<const uint8_t> text(data.data(), 200);
  const std::vector<Window> windows = nonoverlapping_windows(int64_t(text.size()), 8);
  EXPECT_EQ(evaluate_windows(trainer.model(), text, 8, windows, 4).bits_per_byte,
            evaluate_windows(rebuilt, text, 8, windows, 4).bits_per_byte);
  const std::vector<uint8_t> tokens(data.begin(), data.begin() + 2 * 9);
  const float evaluated = trainer.model().loss(tokens, 2, 8);
  EXPECT_EQ(evaluated, rebuilt.forward_backward(tokens, 2, 8));
  EXPECT_NE(evaluated, rebuilt.forward_backward(tokens, 2, 8, nullptr, {0.5, cfg.seed, 3}));
}

TEST(TrainAttentionDropout, CheckpointsKeepTheSettingAndResumeAsksForTheSame) {
  TempDir dir;
  const auto data = relpos_train_test::sample_text(400);
  Trainer trainer(tiny_model("t5"), dropout_training(0.1), data);
  trainer.set_threads(1);
  trainer.step();
  trainer.save(dir.file("run.ckpt"));
  const Checkpoint loaded = load_checkpoint(dir.file("run.ckpt"));
  EXPECT_EQ(TrainConfig::from_text(loaded.train_config).attention_dropout, 0.1);

  const auto resume_error = [&](const Checkpoint& c, double p) {
    Trainer other(tiny_model("t5"), dropout_training(p), data);
    try {
      other.resume(c);
    } catch (const std::runtime_error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  EXPECT_EQ(resume_error(loaded, 0.1), "");
  EXPECT_NE(resume_error(loaded, 0.2).find("training configuration differs (attention_dropout: 0.1 in the checkpoint, "
                                           "0.2 requested)"),
            std::string::npos);
  EXPECT_NE(resume_error(loaded, 0).find("(attention_dropout: 0.1 in the checkpoint, 0 requested)"), std::string::npos);

  // A checkpoint written before the setting existed trained without dropout.
  Checkpoint old = loaded;
  const size_t at = old.train_config.find("attention_dropout=");
  ASSERT_NE(at, std::string::npos);
  old.train_config.erase(at, old.train_config.find('\n', at) + 1 - at);
  EXPECT_EQ(TrainConfig::from_text(old.train_config).attention_dropout, 0);
  EXPECT_EQ(resume_error(old, 0), "");
  EXPECT_NE(resume_error(old, 0.1).find("attention_dropout: 0 in the checkpoint"), std::string::npos);
}

TEST(TrainAttentionDropout, TextRoundTripsAndBadValuesAreRefusedByName) {
  TrainConfig t;
  t.attention_dropout = 0.1 + 0.2;  // not exactly representable in few digits
  EXPECT_EQ(TrainConfig::from_text(t.to_text()).attention_dropout, t.attention_dropout);
  EXPECT_EQ(TrainConfig().attention_dropout, 0);
  const auto error = [](double p) {
    TrainConfig bad;
    bad.attention_dropout = p;
    try {
      bad.validate();
    } catch (const std::invalid_argument& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  for (double p : {-0.1, 1.0, 1.5, std::numeric_limits<double>::quiet_NaN(), std::numeric_limits<double>::infinity()})
    EXPECT_NE(error(p).find("training config: attention_dropout must be in [0, 1)"), std::string::npos) << p;
  EXPECT_EQ(error(0.999), "");
  EXPECT_THROW(TrainConfig::from_text("attention_dropout=1\n"), std::invalid_argument);
  EXPECT_THROW(TrainConfig::from_text("attention_dropout=-0.5\n"), std::invalid_argument);
  EXPECT_THROW(TrainConfig::from_text("attention_dropout=half\n"), std::invalid_argument);
  const auto data = relpos_train_test::sample_text(300);
  EXPECT_THROW(Trainer(tiny_model("alibi"), dropout_training(1.0), data), std::invalid_argument);
}

}  // namespace
