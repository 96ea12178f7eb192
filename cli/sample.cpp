// `relpos sample`: generates text from a trained model, one byte at a time
// through the model's key/value cache (Model::decode), with temperature and
// top-k sampling from a seeded generator.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <numeric>

#include "commands.hpp"
#include "extrapolation.hpp"
#include "fits_memory.hpp"
#include "measure.hpp"
#include "model_memory.hpp"
#include "options.hpp"
#include "relpos/nn/model.hpp"
#include "relpos/train/checkpoint.hpp"

namespace relpos::cli {

namespace {

// Bytes a cache holds per row: prompt and generated text (an int for the model).
constexpr int64_t kMaxCapacity = int64_t(1) << 24;

// Draws a byte from softmax(logits / temperature) restricted to the top_k
// largest logits (top_k 0 = all); temperature 0 takes the largest.
uint8_t draw_byte(std::span<const float> logits, double temperature, int top_k, train::Rng& rng) {
  std::vector<int> order(logits.size());
  std::iota(order.begin(), order.end(), 0);
  // Stable, so ties go to the smaller byte and runs repeat exactly.
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return logits[size_t(a)] > logits[size_t(b)]; });
  if (temperature == 0) return uint8_t(order[0]);
  const size_t keep = top_k > 0 ? std::min(size_t(top_k), order.size()) : order.size();
  std::vector<double> weight(keep);
  const double top = logits[size_t(order[0])];
  double total = 0;
  for (size_t i = 0; i < keep; ++i) total += weight[i] = std::exp((logits[size_t(order[i])] - top) / temperature);
  double u = rng.uniform01() * total;
  for (size_t i = 0; i < keep; ++i) {
    if (u < weight[i]) return uint8_t(order[i]);
    u -= weight[i];
  }
  return uint8_t(order[keep - 1]);  // rounding left u at the very top
}

}  // namespace

int run_sample(int argc, char** argv, int first) {
  std::string checkpoint_path, prompt = "The ", json_path;
  int64_t length = 200, top_k = 0, seed = 1;
  int threads = 0;
  double temperature = 0.8;
  Options opts("relpos sample",
               "Generates --length bytes after --prompt from a trained model ('relpos train' checkpoint),\n"
               "decoding one byte at a time with a key/value cache. Writes prompt + text to stdout.\n"
               "Checkpoints of every position scheme are read:\n" + nn::position_kind_names() + ".");
  opts.add_string("--checkpoint", &checkpoint_path, "checkpoint written by 'relpos train' (required)");
  opts.add_string("--prompt", &prompt, "text to continue (at least one byte)");
  opts.add_int("--length", &length, "bytes to generate (prompt + length at most 2^24)", 1, kMaxCapacity);
  opts.add_double("--temperature", &temperature, "sampling temperature (0 = always the most likely byte)", 0.0);
  opts.add_int("--top-k", &top_k, "sample among the k most likely bytes only (0 = all 256)", 0, 256);
  opts.add_int("--seed", &seed, "sampling seed", 0, std::numeric_limits<int64_t>::max());
  opts.add_int("--threads", &threads, "threads (0 = all cores)", 0, kMaxThreads);
  opts.add_string("--json", &json_path, "also write prompt and text to this JSON file");
  if (!opts.parse(argc, argv, first)) return 0;
  if (checkpoint_path.empty()) throw UsageError{"--checkpoint: required"};
  if (prompt.empty()) throw UsageError{"--prompt: must not be empty (the model needs a byte to start from)"};
  if (!(temperature >= 0) || !std::isfinite(temperature))
    throw UsageError{"--temperature: must be a finite number >= 0"};

  const int64_t capacity = int64_t(prompt.size()) + length;
  if (capacity > kMaxCapacity) throw UsageError{"--length: prompt + length must be at most 16777216 bytes"};

  const train::Checkpoint checkpoint = train::load_checkpoint(checkpoint_path);
  const nn::ModelConfig config = nn::ModelConfig::from_text(checkpoint.model_config);
  // The prompt's pass and the key/value cache of every position.
  check_fits_memory(model_bytes(config, 1, double(prompt.size()), false) + cache_bytes(config, 1, double(capacity)),
                    {{"--length", length}, {"prompt bytes", int64_t(prompt.size())}, {"width", config.width},
                     {"layers", config.layers}});
  nn::Model model = train::model_from_checkpoint(checkpoint);
  model.num_threads = int(threads);
  nn::KVCache cache = model.make_cache(1, int(capacity));
  std::vector<float> logits(256);
  train::Rng rng{uint64_t(seed)};
  const std::vector<uint8_t> prompt_bytes(prompt.begin(), prompt.end());
  model.decode(prompt_bytes, 1, int(prompt_bytes.size()), cache, logits);
  std::fwrite(prompt.data(), 1, prompt.size(), stdout);
  std::string text;
  for (int64_t i = 0; i < length; ++i) {
    const uint8_t next = draw_byte(logits, temperature, int(top_k), rng);
    text += char(next);
    std::fputc(next, stdout);
    std::fflush(stdout);
    if (i + 1 < length) model.decode(std::span(&next, 1), 1, 1, cache, logits);
  }
  std::fputc('\n', stdout);
  if (!json_path.empty()) {
    write_json(json_path, Json{{"checkpoint", checkpoint_path}, {"prompt", prompt}, {"text", text},
                               {"temperature", temperature}, {"top_k", top_k}, {"seed", seed}});
  }
  return 0;
}

}  // namespace relpos::cli
