// The model's attention dropout (relpos/nn/model.hpp, TrainingDropout): the
// attention API's seed and offset of every layer of every step, distinct and
// pure; p = 0 the plain path bit for bit; the masks changing the loss by
// step and seed and repeating for the same ones; evaluation never dropping;
// bad values refused. Gradients against central differences are in
// model_gradient_test.cpp, the micro-batch splits in micro_batch_test.cpp.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <iterator>
#include <limits>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "../../../src/nn/model_impl.hpp"
#include "nn/checks.hpp"

using namespace relpos::nn;
using namespace relpos_nn_test;

namespace {

ModelConfig small_config(PositionKind kind) {
  ModelConfig c;
  c.layers = 2, c.width = 16, c.heads = 2, c.ffn = 24, c.context = 8, c.position = kind;
  c.scheme_options["shaw_k"] = 3;
  c.seed = 5;
  return c;
}

struct Pass {
  double loss = 0;
  std::vector<float> gradients;
};

// A training call of a fresh model of `kind` (one thread) with `dropout`.
Pass training_call(PositionKind kind, const TrainingDropout& dropout) {
  ModelImpl<float> m(small_config(kind));
  m.num_threads = 1;
  const int batch = 3, length = 8;
  const std::vector<uint8_t> tokens = random_tokens(batch * (length + 1), 9);
  Pass pass;
  pass.loss = m.loss(tokens.data(), batch, length, static_cast<KVCache*>(nullptr), 0, true, dropout);
  pass.gradients = m.gradients();
  return pass;
}

}  // namespace

TEST(NnAttentionDropout, EveryLayerOfEveryStepHasItsOwnSeedAndOffset) {
  const int layers = 3;
  std::set<std::pair<uint64_t, uint32_t>> seen;
  for (int64_t step = 0; step < 100; ++step)
    for (int l = 0; l < layers; ++l) {
      const relpos::AttentionDropout d = layer_dropout({0.1, 42, step}, layers, l, 5);
      EXPECT_EQ(d.p, 0.1);
      EXPECT_EQ(d.batch_offset, 5);
      EXPECT_EQ(d.offset, uint32_t(step * layers + l));
      EXPECT_TRUE(seen.insert({d.seed, d.offset}).second) << "step " << step << " layer " << l;
      // A pure function: the same inputs give the same key.
      EXPECT_EQ(layer_dropout({0.1, 42, step}, layers, l, 0).seed, d.seed);
    }
  // One key per run while the call index fits the offset's 32 bits, a
  // different one per run seed.
  EXPECT_EQ(seen.begin()->first, std::prev(seen.end())->first);
  EXPECT_NE(layer_dropout({0.1, 43, 0}, layers, 0, 0).seed, layer_dropout({0.1, 42, 0}, layers, 0, 0).seed);
  // Past 2^32 calls the offset wraps and the key changes: call 2^32 is not call 0.
  const int64_t wrap = (int64_t(1) << 32) / 2;  // two layers: step 2^31, layer 0 is call 2^32
  const relpos::AttentionDropout first = layer_dropout({0.1, 42, 0}, 2, 0, 0);
  const relpos::AttentionDropout wrapped = layer_dropout({0.1, 42, wrap}, 2, 0, 0);
  EXPECT_EQ(wrapped.offset, first.offset);
  EXPECT_NE(wrapped.seed, first.seed);
  EXPECT_EQ(layer_dropout({0.1, 42, wrap - 1}, 2, 1, 0).seed, first.seed);  // call 2^32 - 1, the last of the first key
}

TEST(NnAttentionDropout, ZeroProbabilityIsThePlainPathBitForBit) {
  for (PositionKind kind : {"alibi", "xl", "shaw"}) {
    const Pass plain = training_call(kind, {});
    const Pass zero = training_call(kind, {0.0, 123, 45});
    EXPECT_EQ(zero.loss, plain.loss) << kind;
    EXPECT_EQ(0, std::memcmp(zero.gradients.data(), plain.gradients.data(), plain.gradients.size() * sizeof(float)))
        << kind;
  }
}

TEST(NnAttentionDropout, MasksFollowTheSeedAndStepAndRepeatForTheSame) {
  for (PositionKind kind : {"alibi", "t5", "rope"}) {
    const Pass plain = training_call(kind, {});
    const Pass a = training_call(kind, {0.3, 7, 2});
    EXPECT_NE(a.loss, plain.loss) << kind;
    const Pass again = training_call(kind, {0.3, 7, 2});
    EXPECT_EQ(again.loss, a.loss) << kind;
    EXPECT_EQ(0, std::memcmp(again.gradients.data(), a.gradients.data(), a.gradients.size() * sizeof(float))) << kind;
    EXPECT_NE(training_call(kind, {0.3, 7, 3}).loss, a.loss) << kind << ": another step, another mask";
    EXPECT_NE(training_call(kind, {0.3, 8, 2}).loss, a.loss) << kind << ": another seed, another mask";
  }
}

// The public Model: loss() (evaluation, Transformer-XL memory included) and
// logits() apply no dropout, whatever forward_backward was given before.
TEST(NnAttentionDropout, EvaluationAndLogitsNeverDrop) {
  for (PositionKind kind : {"alibi", "xl"}) {
    Model m(small_config(kind));
    m.num_threads = 1;
    const int batch = 2, length = 8;
    const std::vector<uint8_t> tokens = random_tokens(batch * (length + 1), 3);
    std::vector<uint8_t> inputs;
    for (int b = 0; b < batch; ++b)
      inputs.insert(inputs.end(), tokens.begin() + b * (length + 1), tokens.begin() + b * (length + 1) + length);
    const float plain = m.loss(tokens, batch, length);
    std::vector<float> plain_logits(size_t(batch) * length * kVocabulary);
    m.logits(inputs, batch, length, plain_logits);
    const float dropped = m.forward_backward(tokens, batch, length, nullptr, {0.5, 1, 0});
    EXPECT_NE(dropped, plain) << kind;
    EXPECT_EQ(m.forward_backward(tokens, batch, length), plain) << kind;
    EXPECT_EQ(m.loss(tokens, batch, length), plain) << kind;
    std::vector<float> logits(plain_logits.size());
    m.logits(inputs, batch, length, logits);
    EXPECT_EQ(logits, plain_logits) << kind;
    KVCache memory = m.make_cache(batch, 4), copy = memory;
    EXPECT_EQ(m.loss(tokens, batch, length, &memory), m.forward_backward(tokens, batch, length, &copy)) << kind;
  }
}

TEST(NnAttentionDropout, BadProbabilityOrStepIsRefusedByName) {
  Model m(small_config("alibi"));
  const std::vector<uint8_t> tokens(2 * 9, 7);
  const auto error = [&](const TrainingDropout& d) {
    try {
      m.forward_backward(tokens, 2, 8, nullptr, d);
    } catch (const std::invalid_argument& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  for (double p : {-0.1, 1.0, 1.5, std::numeric_limits<double>::quiet_NaN(), std::numeric_limits<double>::infinity()})
    EXPECT_NE(error({p, 1, 0}).find("dropout.p: must lie in [0, 1)"), std::string::npos) << p;
  EXPECT_NE(error({0.1, 1, -1}).find("dropout.step: must be >= 0, got -1"), std::string::npos);
  EXPECT_EQ(error({0.999, 1, 0}), "");
}
