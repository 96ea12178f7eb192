// How much scratch memory a call needs, estimated from its shapes before any
// work: validation refuses a call that cannot fit this machine's memory with
// the size in the message (instead of std::bad_alloc, or the kernel's
// out-of-memory killer, minutes later), and the memory benchmark skips runs
// over its budget. The per-algorithm classes are those of docs/design.md,
// section 2: the fused kernel's buffers counted one by one (fused_elements),
// the other algorithms' with constants read off `relpos bench memory`.
#include <omp.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <stdexcept>
#include <string>
#include <type_traits>

#include "bf16_split.hpp"
#include "fused.hpp"
#include "head.hpp"
#include "half_storage.hpp"
#include "indexed_rows.hpp"
#include "tiles.hpp"
#include "relpos/attention.hpp"
#include "../schemes/registry.hpp"

namespace relpos {

// The fused kernel's scratch, buffer by buffer as fused_tile.hpp,
// fused_forward.cpp and fused_backward.cpp allocate them, from the same tile
// constants (tiles.hpp): per worker a head's prepared rows (HeadData), then
// the forward's or the backward's own buffers; per call the embeddings and
// the backward's per-thread gradient partials. The larger of the two passes.
template <class T>
double fused_elements(const AttentionForward<T>& p, const EmbeddingSizes& sizes, double requested) {
  const double batch_heads = double(p.q.shape[0]) * double(p.q.shape[1]), heads = double(p.q.shape[1]);
  const double Lq = double(p.q.shape[2]), Lk = double(p.k.shape[2]), d = double(p.q.shape[3]),
               dv = double(p.v.shape[3]), distances = Lq + Lk - 1, widest = std::max(d, dv);
  const double nb = double(sizes.table_rows);                      // a clipped table's 2k+1, an indexed table's rows
  const bool by_key = sizes.query_width > 0;                       // an indexed table read by the key (p2c)
  // Tables by the query (Shaw's wk, DeBERTa's c2p) and of values: a score or
  // bucket sum per table row and query row each; all tables' slices' widths.
  const double query_side = nb * double((sizes.key_width > 0) + (sizes.value_width > 0));
  const double slices = nb * double(sizes.key_width + sizes.value_width + sizes.query_width);
  const bool band = sizes.key_width > 0 && sizes.table_rows == 0;  // a key embedding with a row per distance
  const double rows = double(tiles::kBackwardRows), keys = double(tiles::kBackwardKeys);
  const tiles::ForwardTiles forward = tiles::forward(p.q.shape[3], p.v.shape[3], by_key);
  // The forward's tile rows (fewer for fewer queries) and the logits of a step of keys.
  const int64_t tile_rows = std::min(forward.rows, p.q.shape[2]);
  const double forward_rows = double(std::max<int64_t>(tile_rows, 1));
  const double forward_logits =
      forward_rows * double(std::min(tiles::forward_key_block(forward, tile_rows ? tile_rows : 1), p.k.shape[2]));
  // HeadData: the queries copied, the keys and values too unless read in
  // place (never half storage; a padded key that is not finite copies them
  // too, which is not counted), the queries with a query bias, a bias per
  // distance, a rotation's angles for every query and key, the clipped
  // tables' slices; a table read by the key: its slice and every key's scores.
  using C = compute_t<T>;
  const Scheme scheme = p.pos.scheme;
  const int64_t rotated = p.pos.rope.rotary_dims ? p.pos.rope.rotary_dims : p.q.shape[3];
  const double rotary = scheme_has<RotationOf, C>(scheme) ? double(rotated) : 0.0;
  bool copies_keys = true;
  if constexpr (!is_half_v<T>) copies_keys = !keys_readable_in_place(p);
  const double head = Lq * d + (copies_keys ? Lk * (d + dv) : 0.0) +
                      (scheme_has<QueryBiasOf, C>(scheme) ? Lq * d : 0.0) +
                      (scheme_has<BiasOf, C>(scheme) ? distances : 0.0) + (Lq + Lk) * rotary + slices +
                      (by_key ? Lk * nb : 0.0);
  // A key band's scores (and in the backward their gradients) for a query
  // tile against every key it visits.
  const auto band_scores = [&](double tile_rows) { return band ? tile_rows * (Lk + tile_rows - 1) : 0.0; };
  // A table read by the key: its picks by key (indexed_rows.hpp), a chunk of
  // keys by the tile's rows forward, the backward tile's keys by its rows.
  const auto picks_by_key = [&](double tile_rows, double tile_keys) { return by_key ? tile_rows * tile_keys : 0.0; };
  // bfloat16 parts, three per float32 entry at half its size, where the
  // kernel splits P and dS (bf16_split.hpp).
  double half = 0;
  if constexpr (std::is_same_v<T, bfloat16>) half = fused::splits_stored_bf16(scheme, p) ? 1.0 : 0.0;
  // ForwardScratch: the logits of a step of keys, the output, the key
  // table's scores and value bucket sums, the running max and sum, a
  // transposed tile, picks by key; P split where half storage splits it.
  const double forward_worker = head + forward_logits * (1.0 + 1.5 * half) + forward_rows * (dv + query_side + 2.0) +
                                rows * widest + picks_by_key(forward_rows, double(tiles::kKeyPickChunk)) +
                                band_scores(forward_rows);
  // BackwardScratch: dout, D, the tile's P and dS, key-table scores and
  // dout wv^T, a transposed tile, picks by key; where a head is one group (else below) its
  // QueryGrads (dq's two parts, the key-score gradients and value bucket
  // sums, a band's row gradients, the bias per distance, the keys' score
  // gradients of a table read by the key) and its dk, dv; the
  // tables' gradients of the head. Split tiles: P and dS thrice, the keys thrice, the
  // query tile's q and dout transposed thrice, dk and dv transposed.
  const double query_grads =
      2.0 * Lq * d + Lq * query_side + (band ? distances * d : 0.0) + distances + (by_key ? Lk * nb : 0.0);
  const double groups = double(fused::backward_key_groups(p));
  const double one_group = groups > 1 ? 0.0 : query_grads + Lk * (d + dv);
  const double backward_worker = head + Lq * (dv + 1.0) + dv + 2.0 * rows * keys + rows * query_side +
                                 rows * widest + picks_by_key(rows, keys) + 2.0 * band_scores(std::min(rows, Lq)) +
                                 one_group + slices +
                                 half * (3.0 * rows * keys + 1.5 * Lk * d + 1.5 * rows * (d + dv) + Lk * (d + dv));
  const double forward_workers = std::min(requested, batch_heads * std::ceil(Lq / forward_rows));
  const double backward_workers = std::min(requested, batch_heads * groups);
  // Backward with a head's key tiles in groups: each group's query-side
  // gradients, and every head's dk, dv until its groups are summed.
  const double grouped = groups > 1 ? batch_heads * (groups * query_grads + Lk * (d + dv)) : 0.0;
  // Per call: a key band's rows per head and what its embedding needs per
  // distance; the indexed tables' rows per distance (RowRuns: int32 row and
  // run end, int8 step, counted as 2.25 elements); half storage's positional parameters widened to float32 and
  // their float32 gradients (half_storage.cpp); the backward's per-thread
  // partial gradients of the positional parameters (with a key band's row sums).
  double parameters = 0;
  for_each_scheme_param(p.pos, [&](const char*, const auto& x) { parameters += x.empty() ? 0.0 : double(x.numel()); });
  const double indexed_rows = sizes.indexed ? 2.0 * 2.25 * distances : 0.0;
  const double call = (band ? (heads * d + double(sizes.per_distance)) * (Lq + Lk) : 0.0) + indexed_rows +
                      (is_half_v<T> ? 2.0 * parameters : 0.0);
  const double partials = backward_workers * (parameters + (band ? distances * d : 0.0));
  return call + std::max(forward_workers * forward_worker, backward_workers * backward_worker + grouped + partials);
}

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
  double elements = 0;  // of compute_t<T>
  switch (resolve_algorithm(p)) {
    case Algorithm::reference:  // one head at a time
      elements = pairs * (relative_terms + 8.0);
      break;
    case Algorithm::split:
      elements = threads * pairs * (relative_terms + 8.0);
      break;
    case Algorithm::fused:
      elements = fused_elements(p, sizes, requested);
      break;
    default:  // gather, skew, generalized_skew, relshift: a few (Lq, Lk) matrices and (Lq, 2k+1) buckets
      elements = threads * (pairs * 8.0 + Lq * table_rows * 2.0 + (Lq + Lk) * (d + dv) * 2.0);
      break;
  }
  // Grouped-query backward: every query head's dk, dv until summed per group.
  if (p.k.shape[1] != p.q.shape[1]) elements += heads * Lk * (d + dv);
  const double bytes = elements * double(sizeof(compute_t<T>));
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
