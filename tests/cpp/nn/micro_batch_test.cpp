// Micro-batches: a call's loss, gradients and Transformer-XL memory are those
// of the whole batch in one pass (in double, to rounding), whatever the split
// (attention dropout included: a pass draws its rows of the batch's masks);
// and with the split fixed the float model gives bitwise the same numbers on
// one thread and on two (the passes then run side by side).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "../../../src/nn/model_impl.hpp"
#include "nn/checks.hpp"

using namespace relpos::nn;
using namespace relpos_nn_test;

namespace {

ModelConfig config_of(PositionKind kind) {
  ModelConfig c;
  c.layers = 2;
  c.width = 16;
  c.heads = 2;
  c.ffn = 24;
  c.context = 6;
  c.position = kind;
  c.scheme_options["shaw_k"] = 3;
  c.scheme_options["t5_buckets"] = 6;
  c.scheme_options["t5_max_distance"] = 12;
  c.seed = 11;
  return c;
}

template <class T>
void perturb(ModelImpl<T>& m, uint32_t seed) {
  const std::vector<double> noise = random_values(m.parameters().size(), seed, 0.3);
  for (std::size_t i = 0; i < noise.size(); ++i) m.parameters()[i] += static_cast<T>(noise[i]);
}

// What two successive training calls of a model leave: both losses, the
// gradients they accumulated, and (with memory) the cache.
template <class T>
struct CallsResult {
  std::vector<double> losses;
  std::vector<T> gradients;
  KVCacheOf<T> cache;
};

// Two calls on consecutive segments of `batch` streams (length 6, the first
// position of the second call unscored), gradients accumulating; with memory
// for the kinds that keep one; with attention dropout of probability `p` (the
// calls are steps 7 and 8 of a run).
template <class T>
CallsResult<T> two_calls(ModelImpl<T>& m, int batch, double p = 0) {
  const int length = 6;
  const bool memory = m.config().position == "xl";
  CallsResult<T> run;
  run.cache = m.template make_cache<KVCacheOf<T>>(batch, 5);
  for (int call = 0; call < 2; ++call) {
    const std::vector<uint8_t> tokens = random_tokens(batch * (length + 1), 30 + call);
    run.losses.push_back(
        m.loss(tokens.data(), batch, length, memory ? &run.cache : nullptr, call, true, {p, 4, 7 + call}));
  }
  run.gradients = m.gradients();
  return run;
}

double relative_difference(double a, double b) { return std::abs(a - b) / std::max(1.0, std::abs(b)); }

}  // namespace

class NnMicroBatch : public ::testing::TestWithParam<PositionKind> {};

// Splits of 5 sequences into 1 (the reference), 2 uneven (2 + 3) and 5 passes;
// with attention dropout each pass draws its rows of the whole batch's masks.
TEST_P(NnMicroBatch, SplitsGiveTheWholeBatchsLossGradientsAndMemory) {
  const int batch = 5;
  for (double p : {0.0, 0.3}) {
    ModelImpl<double> whole(config_of(GetParam()));
    perturb(whole, 3);
    whole.num_threads = 1;
    whole.micro_batch_tokens = 1 << 20;
    const CallsResult<double> expected = two_calls(whole, batch, p);
    for (int64_t tokens_per_pass : {int64_t(12), int64_t(1)}) {
      ModelImpl<double> split(config_of(GetParam()));
      perturb(split, 3);
      split.num_threads = 2;
      split.micro_batch_tokens = tokens_per_pass;
      const CallsResult<double> got = two_calls(split, batch, p);
      const std::string label = GetParam() + ", at least " + std::to_string(tokens_per_pass) +
                                " tokens per pass, dropout " + std::to_string(p);
      for (int call = 0; call < 2; ++call)
        EXPECT_LT(relative_difference(got.losses[call], expected.losses[call]), 1e-13) << label << " call " << call;
      for (std::size_t i = 0; i < expected.gradients.size(); ++i)
        ASSERT_LT(relative_difference(got.gradients[i], expected.gradients[i]), 1e-12) << label << " gradient " << i;
      EXPECT_EQ(got.cache.length, expected.cache.length) << label;
      EXPECT_EQ(got.cache.position, expected.cache.position) << label;
      for (int l = 0; l < whole.config().layers; ++l)
        for (std::size_t i = 0; i < expected.cache.keys[l].size(); ++i) {
          ASSERT_LT(relative_difference(got.cache.keys[l][i], expected.cache.keys[l][i]), 1e-13) << label;
          ASSERT_LT(relative_difference(got.cache.values[l][i], expected.cache.values[l][i]), 1e-13) << label;
        }
    }
  }
}

// Four passes (one sequence each): on two threads they run side by side, on
// one after the other; every number is the same bit for bit, in float32 and
// in mixed precision, with attention dropout and without.
TEST_P(NnMicroBatch, OneAndTwoThreadsGiveBitwiseTheSameNumbers) {
  for (Precision precision : {Precision::float32, Precision::bfloat16})
    for (double p : {0.0, 0.3}) {
      std::vector<CallsResult<float>> runs;
      for (int threads : {1, 2}) {
        ModelImpl<float> m(config_of(GetParam()));
        perturb(m, 5);
        m.num_threads = threads;
        m.precision = precision;
        m.micro_batch_tokens = 6;
        runs.push_back(two_calls(m, 4, p));
      }
      const std::string label = GetParam() + " " + to_string(precision) + " dropout " + std::to_string(p);
      for (int call = 0; call < 2; ++call) EXPECT_EQ(runs[0].losses[call], runs[1].losses[call]) << label;
      EXPECT_EQ(0, std::memcmp(runs[0].gradients.data(), runs[1].gradients.data(),
                               runs[0].gradients.size() * sizeof(float)))
          << label;
      for (int l = 0; l < 2; ++l) {
        EXPECT_EQ(runs[0].cache.keys[l], runs[1].cache.keys[l]) << label;
        EXPECT_EQ(runs[0].cache.values[l], runs[1].cache.values[l]) << label;
      }
    }
}

INSTANTIATE_TEST_SUITE_P(Kinds, NnMicroBatch, ::testing::ValuesIn(all_position_kinds()),
                         [](const auto& info) { return info.param; });

TEST(NnMicroBatchSize, TokensPerPassBelowOneIsRefused) {
  ModelImpl<float> m(config_of("alibi"));
  m.micro_batch_tokens = 0;
  const std::vector<uint8_t> tokens(2 * 7, 1);
  EXPECT_THROW(m.loss(tokens.data(), 2, 6, static_cast<KVCache*>(nullptr), 0, true), std::invalid_argument);
}
