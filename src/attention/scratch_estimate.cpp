// How much scratch memory a call needs, estimated from its shapes before any
// work: validation refuses a call that cannot fit this machine's memory with
// the size in the message (instead of std::bad_alloc, or the kernel's
// out-of-memory killer, minutes later), and the memory benchmark skips runs
// over its budget. The per-algorithm classes are those of docs/design.md,
// section 2: the fused kernel's from its plan (fused_plan.hpp), which is what it
// allocates, the other algorithms' with constants read off `relpos bench memory`.
#include <omp.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <stdexcept>
#include <string>

#include "fused_plan.hpp"
#include "half_storage.hpp"
#include "relpos/attention.hpp"
#include "../schemes/registry.hpp"

namespace relpos {

template <class T>
double estimated_scratch_bytes(const AttentionForward<T>& p) {
  const double Lq = double(p.q.shape[2]), Lk = double(p.k.shape[2]), d = double(p.q.shape[3]),
               dv = double(p.v.shape[3]);
  const double heads = double(p.q.shape[0]) * double(p.q.shape[1]);
  const double requested = double(p.num_threads > 0 ? p.num_threads : omp_get_max_threads());
  const double threads = std::min(heads, requested);  // the unfused algorithms run heads in parallel
  const EmbeddingSizes sizes = embedding_sizes(p);
  const double table_rows = double(sizes.table_rows);             // a clipped table's 2k+1
  // Relative tensors (Lq, Lk, width) that reference and split materialise.
  const double relative_terms = double(sizes.key_width + sizes.value_width);
  const double pairs = Lq * Lk;
  const double dropout_pairs = p.dropout.active() ? 2.0 : 0.0;  // the unfused backward's P after dropout, and z
  double elements = 0;  // of compute_t<T>
  double fused_bytes = 0;
  switch (resolve_algorithm(p)) {
    case Algorithm::reference:  // one head at a time
      elements = pairs * (relative_terms + 8.0);
      break;
    case Algorithm::split:
      elements = threads * pairs * (relative_terms + 8.0 + dropout_pairs);
      break;
    case Algorithm::fused: {  // its plan's bytes, of the larger pass
      const fused::FusedPlan plan = fused::plan(p);
      fused_bytes = std::max(plan.forward_bytes(), plan.backward_bytes());
      break;
    }
    default:  // gather, skew, generalized_skew, relshift: a few (Lq, Lk) matrices and (Lq, 2k+1) buckets
      elements = threads * (pairs * (8.0 + dropout_pairs) + Lq * table_rows * 2.0 + (Lq + Lk) * (d + dv) * 2.0);
      break;
  }
  // Grouped-query backward: every query head's dk, dv until summed per group.
  if (p.k.shape[1] != p.q.shape[1]) elements += heads * Lk * (d + dv);
  const double bytes = fused_bytes + elements * double(sizeof(compute_t<T>));
  if constexpr (is_half_v<T>) return bytes + half_storage::chunk_bytes(p);  // the float32 copies of a chunk
  return bytes;
}

template <class T>
void check_scratch_fits(const AttentionForward<T>& p) {
  const double physical = double(sysconf(_SC_PHYS_PAGES)) * double(sysconf(_SC_PAGE_SIZE));
  const double need = estimated_scratch_bytes(p);
  if (physical <= 0 || need <= physical) return;
  char sizes[160];
  std::snprintf(sizes, sizeof sizes, "about %.3g GB of scratch memory, more than this machine's %.3g GB", need / 1e9,
                physical / 1e9);
  std::string shape = "B=" + std::to_string(p.q.shape[0]) + ", H=" + std::to_string(p.q.shape[1]) +
                      ", Lq=" + std::to_string(p.q.shape[2]) + ", Lk=" + std::to_string(p.k.shape[2]) +
                      ", d=" + std::to_string(p.q.shape[3]);
  if (const int64_t rows = embedding_sizes(p).table_rows; rows > 0)
    shape += ", " + std::string(to_string(p.pos.scheme)) + " table rows 2k+1=" + std::to_string(rows);
  const Algorithm a = resolve_algorithm(p);
  throw std::invalid_argument(std::string("relpos: algorithm: '") + to_string(a) + "' needs " + sizes + " for " +
                              shape +
                              (a == Algorithm::fused ? "" : "; the fused algorithm holds no (Lq, Lk) buffer"));
}

#define RELPOS_INSTANTIATE(T)                                                     \
  template double estimated_scratch_bytes<T>(const AttentionForward<T>&); \
  template void check_scratch_fits<T>(const AttentionForward<T>&);
RELPOS_INSTANTIATE(float)
RELPOS_INSTANTIATE(double)
RELPOS_INSTANTIATE(bfloat16)
RELPOS_INSTANTIATE(float16)
#undef RELPOS_INSTANTIATE

}  // namespace relpos
