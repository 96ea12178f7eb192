// `relpos check`: every position scheme x every algorithm that serves it, on
// one small problem, computed in float32 (or stored in bfloat16 / float16)
// and checked against the float64 reference (forward output and every
// gradient), with time and peak scratch.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <tuple>

#include "commands.hpp"
#include "fits_memory.hpp"
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
  double single_fwd_err = 0, single_bwd_err = 0;  // half storage: float32 from the same inputs, rounded
};

template <class T>
double largest_grad_error(const Problem<T>& pb, const Problem<double>& oracle) {
  const auto got = pb.grads();
  const auto want = oracle.grads();
  double worst = 0;
  for (size_t i = 0; i < got.size(); ++i) worst = std::max(worst, relative_error(*got[i], *want[i]));
  return worst;
}

template <class S>
std::vector<float> rounded_to(std::vector<float> x) {
  for (float& v : x) v = float(S(v));
  return x;
}

// The float32 comparator of a half call on `algo`: forward, then backward
// reading out rounded to S (as the half call stores it); its errors against
// the oracle with its results rounded to S at the end.
template <class S>
std::pair<double, double> single_errors(Problem<float>& pf, Algorithm algo, const Problem<double>& oracle) {
  pf.params.algorithm = algo;
  pf.clear_grads();
  attention_forward<float>(pf.params);
  const double fwd = relative_error(rounded_to<S>(pf.out), oracle.out);
  for (float& v : pf.out) v = float(S(v));  // in place: the params' views point into pf.out
  attention_backward<float>(pf.params);
  double bwd = 0;
  const auto got = pf.grads();
  const auto want = oracle.grads();
  for (size_t i = 0; i < got.size(); ++i) bwd = std::max(bwd, relative_error(rounded_to<S>(*got[i]), *want[i]));
  return {fwd, bwd};
}

// Every algorithm serving case c in storage type T against `oracle`; for a
// half type, judged by FlashAttention's rule (errors at most twice those of
// the float32 comparator), otherwise by `tolerance`.
template <class T>
void check_case(const ProblemShape& shape, const SchemeCase& c, int64_t seed, double tolerance, std::vector<Row>& rows) {
  Problem<T> pb = make_problem<T>(shape, c, seed);
  Problem<double> oracle = make_problem<double>(shape, c, seed);
  copy_inputs(pb, oracle);  // the values pb holds, rounded to T
  oracle.params.algorithm = Algorithm::reference;
  attention_forward<double>(oracle.params);
  attention_backward<double>(oracle.params);
  const Algorithm chosen = resolve_algorithm<T>(pb.params);
  for (Algorithm algo : serving_algorithms<T>(pb.params)) {
    AttentionBackward<T>& p = pb.params;
    p.algorithm = algo;
    pb.clear_grads();
    const Footprint fp = measure_footprint([&] {
      attention_forward<T>(p);
      attention_backward<T>(p);
    });
    Row row{c.label, to_string(algo), algo == chosen, relative_error(pb.out, oracle.out), 0, 0, 0, fp.scratch_peak,
            true};
    row.bwd_err = largest_grad_error(pb, oracle);
    row.fwd_ms = best_ms([&] { attention_forward<T>(p); }, 3);
    row.bwd_ms = best_ms([&] { attention_backward<T>(p); }, 3);
    if constexpr (is_half_v<T>) {
      Problem<float> single = make_problem<float>(shape, c, seed);
      copy_inputs(pb, single);
      std::tie(row.single_fwd_err, row.single_bwd_err) = single_errors<T>(single, algo, oracle);
      row.ok = row.fwd_err <= 2 * row.single_fwd_err && row.bwd_err <= 2 * row.single_bwd_err;
    } else {
      row.ok = row.fwd_err <= tolerance && row.bwd_err <= tolerance;
    }
    std::printf("%-26s %-18s %10.2e %10.2e %9.2f %9.2f %10s", row.scheme.c_str(),
                (row.algorithm + (row.is_auto ? " *" : "")).c_str(), row.fwd_err, row.bwd_err, row.fwd_ms, row.bwd_ms,
                human_bytes(double(row.scratch)).c_str());
    if constexpr (is_half_v<T>) std::printf(" %10.2e %10.2e", row.single_fwd_err, row.single_bwd_err);
    std::printf("  %s\n", row.ok ? "ok" : "FAIL");
    std::fflush(stdout);
    rows.push_back(row);
  }
}

// What check_case<T> holds at once for the case that needs most: its
// problem, the float64 oracle's and, for a half type, the float32
// comparator's, and the largest scratch of the algorithms run on them.
template <class T>
double check_bytes(const ProblemShape& shape) {
  double most = 0;
  for (const SchemeCase& c : check_cases()) {
    const std::vector<Algorithm> algorithms = serving_algorithms<T>(shape, c);
    double buffers = problem_bytes<T>(shape, c) + problem_bytes<double>(shape, c);
    double scratch =
        std::max(scratch_bytes<T>(shape, c, algorithms), scratch_bytes<double>(shape, c, {Algorithm::reference}));
    if constexpr (is_half_v<T>) {
      buffers += problem_bytes<float>(shape, c);
      scratch = std::max(scratch, scratch_bytes<float>(shape, c, algorithms));
    }
    most = std::max(most, buffers + scratch);
  }
  return most;
}

// f(T()) with T the storage type that --dtype names.
template <class F>
void in_storage(const std::string& dtype, F&& f) {
  if (dtype == "bfloat16")
    f(bfloat16());
  else if (dtype == "float16")
    f(float16());
  else
    f(float());
}

}  // namespace

int run_check(int argc, char** argv, int first) {
  ProblemShape shape;
  int64_t seed = 0;
  bool no_causal = false;
  double tolerance = 1e-4;
  std::string json_path, dtype = "float32";
  Options opts("relpos check",
               "Runs every position scheme with every algorithm that serves it on one random problem in\n"
               "float32 (or stored in --dtype), checks forward output and every gradient against the float64\n"
               "reference, and prints errors, times and peak scratch memory. Exits 1 if any run exceeds the\n"
               "tolerance (for a half type: the rule).\n"
               "Schemes: " + scheme_names(/*on_a_line=*/true) + " (xl with a memory of L/2 keys).");
  opts.add_int("--batch", &shape.batch, "batch size", 1, kMaxBatch);
  opts.add_int("--heads", &shape.heads, "attention heads", 1, kMaxHeads);
  opts.add_int("--length", &shape.length, "query length L (Transformer-XL adds L/2 memory keys)", 1, kMaxLength);
  opts.add_int("--dim", &shape.dim, "head dimension d (even, for RoPE)", 2, kMaxDim);
  opts.add_int("--seed", &seed, "random seed", 0, std::numeric_limits<int64_t>::max());
  opts.add_flag("--no-causal", &no_causal, "attend to all keys instead of the causal mask");
  opts.add_double("--tolerance", &tolerance, "largest relative float32 error that passes",
                  std::numeric_limits<double>::min());
  opts.add_string("--dtype", &dtype,
                  "float32, or bfloat16 / float16 (bf16 / fp16): the storage checked; a half type passes when its\n"
                  "errors are at most twice those of float32 from the same inputs rounded at the end");
  opts.add_string("--json", &json_path, "also write the results to this JSON file");
  if (!opts.parse(argc, argv, first)) return 0;
  dtype = parse_storage_type(dtype, "--dtype");
  if (shape.dim % 2 != 0) throw UsageError{"--dim: must be even (RoPE rotates pairs), got " + std::to_string(shape.dim)};
  shape.causal = !no_causal;
  in_storage(dtype, [&](auto storage) {
    check_fits_memory(check_bytes<decltype(storage)>(shape), {{"--batch", shape.batch}, {"--heads", shape.heads},
                                                              {"--length", shape.length}, {"--dim", shape.dim}});
  });

  std::printf("relpos check: B=%lld H=%lld L=%lld d=%lld, %s mask\n", (long long)shape.batch, (long long)shape.heads,
              (long long)shape.length, (long long)shape.dim, shape.causal ? "causal" : "no");
  std::printf("errors: %s vs the float64 reference on the same inputs, max|diff| / max|ref|, over out (fwd) and\n"
              "all gradients (bwd)\n", dtype.c_str());
  if (dtype != "float32")
    std::printf("f32 fwd, f32 bwd: the same errors of float32 from those inputs, results rounded to %s; a row\n"
                "passes when its errors are at most twice these (FlashAttention's rule)\n", dtype.c_str());
  std::printf("times: best of 3; scratch: the library's peak temporary memory for forward + backward; * = auto\n\n");
  std::printf("%-26s %-18s %10s %10s %9s %9s %10s", "scheme", "algorithm", "fwd error", "bwd error", "fwd ms",
              "bwd ms", "scratch");
  if (dtype != "float32") std::printf(" %10s %10s", "f32 fwd", "f32 bwd");
  std::printf("  check\n");
  std::vector<Row> rows;
  in_storage(dtype, [&](auto storage) {
    for (const SchemeCase& c : check_cases()) check_case<decltype(storage)>(shape, c, seed, tolerance, rows);
  });
  const bool all_ok = std::all_of(rows.begin(), rows.end(), [](const Row& r) { return r.ok; });
  if (dtype == "float32")
    std::printf("\n%s: %zu scheme x algorithm runs, tolerance %.1e\n", all_ok ? "all agree" : "DISAGREEMENT",
                rows.size(), tolerance);
  else
    std::printf("\n%s: %zu scheme x algorithm runs in %s, errors at most 2x float32's rounded\n",
                all_ok ? "all agree" : "DISAGREEMENT", rows.size(), dtype.c_str());

  if (!json_path.empty()) {
    Json json = {{"batch", shape.batch}, {"heads", shape.heads}, {"length", shape.length}, {"dim", shape.dim},
                 {"causal", shape.causal}, {"dtype", dtype}, {"rows", Json::array()}};
    for (const Row& r : rows) {
      Json row = {{"scheme", r.scheme},        {"algorithm", r.algorithm}, {"auto", r.is_auto},
                  {"fwd_error", r.fwd_err},    {"bwd_error", r.bwd_err},   {"fwd_ms", r.fwd_ms},
                  {"bwd_ms", r.bwd_ms},        {"scratch_bytes", r.scratch}, {"ok", r.ok}};
      if (dtype != "float32") row.update({{"float32_fwd_error", r.single_fwd_err}, {"float32_bwd_error", r.single_bwd_err}});
      json["rows"].push_back(row);
    }
    write_json(json_path, json);
  }
  return all_ok ? 0 : 1;
}

}  // namespace relpos::cli
