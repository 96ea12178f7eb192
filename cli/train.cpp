// `relpos train`: trains one byte-level language model with one position
// scheme, writes a checkpoint (and, with --resume, continues one exactly),
// and reports the validation bits per byte at the training length.
//
// No work is lost: the checkpoint is written every --checkpoint-every steps
// and when SIGINT or SIGTERM stops the run after its current step; its folder
// is checked before training; an existing checkpoint of another run is kept
// unless --force. --resume takes the run's options from the checkpoint.
#include <chrono>
#include <cstdio>
#include <filesystem>

#include "commands.hpp"
#include "extrapolation.hpp"
#include "interrupt.hpp"
#include "measure.hpp"
#include "model_options.hpp"
#include "progress.hpp"
#include "relpos/train/files.hpp"
#include "relpos/train/trainer.hpp"

namespace relpos::cli {

namespace {

struct TrainCommand {
  ModelOptions model;
  TrainOptions training;
  std::string data_path, checkpoint_path, json_path;
  int64_t checkpoint_every = 500, eval_bytes = 65536, stop_after = 0;
  bool resume = false, force = false;

  // Parses argv into this command's fields; false when --help was printed.
  bool parse(int argc, char** argv, int first) {
    Options opts("relpos train",
                 "Trains a byte-level transformer language model with one position scheme on --data (default:\n"
                 "the English fortune files of Debian's 'fortunes' package). The last 10% of the bytes are held\n"
                 "out for validation. Writes a checkpoint that 'relpos eval' and 'relpos sample' read, and\n"
                 "'relpos train --resume' continues exactly (same losses as an uninterrupted run).\n"
                 "Ctrl-C (SIGINT) or SIGTERM stops after the current step and writes the checkpoint and --json.");
    opts.add_string("--data", &data_path, "training text (any bytes); empty = the default corpus");
    model.add_to(opts, true);
    training.add_to(opts);
    opts.add_string("--checkpoint", &checkpoint_path, "checkpoint file (default results/train/<scheme>.ckpt)");
    opts.add_int("--checkpoint-every", &checkpoint_every, "also write the checkpoint every N steps (0 = at the end only)",
                 0, kMaxSteps);
    opts.add_flag("--resume", &resume,
                  "continue --checkpoint with the options stored in it; options given again must agree, but for "
                  "--steps, which may extend a run (the cosine schedule then spans the new count)");
    opts.add_flag("--force", &force, "overwrite an existing --checkpoint of another run");
    opts.add_int("--stop-after", &stop_after, "stop after N steps of this invocation, checkpointed (0 = run to --steps)",
                 0, kMaxSteps);
    opts.add_int("--eval-bytes", &eval_bytes, "validation bytes scored after training (0 = all)", 0,
                 std::numeric_limits<int64_t>::max());
    opts.add_string("--json", &json_path, "also write the results (and every step's loss) to this JSON file");
    return opts.parse(argc, argv, first);
  }
};

// With --resume, the checkpoint's options become the defaults of a second
// parse, so that what the user gives again overrides them and can be compared.
void take_options_from(const train::Checkpoint& checkpoint, TrainCommand& command) {
  const nn::ModelConfig stored = nn::ModelConfig::from_text(checkpoint.model_config);
  const int threads = command.training.threads;
  command.model = ModelOptions::from_config(stored);
  command.training = TrainOptions::from_config(train::TrainConfig::from_text(checkpoint.train_config));
  command.training.threads = threads;
}

}  // namespace

int run_train(int argc, char** argv, int first) {
  TrainCommand cmd;
  if (!cmd.parse(argc, argv, first)) return 0;
  if (cmd.checkpoint_path.empty())
    cmd.checkpoint_path = "results/train/" + cmd.model.parsed_position() + ".ckpt";
  namespace fs = std::filesystem;
  train::Checkpoint stored;
  if (cmd.resume) {
    if (!fs::exists(cmd.checkpoint_path)) throw UsageError{"--resume: checkpoint '" + cmd.checkpoint_path + "' does not exist"};
    stored = train::load_checkpoint(cmd.checkpoint_path);
    const std::string checkpoint_path = cmd.checkpoint_path;
    take_options_from(stored, cmd);
    cmd.parse(argc, argv, first);
    cmd.checkpoint_path = checkpoint_path;
  } else if (fs::exists(cmd.checkpoint_path) && !fs::is_directory(cmd.checkpoint_path) && !cmd.force) {
    throw UsageError{"--checkpoint: '" + cmd.checkpoint_path +
                     "' exists; pass --resume to continue that run or --force to overwrite it"};
  }
  // Refuse before training what would fail after it.
  train::check_writable_file(cmd.checkpoint_path);
  if (!cmd.json_path.empty()) train::check_writable_file(cmd.json_path);

  const nn::PositionKind kind = cmd.model.parsed_position();
  const nn::ModelConfig model_config = cmd.model.config(kind, uint64_t(cmd.training.seed));
  const train::TrainConfig train_config = cmd.training.config();
  check_training_fits({model_config}, train_config, 1);
  if (cmd.resume) {
    if (const std::string d = train::config_difference(stored.model_config, model_config.to_text()); !d.empty())
      throw UsageError{"--resume: the options given disagree with the checkpoint's model (" + d + ")"};
    if (train_config.steps < stored.step)
      throw UsageError{"--steps: the checkpoint has taken " + std::to_string(stored.step) + " steps already"};
  }
  const train::Corpus corpus = cmd.resume && cmd.data_path.empty() ? corpus_from_source(stored.data_source)
                                                                   : train::load_corpus(cmd.data_path);
  const train::Split split = train::split_corpus(corpus.bytes);
  EvalSettings eval;
  eval.multiples = {1};
  eval.sliding = false;
  eval.max_bytes = cmd.eval_bytes;
  check_evaluation_fits(split.validation.size(), eval, model_config);
  train::Trainer trainer(model_config, train_config, split.train, corpus.source);
  trainer.set_threads(cmd.training.threads);
  if (cmd.resume) trainer.resume(stored);
  const int64_t params = int64_t(trainer.model().parameters().size());
  std::fprintf(stderr, "relpos train: %s, %d layers, width %d, %d heads, %lld parameters; length %d, batch %lld; %s; %s\n",
               kind.c_str(), model_config.layers, model_config.width, model_config.heads, (long long)params,
               model_config.context, (long long)train_config.batch, nn::to_string(train_config.precision),
               attention_dropout_text(train_config.attention_dropout).c_str());
  std::fprintf(stderr, "data: %s (%zu training, %zu validation bytes)\n", corpus.source.c_str(), split.train.size(),
               split.validation.size());
  const int64_t first_step = trainer.steps_taken();
  if (cmd.resume) {
    const train::TrainConfig before = train::TrainConfig::from_text(stored.train_config);
    std::fprintf(stderr, "resuming at step %lld of %lld%s\n", (long long)first_step, (long long)train_config.steps,
                 train_config.steps != before.steps
                     ? (" (extended from " + std::to_string(before.steps) +
                        ": the cosine schedule now spans the new count)").c_str()
                     : "");
  }

  const int64_t tokens_per_step = train_config.batch * model_config.context;
  std::vector<float> losses;
  Progress progress("train " + std::string(kind.c_str()), train_config.steps, first_step);
  const StopOnSignal stop;
  const auto start = std::chrono::steady_clock::now();
  while (!trainer.done() && !StopOnSignal::requested() &&
         (cmd.stop_after == 0 || trainer.steps_taken() - first_step < cmd.stop_after)) {
    losses.push_back(trainer.step());
    progress.update(trainer.steps_taken(), (trainer.steps_taken() - first_step) * tokens_per_step, losses.back());
    if (cmd.checkpoint_every > 0 && trainer.steps_taken() % cmd.checkpoint_every == 0)
      trainer.save(cmd.checkpoint_path);
  }
  progress.finish();
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  trainer.save(cmd.checkpoint_path);
  std::printf("steps %lld-%lld in %.1f s (%.0f tokens/s); last step: loss %.4f nats/byte, gradient norm %.3g, lr %.3g\n",
              (long long)first_step, (long long)trainer.steps_taken(), seconds,
              seconds > 0 ? double(trainer.steps_taken() - first_step) * double(tokens_per_step) / seconds : 0.0,
              losses.empty() ? 0.0 : losses.back(), trainer.last_grad_norm(), trainer.last_lr());

  Json json = {{"position", kind.c_str()}, {"parameters", params}, {"data", corpus.source},
               {"train_bytes", split.train.size()}, {"validation_bytes", split.validation.size()},
               {"length", model_config.context}, {"batch", train_config.batch}, {"steps", train_config.steps},
               {"dtype", nn::to_string(train_config.precision)}, {"attention_dropout", train_config.attention_dropout},
               {"first_step", first_step}, {"last_step", trainer.steps_taken()}, {"seconds", seconds},
               {"checkpoint", cmd.checkpoint_path}};
  if (StopOnSignal::requested()) {
    json["interrupted_by"] = StopOnSignal::signal_name();
    json["losses"] = losses;
    if (!cmd.json_path.empty()) write_json(cmd.json_path, json);
    std::fprintf(stderr,
                 "relpos train: stopped by %s after step %lld of %lld; checkpoint: %s%s%s\n"
                 "continue with: relpos train --checkpoint %s --resume\n",
                 StopOnSignal::signal_name(), (long long)trainer.steps_taken(), (long long)train_config.steps,
                 cmd.checkpoint_path.c_str(), cmd.json_path.empty() ? "" : ", results: ", cmd.json_path.c_str(),
                 cmd.checkpoint_path.c_str());
    return StopOnSignal::exit_status();
  }

  const LengthScore valid = evaluate_lengths(trainer.model(), split.validation, eval)[0];
  std::printf("validation: %.4f bits/byte at length %d (%lld bytes)\ncheckpoint: %s\n", valid.windows.bits_per_byte,
              model_config.context, (long long)valid.windows.bytes_scored, cmd.checkpoint_path.c_str());
  if (!cmd.json_path.empty()) {
    json["validation_bits_per_byte"] = valid.windows.bits_per_byte;
    json["losses"] = losses;
    write_json(cmd.json_path, json);
  }
  return 0;
}

}  // namespace relpos::cli
