// `relpos train`: trains one byte-level language model with one position
// scheme, writes a checkpoint (and, with --resume, continues one exactly),
// and reports the validation bits per byte at the training length.
#include <chrono>
#include <cstdio>
#include <filesystem>

#include "commands.hpp"
#include "extrapolation.hpp"
#include "measure.hpp"
#include "model_options.hpp"
#include "progress.hpp"
#include "relpos/train/trainer.hpp"

namespace relpos::cli {

int run_train(int argc, char** argv, int first) {
  ModelOptions model;
  TrainOptions training;
  std::string data_path, checkpoint_path, json_path;
  int64_t checkpoint_every = 0, eval_bytes = 65536, stop_after = 0;
  bool resume = false;
  Options opts("relpos train",
               "Trains a byte-level transformer language model with one position scheme on --data (default:\n"
               "the English fortune files of Debian's 'fortunes' package). The last 10% of the bytes are held\n"
               "out for validation. Writes a checkpoint that 'relpos eval' and 'relpos sample' read, and\n"
               "'relpos train --resume' continues exactly (same losses as an uninterrupted run).");
  opts.add_string("--data", &data_path, "training text (any bytes); empty = the default corpus");
  model.add_to(opts, true);
  training.add_to(opts);
  opts.add_string("--checkpoint", &checkpoint_path, "checkpoint file (default results/train/<position>.ckpt)");
  opts.add_int("--checkpoint-every", &checkpoint_every, "also write the checkpoint every N steps (0 = at the end only)", 0);
  opts.add_flag("--resume", &resume, "continue from --checkpoint (same options as the run that wrote it)");
  opts.add_int("--stop-after", &stop_after, "stop after N steps of this invocation, checkpointed (0 = run to --steps)", 0);
  opts.add_int("--eval-bytes", &eval_bytes, "validation bytes scored after training (0 = all)", 0);
  opts.add_string("--json", &json_path, "also write the results (and every step's loss) to this JSON file");
  if (!opts.parse(argc, argv, first)) return 0;
  const nn::PositionKind kind = model.parsed_position();
  const nn::ModelConfig model_config = model.config(kind, uint64_t(training.seed));
  const train::TrainConfig train_config = training.config();
  if (checkpoint_path.empty()) checkpoint_path = "results/train/" + std::string(nn::to_string(kind)) + ".ckpt";

  const train::Corpus corpus = train::load_corpus(data_path);
  const train::Split split = train::split_corpus(corpus.bytes);
  EvalSettings eval;
  eval.multiples = {1};
  eval.sliding = false;
  eval.max_bytes = eval_bytes;
  check_evaluation_fits(split.validation.size(), eval, model_config.context);
  train::Trainer trainer(model_config, train_config, split.train, corpus.source);
  trainer.set_threads(int(training.threads));
  if (resume) {
    if (!std::filesystem::exists(checkpoint_path))
      throw UsageError{"--resume: checkpoint '" + checkpoint_path + "' does not exist"};
    trainer.resume(checkpoint_path);
  }
  const int64_t params = int64_t(trainer.model().parameters().size());
  std::fprintf(stderr, "relpos train: %s, %d layers, width %d, %d heads, %lld parameters; length %d, batch %lld\n",
               nn::to_string(kind), model_config.layers, model_config.width, model_config.heads, (long long)params,
               model_config.context, (long long)train_config.batch);
  std::fprintf(stderr, "data: %s (%zu training, %zu validation bytes)%s\n", corpus.source.c_str(), split.train.size(),
               split.validation.size(),
               resume ? (", resuming at step " + std::to_string(trainer.steps_taken())).c_str() : "");

  const int64_t tokens_per_step = train_config.batch * model_config.context;
  const int64_t first_step = trainer.steps_taken();
  std::vector<float> losses;
  Progress progress("train " + std::string(nn::to_string(kind)), train_config.steps);
  const auto start = std::chrono::steady_clock::now();
  while (!trainer.done() && (stop_after == 0 || trainer.steps_taken() - first_step < stop_after)) {
    losses.push_back(trainer.step());
    progress.update(trainer.steps_taken(), (trainer.steps_taken() - first_step) * tokens_per_step, losses.back());
    if (checkpoint_every > 0 && trainer.steps_taken() % checkpoint_every == 0) trainer.save(checkpoint_path);
  }
  progress.finish();
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  trainer.save(checkpoint_path);

  const LengthScore valid = evaluate_lengths(trainer.model(), split.validation, eval)[0];
  std::printf("steps %lld-%lld in %.1f s (%.0f tokens/s); last step: loss %.4f nats/byte, gradient norm %.3g, lr %.3g\n",
              (long long)first_step, (long long)trainer.steps_taken(), seconds,
              seconds > 0 ? double(trainer.steps_taken() - first_step) * double(tokens_per_step) / seconds : 0.0,
              losses.empty() ? 0.0 : losses.back(), trainer.last_grad_norm(), trainer.last_lr());
  std::printf("validation: %.4f bits/byte at length %d (%lld bytes)\ncheckpoint: %s\n", valid.windows.bits_per_byte,
              model_config.context, (long long)valid.windows.bytes_scored, checkpoint_path.c_str());

  if (!json_path.empty()) {
    write_json(json_path, Json{{"position", nn::to_string(kind)}, {"parameters", params}, {"data", corpus.source},
                               {"train_bytes", split.train.size()}, {"validation_bytes", split.validation.size()},
                               {"length", model_config.context}, {"batch", train_config.batch},
                               {"steps", train_config.steps}, {"first_step", first_step}, {"seconds", seconds},
                               {"checkpoint", checkpoint_path}, {"validation_bits_per_byte", valid.windows.bits_per_byte},
                               {"losses", losses}});
  }
  return 0;
}

}  // namespace relpos::cli
