// `relpos bench <benchmark>`: the benchmarks, each with its own --help.
#include <cstdio>
#include <cstring>

#include "commands.hpp"
#include "options.hpp"
#include "problem.hpp"

namespace relpos::cli {

namespace {
struct Benchmark {
  const char* name;
  int (*run)(int, char**, int);
  const char* summary;
};
constexpr Benchmark kBenchmarks[] = {
    {"memory", run_bench_memory, "peak memory and time of every scheme x algorithm over lengths L"},
    {"attention", run_bench_attention, "fused kernel speed: GFLOP/s vs sgemm, schemes vs plain, vs unfused"},
};
}  // namespace

int run_bench(int argc, char** argv, int first) {
  const bool help = first < argc && (!std::strcmp(argv[first], "--help") || !std::strcmp(argv[first], "-h"));
  if (help && first + 1 < argc)  // as `relpos --help extra`: a mistyped command line
    throw UsageError{std::string(argv[first]) + " takes no arguments, got '" + argv[first + 1] + "'"};
  if (first >= argc || help) {
    std::FILE* to = help ? stdout : stderr;
    std::fprintf(to, "usage: relpos bench <benchmark> [options]\n\nbenchmarks:\n");
    for (const Benchmark& b : kBenchmarks) std::fprintf(to, "  %-10s %s\n", b.name, b.summary);
    std::fprintf(to, "\nBoth run every scheme: %s.\n'relpos bench <benchmark> --help' describes its options.\n",
                 scheme_names(/*on_a_line=*/true).c_str());
    return help ? 0 : 2;
  }
  for (const Benchmark& b : kBenchmarks)
    if (!std::strcmp(argv[first], b.name)) return b.run(argc, argv, first + 1);
  throw UsageError{std::string("unknown benchmark '") + argv[first] + "'"};
}

}  // namespace relpos::cli
