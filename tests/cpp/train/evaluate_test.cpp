// Evaluation windows: the tiling arithmetic by hand, and the bits per byte
// equal to the model's own losses summed over the same predictions.
#include <gtest/gtest.h>

#include <cmath>
#include <numbers>

#include "relpos/train/evaluate.hpp"
#include "train/test_files.hpp"

namespace {

using namespace relpos::train;
using relpos::nn::Model;
using relpos::nn::ModelConfig;
using relpos::nn::PositionKind;

TEST(TrainEvaluate, NonOverlappingWindowsTileTheDataSharingOneBoundaryByte) {
  // 21 bytes, windows of 5 predictions read 6 bytes: at 0, 5, 10, 15 (15 + 6 = 21).
  const auto w = nonoverlapping_windows(21, 5);
  ASSERT_EQ(w.size(), 4u);
  for (size_t i = 0; i < w.size(); ++i) {
    EXPECT_EQ(w[i].start, int64_t(5 * i));
    EXPECT_EQ(w[i].first_scored, 0);
  }
  EXPECT_EQ(nonoverlapping_windows(20, 5).size(), 3u);  // the fourth would need byte 20
  EXPECT_EQ(nonoverlapping_windows(6, 5).size(), 1u);
  EXPECT_THROW(nonoverlapping_windows(5, 5), std::invalid_argument);
}

TEST(TrainEvaluate, SlidingWindowsScoreEachPredictionOnce) {
  // 30 bytes, window 8, stride 3: starts 0, 3, ..., 21 (21 + 9 = 30).
  const auto w = sliding_windows(30, 8, 3);
  ASSERT_EQ(w.size(), 8u);
  EXPECT_EQ(w[0].start, 0);
  EXPECT_EQ(w[0].first_scored, 0);
  for (size_t i = 1; i < w.size(); ++i) {
    EXPECT_EQ(w[i].start, int64_t(3 * i));
    EXPECT_EQ(w[i].first_scored, 5);  // only the last 3 predictions are new
  }
  // Predicted byte positions (1-based in the data) are covered exactly once:
  // the first window predicts 1..8, window i the bytes start+6..start+8.
  std::vector<int> count(30, 0);
  for (const Window& x : w)
    for (int j = x.first_scored; j < 8; ++j) ++count[size_t(x.start + j + 1)];
  for (int b = 1; b <= 29; ++b) EXPECT_EQ(count[size_t(b)], 1) << "byte " << b;
  EXPECT_EQ(count[0], 0);
  EXPECT_THROW(sliding_windows(30, 8, 0), std::invalid_argument);
  EXPECT_THROW(sliding_windows(30, 8, 9), std::invalid_argument);
  // stride = length is the non-overlapping tiling.
  const auto same = sliding_windows(30, 8, 8);
  const auto non = nonoverlapping_windows(30, 8);
  ASSERT_EQ(same.size(), non.size());
  for (size_t i = 0; i < same.size(); ++i) EXPECT_EQ(same[i].start, non[i].start);
}

ModelConfig tiny(PositionKind p) {
  ModelConfig m;
  m.layers = 1, m.width = 16, m.heads = 2, m.ffn = 32, m.context = 8, m.position = p, m.seed = 3;
  return m;
}

TEST(TrainEvaluate, WindowScoresEqualTheModelsLossesInBits) {
  Model model(tiny("alibi"));
  model.num_threads = 1;
  const auto data = relpos_train_test::sample_text(100);
  const int length = 12;
  for (const auto& windows : {nonoverlapping_windows(100, length), sliding_windows(100, length, 5)}) {
    // Reference: one window at a time.
    double nats = 0;
    int64_t count = 0;
    for (const Window& w : windows) {
      const std::vector<uint8_t> tokens(data.begin() + w.start, data.begin() + w.start + length + 1);
      const int scored = length - w.first_scored;
      nats += double(model.loss(tokens, 1, length, nullptr, w.first_scored)) * scored;
      count += scored;
    }
    for (int batch : {1, 3, 64}) {
      const Score s = evaluate_windows(model, data, length, windows, batch);
      EXPECT_EQ(s.bytes_scored, count);
      EXPECT_NEAR(s.bits_per_byte, nats / count / std::numbers::ln2, 1e-5) << "batch " << batch;
    }
  }
  EXPECT_THROW(evaluate_windows(model, data, length, {{95, 0}}, 1), std::invalid_argument);
  EXPECT_THROW(evaluate_windows(model, data, length, {}, 1), std::invalid_argument);
}

TEST(TrainEvaluate, MemoryEvaluationReadsStreamsInSegmentsWithMemory) {
  Model model(tiny("xl"));
  model.num_threads = 1;
  const auto data = relpos_train_test::sample_text(203);
  // 2 streams of 101 bytes, segments of 8: (101 - 1) / 8 = 12 segments each.
  const Score none = evaluate_with_memory(model, data, 8, 0, 2);
  EXPECT_EQ(none.bytes_scored, 2 * 12 * 8);
  // Without memory, each segment is an independent window of 8.
  double nats = 0;
  for (int b = 0; b < 2; ++b)
    for (int s = 0; s < 12; ++s) {
      const std::vector<uint8_t> t(data.begin() + b * 101 + s * 8, data.begin() + b * 101 + s * 8 + 9);
      nats += model.loss(t, 1, 8) * 8.0;
    }
  EXPECT_NEAR(none.bits_per_byte, nats / (2 * 12 * 8) / std::numbers::ln2, 1e-5);
  // With memory the model sees more context; the score is a different number
  // over the same bytes.
  const Score with = evaluate_with_memory(model, data, 8, 24, 2);
  EXPECT_EQ(with.bytes_scored, none.bytes_scored);
  EXPECT_NE(with.bits_per_byte, none.bits_per_byte);
  EXPECT_TRUE(std::isfinite(with.bits_per_byte));
  EXPECT_THROW(evaluate_with_memory(model, data, 8, 24, 30), std::invalid_argument);  // streams of 6 bytes
}

}  // namespace
