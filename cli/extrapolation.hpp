// What `relpos eval` and `relpos demo` share: bits per byte of a model on the
// validation split at multiples of its training length, and their JSON.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "json_output.hpp"

#include "relpos/nn/model.hpp"
#include "relpos/train/data.hpp"
#include "relpos/train/evaluate.hpp"

namespace relpos::cli {

// Evaluation lengths are multiples of the training length; more than this
// would not fit any corpus relpos reads (and could overflow the window size).
inline constexpr int64_t kMaxMultiple = int64_t(1) << 20;
// Windows per forward pass (an int where the model reads it), as many as a
// training batch may hold.
inline constexpr int64_t kMaxEvalBatch = int64_t(1) << 20;

struct EvalSettings {
  std::vector<int64_t> multiples{1, 2, 4, 8, 16};
  int64_t stride = 0;     // sliding-window stride in bytes; 0 = half the window
  bool sliding = true;    // also the sliding-window evaluation
  int64_t batch = 8;      // windows per forward pass
  int64_t max_bytes = 0;  // evaluate on the first max_bytes validation bytes (0 = all)
};

struct LengthScore {
  int64_t multiple = 1, length = 0;
  train::Score windows;  // non-overlapping windows of `length`
  train::Score sliding;  // sliding windows of `length` (if settings.sliding)
  int64_t stride = 0;
  bool has_memory = false;
  train::Score memory;   // Transformer-XL: segments of the training length, memory (multiple - 1) x it
};

// Throws std::invalid_argument when `validation_bytes` (as capped by
// settings.max_bytes) are too few for the longest window or that window is
// longer than a model reads at once (an int), and UsageError
// (check_fits_memory) when what evaluate_lengths would hold at once for a
// model of `config` exceeds this machine's memory; commands call it before
// training so that a bad setting fails at once.
void check_evaluation_fits(size_t validation_bytes, const EvalSettings& settings, const nn::ModelConfig& config);

// Throws std::invalid_argument when the validation bytes are too few for the
// longest window. `on_done(i)` runs after multiple i (progress).
std::vector<LengthScore> evaluate_lengths(nn::Model& model, std::span<const uint8_t> validation,
                                          const EvalSettings& settings,
                                          const std::function<void(size_t)>& on_done = nullptr);

Json scores_json(const std::vector<LengthScore>& scores);

// The corpus a checkpoint was trained on, from its data_source: a file
// path, or "fortunes:<dir>" for the default corpus.
train::Corpus corpus_from_source(const std::string& source);

}  // namespace relpos::cli
