// `relpos bench attention`: speed of the fused kernel for every scheme,
// reported as ratios measured in the same run: achieved GFLOP/s against the
// sgemm rate on the same (L x L x d) per-head products with the same threads,
// each scheme against plain attention, fused against the best unfused
// algorithm, and backward against forward; plus peak scratch memory of a
// forward and a backward. With --dtype bfloat16 or float16, each row also
// times the same problem stored in that type, beside float32 in the same run.
#include <omp.h>

#include <algorithm>
#include <cstdio>
#include <optional>

#include "relpos/gemm.hpp"
#include "../src/schemes/registry.hpp"
#include "commands.hpp"
#include "fits_memory.hpp"
#include "json_output.hpp"
#include "measure.hpp"
#include "options.hpp"
#include "problem.hpp"

namespace relpos::cli {
namespace {

// --reps is used as an int; more repetitions would run for days at any length.
constexpr int64_t kMaxReps = 1 << 20;

std::vector<SchemeCase> cases() {
  SchemeCase shaw{"shaw k=64 K+V", Scheme::shaw}, xl{"transformer-xl", Scheme::xl};
  shaw.shaw_k = 64;
  return cases_of_every_scheme({shaw, xl});
}

// The bytes of sgemm_gflops' buffers (below): one operand, a result per thread.
double sgemm_bytes(double m, double n, double k, double threads) {
  return double(sizeof(float)) * (std::max(m, n) * k + threads * m * n);
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
  double half_fwd_ms = 0, half_bwd_ms = 0;  // the half-storage problem, when --dtype asks for one
  int64_t half_scratch = 0;
};

// Sets pb up for the fused kernel on `threads` and returns the peak scratch
// of a forward and a backward (which also warm it up).
template <class T>
int64_t fused_scratch(Problem<T>& pb, int64_t threads) {
  AttentionBackward<T>& p = pb.params;
  p.num_threads = int(threads);
  p.algorithm = Algorithm::fused;
  return measure_footprint([&] {
    attention_forward<T>(p);
    attention_backward<T>(p);
  }).scratch_peak;
}

// One timed forward and backward of pb, each kept if faster than before.
template <class T>
void time_once(Problem<T>& pb, double& fwd_ms, double& bwd_ms) {
  fwd_ms = std::min(fwd_ms, best_ms([&] { attention_forward<T>(pb.params); }, 1));
  bwd_ms = std::min(bwd_ms, best_ms([&] { attention_backward<T>(pb.params); }, 1));
}

// Best-of-reps forward and backward times of pb and, when given, of the same
// problem in half storage, their runs alternating so that both see the same
// spells of a noisy machine.
template <class H>
void time_fused(Problem<float>& pb, Problem<H>* half, int64_t reps, Row& r) {
  r.fwd_ms = r.bwd_ms = r.half_fwd_ms = r.half_bwd_ms = 1e300;
  for (int64_t rep = 0; rep < reps; ++rep) {
    time_once(pb, r.fwd_ms, r.bwd_ms);
    if (half) time_once(*half, r.half_fwd_ms, r.half_bwd_ms);
  }
}

// The unfused algorithm that 'auto' picked before the fused kernel; none
// for a scheme that only the reference and the fused kernel serve (DeBERTa).
std::optional<Algorithm> unfused_algorithm(const SchemeCase& c) {
  if (c.scheme == Scheme::xl) return Algorithm::relshift;
  if (scheme_serves(c.scheme, Algorithm::gather)) return Algorithm::gather;
  return std::nullopt;
}

// What one row holds at once: the float32 problem and, with --dtype, the
// half one, with the largest scratch of the algorithms timed on them.
double row_bytes(const ProblemShape& shape, const SchemeCase& c, const std::string& dtype, int threads,
                 bool times_unfused) {
  std::vector<Algorithm> timed = {Algorithm::fused};
  if (times_unfused && unfused_algorithm(c)) timed.push_back(*unfused_algorithm(c));
  double buffers = problem_bytes<float>(shape, c), scratch = scratch_bytes<float>(shape, c, timed, threads);
  const auto add_half = [&](auto half) {
    using H = decltype(half);
    buffers += problem_bytes<H>(shape, c);
    scratch = std::max(scratch, scratch_bytes<H>(shape, c, {Algorithm::fused}, threads));
  };
  if (dtype == "bfloat16")
    add_half(bfloat16());
  else if (dtype == "float16")
    add_half(float16());
  return buffers + scratch;
}

}  // namespace

int run_bench_attention(int argc, char** argv, int first) {
  ProblemShape shape;
  shape.batch = 1, shape.heads = 8;
  std::vector<int64_t> lengths = {512, 2048, 8192}, dims = {64, 128}, thread_counts = {1, 2};
  std::string json_path = "results/bench_attention.json";
  int64_t reps = 2, unfused_max_length = 2048;
  std::string dtype = "float32";
  Options opts("relpos bench attention",
               "Speed of the fused kernel for every scheme (float32, causal, forward and backward) as ratios\n"
               "measured in this run: GFLOP/s (4 L^2 d per head forward, halved for the causal mask) against\n"
               "sgemm on the same per-head (L x d)(d x L) products and threads, and against sgemm on\n"
               "compute-bound 1024^3 squares; each scheme against plain attention; fused against the\n"
               "unfused algorithm that 'auto' picked before the fused kernel (gather, or relshift for\n"
               "Transformer-XL; DeBERTa has none); backward against forward. Writes JSON.\n"
               "Schemes: " + scheme_names(/*on_a_line=*/true) + ".");
  opts.add_int_list("--lengths", &lengths, "sequence lengths L", kMaxLength);
  opts.add_int_list("--dims", &dims, "head dimensions d (even)", kMaxDim);
  opts.add_int_list("--threads", &thread_counts, "thread counts", kMaxThreads);
  opts.add_int("--heads", &shape.heads, "attention heads", 1, kMaxHeads);
  opts.add_int("--batch", &shape.batch, "batch size", 1, kMaxBatch);
  opts.add_int("--reps", &reps, "repetitions per measurement (the best is kept)", 1, kMaxReps);
  opts.add_int("--unfused-max-length", &unfused_max_length, "largest L at which the unfused algorithm is timed", 1,
               kMaxLength);
  opts.add_string("--dtype", &dtype,
                  "float32, or bfloat16 / float16 (bf16 / fp16) to time that storage too, beside float32");
  opts.add_string("--json", &json_path, "where to write the results (empty: nowhere)");
  if (!opts.parse(argc, argv, first)) return 0;
  dtype = parse_storage_type(dtype, "--dtype");
  const bool half = dtype != "float32";
  for (int64_t d : dims)
    if (d % 2) throw UsageError{"--dims: must be even (RoPE rotates pairs)"};
  // Before the first calibration: every row's sgemm buffers and problems.
  for (int64_t threads : thread_counts)
    for (int64_t d : dims)
      for (int64_t L : lengths) {
        shape.length = L, shape.dim = d;
        double need = std::max(sgemm_bytes(1024, 1024, 1024, double(threads)),
                               sgemm_bytes(double(L), double(L), double(d), double(threads)));
        for (const SchemeCase& c : cases())
          need = std::max(need, row_bytes(shape, c, dtype, int(threads), L <= unfused_max_length));
        check_fits_memory(need, {{"--lengths", L}, {"--dims", d}, {"--heads", shape.heads}, {"--batch", shape.batch},
                                 {"--threads", threads}});
      }

  std::printf("relpos bench attention: B=%lld H=%lld, causal, float32%s%s, best of %lld\n", (long long)shape.batch,
              (long long)shape.heads, half ? " and " : "", half ? dtype.c_str() : "", (long long)reps);
  std::printf("GF/s: fused forward GFLOP/s; /sgemm: that over sgemm's rate on the same (L x d)(d x L) products\n"
              "and threads; /peak: over sgemm on compute-bound 1024^3 squares, same threads;\n"
              "/plain: time over plain fused attention; vs unfused: unfused time over fused (>1: fused faster)\n\n");
  if (half)
    std::printf("%s: the same problem stored in %s (float32 compute): f32/h fwd, f32/h bwd = float32 time over its\n"
                "time (>1: faster); h scratch its peak scratch; its q, k, v, out take half float32's bytes\n\n",
                dtype.c_str(), dtype.c_str());
  std::printf("%-15s %6s %4s %3s %9s %9s %7s %7s %7s %7s %7s %9s %10s", "scheme", "L", "d", "thr", "fwd ms", "bwd ms",
              "bwd/fwd", "GF/s", "/sgemm", "/peak", "/plain", "vs unfused", "scratch");
  if (half) std::printf(" %9s %9s %10s", "f32/h fwd", "f32/h bwd", "h scratch");
  std::printf("\n");
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
          Row r{c.label, "fused", L, d, threads, 0, 0, 0, sgemm, peak, 0};
          r.scratch = fused_scratch(pb, threads);
          const auto time_with = [&](auto half_type) {
            using H = decltype(half_type);
            Problem<H> ph = make_problem<H>(shape, c, 1);
            r.half_scratch = fused_scratch(ph, threads);
            time_fused(pb, &ph, reps, r);
          };
          if (dtype == "bfloat16")
            time_with(bfloat16{});
          else if (dtype == "float16")
            time_with(float16{});
          else
            time_fused<bfloat16>(pb, nullptr, reps, r);
          const double flops = 4.0 * double(L) * double(L) * double(d) * double(shape.batch * shape.heads) / 2;
          r.gflops = flops / (r.fwd_ms * 1e6);
          if (c.scheme == Scheme::none) plain_ms = r.fwd_ms;
          r.vs_plain = r.fwd_ms / plain_ms;
          if (L <= unfused_max_length && unfused_algorithm(c)) {
            p.algorithm = *unfused_algorithm(c);
            r.vs_unfused = best_ms([&] { attention_forward<float>(p); }, int(reps)) / r.fwd_ms;
          }
          char unfused[16] = "-";
          if (r.vs_unfused > 0) std::snprintf(unfused, sizeof unfused, "%.2fx", r.vs_unfused);
          std::printf("%-15s %6lld %4lld %3lld %9.1f %9.1f %7.2f %7.1f %7.2f %7.2f %7.2f %9s %10s", r.scheme.c_str(),
                      (long long)L, (long long)d, (long long)threads, r.fwd_ms, r.bwd_ms, r.bwd_ms / r.fwd_ms, r.gflops,
                      r.gflops / sgemm, r.gflops / peak, r.vs_plain, unfused, human_bytes(double(r.scratch)).c_str());
          if (half)
            std::printf(" %9.2f %9.2f %10s", r.fwd_ms / r.half_fwd_ms, r.bwd_ms / r.half_bwd_ms,
                        human_bytes(double(r.half_scratch)).c_str());
          std::printf("\n");
          std::fflush(stdout);
          rows.push_back(r);
        }
      }
  }

  if (!json_path.empty()) {
    Json json = {{"batch", shape.batch}, {"heads", shape.heads}, {"causal", true}, {"dtype", dtype},
                 {"rows", Json::array()}};
    for (const Row& r : rows) {
      Json row = {{"scheme", r.scheme}, {"length", r.length}, {"dim", r.dim}, {"threads", r.threads},
                  {"fwd_ms", r.fwd_ms}, {"bwd_ms", r.bwd_ms}, {"fwd_gflops", r.gflops},
                  {"sgemm_gflops", r.sgemm_gflops}, {"peak_sgemm_gflops", r.peak_gflops},
                  {"fwd_vs_plain", r.vs_plain}, {"unfused_over_fused", r.vs_unfused}, {"scratch_bytes", r.scratch}};
      if (half)
        row.update({{"half_fwd_ms", r.half_fwd_ms}, {"half_bwd_ms", r.half_bwd_ms},
                    {"half_scratch_bytes", r.half_scratch}});
      json["rows"].push_back(row);
    }
    write_json(json_path, json);
    std::printf("\nwrote %s\n", json_path.c_str());
  }
  return 0;
}

}  // namespace relpos::cli
