// The relpos subcommands; each parses its own options from argv[first..).
#pragma once

namespace relpos::cli {

int run_demo(int argc, char** argv, int first);   // train short, test long (the main job)
int run_check(int argc, char** argv, int first);  // every scheme x algorithm against float64
int run_train(int argc, char** argv, int first);
int run_eval(int argc, char** argv, int first);
int run_sample(int argc, char** argv, int first);
int run_info(int argc, char** argv, int first);          // version, SIMD target, GEMM, threads
int run_bench(int argc, char** argv, int first);         // dispatches to the benchmarks below
int run_bench_memory(int argc, char** argv, int first);
int run_bench_attention(int argc, char** argv, int first);

}  // namespace relpos::cli
