// `relpos bench memory`: peak memory and time of every scheme x algorithm
// over a range of lengths, to show the growth each paper claims: the
// reference (and Shaw's split form) hold O(L^2 d) relative tensors, the
// others O(L d) or O(L k) beside the L^2 logits.
#include <omp.h>

#include <algorithm>
#include <cstdio>

#include "commands.hpp"
#include "fits_memory.hpp"
#include "json_output.hpp"
#include "measure.hpp"
#include "options.hpp"
#include "problem.hpp"

namespace relpos::cli {
namespace {

std::vector<SchemeCase> bench_cases() {
  std::vector<SchemeCase> cases(6);
  const char* labels[] = {"none", "shaw k=16 K+V", "t5", "alibi", "rope", "transformer-xl"};
  const Scheme schemes[] = {Scheme::none, Scheme::shaw, Scheme::t5, Scheme::alibi, Scheme::rope, Scheme::xl};
  for (size_t i = 0; i < cases.size(); ++i) cases[i].label = labels[i], cases[i].scheme = schemes[i];
  return cases;
}


struct Result {
  std::string scheme, algorithm;
  int64_t length;
  Footprint memory;
  double fwd_ms, bwd_ms;
};

}  // namespace

int run_bench_memory(int argc, char** argv, int first) {
  ProblemShape shape;
  shape.batch = 1, shape.heads = 8, shape.dim = 64;
  std::vector<int64_t> lengths = {256, 512, 1024, 2048, 4096, 8192};
  std::string json_path = "results/bench_memory.json";
  double budget_gb = 12;
  bool no_backward = false;
  Options opts("relpos bench memory",
               "Peak memory and time of every position scheme x algorithm, float32, causal, for a range of\n"
               "lengths. Memory is the library's own peak scratch (counted allocations) and how far the\n"
               "process's peak RSS rose above its RSS before the run. Prints a table and writes JSON. Runs\n"
               "whose estimated scratch exceeds --budget-gb or this machine's memory are listed as skipped.\n"
               "Schemes: " + scheme_names(/*on_a_line=*/true) + ".");
  opts.add_int_list("--lengths", &lengths, "sequence lengths L", kMaxLength);
  opts.add_int("--heads", &shape.heads, "attention heads", 1, kMaxHeads);
  opts.add_int("--dim", &shape.dim, "head dimension d (even)", 2, kMaxDim);
  opts.add_int("--batch", &shape.batch, "batch size", 1, kMaxBatch);
  opts.add_double("--budget-gb", &budget_gb, "skip runs estimated to need more scratch than this",
                  std::numeric_limits<double>::min());
  opts.add_flag("--no-backward", &no_backward, "measure forward only");
  opts.add_string("--json", &json_path, "where to write the results (empty: nowhere)");
  if (!opts.parse(argc, argv, first)) return 0;
  if (shape.dim % 2) throw UsageError{"--dim: must be even (RoPE rotates pairs)"};
  // Every problem's buffers before the first run; a run whose scratch the
  // library would refuse (more than this machine's memory) is skipped below,
  // like one over --budget-gb.
  for (int64_t L : lengths) {
    shape.length = L;
    double need = 0;
    for (const SchemeCase& c : bench_cases()) need = std::max(need, problem_bytes<float>(shape, c));
    check_fits_memory(need,
                      {{"--lengths", L}, {"--dim", shape.dim}, {"--heads", shape.heads}, {"--batch", shape.batch}});
  }
  const double physical = physical_memory_bytes();

  std::printf("relpos bench memory: B=%lld H=%lld d=%lld, causal, float32, %s\n", (long long)shape.batch,
              (long long)shape.heads, (long long)shape.dim, no_backward ? "forward" : "forward + backward");
  std::printf("scratch: the library's peak temporary bytes; /L^2: scratch per (query, key) pair of one head\n\n");
  std::printf("%-16s %-18s %6s %10s %8s %11s %10s %10s\n", "scheme", "algorithm", "L", "scratch", "/L^2", "RSS growth",
              "fwd ms", "bwd ms");
  std::vector<Result> results;
  for (const SchemeCase& c : bench_cases()) {
    for (int64_t L : lengths) {
      shape.length = L;
      Problem<float> pb = make_problem<float>(shape, c, 1);
      for (Algorithm a : serving_algorithms<float>(pb.params)) {
        const char* name = to_string(a);
        pb.params.algorithm = a;
        const double need = estimated_scratch_bytes<float>(pb.params);
        const bool over_budget = need > budget_gb * 1e9, over_memory = physical > 0 && need > physical;
        if (over_budget || over_memory) {
          std::printf("%-16s %-18s %6lld   skipped: needs ~%s > %s\n", c.label.c_str(), name, (long long)L,
                      human_bytes(need).c_str(), over_budget ? "--budget-gb" : "this machine's memory");
          continue;
        }
        Result r{c.label, name, L, {}, 0, 0};
        r.memory = measure_footprint([&] {
          r.fwd_ms = best_ms([&] { attention_forward<float>(pb.params); }, 1);
          if (!no_backward) r.bwd_ms = best_ms([&] { attention_backward<float>(pb.params); }, 1);
        });
        std::printf("%-16s %-18s %6lld %10s %8.1f %11s %10.1f %10.1f\n", r.scheme.c_str(), name, (long long)L,
                    human_bytes(double(r.memory.scratch_peak)).c_str(), double(r.memory.scratch_peak) / double(L * L),
                    r.memory.rss_growth < 0 ? "n/a" : human_bytes(double(r.memory.rss_growth)).c_str(), r.fwd_ms,
                    r.bwd_ms);
        std::fflush(stdout);
        results.push_back(r);
      }
    }
  }

  if (!json_path.empty()) {
    Json json = {{"batch", shape.batch}, {"heads", shape.heads}, {"dim", shape.dim}, {"causal", true},
                 {"dtype", "float32"}, {"backward", !no_backward}, {"rows", Json::array()}};
    for (const Result& r : results)
      json["rows"].push_back({{"scheme", r.scheme}, {"algorithm", r.algorithm}, {"length", r.length},
                              {"scratch_peak_bytes", r.memory.scratch_peak}, {"rss_growth_bytes", r.memory.rss_growth},
                              {"fwd_ms", r.fwd_ms}, {"bwd_ms", r.bwd_ms}});
    write_json(json_path, json);
    std::printf("\nwrote %s\n", json_path.c_str());
  }
  return 0;
}

}  // namespace relpos::cli
