// bfloat16 GEMMs: bf16 x bf16 products accumulated in float32.
//
// On a CPU whose oneDNN instruction set has AVX512-BF16 (or AMX), the product
// is a oneDNN matmul primitive with bf16 source and weights and a float32
// destination; it runs at about twice sgemm's rate (the VDPBF16PS
// instruction does two multiply-adds per float32 lane). A primitive is built
// once per shape, transposition, leading dimensions, alpha/beta and thread
// count (building one takes 0.2-5 ms, running a trainer-sized one 0.1-1 ms)
// and kept. Elsewhere the operands are widened to float32 and go to
// gemm<float>: the same exact products (a product of two bf16 numbers is
// exact in float32), summed in another order.
#include <oneapi/dnnl/dnnl.hpp>
#include <omp.h>

#include <map>
#include <mutex>
#include <stdexcept>
#include <string>
#include <tuple>
#include <unordered_map>
#include <vector>

#include "convert.hpp"
#include "relpos/gemm.hpp"

namespace relpos {

namespace {

using Dims = dnnl::memory::dims;
using DataType = dnnl::memory::data_type;

// The operand op(X) (rows x cols) of a row-major X with leading dimension ld
// as a oneDNN memory descriptor (a transposed X is read through its strides).
dnnl::memory::desc operand_desc(Trans t, int64_t rows, int64_t cols, int64_t ld, DataType type) {
  return dnnl::memory::desc(Dims{rows, cols}, type, t == Trans::no ? Dims{ld, 1} : Dims{1, ld});
}

struct MatmulKey {
  Trans ta, tb;
  int64_t m, n, k, lda, ldb, ldc;
  float alpha, beta;
  int threads;
  auto tie() const { return std::tie(ta, tb, m, n, k, lda, ldb, ldc, alpha, beta, threads); }
  bool operator<(const MatmulKey& o) const { return tie() < o.tie(); }
};

const dnnl::engine& cpu_engine() {
  static const dnnl::engine engine(dnnl::engine::kind::cpu, 0);
  return engine;
}

// A built primitive and the bytes of scratchpad it needs per run.
struct Matmul {
  dnnl::matmul primitive;
  std::size_t scratchpad_bytes = 0;
};

// At most this many shapes are kept (in the shared map and in each thread's):
// a caller of ever new shapes empties the map now and then.
constexpr std::size_t kKept = 256;

// The primitive for `key`, built on first use and kept. A primitive is a
// shared handle, returned by copy, so a caller's stays valid when the map is
// emptied. Its scratchpad is the caller's (user mode): oneDNN's own is one
// buffer for the whole library, which primitives running on several threads
// at once (the fused kernel's tiles) would share, and did: wrong results in 6
// of 1,140 Python tests, which run on two threads.
Matmul matmul_for(const MatmulKey& key) {
  static std::mutex guard;
  static std::map<MatmulKey, Matmul> built;
  const std::lock_guard<std::mutex> lock(guard);
  auto found = built.find(key);
  if (found != built.end()) return found->second;
  if (built.size() >= kKept) built.clear();
  dnnl::primitive_attr attr;
  attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  if (key.alpha != 1.f) attr.set_output_scales(0, {key.alpha});
  if (key.beta != 0.f) {
    dnnl::post_ops ops;
    ops.append_sum(key.beta);
    attr.set_post_ops(ops);
  }
  const dnnl::matmul::desc desc(operand_desc(key.ta, key.m, key.k, key.lda, DataType::bf16),
                                operand_desc(key.tb, key.k, key.n, key.ldb, DataType::bf16),
                                operand_desc(Trans::no, key.m, key.n, key.ldc, DataType::f32));
  const dnnl::matmul::primitive_desc pd(desc, attr, cpu_engine());
  return built.emplace(key, Matmul{dnnl::matmul(pd), pd.scratchpad_desc().get_size()}).first->second;
}

// A primitive ready to run on this thread: memory objects for its operands,
// whose data pointers are set at each call, and the argument map naming
// them. Kept per thread and shape: the trainer calls a dozen shapes in turn,
// and a step's hundreds of calls each built the map and the memory objects.
struct PreparedMatmul {
  Matmul matmul;
  dnnl::memory src, weights, dst, scratchpad;
  std::unordered_map<int, dnnl::memory> args;
};

PreparedMatmul& prepared_for(const MatmulKey& key) {
  thread_local std::map<MatmulKey, PreparedMatmul> prepared;
  auto found = prepared.find(key);
  if (found != prepared.end()) return found->second;
  if (prepared.size() >= kKept) prepared.clear();
  const dnnl::engine& engine = cpu_engine();
  PreparedMatmul p;
  p.matmul = matmul_for(key);
  // Each operand's memory spans its rows up to the last row's last element.
  p.src = dnnl::memory(operand_desc(key.ta, key.m, key.k, key.lda, DataType::bf16), engine, DNNL_MEMORY_NONE);
  p.weights = dnnl::memory(operand_desc(key.tb, key.k, key.n, key.ldb, DataType::bf16), engine, DNNL_MEMORY_NONE);
  p.dst = dnnl::memory(operand_desc(Trans::no, key.m, key.n, key.ldc, DataType::f32), engine, DNNL_MEMORY_NONE);
  p.args = {{DNNL_ARG_SRC, p.src}, {DNNL_ARG_WEIGHTS, p.weights}, {DNNL_ARG_DST, p.dst}};
  if (p.matmul.scratchpad_bytes > 0) {
    const dnnl::memory::desc bytes(Dims{int64_t(p.matmul.scratchpad_bytes)}, DataType::u8, Dims{1});
    p.scratchpad = dnnl::memory(bytes, engine, DNNL_MEMORY_NONE);
    p.args.emplace(DNNL_ARG_SCRATCHPAD, p.scratchpad);
  }
  return prepared.emplace(key, std::move(p)).first->second;
}

void native_gemm_bf16(Trans ta, Trans tb, int64_t m, int64_t n, int64_t k, float alpha, const bfloat16* a,
                      int64_t lda, const bfloat16* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  try {
    PreparedMatmul& p = prepared_for(MatmulKey{ta, tb, m, n, k, lda, ldb, ldc, alpha, beta, omp_get_max_threads()});
    thread_local dnnl::stream stream(cpu_engine());
    thread_local std::vector<uint8_t> scratchpad;  // this thread's, never shared
    if (scratchpad.size() < p.matmul.scratchpad_bytes) scratchpad.resize(p.matmul.scratchpad_bytes);
    p.src.set_data_handle(const_cast<bfloat16*>(a));
    p.weights.set_data_handle(const_cast<bfloat16*>(b));
    p.dst.set_data_handle(c);
    if (p.matmul.scratchpad_bytes > 0) p.scratchpad.set_data_handle(scratchpad.data());
    p.matmul.primitive.execute(stream, p.args);
    stream.wait();
  } catch (const dnnl::error& e) {
    throw std::runtime_error(std::string("relpos: oneDNN bfloat16 matmul failed: ") + e.what());
  }
}

// The stored rows of op(X) (rows x cols): X itself holds rows x cols
// (untransposed) or cols x rows (transposed) at leading dimension ld.
struct StoredShape {
  int64_t rows, cols;
};
StoredShape stored_shape(Trans t, int64_t rows, int64_t cols) {
  return t == Trans::no ? StoredShape{rows, cols} : StoredShape{cols, rows};
}

// X's stored rows converted to To, densely (leading dimension = row length),
// in `buffer` (kept by the caller's thread between calls: no allocation and no
// zero fill once it has grown). A large operand is converted by OpenMP's
// threads (the GEMM's own; one inside a relpos parallel region): done by one
// thread, the copies took 8% of a two-thread mixed-precision training step.
template <class To, class From>
const To* dense_copy(const From* x, StoredShape s, int64_t ld, std::vector<To>& buffer) {
  constexpr int64_t kParallelElements = 1 << 15;
  if (buffer.size() < static_cast<std::size_t>(s.rows * s.cols)) buffer.resize(s.rows * s.cols);
  To* dense = buffer.data();
#pragma omp parallel for schedule(static) if (s.rows * s.cols >= kParallelElements)
  for (int64_t r = 0; r < s.rows; ++r) convert::row(x + r * ld, 1, dense + r * s.cols, 1, s.cols);
  return dense;
}

}  // namespace

bool gemm_bf16_native() {
  const unsigned isa = dnnl_get_effective_cpu_isa();
  return (isa & dnnl_cpu_isa_avx512_core_bf16) == dnnl_cpu_isa_avx512_core_bf16;
}

bool gemm_bf16_matrix_units() {
  const unsigned isa = dnnl_get_effective_cpu_isa();
  return (isa & dnnl_cpu_isa_avx512_core_amx) == dnnl_cpu_isa_avx512_core_amx;
}

void gemm_bf16(Trans ta, Trans tb, int64_t m, int64_t n, int64_t k, float alpha, const bfloat16* a, int64_t lda,
               const bfloat16* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  if (m == 0 || n == 0) return;
  if (k > 0 && gemm_bf16_native()) return native_gemm_bf16(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
  thread_local std::vector<float> wide_a, wide_b;
  const StoredShape sa = stored_shape(ta, m, k), sb = stored_shape(tb, k, n);
  gemm<float>(ta, tb, m, n, k, alpha, dense_copy(a, sa, lda, wide_a), sa.cols, dense_copy(b, sb, ldb, wide_b), sb.cols,
              beta, c, ldc);
}

void gemm_bf16_valued(Trans ta, Trans tb, int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t lda,
                      const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  if (m == 0 || n == 0 || k == 0 || !gemm_bf16_native())
    return gemm<float>(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
  thread_local std::vector<bfloat16> narrow_a, narrow_b;
  const StoredShape sa = stored_shape(ta, m, k), sb = stored_shape(tb, k, n);
  native_gemm_bf16(ta, tb, m, n, k, alpha, dense_copy(a, sa, lda, narrow_a), sa.cols, dense_copy(b, sb, ldb, narrow_b),
                   sb.cols, beta, c, ldc);
}

}  // namespace relpos
