// `relpos demo`, the main job: train short, test long. Trains one small
// byte-level language model per position scheme at a short length on the same
// data, evaluates each at 1x..16x that length on held-out text, and prints a
// table of bits per byte (scheme x evaluation length), with the results as
// JSON and an SVG plot. Absolute position embeddings degrade past the training
// length; relative schemes (ALiBi, T5, Shaw, Transformer-XL) hold.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <exception>
#include <numeric>
#include <thread>

#include "commands.hpp"
#include "extrapolation.hpp"
#include "interrupt.hpp"
#include "measure.hpp"
#include "model_options.hpp"
#include "progress.hpp"
#include "relpos/train/files.hpp"
#include "svg_plot.hpp"

namespace relpos::cli {

namespace {

// The default run fits in 10 minutes on 2 cores (docs/benchmarks.md has the
// measurement); --full trains larger models for longer.
void set_preset(bool full, ModelOptions& m, TrainOptions& t, EvalSettings& e) {
  m.layers = 2, m.width = 128, m.heads = 4, m.ffn = 512, m.length = 32;
  t.steps = 1500, t.batch = 16, t.lr = 3e-3, t.warmup = 100, t.dtype = "auto";
  e.max_bytes = 32768;
  if (full) {
    m.layers = 4, m.width = 128, m.ffn = 512, m.length = 64;
    t.steps = 3000, t.batch = 32, t.warmup = 200;
    e.max_bytes = 0;
  }
}

// The header's precision, and why where --dtype auto chose it.
std::string precision_text(const std::string& dtype, nn::Precision chosen) {
  std::string text = nn::to_string(chosen);
  if (dtype != "auto") return text;
  return text + (chosen == nn::Precision::bfloat16
                     ? " mixed precision (--dtype auto: this CPU multiplies bfloat16; --dtype float32 for float32)"
                     : " (--dtype auto: this CPU has no bfloat16 products)");
}

struct SchemeResult {
  nn::PositionKind kind;
  int64_t parameters = 0, steps = 0;  // steps: trained so far (fewer when a signal stopped the demo)
  double train_seconds = 0, eval_seconds = 0, final_loss = 0;
  std::vector<LengthScore> scores;
};

// After SIGINT / SIGTERM: every model that started training is checkpointed
// at the step it reached; the JSON lists them, and the exit status says why.
int report_interrupted(const std::vector<SchemeResult>& results, const std::string& json_path,
                       const std::string& out_dir, int64_t steps) {
  Json json = {{"interrupted_by", StopOnSignal::signal_name()}, {"steps", steps}, {"schemes", Json::array()}};
  std::fprintf(stderr, "relpos demo: stopped by %s; checkpoints in %s/:\n", StopOnSignal::signal_name(),
               out_dir.c_str());
  for (const SchemeResult& r : results) {
    if (r.parameters == 0) continue;  // never started
    const std::string checkpoint = out_dir + "/" + r.kind + ".ckpt";
    json["schemes"].push_back({{"position", r.kind}, {"steps_trained", r.steps},
                               {"checkpoint", checkpoint}, {"scores", scores_json(r.scores)}});
    std::fprintf(stderr, "  %-10s step %lld of %lld  (relpos train --checkpoint %s --resume continues it)\n",
                 r.kind.c_str(), (long long)r.steps, (long long)steps, checkpoint.c_str());
  }
  write_json(json_path, json);
  std::fprintf(stderr, "results so far: %s; run relpos demo again for the whole comparison\n", json_path.c_str());
  return StopOnSignal::exit_status();
}

void print_table(const char* title, const std::vector<SchemeResult>& results, const EvalSettings& e, int64_t length,
                 train::Score LengthScore::*score, bool memory_rows) {
  std::printf("\n%s\n%-12s", title, "scheme");
  for (int64_t m : e.multiples) std::printf(" %9s", (std::to_string(m * length) + " " + std::to_string(m) + "x").c_str());
  std::printf("\n");
  for (const SchemeResult& r : results) {
    if (memory_rows && !r.scores.front().has_memory) continue;
    std::printf("%-12s", memory_rows ? "xl memory" : r.kind.c_str());
    for (const LengthScore& s : r.scores) std::printf(" %9.4f", (s.*score).bits_per_byte);
    std::printf("\n");
  }
}

}  // namespace

int run_demo(int argc, char** argv, int first) {
  bool full = false;
  for (int a = first; a < argc; ++a) full = full || !std::strcmp(argv[a], "--full");
  ModelOptions model;
  TrainOptions training;
  EvalSettings eval;
  set_preset(full, model, training, eval);
  std::string data_path, out_dir = "results/demo", positions_text, json_path;
  int64_t jobs = 0;
  bool no_sliding = false;
  Options opts("relpos demo",
               "Train short, test long: trains one small byte-level language model per position scheme\n"
               "(--positions) at --length on the same data (default: Debian's English fortune files), then\n"
               "scores each on held-out text at 1x..16x that length (bits per byte; non-overlapping and sliding\n"
               "windows; Transformer-XL also with a memory of (n-1) x length). Prints the tables and writes\n"
               "demo.json, bits_per_byte.svg and one checkpoint per scheme to --out. The defaults finish within\n"
               "10 minutes on 2 cores (docs/trainer.md); --full trains larger models for longer (the defaults\n"
               "shown follow --full when it is given).");
  opts.add_flag("--full", &full, "larger models, more steps, the whole validation split");
  opts.add_string("--data", &data_path, "training text (any bytes); empty = the default corpus");
  add_positions_option(opts, &positions_text, "comma-separated schemes to train (default: all)");
  model.add_to(opts, false);
  training.add_to(opts);
  opts.add_int("--jobs", &jobs, "models trained side by side (0 = as many as --threads allows)", 0, kMaxThreads);
  opts.add_int_list("--multiples", &eval.multiples, "evaluation lengths as multiples of --length", kMaxMultiple);
  opts.add_int("--max-bytes", &eval.max_bytes, "validation bytes scored per length (0 = all)", 0,
               std::numeric_limits<int64_t>::max());
  opts.add_int("--stride", &eval.stride, "sliding-window stride in bytes (0 = half the window)", 0,
               std::numeric_limits<int>::max());
  opts.add_flag("--no-sliding", &no_sliding, "skip the sliding-window evaluation");
  opts.add_string("--out", &out_dir, "folder for demo.json, bits_per_byte.svg and the checkpoints");
  opts.add_string("--json", &json_path, "write the results here instead of <out>/demo.json");
  if (!opts.parse(argc, argv, first)) return 0;
  eval.sliding = !no_sliding;
  std::vector<nn::PositionKind> kinds = nn::all_position_kinds();
  if (!positions_text.empty()) {
    // Every item a scheme, none empty ("alibi,", ",alibi" and "alibi,,rope"
    // are refused, as --multiples' are), none twice (one checkpoint each).
    kinds.clear();
    std::vector<std::string> names(1);
    for (char c : positions_text) {
      if (c == ',')
        names.emplace_back();
      else
        names.back() += c;
    }
    for (const std::string& name : names) {
      if (name.empty())
        throw UsageError{"--positions: expected comma-separated schemes, got an empty item in '" + positions_text +
                         "'"};
      model.position = name;
      const nn::PositionKind kind = model.parsed_position();
      if (std::find(kinds.begin(), kinds.end(), kind) != kinds.end())
        throw UsageError{"--positions: '" + name + "' is given twice"};
      kinds.push_back(kind);
    }
  }
  const train::TrainConfig train_config = training.config();
  std::vector<nn::ModelConfig> configs;  // refuse bad sizes before training
  for (nn::PositionKind k : kinds) configs.push_back(model.config(k, uint64_t(training.seed)));
  const int threads = training.threads > 0 ? int(training.threads) : int(std::thread::hardware_concurrency());
  // Small models use one core poorly: training several side by side with
  // fewer threads each finishes sooner than one after another.
  const int workers = int(std::clamp<int64_t>(jobs > 0 ? jobs : threads, 1, int64_t(kinds.size())));
  const int threads_each = std::max(1, threads / workers);
  check_training_fits(configs, train_config, workers);

  // Refuse before training what would fail after it.
  train::check_writable_file(out_dir + "/demo.json");
  if (!json_path.empty()) train::check_writable_file(json_path);
  const train::Corpus corpus = train::load_corpus(data_path);
  const train::Split split = train::split_corpus(corpus.bytes);
  for (const nn::ModelConfig& config : configs) check_evaluation_fits(split.validation.size(), eval, config);
  std::printf("relpos demo: train at length %lld, evaluate at %s x; %lld layers, width %lld, %lld heads; %lld steps "
              "of batch %lld, %s; %s\ndata: %s (%zu training, %zu validation bytes)\n",
              (long long)model.length, joined_list(eval.multiples).c_str(), (long long)model.layers,
              (long long)model.width, (long long)model.heads, (long long)train_config.steps,
              (long long)train_config.batch, attention_dropout_text(train_config.attention_dropout).c_str(),
              precision_text(training.dtype, train_config.precision).c_str(), corpus.source.c_str(),
              split.train.size(), split.validation.size());
  std::printf("%zu models, %d at a time with %d thread%s each\n", kinds.size(), workers, threads_each,
              threads_each == 1 ? "" : "s");
  std::fflush(stdout);

  std::vector<SchemeResult> results(kinds.size());
  std::vector<std::exception_ptr> errors(kinds.size());
  std::atomic<size_t> next{0};
  std::atomic<int64_t> steps_done{0};
  const int64_t tokens_per_step = train_config.batch * model.length;
  Progress progress("demo", int64_t(kinds.size()) * train_config.steps);
  const auto start = std::chrono::steady_clock::now();
  // Transformer-XL (attention over memory too) takes longest: start it first
  // so that no worker is left alone with it at the end.
  std::vector<size_t> order(kinds.size());
  std::iota(order.begin(), order.end(), size_t(0));
  std::stable_partition(order.begin(), order.end(), [&](size_t i) { return kinds[i] == "xl"; });
  const StopOnSignal stop;
  auto work = [&] {
    for (size_t claim; !StopOnSignal::requested() && (claim = next++) < kinds.size();) {
      const size_t i = order[claim];
      try {
        SchemeResult& r = results[i];
        r.kind = kinds[i];
        const auto t0 = std::chrono::steady_clock::now();
        train::Trainer trainer(model.config(r.kind, uint64_t(training.seed)), train_config, split.train, corpus.source);
        trainer.set_threads(threads_each);
        r.parameters = int64_t(trainer.model().parameters().size());
        while (!trainer.done() && !StopOnSignal::requested()) {
          r.final_loss = trainer.step();
          const int64_t done = ++steps_done;
          progress.update(done, done * tokens_per_step, r.final_loss);
        }
        const auto t1 = std::chrono::steady_clock::now();
        r.steps = trainer.steps_taken();
        trainer.save(out_dir + "/" + r.kind + ".ckpt");
        if (!trainer.done()) continue;  // stopped by a signal: saved, not evaluated
        r.scores = evaluate_lengths(trainer.model(), split.validation, eval);
        r.train_seconds = std::chrono::duration<double>(t1 - t0).count();
        r.eval_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t1).count();
        char line[160];
        std::snprintf(line, sizeof line, "%-10s trained in %5.1f s, evaluated in %5.1f s: %.4f bits/byte at 1x, %.4f at %lldx",
                      r.kind.c_str(), r.train_seconds, r.eval_seconds, r.scores.front().windows.bits_per_byte,
                      r.scores.back().windows.bits_per_byte, (long long)r.scores.back().multiple);
        progress.note(line);
      } catch (...) {
        errors[i] = std::current_exception();
      }
    }
  };
  std::vector<std::thread> pool;
  for (int w = 1; w < workers; ++w) pool.emplace_back(work);
  work();
  for (std::thread& t : pool) t.join();
  progress.finish();
  for (const std::exception_ptr& e : errors)
    if (e) std::rethrow_exception(e);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (json_path.empty()) json_path = out_dir + "/demo.json";
  if (StopOnSignal::requested()) return report_interrupted(results, json_path, out_dir, train_config.steps);

  print_table("bits per byte, non-overlapping windows (lower is better; trained at the 1x length)", results, eval,
              model.length, &LengthScore::windows, false);
  if (eval.sliding)
    print_table("bits per byte, sliding windows (stride: half the window unless --stride)", results, eval,
                model.length, &LengthScore::sliding, false);
  const bool any_xl = std::any_of(results.begin(), results.end(), [](auto& r) { return r.scores.front().has_memory; });
  if (any_xl)
    print_table("Transformer-XL, segments of the training length with memory (n-1) x length", results, eval,
                model.length, &LengthScore::memory, true);
  std::printf("\n%zu models trained and evaluated in %s (wall clock)\n", results.size(), clock_text(seconds).c_str());

  std::vector<PlotSeries> series;
  for (const SchemeResult& r : results) {
    PlotSeries s{r.kind, {}, {}, false}, m{"xl memory", {}, {}, true};
    for (const LengthScore& ls : r.scores) {
      s.x.push_back(double(ls.multiple)), s.y.push_back(ls.windows.bits_per_byte);
      if (ls.has_memory) m.x.push_back(double(ls.multiple)), m.y.push_back(ls.memory.bits_per_byte);
    }
    series.push_back(s);
    if (!m.x.empty()) series.push_back(m);
  }
  const std::string svg_path = out_dir + "/bits_per_byte.svg";
  train::write_file_atomic(svg_path,
             line_plot_svg({"Train at " + std::to_string(model.length) + " bytes, evaluate longer",
                            "evaluation length / training length (log scale)",
                            "validation bits per byte (non-overlapping windows)", true},
                           series));
  Json json = {{"data", corpus.source}, {"train_bytes", split.train.size()},
               {"validation_bytes", split.validation.size()}, {"max_bytes", eval.max_bytes},
               {"length", model.length}, {"layers", model.layers}, {"width", model.width}, {"heads", model.heads},
               {"ffn", model.ffn}, {"steps", train_config.steps}, {"batch", train_config.batch},
               {"lr", train_config.lr}, {"seed", training.seed}, {"dtype", nn::to_string(train_config.precision)},
               {"attention_dropout", train_config.attention_dropout}, {"workers", workers},
               {"threads_per_worker", threads_each}, {"seconds", seconds}, {"schemes", Json::array()}};
  for (const SchemeResult& r : results)
    json["schemes"].push_back({{"position", r.kind}, {"parameters", r.parameters},
                               {"final_train_loss", r.final_loss}, {"train_seconds", r.train_seconds},
                               {"eval_seconds", r.eval_seconds}, {"scores", scores_json(r.scores)}});
  write_json(json_path, json);
  std::printf("wrote %s, %s and the checkpoints in %s/\n", json_path.c_str(), svg_path.c_str(), out_dir.c_str());
  return 0;
}

}  // namespace relpos::cli
