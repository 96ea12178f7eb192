// The whole model in double against central differences, for every position
// kind: a random subset of the coordinates of every parameter tensor (all of
// the small ones), the objective being the mean cross-entropy.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "../../../src/nn/model_impl.hpp"
#include "nn/checks.hpp"

using namespace relpos::nn;
using namespace relpos_nn_test;

namespace {

ModelConfig tiny_config(PositionKind kind) {
  ModelConfig c;
  c.layers = 2;
  c.width = 8;
  c.heads = 2;
  c.ffn = 12;
  c.context = 4;  // shorter than the sequence: learned positions beyond it use the last row
  c.position = kind;
  c.scheme_options["shaw_k"] = 2;
  c.scheme_options["t5_buckets"] = 6;
  c.scheme_options["t5_max_distance"] = 8;
  // Log buckets past distance 2, a table of 8 rows most of which the sequence reaches.
  c.scheme_options["deberta_buckets"] = 4;
  c.scheme_options["deberta_max_distance"] = 8;
  c.seed = 7;
  return c;
}

// Moves every parameter off its initial value (LayerNorm gains of exactly 1
// and biases of exactly 0 would hide terms of the gradient).
void perturb(ModelImpl<double>& m, uint32_t seed) {
  m.num_threads = 1;  // thousands of tiny forward passes: threads would only add wake-ups
  const std::vector<double> noise = random_values(m.parameters().size(), seed, 0.3);
  for (std::size_t i = 0; i < noise.size(); ++i) m.parameters()[i] += noise[i];
}

// Checks every tensor of m for the objective `loss(backward)`. Random
// coordinates of the byte embedding mostly fall on bytes absent from the
// input, whose gradient comes from the tied head alone: the rows of the first
// bytes of `inputs` are checked in full as well, covering the input side.
template <class Loss>
void expect_model_gradients(ModelImpl<double>& m, Loss loss, const std::vector<uint8_t>& inputs,
                            const std::string& label) {
  std::fill(m.gradients().begin(), m.gradients().end(), kGradFill);
  loss(true);
  const std::vector<double> analytic = m.gradients();
  uint32_t seed = 100;
  for (const ParameterInfo& info : m.layout().table) {
    const std::vector<int64_t> local = coordinates(info.size, seed++, 48, 10);
    std::vector<int64_t> coords;
    for (int64_t c : local) coords.push_back(info.offset + c);
    if (info.name == "embedding.weight")
      for (std::size_t i = 0; i < 2; ++i)
        for (int64_t c = 0; c < m.config().width; ++c) coords.push_back(info.offset + inputs[i] * m.config().width + c);
    EXPECT_TRUE(matches_central_differences(
        label + " " + info.name, m.parameters().data(), coords,
        [&](int64_t c) { return analytic[c] - kGradFill; }, [&] { return loss(false); }, 1e-6, 2e-5, 1e-8));
  }
}

}  // namespace

class NnModelGradient : public ::testing::TestWithParam<PositionKind> {};

TEST_P(NnModelGradient, MatchesCentralDifferences) {
  ModelImpl<double> m(tiny_config(GetParam()));
  perturb(m, 1);
  const int batch = 2, length = 6;
  const std::vector<uint8_t> tokens = random_tokens(batch * (length + 1), 2);
  expect_model_gradients(
      m,
      [&](bool backward) {
        return m.loss(tokens.data(), batch, length, static_cast<KVCacheOf<double>*>(nullptr), 1, backward);
      },
      tokens, GetParam());
}

// With a memory of earlier keys and values in front (Transformer-XL
// training): the memory is an input, so the gradient covers only this
// segment's path; each evaluation starts from the same memory.
TEST_P(NnModelGradient, WithMemoryMatchesCentralDifferences) {
  ModelImpl<double> m(tiny_config(GetParam()));
  perturb(m, 3);
  const int batch = 2, length = 4;
  const std::vector<uint8_t> first = random_tokens(batch * (length + 1), 4), second = random_tokens(batch * (length + 1), 5);
  KVCacheOf<double> memory = m.make_cache<KVCacheOf<double>>(batch, 3);
  m.loss(first.data(), batch, length, &memory, 0, false);
  ASSERT_EQ(memory.length, 3);
  ASSERT_EQ(memory.position, length);
  expect_model_gradients(
      m,
      [&](bool backward) {
        KVCacheOf<double> copy = memory;
        return m.loss(second.data(), batch, length, &copy, 0, backward);
      },
      second, GetParam() + " with memory");
}

// With attention dropout: the mask is fixed by the seed and step, so the loss
// is a smooth function of the parameters whose gradient the backward (drawing
// the forward's mask again) must give; with a memory in front, whose keys the
// mask covers too.
TEST_P(NnModelGradient, WithAttentionDropoutMatchesCentralDifferences) {
  ModelImpl<double> m(tiny_config(GetParam()));
  perturb(m, 5);
  const int batch = 2, length = 4;
  const std::vector<uint8_t> first = random_tokens(batch * (length + 1), 6), second = random_tokens(batch * (length + 1), 7);
  const TrainingDropout dropout{0.3, 17, 4};
  KVCacheOf<double> memory = m.make_cache<KVCacheOf<double>>(batch, 3);
  m.loss(first.data(), batch, length, &memory, 0, false);
  const auto loss = [&](bool backward, const TrainingDropout& d) {
    KVCacheOf<double> copy = memory;
    return m.loss(second.data(), batch, length, &copy, 0, backward, d);
  };
  ASSERT_NE(loss(false, dropout), loss(false, {})) << "the mask must drop something";
  expect_model_gradients(
      m, [&](bool backward) { return loss(backward, dropout); }, second, GetParam() + " with attention dropout");
}

INSTANTIATE_TEST_SUITE_P(AllPositionKinds, NnModelGradient,
                         ::testing::ValuesIn(all_position_kinds()),
                         [](const auto& info) { return info.param; });
