// `relpos bench attention`: speed of the fused kernel for every scheme,
// reported as ratios measured in the same run: achieved GFLOP/s against the
// sgemm rate on the same (L x L x d) per-head products with the same threads,
// each scheme against plain attention, fused against the best unfused
// algorithm, and backward against forward; plus peak scratch memory of a
// forward and a backward.
#include <omp.h>

#include <algorithm>
#include <cstdio>

#include "relpos/gemm.hpp"
#include "commands.hpp"
#include "json_output.hpp"
#include "measure.hpp"
#include "options.hpp"
#include "problem.hpp"

namespace relpos::cli {
namespace {


std::vector<SchemeCase> cases() {
  std::vector<SchemeCase> c(7);
  const char* labels[] = {"none", "shaw k=64 K+V", "t5", "alibi", "rope", "transformer-xl", "kerple"};
  const Scheme schemes[] = {Scheme::none, Scheme::shaw,  Scheme::t5,    Scheme::alibi,
                            Scheme::rope, Scheme::xl, Scheme::kerple};
  for (size_t i = 0; i < c.size(); ++i) c[i].label = labels[i], c[i].scheme = schemes[i], c[i].shaw_k = 64;
  return c;
}

// sgemm rate of `count` (m x k)(k x n) products spread over `threads`, one
// single-threaded GEMM per thread at a time, like the kernels' work.
double sgemm_gflops(int64_t m, int64_t n, int64_t k, int64_t count, int threads, int reps) {
  std::vector<float> a(std::max(m, n) * k, 0.5f), c(threads * m * n);
  const double ms = best_ms(
      [&] {
#pragma omp parallel num_threads(threads)
        {
          omp_set_num_threads(1);  // one single-threaded GEMM per thread, as in the kernels
#pragma omp for schedule(static)
          for (int64_t h = 0; h < count; ++h)
            gemm<float>(Trans::no, Trans::yes, m, n, k, 1.f, a.data(), k, a.data(), k, 0.f,
                        c.data() + omp_get_thread_num() * m * n, n);
        }
      },
      reps);
  return 2.0 * double(m) * double(n) * double(k) * double(count) / (ms * 1e6);
}

struct Row {
  std::string scheme, algorithm;
  int64_t length, dim, threads;
  double fwd_ms, bwd_ms, gflops, sgemm_gflops, peak_gflops;
  int64_t scratch;
  double vs_plain = 0, vs_unfused = 0;  // time ratios, forward
};

}  // namespace

int run_bench_attention(int argc, char** argv, int first) {
  ProblemShape shape;
  shape.batch = 1, shape.heads = 8;
  std::string lengths_text = "512,2048,8192", dims_text = "64,128", threads_text = "1,2";
  std::string json_path = "results/bench_attention.json";
  int64_t reps = 2, unfused_max_length = 2048;
  Options opts("relpos bench attention",
               "Speed of the fused kernel for every scheme (float32, causal, forward and backward) as ratios\n"
               "measured in this run: GFLOP/s (4 L^2 d per head forward, halved for the causal mask) against\n"
               "sgemm on the same per-head (L x d)(d x L) products and threads, and against sgemm on\n"
               "compute-bound 1024^3 squares; each scheme against plain\n"
               "attention; fused against the unfused algorithm that 'auto' picked before the fused kernel\n"
               "(gather, or relshift for Transformer-XL); backward against forward. Writes JSON.");
  opts.add_string("--lengths", &lengths_text, "comma-separated sequence lengths L");
  opts.add_string("--dims", &dims_text, "comma-separated head dimensions d");
  opts.add_string("--threads", &threads_text, "comma-separated thread counts");
  opts.add_int("--heads", &shape.heads, "attention heads", 1);
  opts.add_int("--batch", &shape.batch, "batch size", 1);
  opts.add_int("--reps", &reps, "repetitions per measurement (the best is kept)", 1);
  opts.add_int("--unfused-max-length", &unfused_max_length, "largest L at which the unfused algorithm is timed", 1);
  opts.add_string("--json", &json_path, "where to write the results (empty: nowhere)");
  if (!opts.parse(argc, argv, first)) return 0;
  const auto lengths = parse_int_list(lengths_text, "--lengths");
  const auto dims = parse_int_list(dims_text, "--dims");
  const auto thread_counts = parse_int_list(threads_text, "--threads", kMaxThreads);
  for (int64_t d : dims)
    if (d % 2) throw UsageError{"--dims: must be even (RoPE rotates pairs)"};

  std::printf("relpos bench attention: B=%lld H=%lld, causal, float32, best of %lld\n", (long long)shape.batch,
              (long long)shape.heads, (long long)reps);
  std::printf("GF/s: fused forward GFLOP/s; /sgemm: that over sgemm's rate on the same (L x d)(d x L) products\n"
              "and threads; /peak: over sgemm on compute-bound 1024^3 squares, same threads;\n"
              "/plain: time over plain fused attention; vs unfused: unfused time over fused (>1: fused faster)\n\n");
  std::printf("%-15s %6s %4s %3s %9s %9s %7s %7s %7s %7s %7s %9s %10s\n", "scheme", "L", "d", "thr", "fwd ms",
              "bwd ms", "bwd/fwd", "GF/s", "/sgemm", "/peak", "/plain", "vs unfused", "scratch");
  std::vector<Row> rows;
  for (int64_t threads : thread_counts) {
    // The machine's sgemm rate on compute-bound squares, same threads.
    const double peak = sgemm_gflops(1024, 1024, 1024, 2 * threads, int(threads), int(reps) + 1);
    std::printf("sgemm 1024^3 on %lld thread(s): %.1f GFLOP/s\n", (long long)threads, peak);
    for (int64_t d : dims)
      for (int64_t L : lengths) {
        shape.length = L, shape.dim = d;
        const double sgemm = sgemm_gflops(L, L, d, shape.batch * shape.heads, int(threads), int(reps));
        double plain_ms = 0;
        for (const SchemeCase& c : cases()) {
          Problem<float> pb = make_problem<float>(shape, c, 1);
          AttentionBackward<float>& p = pb.params;
          p.num_threads = int(threads);
          p.algorithm = Algorithm::fused;
          Row r{c.label, "fused", L, d, threads, 0, 0, 0, sgemm, peak, 0};
          r.scratch = measure_footprint([&] {
            attention_forward<float>(p);
            attention_backward<float>(p);
          }).scratch_peak;
          r.fwd_ms = best_ms([&] { attention_forward<float>(p); }, int(reps));
          r.bwd_ms = best_ms([&] { attention_backward<float>(p); }, int(reps));
          const double flops = 4.0 * double(L) * double(L) * double(d) * double(shape.batch * shape.heads) / 2;
          r.gflops = flops / (r.fwd_ms * 1e6);
          if (c.scheme == Scheme::none) plain_ms = r.fwd_ms;
          r.vs_plain = r.fwd_ms / plain_ms;
          if (L <= unfused_max_length) {
            p.algorithm = c.scheme == Scheme::xl ? Algorithm::relshift : Algorithm::gather;
            r.vs_unfused = best_ms([&] { attention_forward<float>(p); }, int(reps)) / r.fwd_ms;
          }
          char unfused[16] = "-";
          if (r.vs_unfused > 0) std::snprintf(unfused, sizeof unfused, "%.2fx", r.vs_unfused);
          std::printf("%-15s %6lld %4lld %3lld %9.1f %9.1f %7.2f %7.1f %7.2f %7.2f %7.2f %9s %10s\n", r.scheme.c_str(),
                      (long long)L, (long long)d, (long long)threads, r.fwd_ms, r.bwd_ms, r.bwd_ms / r.fwd_ms, r.gflops,
                      r.gflops / sgemm, r.gflops / peak, r.vs_plain, unfused, human_bytes(double(r.scratch)).c_str());
          std::fflush(stdout);
          rows.push_back(r);
        }
      }
  }

  if (!json_path.empty()) {
    Json json = {{"batch", shape.batch}, {"heads", shape.heads}, {"causal", true}, {"rows", Json::array()}};
    for (const Row& r : rows)
      json["rows"].push_back({{"scheme", r.scheme}, {"length", r.length}, {"dim", r.dim}, {"threads", r.threads},
                              {"fwd_ms", r.fwd_ms}, {"bwd_ms", r.bwd_ms}, {"fwd_gflops", r.gflops},
                              {"sgemm_gflops", r.sgemm_gflops}, {"peak_sgemm_gflops", r.peak_gflops},
                              {"fwd_vs_plain", r.vs_plain}, {"unfused_over_fused", r.vs_unfused},
                              {"scratch_bytes", r.scratch}});
    write_json(json_path, json);
    std::printf("\nwrote %s\n", json_path.c_str());
  }
  return 0;
}

}  // namespace relpos::cli
