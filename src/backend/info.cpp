#include "relpos/info.hpp"

#include <oneapi/dnnl/dnnl.h>
#include <omp.h>

#include <cstdlib>

#include "relpos/gemm.hpp"
#include "../attention/tiles.hpp"
#include "simd.hpp"

namespace relpos {

namespace {

std::string isa_name(dnnl_cpu_isa_t isa) {
  switch (isa) {
    case dnnl_cpu_isa_sse41: return "SSE4.1";
    case dnnl_cpu_isa_avx: return "AVX";
    case dnnl_cpu_isa_avx2: return "AVX2";
    case dnnl_cpu_isa_avx2_vnni: return "AVX2 VNNI";
    case dnnl_cpu_isa_avx512_core: return "AVX-512";
    case dnnl_cpu_isa_avx512_core_vnni: return "AVX-512 VNNI";
    case dnnl_cpu_isa_avx512_core_bf16: return "AVX-512 BF16";
    case dnnl_cpu_isa_avx512_core_amx: return "AVX-512 AMX";
    case dnnl_cpu_isa_all: return "all (the best the CPU has)";
    default: return "other (" + std::to_string(int(isa)) + ")";
  }
}

}  // namespace

BuildInfo build_info() {
  BuildInfo info;
  info.version = RELPOS_VERSION;
  info.simd_target = simd::active_target();
  info.simd_compiled = simd::compiled_targets();
  info.simd_supported = simd::supported_targets();
  const dnnl_version_t* v = dnnl_version();
  info.gemm = "oneDNN " + std::to_string(v->major) + "." + std::to_string(v->minor) + "." + std::to_string(v->patch) +
              " (dnnl_sgemm)";
  info.gemm_isa = isa_name(dnnl_get_effective_cpu_isa());
  info.gemm_bf16 = gemm_bf16_native() ? "bfloat16 products (oneDNN bf16 matmul, float32 accumulation)"
                                       : "widened to float32 (oneDNN's instruction set has no AVX512-BF16)";
  // Half-storage attention calls run the float32 kernels on widened rows
  // (src/attention/half_storage.cpp); the fused kernel multiplies stored
  // bfloat16 rows in place where their products are exact (src/attention/bf16_split.hpp).
  info.half_storage = gemm_bf16_matrix_units()
                          ? "fused: q k^T and dout v^T as bfloat16 products of the stored rows; P v, dS k, dS^T q "
                            "and P^T dout with P and dS split exactly into three bfloat16 parts (values of 64+ "
                            "features), the rest widened to float32; other algorithms widened to float32 per batch "
                            "chunk"
                      : gemm_bf16_native()
                          ? "fused: q k^T and dout v^T as bfloat16 products of the stored rows, the rest widened to "
                            "float32; other algorithms widened to float32 per batch chunk"
                          : "bfloat16/float16 widened to float32 per batch chunk, float32 GEMMs";
  info.cpu_avx512_bf16 = __builtin_cpu_supports("avx512bf16");
  info.max_threads = omp_get_max_threads();
  const char* policy = std::getenv("OMP_WAIT_POLICY");
  info.openmp_wait_policy = policy ? policy : "";
  const tiles::CacheSizes& caches = tiles::this_cpu();
  info.l1d_bytes = caches.l1d, info.l2_bytes = caches.l2, info.l3_bytes = caches.l3;
  info.forward_tiles = tiles::describe();
  return info;
}

}  // namespace relpos
