// `relpos check`: every position scheme x every algorithm that serves it, on
// one small problem, computed in float32 and checked against the float64
// reference (forward output and every gradient), with time and peak scratch.
#include <algorithm>
#include <cmath>
#include <cstdio>

#include "commands.hpp"
#include "json_output.hpp"
#include "measure.hpp"
#include "options.hpp"
#include "problem.hpp"

namespace relpos::cli {
namespace {

// max |a - b| / max |b|: the error relative to the tensor's magnitude.
template <class A, class B>
double relative_error(const std::vector<A>& a, const std::vector<B>& b) {
  double diff = 0, scale = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    diff = std::max(diff, std::fabs(double(a[i]) - double(b[i])));
    scale = std::max(scale, std::fabs(double(b[i])));
  }
  return scale > 0 ? diff / scale : diff;
}

struct Row {
  std::string scheme, algorithm;
  bool is_auto;
  double fwd_err, bwd_err, fwd_ms, bwd_ms;
  int64_t scratch;
  bool ok;
};

}  // namespace

int run_check(int argc, char** argv, int first) {
  ProblemShape shape;
  int64_t seed = 0;
  bool no_causal = false;
  double tolerance = 1e-4;
  std::string json_path;
  Options opts("relpos check",
               "Runs every position scheme (none, Shaw, T5, ALiBi, RoPE, Transformer-XL with memory) with\n"
               "every algorithm that serves it on one random problem in float32, checks forward output and\n"
               "every gradient against the float64 reference, and prints errors, times and peak scratch\n"
               "memory. Exits 1 if any run exceeds the tolerance.");
  opts.add_int("--batch", &shape.batch, "batch size", 1);
  opts.add_int("--heads", &shape.heads, "attention heads", 1);
  opts.add_int("--length", &shape.length, "query length L (Transformer-XL adds L/2 memory keys)", 1);
  opts.add_int("--dim", &shape.dim, "head dimension d (even, for RoPE)", 2);
  opts.add_int("--seed", &seed, "random seed", 0);
  opts.add_flag("--no-causal", &no_causal, "attend to all keys instead of the causal mask");
  opts.add_double("--tolerance", &tolerance, "largest relative float32 error that passes",
                  std::numeric_limits<double>::min());
  opts.add_string("--json", &json_path, "also write the results to this JSON file");
  if (!opts.parse(argc, argv, first)) return 0;
  if (shape.dim % 2 != 0) throw UsageError{"--dim: must be even (RoPE rotates pairs), got " + std::to_string(shape.dim)};
  shape.causal = !no_causal;

  std::printf("relpos check: B=%lld H=%lld L=%lld d=%lld, %s mask\n", (long long)shape.batch, (long long)shape.heads,
              (long long)shape.length, (long long)shape.dim, shape.causal ? "causal" : "no");
  std::printf("errors: float32 vs the float64 reference, max|diff| / max|ref|, over out (fwd) and all gradients (bwd)\n");
  std::printf("times: best of 3; scratch: the library's peak temporary memory for forward + backward; * = auto\n\n");
  std::printf("%-26s %-18s %10s %10s %9s %9s %10s  %s\n", "scheme", "algorithm", "fwd error", "bwd error", "fwd ms",
              "bwd ms", "scratch", "check");
  std::vector<Row> rows;
  for (const SchemeCase& c : check_cases()) {
    Problem<double> oracle = make_problem<double>(shape, c, seed);
    oracle.params.algorithm = Algorithm::reference;
    attention_forward<double>(oracle.params);
    attention_backward<double>(oracle.params);
    Problem<float> f32 = make_problem<float>(shape, c, seed);
    const Algorithm chosen = resolve_algorithm<float>(f32.params);
    for (Algorithm algo : serving_algorithms<float>(f32.params)) {
      AttentionBackward<float>& p = f32.params;
      p.algorithm = algo;
      f32.clear_grads();
      const Footprint fp = measure_footprint([&] {
        attention_forward<float>(p);
        attention_backward<float>(p);
      });
      Row row{c.label, to_string(algo), algo == chosen, relative_error(f32.out, oracle.out), 0, 0, 0, fp.scratch_peak,
              true};
      const auto g32 = f32.grads();
      const auto g64 = oracle.grads();
      for (size_t i = 0; i < g32.size(); ++i) row.bwd_err = std::max(row.bwd_err, relative_error(*g32[i], *g64[i]));
      row.fwd_ms = best_ms([&] { attention_forward<float>(p); }, 3);
      row.bwd_ms = best_ms([&] { attention_backward<float>(p); }, 3);
      row.ok = row.fwd_err <= tolerance && row.bwd_err <= tolerance;
      std::printf("%-26s %-18s %10.2e %10.2e %9.2f %9.2f %10s  %s\n", row.scheme.c_str(),
                  (row.algorithm + (row.is_auto ? " *" : "")).c_str(), row.fwd_err, row.bwd_err, row.fwd_ms,
                  row.bwd_ms, human_bytes(double(row.scratch)).c_str(), row.ok ? "ok" : "FAIL");
      std::fflush(stdout);
      rows.push_back(row);
    }
  }
  const bool all_ok = std::all_of(rows.begin(), rows.end(), [](const Row& r) { return r.ok; });
  std::printf("\n%s: %zu scheme x algorithm runs, tolerance %.1e\n", all_ok ? "all agree" : "DISAGREEMENT",
              rows.size(), tolerance);

  if (!json_path.empty()) {
    Json json = {{"batch", shape.batch}, {"heads", shape.heads}, {"length", shape.length}, {"dim", shape.dim},
                 {"causal", shape.causal}, {"rows", Json::array()}};
    for (const Row& r : rows)
      json["rows"].push_back({{"scheme", r.scheme}, {"algorithm", r.algorithm}, {"auto", r.is_auto},
                              {"fwd_error", r.fwd_err}, {"bwd_error", r.bwd_err}, {"fwd_ms", r.fwd_ms},
                              {"bwd_ms", r.bwd_ms}, {"scratch_bytes", r.scratch}, {"ok", r.ok}});
    write_json(json_path, json);
  }
  return all_ok ? 0 : 1;
}

}  // namespace relpos::cli
