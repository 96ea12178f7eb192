// The attention API: one params struct for forward, extended by backward.
//
// Semantics (docs/design.md section 1), per batch b and head h:
//   r(i, j)     = (k_offset + j) - (q_offset + i)        key minus query
//   logits(i,j) = scale * (q_i . k_j + score terms) + bias terms, masked to -inf
//   out_i       = sum_j softmax_j(logits)(i, j) * (v_j + value terms)
//   lse_i       = log sum_j exp(logits(i, j))             (-inf for a fully masked row)
// A fully masked row outputs zeros and receives zero gradients. With dropout
// (relpos/dropout.hpp), out_i sums softmax(i, j) * z(i, j) instead, z the
// entry's keep bit / (1 - p); lse is the softmax's, before dropout.
//
// T, the type the tensors are stored in, is float, double, bfloat16 or
// float16 (relpos/half.hpp). A call computes in compute_t<T>: T itself, or
// float32 for the half types, whose results are rounded once at the end and
// whose lse is float32.
#pragma once

#include <cmath>
#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "relpos/dropout.hpp"
#include "relpos/half.hpp"
#include "relpos/position.hpp"
#include "relpos/tensor.hpp"

namespace relpos {

enum class Scheme { none, shaw, t5, alibi, rope, xl, kerple, kerple_power, deberta, sam, swin };
inline constexpr int kSchemeCount = static_cast<int>(Scheme::swin) + 1;  // the last value's, plus one

// Largest thread count relpos accepts anywhere (0 = OpenMP's maximum); checked
// before OpenMP or the GEMM library sees it (100000 crashed inside libgomp).
inline constexpr int kMaxThreads = 4096;
// How attention is computed (docs/design.md section 2); every algorithm equals the
// reference. automatic picks the fused kernel.
//   reference         the formula, O(L^2 d) relative tensors; every scheme
//   split             Shaw: A^K, A^V materialised once, shared by batch and heads
//   gather            Shaw by (Lq, 2k+1) gathers and bucket sums; T5 / ALiBi biases
//                     per distance; plain attention and RoPE
//   skew              Shaw key/value terms by Music Transformer's pad-reshape-slice
//                     (causal self-attention, equal offsets)
//   generalized_skew  Shaw or Transformer-XL by diagonal extraction of Q E, any mask
//   relshift          Transformer-XL appendix B (causal, queries end-aligned with keys)
//   fused             streaming tiles with an online softmax, no (L, L) buffer; every scheme
enum class Algorithm { automatic, reference, split, gather, skew, generalized_skew, relshift, fused };

const char* to_string(Scheme s);
const char* to_string(Algorithm a);
Scheme parse_scheme(const std::string& name);        // throws std::invalid_argument
Algorithm parse_algorithm(const std::string& name);  // throws std::invalid_argument

// Shaw et al.: score q_i . wk[c(r)], value wv[c(r)]. Tables are (Ht, 2k+1, d)
// and (Ht, 2k+1, dv) with Ht = 1 (shared by heads) or H (one per head). Either
// table may be empty: K-only or V-only.
template <class T>
struct ShawParams {
  int64_t k = 0;
  Beyond beyond = Beyond::clip;
  View3<const T> wk, wv;
};

// T5: bias table[h, bucket(r)], table (H, num_buckets).
template <class T>
struct T5Params {
  bool bidirectional = true;
  int64_t max_distance = 128;
  View2<const T> table;  // num_buckets = table.shape[1]
};

// ALiBi: bias -m_h * |r|, slopes (H); empty = the paper's slopes for H heads.
template <class T>
struct AlibiParams {
  View1<const T> slopes;
};

// RoPE: q rotated by its absolute position q_offset + i, k by k_offset + j.
struct RopeParams {
  double base = 10000.0;
  int64_t rotary_dims = 0;  // 0 = the whole head dimension
  RopeStyle style = RopeStyle::half_split;
};

// Transformer-XL: score (q_i + u) . k_j + (q_i + v) . W_R R(xl_distance(r)),
// u, v (H, d), W_R (H, d, pos_dim), R the sinusoid of size pos_dim (even).
// Memory is expressed by offsets: keys = [memory; current], k_offset = 0,
// q_offset = mem_len.
template <class T>
struct XLParams {
  View2<const T> u, v;
  View3<const T> w_r;
  int64_t clamp_len = 0;  // 0 = unclamped
};

// KERPLE (Chi et al. 2022, logarithmic variant): bias -r1_h * log(1 + r2_h * |r|),
// r1, r2 (H), every entry finite and > 0.
template <class T>
struct KerpleParams {
  View1<const T> r1, r2;
};

// KERPLE, power variant: bias -r1_h * |r|^r2_h, r1 (H) finite and > 0,
// r2 (H) in (0, 2].
template <class T>
struct KerplePowerParams {
  View1<const T> r1, r2;
};

// DeBERTa (He et al. 2021): score q_i . c2p[c(-r)] (content to position) and
// k_j . p2c[c(-r)] (position to content) beside q_i . k_j, -r = query_pos -
// key_pos (transformers' relative position for both terms), with
// c(x) = clamp(bucket(x) + span, 0, 2 span - 1) and bucket DeBERTa's log
// buckets (deberta_bucket in relpos/position.hpp); span = position_buckets,
// or max_relative_positions where position_buckets <= 0 (no buckets).
// Tables (Ht, 2 span, d), Ht = 1 or H; either may be empty (c2p or p2c only).
// The default scale is 1 / sqrt(d (1 + [c2p] + [p2c])), DeBERTa's.
template <class T>
struct DebertaParams {
  int64_t position_buckets = 256;
  int64_t max_relative_positions = 512;
  View3<const T> c2p, p2c;
  int64_t span() const { return position_buckets > 0 ? position_buckets : max_relative_positions; }
};

// Positions on a grid (docs/design.md, "Positions on a grid"): query row i
// is cell (y, x) = (i / q_width, i % q_width) of a q_height x q_width grid
// (Lq = q_height q_width), key row j cell (j / k_width, j % k_width) of a
// k_height x k_width grid (0: the query grid's). A pair's offset on each axis
// is an index into that axis's rows, SAM's get_rel_pos: rel(yq, yk) =
// floor(yq max(kh / qh, 1) - yk max(qh / kh, 1) + (kh - 1) max(qh / kh, 1))
// in float32 (relpos/position.hpp's grid_offset_index), yq - yk + kh - 1 where
// the two grids agree.

// SAM / ViTDet / MViTv2's decomposed relative positions (Li et al. 2022):
// the logit of (i, j) gains q_i . rel_h[rel(yi, yj)] + q_i . rel_w[rel(xi, xj)],
// unscaled (SAM adds it to the scaled q . k). rel_h (2 max(qh, kh) - 1, d),
// rel_w (2 max(qw, kw) - 1, d), shared by the heads (the caller resizes
// tables trained for another grid, as SAM interpolates them).
template <class T>
struct SamParams {
  int64_t q_height = 0, q_width = 0, k_height = 0, k_width = 0;
  View2<const T> rel_h, rel_w;
};

// Swin's relative position bias (Liu et al. 2021), inside a window of
// window_height x window_width cells (queries and keys on the window's grid):
// the logit of (i, j) gains table[h, rel(yi, yj) (2 ww - 1) + rel(xi, xj)],
// table (H, (2 wh - 1)(2 ww - 1)) (Swin keeps it (rows, H)). Windows are batch
// entries, as Swin lays them out.
template <class T>
struct SwinParams {
  int64_t window_height = 0, window_width = 0;
  View2<const T> table;
};

template <class T>
struct PositionParams {
  Scheme scheme = Scheme::none;
  ShawParams<T> shaw;
  T5Params<T> t5;
  AlibiParams<T> alibi;
  RopeParams rope;
  XLParams<T> xl;
  KerpleParams<T> kerple;
  KerplePowerParams<T> kerple_power;
  DebertaParams<T> deberta;
  SamParams<T> sam;
  SwinParams<T> swin;
};

// Gradients of the learnable positional parameters, same shapes as the
// parameters. Backward adds into them; an empty view means "not wanted".
template <class T>
struct PositionGrads {
  View3<T> shaw_wk, shaw_wv;
  View2<T> t5_table;
  View1<T> alibi_slopes;  // needs explicit slopes in PositionParams
  View2<T> xl_u, xl_v;
  View3<T> xl_w_r;
  View1<T> kerple_r1, kerple_r2;
  View1<T> kerple_power_r1, kerple_power_r2;
  View3<T> deberta_c2p, deberta_p2c;
  View2<T> sam_rel_h, sam_rel_w;
  View2<T> swin_table;
};

template <class T>
struct AttentionForward {
  View4<const T> q;  // (B, H, Lq, d)
  View4<const T> k;  // (B, Hkv, Lk, d)   Hkv divides H: query head h reads key head kv_head(h)
  View4<const T> v;  // (B, Hkv, Lk, dv)  (grouped-query attention; Hkv = 1: multi-query; Hkv = H: multi-head)
  View4<T> out;      // (B, H, Lq, dv)    written by forward, read by backward
  View3<compute_t<T>> lse;  // (B, H, Lq)  written by forward, read by backward

  bool causal = false;                // mask keys with r > 0
  View2<const uint8_t> key_padding;   // (B, Lk), nonzero = padded key; empty = none
  // Segments (packed documents; Swin's shifted windows): query row i sees key j
  // only where q_segments(b, i) == k_segments(b, j); (B, Lq) and (B, Lk), both
  // or neither (empty = none).
  View2<const int32_t> q_segments, k_segments;
  int64_t q_offset = 0, k_offset = 0; // absolute positions of q row 0 and k row 0
  std::optional<double> scale;        // default: the scheme's (effective_scale below)
  PositionParams<T> pos;
  AttentionDropout dropout;  // on the probabilities; a backward draws its forward's mask again from it
  Algorithm algorithm = Algorithm::automatic;
  int num_threads = 0;  // OpenMP threads over (batch, head); 0 = omp_get_max_threads()
};

template <class T>
struct AttentionBackward : AttentionForward<T> {
  View4<const T> dout;  // (B, H, Lq, dv)
  View4<T> dq, dk, dv;  // shaped like q, k, v; added into; an empty view means "not wanted"
  // dk and dv hold the gradients of keys key_grads_from .. Lk - 1 only, shaped
  // (B, Hkv, Lk - key_grads_from, .): the keys before them (a Transformer-XL
  // memory, which training never differentiates) get none, and the fused
  // kernel skips their products.
  int64_t key_grads_from = 0;
  PositionGrads<T> dpos;
};

// What attention_forward throws when every input is finite but a row's
// scores overflowed the compute type (NaN or zero rows otherwise): an
// std::invalid_argument, of its own type so that a caller can say why (a
// trainer: its run diverged).
class ScoresOverflow : public std::invalid_argument {
 public:
  using std::invalid_argument::invalid_argument;
};

// Validate, then run the selected algorithm. Throw std::invalid_argument
// naming the offending argument; never abort.
template <class T>
void attention_forward(const AttentionForward<T>& p);
template <class T>
void attention_backward(const AttentionBackward<T>& p);

// The checks behind the two calls above, exposed for frontends that want to
// fail before allocating outputs.
template <class T>
void validate_forward(const AttentionForward<T>& p);
template <class T>
void validate_backward(const AttentionBackward<T>& p);

// The algorithm a call runs: p.algorithm, or for automatic the cheapest one
// that serves p's scheme and mask.
template <class T>
Algorithm resolve_algorithm(const AttentionForward<T>& p);

// Throws std::invalid_argument (naming 'algorithm') when p's algorithm does
// not serve its scheme, mask or shape. Part of validate_forward.
template <class T>
void check_algorithm(const AttentionForward<T>& p);

// The algorithms (automatic excluded) that serve p, from the schemes'
// capability tables, the algorithms' mask and shape conditions and the
// machine's memory; nothing is computed. Throws std::invalid_argument when p
// is invalid for a reason other than its algorithm.
template <class T>
std::vector<Algorithm> available_algorithms(const AttentionForward<T>& p);

// Scratch memory (bytes) a call's algorithm needs beyond its inputs and
// outputs, forward and backward, estimated from the shapes before any work.
// For the fused kernel it is the larger pass of the kernel's plan of its
// buffers with every gradient wanted; the kernel's workers reserve that plan
// before any work, and a test checks, byte for byte, that each pass allocates
// its plan (a padded key that is not finite adds a copy of the head's keys and
// values). Grouped-query attention adds every query head's dk and dv, and
// bfloat16 or float16 storage the float32 copies of a chunk where the kernel
// does not read the stored rows itself.
template <class T>
double estimated_scratch_bytes(const AttentionForward<T>& p);

// Throws std::invalid_argument (naming 'algorithm', the estimate and the
// machine's memory) when that estimate exceeds the machine's physical memory.
// Part of validate_forward.
template <class T>
void check_scratch_fits(const AttentionForward<T>& p);

// The key/value head query head h reads: H / Hkv consecutive query heads
// share one (grouped-query attention).
template <class T>
int64_t kv_head(const AttentionForward<T>& p, int64_t h) {
  return h / (p.q.shape[1] / p.k.shape[1]);
}

// Effective softmax scale of a call: p.scale, else the scheme's own default,
// 1 for T5 (its paper and every T5 checkpoint fold the scale into the
// initialisation), 1 / sqrt(d n) for DeBERTa with n = 1 + its number of
// position terms (its paper's scaling; the root in float32, as transformers
// takes it: the same scale value, so float64 calls agree with it to rounding), and
// 1 / sqrt(d) for the others.
template <class T>
double effective_scale(const AttentionForward<T>& p) {
  if (p.scale) return *p.scale;
  if (p.pos.scheme == Scheme::t5) return 1.0;
  if (p.pos.scheme == Scheme::deberta) {
    const int64_t terms = 1 + !p.pos.deberta.c2p.empty() + !p.pos.deberta.p2c.empty();
    return 1.0 / static_cast<double>(std::sqrt(static_cast<float>(p.q.shape[3] * terms)));
  }
  return 1.0 / std::sqrt(static_cast<double>(p.q.shape[3]));
}

}  // namespace relpos
