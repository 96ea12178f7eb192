// The KV cache against the full forward pass, for every position kind:
// decoding token by token or in chunks gives the full pass's logits; a
// Transformer-XL segment with the previous one in memory gives the full
// pass's loss on its positions; a sliding cache keeps absolute positions.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "relpos/nn/model.hpp"
#include "nn/checks.hpp"

using namespace relpos::nn;
using namespace relpos_nn_test;

namespace {

constexpr int kVocab = 256;

// A model whose parameters are moved far from initialisation (std 0.3), so
// attention is sharp and positions matter to the logits.
Model sharp_model(PositionKind kind, int layers) {
  ModelConfig c;
  c.layers = layers;
  c.width = 16;
  c.heads = 2;
  c.ffn = 32;
  c.context = 8;  // shorter than the sequences: learned positions clamp to the last row
  c.position = kind;
  c.scheme_options["shaw_k"] = 3;
  c.scheme_options["t5_buckets"] = 8;
  c.scheme_options["t5_max_distance"] = 16;
  c.seed = 11;
  Model m(c);
  m.num_threads = 1;
  std::mt19937 gen(5);
  std::normal_distribution<float> normal(0.0f, 0.3f);
  for (float& p : m.parameters()) p += normal(gen);
  return m;
}

// Tokens [begin, end) of every row of a (batch, row_length) array.
std::vector<uint8_t> columns(const std::vector<uint8_t>& tokens, int batch, int row_length, int begin, int end) {
  std::vector<uint8_t> out;
  for (int b = 0; b < batch; ++b)
    out.insert(out.end(), tokens.begin() + b * row_length + begin, tokens.begin() + b * row_length + end);
  return out;
}

::testing::AssertionResult logits_near(const float* actual, const float* expected, const std::string& what) {
  for (int v = 0; v < kVocab; ++v)
    if (!(std::abs(actual[v] - expected[v]) <= 2e-4f * (1 + std::abs(expected[v]))))
      return ::testing::AssertionFailure() << what << ": logit " << v << " = " << actual[v] << ", expected "
                                           << expected[v];
  return ::testing::AssertionSuccess();
}

const auto kAllKinds = ::testing::ValuesIn(all_position_kinds());

}  // namespace

class NnDecode : public ::testing::TestWithParam<PositionKind> {};

TEST_P(NnDecode, TokenByTokenAndChunksEqualFullLogits) {
  Model m = sharp_model(GetParam(), 2);
  const int batch = 2, length = 12;
  const std::vector<uint8_t> tokens = random_tokens(batch * length, 1);
  std::vector<float> full(batch * length * kVocab), step(batch * kVocab);
  m.logits(tokens, batch, length, full);

  KVCache cache = m.make_cache(batch, length);
  for (int t = 0; t < length; ++t) {
    m.decode(columns(tokens, batch, length, t, t + 1), batch, 1, cache, step);
    for (int b = 0; b < batch; ++b)
      EXPECT_TRUE(logits_near(&step[b * kVocab], &full[(b * length + t) * kVocab],
                              "token " + std::to_string(t) + " row " + std::to_string(b)));
  }
  EXPECT_EQ(cache.length, length);
  EXPECT_EQ(cache.position, length);

  KVCache chunked = m.make_cache(batch, length);
  int begin = 0;
  for (int size : {5, 1, 4, 2}) {
    m.decode(columns(tokens, batch, length, begin, begin + size), batch, size, chunked, step);
    begin += size;
    for (int b = 0; b < batch; ++b)
      EXPECT_TRUE(logits_near(&step[b * kVocab], &full[(b * length + begin - 1) * kVocab],
                              "chunk ending at " + std::to_string(begin) + " row " + std::to_string(b)));
  }
}

// One layer, so a layer's keys depend only on tokens and absolute positions:
// decoding with a cache of capacity C slides, and the logits at step t equal
// those of the window t-C..t fed at once behind an empty cache placed at
// position t-C.
TEST_P(NnDecode, SlidingCacheKeepsAbsolutePositions) {
  Model m = sharp_model(GetParam(), 1);
  const int batch = 2, length = 11, capacity = 4;
  const std::vector<uint8_t> tokens = random_tokens(batch * length, 2);
  KVCache cache = m.make_cache(batch, capacity);
  std::vector<float> step(batch * kVocab), window(batch * kVocab);
  for (int t = 0; t < length; ++t) {
    m.decode(columns(tokens, batch, length, t, t + 1), batch, 1, cache, step);
    EXPECT_EQ(cache.length, std::min(t + 1, capacity));
    EXPECT_EQ(cache.position, t + 1);
    if (t < capacity) continue;
    KVCache placed = m.make_cache(batch, capacity + 1);
    placed.position = t - capacity;
    m.decode(columns(tokens, batch, length, t - capacity, t + 1), batch, capacity + 1, placed, window);
    for (int b = 0; b < batch; ++b)
      EXPECT_TRUE(logits_near(&step[b * kVocab], &window[b * kVocab], "step " + std::to_string(t)));
  }
}

// Segment 2 with segment 1 in memory scores like positions S..2S-1 of the
// full pass over both (first_scored = S); forward_backward reports the same
// loss and leaves the same memory.
TEST_P(NnDecode, MemorySegmentEqualsFullForward) {
  Model m = sharp_model(GetParam(), 2);
  const int batch = 2, segment = 6, row = 2 * segment + 1;
  const std::vector<uint8_t> tokens = random_tokens(batch * row, 3);
  const float full = m.loss(tokens, batch, 2 * segment, nullptr, segment);

  KVCache memory = m.make_cache(batch, segment);
  m.loss(columns(tokens, batch, row, 0, segment + 1), batch, segment, &memory);
  KVCache trained = memory;
  const std::vector<uint8_t> second = columns(tokens, batch, row, segment, row);
  const float segmented = m.loss(second, batch, segment, &memory);
  EXPECT_NEAR(segmented, full, 2e-5f * full);
  EXPECT_EQ(memory.position, 2 * segment);

  const float with_gradients = m.forward_backward(second, batch, segment, &trained);
  EXPECT_NEAR(with_gradients, segmented, 1e-6f * segmented);
  EXPECT_EQ(trained.keys, memory.keys);
  EXPECT_EQ(trained.values, memory.values);
}

INSTANTIATE_TEST_SUITE_P(AllPositionKinds, NnDecode, kAllKinds,
                         [](const auto& info) { return info.param; });

TEST(NnDecodeErrors, BadCacheOrSizesAreRefused) {
  Model m = sharp_model("rope", 1);
  std::vector<float> logits(2 * kVocab);
  KVCache cache = m.make_cache(2, 4);
  EXPECT_THROW(m.decode(std::vector<uint8_t>(3), 2, 1, cache, logits), std::invalid_argument);  // tokens size
  EXPECT_THROW(m.decode(std::vector<uint8_t>(1), 1, 1, cache, std::span<float>(logits).first(kVocab)),
               std::invalid_argument);  // cache made for batch 2
  EXPECT_THROW(m.decode(std::vector<uint8_t>(2), 2, 1, cache, std::span<float>(logits).first(kVocab)),
               std::invalid_argument);  // logits size
  KVCache broken = cache;
  broken.keys.pop_back();
  EXPECT_THROW(m.decode(std::vector<uint8_t>(2), 2, 1, broken, logits), std::invalid_argument);
  broken = cache;
  broken.length = 5;
  EXPECT_THROW(m.decode(std::vector<uint8_t>(2), 2, 1, broken, logits), std::invalid_argument);
  EXPECT_THROW(m.make_cache(2, 0), std::invalid_argument);
  EXPECT_THROW(m.make_cache(0, 4), std::invalid_argument);
  EXPECT_THROW(m.loss(std::vector<uint8_t>(2 * 5), 2, 4, nullptr, 4), std::invalid_argument);   // first_scored
  EXPECT_THROW(m.loss(std::vector<uint8_t>(2 * 5), 2, 4, nullptr, -1), std::invalid_argument);  // first_scored
  EXPECT_THROW(m.forward_backward(std::vector<uint8_t>(2 * 4), 2, 4), std::invalid_argument);  // needs length + 1
}
