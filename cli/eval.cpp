// `relpos eval`: bits per byte of a trained model on the validation split at
// 1, 2, 4, 8 and 16 times its training length (non-overlapping windows,
// sliding windows, and for Transformer-XL segments with a longer memory).
#include <cmath>
#include <cstdio>

#include "commands.hpp"
#include "extrapolation.hpp"
#include "measure.hpp"
#include "options.hpp"
#include "progress.hpp"
#include "relpos/nn/model.hpp"
#include "relpos/train/checkpoint.hpp"

namespace relpos::cli {

int run_eval(int argc, char** argv, int first) {
  std::string checkpoint_path, data_path, json_path;
  EvalSettings settings;
  bool no_sliding = false;
  int threads = 0;
  Options opts("relpos eval",
               "Scores a trained model (a 'relpos train' checkpoint) on the validation split of its data (the\n"
               "last 10%) at multiples of its training length L, in bits per byte:\n"
               "  windows  non-overlapping windows of n L, every byte scored;\n"
               "  sliding  windows of n L every --stride bytes (default n L / 2); the first window scores all\n"
               "           its bytes, later ones only their new tail, so each byte has >= n L - stride context;\n"
               "  memory   Transformer-XL only: segments of L with a memory of (n - 1) L, as in its paper.\n"
               "Checkpoints of every position scheme are read:\n" + nn::position_kind_names() + ".");
  opts.add_string("--checkpoint", &checkpoint_path, "checkpoint written by 'relpos train' (required)");
  opts.add_string("--data", &data_path, "evaluate on this file's validation split (default: the checkpoint's data)");
  opts.add_int_list("--multiples", &settings.multiples, "evaluation lengths as multiples of the training length",
                    kMaxMultiple);
  opts.add_int("--stride", &settings.stride, "sliding-window stride in bytes (0 = half the window)", 0,
               std::numeric_limits<int>::max());
  opts.add_flag("--no-sliding", &no_sliding, "skip the sliding-window evaluation");
  opts.add_int("--batch", &settings.batch, "windows per forward pass", 1, kMaxEvalBatch);
  opts.add_int("--max-bytes", &settings.max_bytes, "score only the first N validation bytes (0 = all)", 0,
               std::numeric_limits<int64_t>::max());
  opts.add_int("--threads", &threads, "threads (0 = all cores)", 0, kMaxThreads);
  opts.add_string("--json", &json_path, "also write the results to this JSON file");
  if (!opts.parse(argc, argv, first)) return 0;
  if (checkpoint_path.empty()) throw UsageError{"--checkpoint: required"};
  settings.sliding = !no_sliding;

  const train::Checkpoint checkpoint = train::load_checkpoint(checkpoint_path);
  nn::Model model = train::model_from_checkpoint(checkpoint);
  model.num_threads = int(threads);
  const train::Corpus corpus = data_path.empty() ? corpus_from_source(checkpoint.data_source) : train::load_file(data_path);
  const train::Split split = train::split_corpus(corpus.bytes);
  if (data_path.empty() && (split.train.size() != size_t(checkpoint.data_bytes) ||
                            train::fnv1a64(split.train) != checkpoint.data_hash))
    throw std::runtime_error("the training data '" + checkpoint.data_source +
                             "' changed since the checkpoint was written; pass --data to evaluate on other text");
  const nn::ModelConfig& config = model.config();
  std::printf("relpos eval: %s (%s, trained %lld steps at length %d in %s), validation of %s: %zu bytes%s\n",
              checkpoint_path.c_str(), config.position.c_str(), (long long)checkpoint.step, config.context,
              nn::to_string(model.precision),
              corpus.source.c_str(), split.validation.size(),
              settings.max_bytes > 0 ? (", first " + std::to_string(settings.max_bytes) + " scored").c_str() : "");
  Progress progress("eval", int64_t(settings.multiples.size()));
  const auto scores = evaluate_lengths(model, split.validation, settings, [&](size_t i) {
    progress.update(int64_t(i + 1), 0, NAN);
  });
  progress.finish();
  std::printf("\n%8s %8s %12s %12s %12s\n", "length", "x train", "windows", "sliding", "xl memory");
  for (const LengthScore& r : scores) {
    std::printf("%8lld %7lldx %12.4f", (long long)r.length, (long long)r.multiple, r.windows.bits_per_byte);
    if (r.stride > 0) std::printf(" %12.4f", r.sliding.bits_per_byte);
    else std::printf(" %12s", "-");
    if (r.has_memory) std::printf(" %12.4f", r.memory.bits_per_byte);
    else std::printf(" %12s", "-");
    std::printf("\n");
  }
  std::printf("(bits per byte; lower is better)\n");
  if (!json_path.empty()) {
    write_json(json_path, Json{{"checkpoint", checkpoint_path}, {"position", config.position.c_str()},
                               {"train_length", config.context}, {"steps", checkpoint.step}, {"data", corpus.source},
                               {"dtype", nn::to_string(model.precision)},
                               {"validation_bytes", split.validation.size()}, {"scores", scores_json(scores)}});
  }
  return 0;
}

}  // namespace relpos::cli
