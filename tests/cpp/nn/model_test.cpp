// The public Model: its parameter table, deterministic initialisation, and
// threads.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <set>
#include <string>
#include <vector>

#include "relpos/nn/model.hpp"

using namespace relpos::nn;

namespace {

ModelConfig small_config(PositionKind kind) {
  ModelConfig c;
  c.layers = 2, c.width = 32, c.heads = 4, c.ffn = 64, c.context = 16, c.position = kind;
  c.scheme_options = {{"shaw_k", 4}, {"t5_buckets", 8}, {"t5_max_distance", 32}}, c.seed = 3;
  return c;
}

const ParameterInfo& find(const Model& m, const std::string& name) {
  for (const ParameterInfo& p : m.parameter_table())
    if (p.name == name) return p;
  throw std::runtime_error("no parameter " + name);
}

double std_of(const Model& m, const ParameterInfo& p) {
  double sq = 0;
  for (int64_t i = 0; i < p.size; ++i) sq += double(m.parameters()[p.offset + i]) * m.parameters()[p.offset + i];
  return std::sqrt(sq / p.size);
}

}  // namespace

TEST(NnModel, ParameterTableTilesTheBuffer) {
  for (PositionKind kind : {"none", "learned", "shaw", "t5",
                            "xl"}) {
    const Model m(small_config(kind));
    int64_t next = 0;
    std::set<std::string> names;
    for (const ParameterInfo& p : m.parameter_table()) {
      EXPECT_EQ(p.offset, next) << p.name;
      int64_t size = 1;
      for (int64_t s : p.shape) size *= s;
      EXPECT_EQ(size, p.size) << p.name;
      EXPECT_TRUE(names.insert(p.name).second) << "duplicate " << p.name;
      // Matrices decay; vectors (biases, norms) and position tables do not.
      const bool position = p.name.find("positions") != std::string::npos || p.name.find("t5") == 0 ||
                            p.name.find("xl") != std::string::npos || p.name.find("shaw") != std::string::npos;
      EXPECT_EQ(p.weight_decay, p.shape.size() == 2 && !position) << p.name;
      next += p.size;
    }
    EXPECT_EQ(next, static_cast<int64_t>(m.parameters().size()));
  }
  const Model xl(small_config("xl"));
  EXPECT_EQ(find(xl, "layer1.attn.xl.w_r").shape, (std::vector<int64_t>{4, 8, 32}));
  EXPECT_EQ(find(xl, "xl.u").shape, (std::vector<int64_t>{4, 8}));
  const Model shaw(small_config("shaw"));
  EXPECT_EQ(find(shaw, "layer0.attn.shaw.wk").shape, (std::vector<int64_t>{1, 9, 8}));
  const Model t5(small_config("t5"));
  EXPECT_EQ(find(t5, "t5.table").shape, (std::vector<int64_t>{4, 8}));
  EXPECT_EQ(find(t5, "embedding.weight").shape, (std::vector<int64_t>{256, 32}));
}

TEST(NnModel, InitialisationIsDeterministicAndScaled) {
  ModelConfig c = small_config("alibi");
  c.width = 128, c.ffn = 256;
  const Model a(c), b(c);
  EXPECT_TRUE(std::equal(a.parameters().begin(), a.parameters().end(), b.parameters().begin()));
  c.seed = 4;
  const Model other(c);
  EXPECT_FALSE(std::equal(a.parameters().begin(), a.parameters().end(), other.parameters().begin()));
  EXPECT_NEAR(std_of(a, find(a, "layer0.attn.qkv.weight")), 0.02, 0.001);
  EXPECT_NEAR(std_of(a, find(a, "layer1.ffn.up.weight")), 0.02, 0.001);
  EXPECT_NEAR(std_of(a, find(a, "layer0.attn.out.weight")), 0.02 / 2, 0.001);  // 1 / sqrt(2 * layers)
  EXPECT_NEAR(std_of(a, find(a, "layer1.ffn.down.weight")), 0.02 / 2, 0.001);
  EXPECT_EQ(std_of(a, find(a, "layer0.attn.qkv.bias")), 0.0);
  EXPECT_EQ(std_of(a, find(a, "final_ln.weight")), 1.0);
  // A model at initialisation predicts nearly uniformly: loss near ln 256 (the
  // tied head favours repeating the input byte a little: its row meets itself).
  Model m(c);
  m.num_threads = 1;
  std::vector<uint8_t> tokens(2 * 17);
  for (std::size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<uint8_t>(i * 37);
  EXPECT_NEAR(m.loss(tokens, 2, 16), std::log(256.0), 0.3);
}

namespace {

// A bounded scheme tensor enters the attention clamped to its documented
// bounds: a parameter outside gives the loss of the bound and receives no
// gradient; at the bound itself it still learns.
void expect_clamped_at(const std::string& kind, const std::string& tensor, float outside, float bound, float inside) {
  SCOPED_TRACE(tensor);
  std::vector<uint8_t> tokens(2 * 17);
  for (std::size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<uint8_t>((i * 13) % 251);
  auto loss_and_grad = [&](float head1) {
    Model m(small_config(kind));
    m.num_threads = 1;
    const int64_t offset = find(m, tensor).offset;
    m.parameters()[offset + 1] = head1;
    const float loss = m.forward_backward(tokens, 2, 16);
    return std::pair{loss, m.gradients()[offset + 1]};
  };
  const auto [outside_loss, outside_grad] = loss_and_grad(outside);
  const auto [bound_loss, bound_grad] = loss_and_grad(bound);
  const auto [inside_loss, inside_grad] = loss_and_grad(inside);
  EXPECT_EQ(outside_loss, bound_loss);
  EXPECT_EQ(outside_grad, 0.0f);
  EXPECT_NE(inside_loss, bound_loss);
  EXPECT_NE(inside_grad, 0.0f);
  EXPECT_NE(bound_grad, 0.0f);
}

}  // namespace

// KERPLE's r1, r2 (both variants) have the floor 0.01; the power variant's
// exponent r2 also the ceiling 2.
TEST(NnModel, KerpleParametersOutsideTheirBoundsActAsTheBoundWithoutGradient) {
  expect_clamped_at("kerple", "layer0.attn.kerple.r2", -0.5f, 0.01f, 0.5f);
  expect_clamped_at("kerple_power", "layer0.attn.kerple_power.r1", -0.5f, 0.01f, 0.5f);
  expect_clamped_at("kerple_power", "layer0.attn.kerple_power.r2", 3.0f, 2.0f, 1.5f);
}

TEST(NnModel, ThreadsGiveTheSameLossAndGradients) {
  std::vector<uint8_t> tokens(4 * 33);
  for (std::size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<uint8_t>((i * i * 7) % 251);
  std::vector<std::vector<float>> grads;
  std::vector<float> losses;
  for (int threads : {1, 2}) {
    Model m(small_config("shaw"));
    m.num_threads = threads;
    losses.push_back(m.forward_backward(tokens, 4, 32));
    grads.emplace_back(m.gradients().begin(), m.gradients().end());
  }
  EXPECT_NEAR(losses[0], losses[1], 1e-5);
  for (std::size_t i = 0; i < grads[0].size(); ++i)
    ASSERT_NEAR(grads[0][i], grads[1][i], 1e-5 + 1e-3 * std::abs(grads[0][i])) << "gradient " << i;
}

TEST(NnModel, GradientsAccumulateUntilZeroed) {
  Model m(small_config("rope"));
  m.num_threads = 1;
  std::vector<uint8_t> tokens(2 * 9, 65);
  m.forward_backward(tokens, 2, 8);
  const std::vector<float> once(m.gradients().begin(), m.gradients().end());
  m.forward_backward(tokens, 2, 8);
  for (std::size_t i = 0; i < once.size(); ++i) ASSERT_NEAR(m.gradients()[i], 2 * once[i], 1e-6 + 1e-5 * std::abs(once[i]));
  m.zero_gradients();
  for (float g : m.gradients()) ASSERT_EQ(g, 0.0f);
}

// The learned table has `context` rows; every position from context - 1 on
// reads the last one. With the attention branch silenced (output projection
// zero) a position's logits depend only on its byte and its table row: the
// same byte at positions 3..6 (context 4) gives identical logits, and each
// earlier position its own.
TEST(NnModel, LearnedPositionsBeyondContextUseTheLastRow) {
  ModelConfig c = small_config("learned");
  c.layers = 1, c.context = 4;
  Model m(c);
  m.num_threads = 1;
  for (const char* name : {"layer0.attn.out.weight", "layer0.attn.out.bias"}) {
    const ParameterInfo& p = find(m, name);
    std::fill_n(m.parameters().begin() + p.offset, p.size, 0.0f);
  }
  const int length = 7;
  const std::vector<uint8_t> tokens(length, 'a');
  std::vector<float> out(length * 256);
  m.logits(tokens, 1, length, out);
  // Not bitwise: the GEMM library may round tail rows through another kernel
  // on another CPU. Equal rows agree to float rounding; different table rows
  // (random initialisation) move the logits by orders of magnitude more.
  auto row_difference = [&](int i, int j) {
    float d = 0;
    for (int c = 0; c < 256; ++c) d = std::max(d, std::abs(out[i * 256 + c] - out[j * 256 + c]));
    return d;
  };
  for (int i = 4; i < length; ++i) EXPECT_LE(row_difference(3, i), 1e-5f) << "position " << i;
  for (int i = 0; i < 3; ++i)
    for (int j = i + 1; j < 4; ++j) EXPECT_GT(row_difference(i, j), 1e-3f) << "positions " << i << ", " << j;
}

// The first block's input is embed_scale * E[byte] + the position's embedding,
// embed_scale = sqrt(width) under sinusoidal positions and 1 for the other
// kinds. With both residual branches of every block silenced (output
// projections zero) that input reaches final_ln unchanged, so the logits are
// LayerNorm(input) E^T (final_ln at its initial gain 1 and bias 0), computed
// here from the parameter buffer and the sinusoid's formula
// [sin(p f_j)..., cos(p f_j)...], f_j = 10000^(-2j/width).
TEST(NnModel, SinusoidalPositionsScaleTheByteEmbeddingBySqrtWidth) {
  for (PositionKind kind : {"sinusoidal", "learned", "none"}) {
    const ModelConfig c = small_config(kind);
    Model m(c);
    m.num_threads = 1;
    for (int l = 0; l < c.layers; ++l)
      for (const char* part : {"attn.out.weight", "attn.out.bias", "ffn.down.weight", "ffn.down.bias"}) {
        const ParameterInfo& p = find(m, "layer" + std::to_string(l) + "." + part);
        std::fill_n(m.parameters().begin() + p.offset, p.size, 0.0f);
      }
    const int length = 20, w = c.width, half = w / 2;  // beyond context: learned positions reuse the last row
    std::vector<uint8_t> tokens(length);
    for (int i = 0; i < length; ++i) tokens[i] = static_cast<uint8_t>((i * 71 + 5) % 256);
    std::vector<float> out(length * 256);
    m.logits(tokens, 1, length, out);
    const float* table = m.parameters().data() + find(m, "embedding.weight").offset;

    // Logits of position i when the byte embedding is multiplied by `scale`.
    auto expected_logits = [&](int i, double scale) {
      std::vector<double> x(w);
      for (int j = 0; j < w; ++j) x[j] = scale * table[tokens[i] * w + j];
      if (kind == "sinusoidal")
        for (int j = 0; j < half; ++j) {
          const double f = std::pow(10000.0, -2.0 * j / w);
          x[j] += std::sin(i * f);
          x[half + j] += std::cos(i * f);
        }
      if (kind == "learned") {
        const float* row = m.parameters().data() + find(m, "positions.learned").offset + std::min(i, c.context - 1) * w;
        for (int j = 0; j < w; ++j) x[j] += row[j];
      }
      double mean = 0, var = 0;
      for (double v : x) mean += v / w;
      for (double v : x) var += (v - mean) * (v - mean) / w;
      for (double& v : x) v = (v - mean) / std::sqrt(var + 1e-5);
      std::vector<double> logits(256, 0.0);
      for (int v = 0; v < 256; ++v)
        for (int j = 0; j < w; ++j) logits[v] += x[j] * table[v * w + j];
      return logits;
    };

    const double scale = kind == "sinusoidal" ? std::sqrt(double(w)) : 1.0;
    double largest_gap_to_unscaled = 0;
    for (int i = 0; i < length; ++i) {
      const std::vector<double> want = expected_logits(i, scale), unscaled = expected_logits(i, 1.0);
      for (int v = 0; v < 256; ++v) {
        ASSERT_NEAR(out[i * 256 + v], want[v], 2e-5) << kind << " position " << i << " byte " << v;
        largest_gap_to_unscaled = std::max(largest_gap_to_unscaled, std::abs(want[v] - unscaled[v]));
      }
    }
    // The scale is visible in the logits: leaving it out would fail the check above.
    if (kind == "sinusoidal") {
      EXPECT_GT(largest_gap_to_unscaled, 1e-2);
    }
  }
}
