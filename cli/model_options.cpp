#include "model_options.hpp"

#include <algorithm>
#include <cstdio>
#include <stdexcept>

#include "../src/schemes/registry.hpp"
#include "fits_memory.hpp"
#include "model_memory.hpp"
#include "relpos/gemm.hpp"

namespace relpos::cli {

void add_positions_option(Options& o, std::string* target, const std::string& help) {
  o.add_string("--positions", target, help + ": " + nn::position_kind_names(), "--position");
}

void ModelOptions::add_to(Options& o, bool with_position) {
  if (with_position) add_positions_option(o, &position, "the position scheme to train, one of");
  o.add_int("--length", &length, "training length (bytes per sequence; the model's context)", 1, kMaxContext);
  o.add_int("--layers", &layers, "transformer blocks", 1, kMaxLayers);
  o.add_int("--width", &width, "model width (heads x head dimension)", 1, kMaxWidth);
  o.add_int("--heads", &heads, "attention heads (at most --width)", 1, kMaxWidth);
  o.add_int("--ffn", &ffn, "hidden width of the feed-forward block", 1, kMaxFfn);
  for_each_model_option([&](const ModelOption& option) {  // "shaw_k" -> --shaw-k
    std::string flag = std::string("--") + option.key;
    std::replace(flag.begin(), flag.end(), '_', '-');
    if (option.integer) {
      int64_t& value = integer_options.try_emplace(option.key, int64_t(option.fallback)).first->second;
      o.add_int(flag, &value, option.help, int64_t(option.low), int64_t(option.high));
    } else {
      double& value = real_options.try_emplace(option.key, option.fallback).first->second;
      o.add_double(flag, &value, option.help, option.low, option.high);
    }
  });
}

nn::PositionKind ModelOptions::parsed_position() const {
  if (position.find(',') != std::string::npos)
    throw UsageError{"--positions: one scheme is trained here, got '" + position +
                     "' ('relpos demo --positions' trains several)"};
  try {
    return nn::parse_position_kind(position);
  } catch (const std::invalid_argument&) {
    throw UsageError{"--positions: unknown scheme '" + position + "' (known: " + nn::position_kind_names() + ")"};
  }
}

nn::ModelConfig ModelOptions::config(nn::PositionKind kind, uint64_t seed) const {
  nn::ModelConfig c;
  for (const auto& [key, value] : integer_options) c.scheme_options[key] = double(value);
  for (const auto& [key, value] : real_options) c.scheme_options[key] = value;
  c.layers = layers;
  c.width = width;
  c.heads = heads;
  c.ffn = ffn;
  c.context = length;
  c.position = kind;
  c.seed = seed;
  try {
    c.validate();
  } catch (const std::invalid_argument& e) {
    throw UsageError{e.what()};
  }
  return c;
}

ModelOptions ModelOptions::from_config(const nn::ModelConfig& c) {
  ModelOptions o;
  o.layers = c.layers, o.width = c.width, o.heads = c.heads, o.ffn = c.ffn, o.length = c.context;
  o.position = c.position;
  for_each_model_option([&](const ModelOption& option) {
    if (option.integer)
      o.integer_options[option.key] = int64_t(option.value_in(c));
    else
      o.real_options[option.key] = option.value_in(c);
  });
  return o;
}

TrainOptions TrainOptions::from_config(const train::TrainConfig& c) {
  TrainOptions o;
  o.steps = c.steps, o.batch = c.batch, o.warmup = c.warmup, o.seed = int64_t(c.seed);
  o.lr = c.lr, o.min_lr_ratio = c.min_lr_ratio, o.weight_decay = c.weight_decay, o.clip = c.clip;
  o.dtype = nn::to_string(c.precision);
  o.xl_memory = c.xl_memory;
  o.attention_dropout = c.attention_dropout;
  return o;
}

void TrainOptions::add_to(Options& o) {
  o.add_int("--steps", &steps, "optimizer steps", 1, kMaxSteps);
  o.add_int("--batch", &batch, "sequences per step", 1, kMaxTrainBatch);
  o.add_double("--lr", &lr, "peak learning rate (AdamW)", std::numeric_limits<double>::min());
  o.add_int("--warmup", &warmup, "linear warmup steps, then cosine decay", 0, kMaxSteps);
  o.add_double("--min-lr-ratio", &min_lr_ratio, "the cosine ends at this fraction of --lr", 0.0, 1.0);
  o.add_double("--weight-decay", &weight_decay, "decoupled weight decay of the weight matrices", 0.0);
  o.add_double("--clip", &clip, "global gradient-norm limit (0 = none)", 0.0);
  o.add_int("--seed", &seed, "seed of the initialisation and the batch sampling", 0,
            std::numeric_limits<int64_t>::max());
  o.add_int("--threads", &threads, "threads (0 = all cores)", 0, kMaxThreads);
  o.add_int("--xl-memory", &xl_memory, "Transformer-XL: keys of memory carried from batch to batch (0 = --length)", 0,
            train::kMaxXlMemory);
  o.add_probability("--attention-dropout", &attention_dropout,
                    "probability of dropping each attention weight in training steps (not in evaluation or "
                    "sampling); the masks follow --seed and the step, so --resume continues exactly");
  o.add_string("--dtype", &dtype,
               "float32; bf16: mixed precision (GEMM and attention operands rounded to bfloat16, float32 "
               "accumulation, weights, optimizer state and checkpoints); auto: bf16 where the CPU multiplies "
               "bfloat16 (AVX512-BF16 or AMX; relpos info), float32 elsewhere");
}

train::TrainConfig TrainOptions::config() const {
  train::TrainConfig c;
  c.steps = steps;
  c.batch = batch;
  c.lr = lr;
  c.warmup = warmup;
  c.min_lr_ratio = min_lr_ratio;
  c.weight_decay = weight_decay;
  c.clip = clip;
  c.seed = uint64_t(seed);
  c.xl_memory = xl_memory;
  c.attention_dropout = attention_dropout;
  try {
    // auto: bfloat16 only where it is faster; elsewhere its operands are
    // rounded in float32 buffers and the GEMMs are float32's (docs/trainer.md).
    c.precision = dtype == "auto" ? (gemm_bf16_native() ? nn::Precision::bfloat16 : nn::Precision::float32)
                                  : nn::parse_precision(dtype);
  } catch (const std::invalid_argument&) {
    throw UsageError{"--dtype: expected float32, bf16 (bfloat16) or auto, got '" + dtype + "'"};
  }
  try {
    c.validate();
  } catch (const std::invalid_argument& e) {
    throw UsageError{e.what()};
  }
  return c;
}

std::string attention_dropout_text(double p) {
  if (p == 0) return "no attention dropout";
  char text[48];
  std::snprintf(text, sizeof text, "attention dropout %g", p);
  return text;
}

void check_training_fits(const std::vector<nn::ModelConfig>& models, const train::TrainConfig& training,
                         int side_by_side) {
  double most = 0;
  const nn::ModelConfig* largest = &models.front();
  for (const nn::ModelConfig& m : models)
    if (const double need = model_bytes(m, double(training.batch), m.context, true); need > most)
      most = need, largest = &m;
  std::vector<SizeOption> sizes = {{"--layers", largest->layers}, {"--width", largest->width},
                                   {"--ffn", largest->ffn},       {"--batch", training.batch},
                                   {"--length", largest->context}};
  if (side_by_side > 1) sizes.push_back({"models side by side", side_by_side});
  check_fits_memory(most * side_by_side, sizes);
}

}  // namespace relpos::cli
