// `relpos info` (and `relpos --version`): what this build runs on.
#include <cstdio>
#include <string>
#include <vector>

#include "commands.hpp"
#include "json_output.hpp"
#include "options.hpp"
#include "problem.hpp"
#include "relpos/info.hpp"

namespace relpos::cli {

namespace {
std::string joined(const std::vector<std::string>& names) {
  std::string out;
  for (const std::string& n : names) out += (out.empty() ? "" : ", ") + n;
  return out;
}
// "512 KiB", "32 MiB", "not reported".
std::string cache_text(int64_t bytes) {
  if (bytes <= 0) return "not reported";
  return bytes >= (8 << 20) ? std::to_string(bytes >> 20) + " MiB" : std::to_string(bytes >> 10) + " KiB";
}
}  // namespace

int run_info(int argc, char** argv, int first) {
  std::string json_path;
  Options opts("relpos info",
               "Prints relpos's version, its position schemes, the SIMD target its vector loops run on (chosen\n"
               "at run time; the environment variable RELPOS_SIMD=avx512|avx2|sse4|scalar limits it), the GEMM\n"
               "library and the instruction set it uses (ONEDNN_MAX_CPU_ISA limits it), how bfloat16 GEMMs and\n"
               "bfloat16 / float16 attention calls compute, OpenMP's threads and wait policy, the CPU's caches\n"
               "and the fused forward's tiles chosen from them (RELPOS_FORWARD_TILES=ROWSxKEYS sets them).\n"
               "Schemes: " + scheme_names() + ".");
  opts.add_string("--json", &json_path, "also write this to a JSON file");
  if (!opts.parse(argc, argv, first)) return 0;
  const BuildInfo i = build_info();
  std::printf("relpos %s\nschemes: %s\nSIMD: %s (compiled: %s; this CPU: %s)\nGEMM: %s on %s\nbfloat16 GEMM: %s\n"
              "half storage: %s (this CPU %s AVX512-BF16)\nthreads: %d, OpenMP wait policy: %s\n"
              "caches: L1d %s, L2 %s per core, L3 %s\nfused forward tiles: %s\n",
              i.version.c_str(), scheme_names().c_str(), i.simd_target.c_str(), joined(i.simd_compiled).c_str(),
              joined(i.simd_supported).c_str(), i.gemm.c_str(), i.gemm_isa.c_str(), i.gemm_bf16.c_str(),
              i.half_storage.c_str(),
              i.cpu_avx512_bf16 ? "has" : "lacks", i.max_threads,
              i.openmp_wait_policy.empty() ? "default (spin, then sleep)" : i.openmp_wait_policy.c_str(),
              cache_text(i.l1d_bytes).c_str(), cache_text(i.l2_bytes).c_str(), cache_text(i.l3_bytes).c_str(),
              i.forward_tiles.c_str());
  if (!json_path.empty())
    write_json(json_path, Json{{"version", i.version}, {"schemes", scheme_name_list()}, {"simd_target", i.simd_target},
                               {"simd_compiled", i.simd_compiled}, {"simd_supported", i.simd_supported},
                               {"gemm", i.gemm}, {"gemm_isa", i.gemm_isa}, {"gemm_bf16", i.gemm_bf16},
                               {"half_storage", i.half_storage},
                               {"cpu_avx512_bf16", i.cpu_avx512_bf16}, {"threads", i.max_threads},
                               {"openmp_wait_policy", i.openmp_wait_policy}, {"l1d_bytes", i.l1d_bytes},
                               {"l2_bytes", i.l2_bytes}, {"l3_bytes", i.l3_bytes}, {"forward_tiles", i.forward_tiles}});
  return 0;
}

}  // namespace relpos::cli
