// Command-line options shared by `relpos train` and `relpos demo`: the model's
// size and position scheme, and the training hyperparameters.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "options.hpp"
#include "relpos/nn/model.hpp"
#include "relpos/train/trainer.hpp"

namespace relpos::cli {

// ModelConfig::validate's and TrainConfig::validate's limits, declared with
// the options so that --help shows them and a value beyond is refused naming
// the option; more steps than kMaxSteps would not end in a lifetime.
inline constexpr int kMaxLayers = 1024, kMaxWidth = 1 << 16, kMaxFfn = 1 << 20, kMaxContext = 1 << 24;
inline constexpr int64_t kMaxTrainBatch = int64_t(1) << 20, kMaxSteps = int64_t(1) << 40;

struct ModelOptions {
  // int, as ModelConfig holds them: a value beyond int is refused, not narrowed.
  int layers = 2, width = 128, heads = 4, ffn = 512, length = 64;
  std::string position = "alibi";
  // The schemes' model options by key (SchemeModelConfig::scheme_options),
  // each at its default until its flag writes it.
  std::map<std::string, int64_t> integer_options;
  std::map<std::string, double> real_options;

  // with_position: also --positions, the one scheme to train (the demo
  // takes a list instead: add_positions_option).
  void add_to(Options& options, bool with_position);
  nn::ModelConfig config(nn::PositionKind position, uint64_t seed) const;
  // The options that give `c` (the defaults of a resumed run).
  static ModelOptions from_config(const nn::ModelConfig& c);
  nn::PositionKind parsed_position() const;  // UsageError for an unknown name
};

// --positions, the option every command that trains schemes takes (`relpos
// train` one, `relpos demo` a comma-separated list), writing `target`; `help`
// is followed by every position kind's name. The earlier spelling --position
// is accepted with a hint (Options::add_string).
void add_positions_option(Options& options, std::string* target, const std::string& help);

struct TrainOptions {
  int64_t steps = 1000, batch = 16, warmup = 100, seed = 1;
  int threads = 0, xl_memory = 0;
  double lr = 3e-3, min_lr_ratio = 0.1, weight_decay = 0.1, clip = 1.0, attention_dropout = 0;
  std::string dtype = "float32";

  void add_to(Options& options);
  train::TrainConfig config() const;
  static TrainOptions from_config(const train::TrainConfig& c);
};

// How a header names a run's attention dropout: "attention dropout 0.1", or
// "no attention dropout".
std::string attention_dropout_text(double p);

// Refuses (check_fits_memory, naming the options) training `side_by_side`
// models of the largest of `models` at once with `training`'s batches.
void check_training_fits(const std::vector<nn::ModelConfig>& models, const train::TrainConfig& training,
                         int side_by_side);

}  // namespace relpos::cli
