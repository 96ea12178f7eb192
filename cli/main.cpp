// relpos command-line tool: dispatches to a subcommand and turns every error
// into a message and a non-zero exit status (never an abort).
#include <cstdio>
#include <cstring>
#include <exception>
#include <new>
#include <stdexcept>
#include <string>

#include "commands.hpp"
#include "interrupt.hpp"
#include "openmp_wait.hpp"
#include "options.hpp"
#include "problem.hpp"
#include "relpos/info.hpp"

namespace {

struct Command {
  const char* name;
  int (*run)(int, char**, int);
  const char* summary;
};

constexpr Command kCommands[] = {
    {"demo", relpos::cli::run_demo, "train short, test long: one small language model per scheme, bits/byte at 1x..16x"},
    {"train", relpos::cli::run_train, "train a byte-level language model with one position scheme"},
    {"eval", relpos::cli::run_eval, "bits per byte of a trained model at 1x..16x its training length"},
    {"sample", relpos::cli::run_sample, "generate text from a trained model (key/value cache decoding)"},
    {"check", relpos::cli::run_check, "every scheme x algorithm on a small problem, checked against float64"},
    {"bench", relpos::cli::run_bench, "benchmarks: 'relpos bench memory', 'relpos bench attention'"},
    {"info", relpos::cli::run_info, "version, schemes, the SIMD target and GEMM path in use, threads"},
};

// Every command of kCommands is listed, and every scheme of the library by
// the one list of names (problem.hpp's scheme_names).
void print_usage(std::FILE* to) {
  std::fprintf(to,
               "usage: relpos <command> [options]\n\n"
               "relpos: attention with relative position representations, forward and backward.\n"
               "schemes: %s\n\ncommands:\n",
               relpos::cli::scheme_names().c_str());
  for (const Command& c : kCommands) std::fprintf(to, "  %-10s %s\n", c.name, c.summary);
  std::fprintf(to, "\n'relpos <command> --help' describes a command's options; 'relpos --version' the version.\n");
}

}  // namespace

int main(int argc, char** argv) {
  relpos::cli::use_passive_openmp_wait(argv);
  relpos::cli::take_signals_on_their_own_thread();
  if (argc < 2) {
    print_usage(stderr);
    return 2;
  }
  const bool version = !std::strcmp(argv[1], "--version") || !std::strcmp(argv[1], "-V");
  const bool help = !std::strcmp(argv[1], "--help") || !std::strcmp(argv[1], "-h") || !std::strcmp(argv[1], "help");
  if ((version || help) && argc > 2) {  // a mistyped command line, not a request to ignore the rest
    std::fprintf(stderr,
                 "relpos: %s takes no arguments, got '%s'\n"
                 "(see 'relpos --help'; 'relpos <command> --help' for a command's options)\n",
                 argv[1], argv[2]);
    return 2;
  }
  if (version) {
    std::printf("relpos %s\n", relpos::build_info().version.c_str());
    return 0;
  }
  if (help) {
    print_usage(stdout);
    return 0;
  }
  for (const Command& c : kCommands) {
    if (std::strcmp(argv[1], c.name) != 0) continue;
    try {
      return c.run(argc, argv, 2);
    } catch (const relpos::cli::UsageError& e) {
      std::fprintf(stderr, "relpos %s: %s\n(see 'relpos %s --help')\n", c.name, e.message.c_str(), c.name);
      return 2;
    } catch (const std::bad_alloc&) {
      std::fprintf(stderr, "relpos %s: out of memory (try a smaller problem)\n", c.name);
      return 1;
    } catch (const std::exception& e) {
      std::fprintf(stderr, "relpos %s: %s\n", c.name, e.what());
      return 1;
    }
  }
  std::fprintf(stderr, "relpos: unknown command '%s'\n\n", argv[1]);
  print_usage(stderr);
  return 2;
}
