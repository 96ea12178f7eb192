// Mixed-precision (bfloat16) models and training.
//
// The forward is checked against an oracle written here in double, from the
// rounding points the model documents (GEMM and attention operands rounded
// to bfloat16; everything else in full precision): its logits must agree
// with the bfloat16 model far more closely than with the unrounded
// computation. Gradients are judged against the float64 model (rounding
// makes the bfloat16 loss piecewise constant, so central differences say
// nothing); training is judged by what it reaches beside float32; the
// trainer keeps float32 parameters and checkpoints and records the
// precision of its run.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <span>
#include <string>
#include <vector>

#include "../../../src/nn/model_impl.hpp"
#include "nn/checks.hpp"
#include "relpos/half.hpp"
#include "relpos/train/checkpoint.hpp"
#include "relpos/train/trainer.hpp"
#include "train/test_files.hpp"

using namespace relpos::nn;
using relpos_nn_test::random_tokens;
using relpos_nn_test::random_values;

namespace {

ModelConfig small_config(PositionKind kind) {
  ModelConfig c;
  c.layers = 2, c.width = 16, c.heads = 2, c.ffn = 32, c.context = 12, c.position = kind;
  c.scheme_options = {{"shaw_k", 3}, {"t5_buckets", 6}, {"t5_max_distance", 16}}, c.seed = 4;
  return c;
}

// Every parameter moved off its initial value (gains of 1 and biases of 0
// would leave terms of the computation unexercised).
void perturb(std::span<float> params, uint32_t seed) {
  const std::vector<double> noise = random_values(params.size(), seed, 0.1);
  for (std::size_t i = 0; i < params.size(); ++i) params[i] += static_cast<float>(noise[i]);
}

double bf16(double x) { return double(float(relpos::bfloat16(float(x)))); }

// The model without position terms, in double, rounding with `round` where
// the bfloat16 model stores: logits (batch, length, 256).
class Oracle {
 public:
  Oracle(const ModelImpl<float>& m, bool round) : m_(m), round_(round), c_(m.config()) {}

  std::vector<double> logits(const std::vector<uint8_t>& tokens, int batch, int length) const {
    const int64_t w = c_.width, n = int64_t(batch) * length;
    std::vector<double> x(n * w);
    for (int64_t r = 0; r < n; ++r)
      for (int64_t c = 0; c < w; ++c) x[r * w + c] = param("embedding.weight")[tokens[r] * w + c];
    for (int l = 0; l < c_.layers; ++l) {
      const std::string p = "layer" + std::to_string(l) + ".";
      const std::vector<double> qkv = linear(norm(x, p + "ln1"), p + "attn.qkv", w, 3 * w, true);
      const std::vector<double> branch = linear(attention(qkv, batch, length), p + "attn.out", w, w, false);
      for (int64_t i = 0; i < n * w; ++i) x[i] += branch[i];
      std::vector<double> hidden = linear(norm(x, p + "ln2"), p + "ffn.up", w, c_.ffn, false);
      for (double& h : hidden) h = stored(0.5 * h * (1 + std::erf(h / std::sqrt(2.0))));
      const std::vector<double> down = linear(hidden, p + "ffn.down", c_.ffn, w, false);
      for (int64_t i = 0; i < n * w; ++i) x[i] += down[i];
    }
    const std::vector<double> final_out = norm(x, "final_ln");
    std::vector<double> out(n * 256, 0.0);
    for (int64_t r = 0; r < n; ++r)
      for (int64_t v = 0; v < 256; ++v)
        for (int64_t c = 0; c < w; ++c) out[r * 256 + v] += final_out[r * w + c] * weight("embedding.weight", v * w + c);
    return out;
  }

 private:
  const float* param(const std::string& name) const {
    for (const ParameterInfo& p : m_.layout().table)
      if (p.name == name) return m_.parameters().data() + p.offset;
    throw std::runtime_error("no parameter " + name);
  }
  double stored(double x) const { return round_ ? bf16(x) : x; }
  double weight(const std::string& name, int64_t i) const { return stored(param(name)[i]); }

  std::vector<double> norm(const std::vector<double>& x, const std::string& name) const {
    const int64_t w = c_.width, n = int64_t(x.size()) / w;
    std::vector<double> y(x.size());
    for (int64_t r = 0; r < n; ++r) {
      double mean = 0, var = 0;
      for (int64_t c = 0; c < w; ++c) mean += x[r * w + c] / w;
      for (int64_t c = 0; c < w; ++c) var += (x[r * w + c] - mean) * (x[r * w + c] - mean) / w;
      for (int64_t c = 0; c < w; ++c)
        y[r * w + c] = stored((x[r * w + c] - mean) / std::sqrt(var + 1e-5) * param(name + ".weight")[c] +
                              param(name + ".bias")[c]);
    }
    return y;
  }

  // x (n, k) -> y = x W^T + b (n, out), rounded when `rounded_output` (the attention reads it).
  std::vector<double> linear(const std::vector<double>& x, const std::string& name, int64_t k, int64_t out,
                             bool rounded_output) const {
    const int64_t n = int64_t(x.size()) / k;
    std::vector<double> y(n * out);
    for (int64_t r = 0; r < n; ++r)
      for (int64_t o = 0; o < out; ++o) {
        double s = param(name + ".bias")[o];
        for (int64_t c = 0; c < k; ++c) s += x[r * k + c] * weight(name + ".weight", o * k + c);
        y[r * out + o] = rounded_output ? stored(s) : s;
      }
    return y;
  }

  // Causal softmax attention per head, q/k/v read from qkv rows, output rounded.
  std::vector<double> attention(const std::vector<double>& qkv, int batch, int length) const {
    const int64_t w = c_.width, dh = w / c_.heads;
    std::vector<double> out(int64_t(batch) * length * w);
    for (int b = 0; b < batch; ++b)
      for (int h = 0; h < c_.heads; ++h)
        for (int i = 0; i < length; ++i) {
          const double* q = &qkv[(int64_t(b) * length + i) * 3 * w + h * dh];
          std::vector<double> score(i + 1);
          double top = -INFINITY, total = 0;
          for (int j = 0; j <= i; ++j) {
            const double* k = &qkv[(int64_t(b) * length + j) * 3 * w + w + h * dh];
            double s = 0;
            for (int64_t d = 0; d < dh; ++d) s += q[d] * k[d];
            score[j] = s / std::sqrt(double(dh));
            top = std::max(top, score[j]);
          }
          for (double& s : score) total += (s = std::exp(s - top));
          for (int64_t d = 0; d < dh; ++d) {
            double acc = 0;
            for (int j = 0; j <= i; ++j) acc += score[j] * qkv[(int64_t(b) * length + j) * 3 * w + 2 * w + h * dh + d];
            out[(int64_t(b) * length + i) * w + h * dh + d] = stored(acc / total);
          }
        }
    return out;
  }

  const ModelImpl<float>& m_;
  bool round_;
  ModelConfig c_;
};

double max_abs_difference(const float* a, const std::vector<double>& b) {
  double worst = 0;
  for (std::size_t i = 0; i < b.size(); ++i) worst = std::max(worst, std::abs(double(a[i]) - b[i]));
  return worst;
}

}  // namespace

TEST(NnMixedPrecision, LogitsAgreeWithAnOracleRoundingAtTheDocumentedPoints) {
  ModelImpl<float> m(small_config("none"));
  m.num_threads = 1;
  perturb(m.parameters(), 21);
  const int batch = 2, length = 12;
  const std::vector<uint8_t> tokens = random_tokens(batch * length, 5);
  const std::vector<double> rounded = Oracle(m, true).logits(tokens, batch, length);
  const std::vector<double> exact = Oracle(m, false).logits(tokens, batch, length);

  m.precision = Precision::float32;
  const float* f32 = m.logits(tokens.data(), batch, length, static_cast<KVCacheOf<float>*>(nullptr));
  const double f32_vs_exact = max_abs_difference(f32, exact);
  m.precision = Precision::bfloat16;
  const float* mixed = m.logits(tokens.data(), batch, length, static_cast<KVCacheOf<float>*>(nullptr));
  const double mixed_vs_rounded = max_abs_difference(mixed, rounded);
  const double mixed_vs_exact = max_abs_difference(mixed, exact);
  std::printf("max |logit error|: float32 vs exact %.2e; bfloat16 vs rounded oracle %.2e, vs exact %.2e\n",
              f32_vs_exact, mixed_vs_rounded, mixed_vs_exact);
  EXPECT_LT(f32_vs_exact, 1e-5);
  // Rounding shows (bfloat16 keeps 8 significant bits) ...
  EXPECT_GT(mixed_vs_exact, 1e-3);
  // ... and it happens where the oracle rounds: the float32 arithmetic in
  // between only rarely moves a value across a rounding boundary.
  EXPECT_LT(mixed_vs_rounded, 0.05 * mixed_vs_exact);
}

namespace {

// A bfloat16 model and a float64 model at the same (perturbed) parameters.
struct MixedAndExact {
  ModelImpl<float> mixed;
  ModelImpl<double> exact;
  MixedAndExact(const ModelConfig& config, uint32_t seed) : mixed(config), exact(config) {
    mixed.num_threads = exact.num_threads = 1;
    perturb(mixed.parameters(), seed);
    std::copy(mixed.parameters().begin(), mixed.parameters().end(), exact.parameters().begin());
    mixed.precision = Precision::bfloat16;
  }

  // Every gradient tensor within 6% of its largest float64 entry: 2^-8 per
  // rounding, through two layers and the loss; the smallest tensors (XL's W_R,
  // KERPLE's r2) reach 3.4%, a lost term would be 100%. Returns the worst ratio.
  double expect_gradients_near() {
    double worst_ratio = 0;
    for (const ParameterInfo& p : mixed.layout().table) {
      double largest = 0, worst = 0;
      for (int64_t i = p.offset; i < p.offset + p.size; ++i) {
        largest = std::max(largest, std::abs(exact.gradients()[i]));
        worst = std::max(worst, std::abs(double(mixed.gradients()[i]) - exact.gradients()[i]));
      }
      EXPECT_LE(worst, 6e-2 * largest) << p.name << ": largest gradient " << largest;
      EXPECT_GT(largest, 0) << p.name;
      worst_ratio = std::max(worst_ratio, worst / largest);
    }
    return worst_ratio;
  }
};

}  // namespace

class NnMixedPrecisionKinds : public ::testing::TestWithParam<PositionKind> {};

// Loss and every gradient tensor of the bfloat16 model against the float64
// model at the same parameters: within what 8 significant bits allow, per
// tensor (relative to the tensor's largest entry), for every position kind.
TEST_P(NnMixedPrecisionKinds, LossAndGradientsStayNearFloat64) {
  MixedAndExact models(small_config(GetParam()), 22);
  const int batch = 2, length = 12;
  const std::vector<uint8_t> tokens = random_tokens(batch * (length + 1), 6);
  const double mixed_loss =
      models.mixed.loss(tokens.data(), batch, length, static_cast<KVCacheOf<float>*>(nullptr), 0, true);
  const double exact_loss =
      models.exact.loss(tokens.data(), batch, length, static_cast<KVCacheOf<double>*>(nullptr), 0, true);
  EXPECT_NEAR(mixed_loss, exact_loss, 2e-3 * exact_loss);
  const double worst_ratio = models.expect_gradients_near();
  std::printf("loss %.6f (float64 %.6f); worst gradient error %.2f%% of its tensor's largest entry\n", mixed_loss,
              exact_loss, 100 * worst_ratio);
}

// Transformer-XL as the trainer runs it: a second segment with the first one's
// keys and values in memory (rounded to bfloat16 there; their gradients are
// not taken). Loss and gradients of both calls against float64, as above.
TEST(NnMixedPrecision, TransformerXlWithMemoryStaysNearFloat64) {
  MixedAndExact models(small_config("xl"), 23);
  const int batch = 2, length = 8, memory = 8;
  auto mixed_cache = models.mixed.make_cache<KVCacheOf<float>>(batch, memory);
  auto exact_cache = models.exact.make_cache<KVCacheOf<double>>(batch, memory);
  for (int call = 0; call < 2; ++call) {
    const std::vector<uint8_t> tokens = random_tokens(batch * (length + 1), 40 + call);
    const double m = models.mixed.loss(tokens.data(), batch, length, &mixed_cache, 0, true);
    const double e = models.exact.loss(tokens.data(), batch, length, &exact_cache, 0, true);
    EXPECT_NEAR(m, e, 2e-3 * e) << "call " << call;
  }
  EXPECT_EQ(mixed_cache.length, memory);  // the second call read a full memory
  models.expect_gradients_near();
}

INSTANTIATE_TEST_SUITE_P(AllPositionKinds, NnMixedPrecisionKinds, ::testing::ValuesIn(all_position_kinds()),
                         [](const auto& info) { return info.param; });

namespace {

using relpos::train::Trainer;
using relpos::train::TrainConfig;

TrainConfig short_run(Precision precision) {
  TrainConfig t;
  t.steps = 150, t.batch = 8, t.warmup = 10, t.lr = 5e-3, t.seed = 3, t.precision = precision;
  return t;
}

}  // namespace

// The same run in float32 and bfloat16: a loss as low, and float32 parameters
// (rounding to bfloat16 only where GEMMs read them).
TEST(NnMixedPrecision, TrainingReachesTheLossOfFloat32) {
  const std::vector<uint8_t> data = relpos_train_test::sample_text(4000);
  ModelConfig config = small_config("alibi");
  config.width = 32, config.ffn = 64, config.context = 16;
  double mean_last[2] = {0, 0};
  std::vector<float> params;
  for (Precision precision : {Precision::float32, Precision::bfloat16}) {
    Trainer trainer(config, short_run(precision), data);
    trainer.set_threads(1);
    EXPECT_EQ(trainer.model().precision, precision);
    int64_t step = 0;
    while (!trainer.done()) {
      const float loss = trainer.step();
      if (++step > 130) mean_last[int(precision)] += loss / 20;
    }
    params.assign(trainer.model().parameters().begin(), trainer.model().parameters().end());
  }
  std::printf("mean loss of the last 20 steps: float32 %.4f, bfloat16 %.4f nats/byte\n", mean_last[0], mean_last[1]);
  EXPECT_LT(mean_last[0], 2.5);  // learnt something (uniform bytes: 5.5)
  EXPECT_NEAR(mean_last[1], mean_last[0], 0.05);
  const auto off_grid = std::count_if(params.begin(), params.end(), [](float x) { return double(x) != bf16(x); });
  EXPECT_GT(off_grid, int64_t(params.size()) / 2) << "the master weights must stay float32";
}

TEST(NnMixedPrecision, PrecisionIsPartOfTheRunAndOfItsCheckpoint) {
  relpos_train_test::TempDir dir;
  const std::vector<uint8_t> data = relpos_train_test::sample_text(2000);
  TrainConfig cfg = short_run(Precision::bfloat16);
  cfg.steps = 3;
  EXPECT_EQ(TrainConfig::from_text(cfg.to_text()).precision, Precision::bfloat16);
  // A training config without the key (written before it existed) means float32.
  std::string old_text = cfg.to_text();
  old_text.erase(old_text.find("precision="));
  EXPECT_EQ(TrainConfig::from_text(old_text).precision, Precision::float32);
  EXPECT_THROW(
      {
        try {
          TrainConfig::from_text("precision=float16\n");
        } catch (const std::invalid_argument& e) {
          EXPECT_NE(std::string(e.what()).find("precision"), std::string::npos) << e.what();
          throw;
        }
      },
      std::invalid_argument);

  Trainer trainer(small_config("rope"), cfg, data);
  while (!trainer.done()) trainer.step();
  const std::string path = dir.file("run.ckpt");
  trainer.save(path);
  const Model restored = relpos::train::model_from_checkpoint(relpos::train::load_checkpoint(path));
  EXPECT_EQ(restored.precision, Precision::bfloat16);
  EXPECT_TRUE(std::equal(restored.parameters().begin(), restored.parameters().end(),
                         trainer.model().parameters().begin()));

  TrainConfig other = cfg;
  other.precision = Precision::float32;
  Trainer in_float32(small_config("rope"), other, data);
  try {
    in_float32.resume(path);
    FAIL() << "a float32 resume of a bfloat16 run was accepted";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("precision: bfloat16 in the checkpoint, float32 requested"),
              std::string::npos)
        << e.what();
  }
}

TEST(NnMixedPrecision, PrecisionNamesParse) {
  EXPECT_EQ(parse_precision("bf16"), Precision::bfloat16);
  EXPECT_EQ(parse_precision("bfloat16"), Precision::bfloat16);
  EXPECT_EQ(parse_precision("float32"), Precision::float32);
  EXPECT_STREQ(to_string(Precision::bfloat16), "bfloat16");
  EXPECT_THROW(parse_precision("fp16"), std::invalid_argument);
}

// Decoding through the key/value cache computes what the full forward does:
// the cache holds keys and values as rounded.
TEST(NnMixedPrecision, DecodingAgreesWithTheFullForward) {
  Model m(small_config("rope"));
  m.num_threads = 1;
  perturb(m.parameters(), 23);
  const int length = 10;
  const std::vector<uint8_t> tokens = random_tokens(length, 7);
  std::vector<float> full(length * 256), f32(length * 256), step(256);
  m.logits(tokens, 1, length, f32);
  m.precision = Precision::bfloat16;
  m.logits(tokens, 1, length, full);
  KVCache cache = m.make_cache(1, length);
  double worst = 0, rounding = 0;
  for (int i = 0; i < length; ++i) {
    m.decode(std::span(tokens).subspan(i, 1), 1, 1, cache, step);
    for (int v = 0; v < 256; ++v) {
      worst = std::max(worst, std::abs(double(step[v]) - full[i * 256 + v]));
      rounding = std::max(rounding, std::abs(double(f32[i * 256 + v]) - full[i * 256 + v]));
    }
  }
  std::printf("decode vs full forward in bfloat16: %.2e (bfloat16 vs float32: %.2e)\n", worst, rounding);
  EXPECT_GT(rounding, 1e-3);
  EXPECT_LT(worst, 0.05 * rounding);
}
