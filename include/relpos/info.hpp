// What this build of relpos runs on: its version, the SIMD target chosen at
// run time, the GEMM library and the instruction set it uses, the threads.
// `relpos info` and `relpos.info()` print it.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace relpos {

struct BuildInfo {
  std::string version;                       // "0.1.0"
  std::string simd_target;                   // the target the SIMD loops run on now ("AVX2", ...)
  std::vector<std::string> simd_compiled;    // targets compiled in
  std::vector<std::string> simd_supported;   // of those, the ones this CPU runs (RELPOS_SIMD may limit them)
  std::string gemm;                          // "oneDNN 2.7.3 (sgemm)"
  std::string gemm_isa;                      // the instruction set oneDNN dispatches to
  std::string gemm_bf16;                     // how relpos::gemm_bf16 (mixed-precision training) multiplies
  std::string half_storage;                  // how bfloat16 / float16 attention calls compute
  bool cpu_avx512_bf16 = false;              // whether this CPU has AVX512-BF16 instructions
  int max_threads = 0;                       // OpenMP's maximum (threads = 0)
  std::string openmp_wait_policy;            // OMP_WAIT_POLICY as this process sees it ("" = default)
  int64_t l1d_bytes = 0, l2_bytes = 0, l3_bytes = 0;  // the CPU's caches as it reports them (0 = not reported)
  std::string forward_tiles;                 // the fused forward's tiles, rows x keys, and why
};

BuildInfo build_info();

}  // namespace relpos
