// Position math shared by every algorithm: the small, exact functions that
// turn a relative distance r = key_pos - query_pos (or an absolute position)
// into a table index, a bias, a rotation or a sinusoid. docs/design.md section 1.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace relpos {

// Largest absolute position, distance or window relpos accepts: positions and
// distances then stay exact in double and far from int64 overflow.
constexpr int64_t kMaxPosition = int64_t(1) << 40;

// ---- Shaw et al. 2018 / Music Transformer -------------------------------

// What a distance beyond +-k sees: the edge embedding (Shaw) or a zero
// embedding (tensor2tensor's Music Transformer).
enum class Beyond { clip, zero };

// Table row c(r) = clip(r, -k, k) + k, in [0, 2k]. With Beyond::zero a
// distance |r| > k has no row and the function returns -1.
int64_t shaw_index(int64_t r, int64_t k, Beyond beyond);

// ---- T5 -------------------------------------------------------------------

// HF transformers' T5Attention._relative_position_bucket for one distance:
// its large-distance branch in float32 arithmetic, as PyTorch evaluates it,
// with the correctly rounded float32 logarithm. Upstream uses the platform's
// float32 log, so where the scaled value lies within a few ulps of an integer
// its bucket depends on the CPU (e.g. 108 buckets, max_distance 125, r = 45);
// relpos's is the same everywhere. `r` is memory_position - query_position,
// any int64. Call only with a configuration that check_t5_config accepts.
int64_t t5_bucket(int64_t r, bool bidirectional, int64_t num_buckets, int64_t max_distance);

// Throws std::invalid_argument naming t5.num_buckets or t5.max_distance unless
// the configuration defines buckets (an exact range of at least one distance
// and a max_distance beyond it). A frontend whose arguments are named
// otherwise gives the names that start its messages.
void check_t5_config(bool bidirectional, int64_t num_buckets, int64_t max_distance,
                     const std::string& num_buckets_name = "relpos: t5.num_buckets",
                     const std::string& max_distance_name = "relpos: t5.max_distance");

// ---- DeBERTa --------------------------------------------------------------

// transformers' make_log_bucket_position (DeBERTa-v2/v3) for one relative
// position x = query_pos - key_pos: x itself where |x| <= mid =
// position_buckets / 2, else sign(x) (mid + ceil(log(|x| / mid) /
// log((max_relative_positions - 1) / mid) (mid - 1))), in float32 as PyTorch
// evaluates it under its default dtype, with the correctly rounded float32
// logarithm (as t5_bucket). position_buckets <= 0: no buckets, x itself.
int64_t deberta_bucket(int64_t x, int64_t position_buckets, int64_t max_relative_positions);

// The table row of relative position x: clamp(bucket(x) + span, 0, 2 span - 1),
// span = position_buckets, or max_relative_positions without buckets.
int64_t deberta_row(int64_t x, int64_t position_buckets, int64_t max_relative_positions);

// Throws std::invalid_argument naming deberta.position_buckets or
// deberta.max_relative_positions unless they define buckets: a span in
// [1, 2^40], and with buckets (position_buckets > 0) position_buckets >= 2 and
// a log ratio log((max_relative_positions - 1) / (position_buckets / 2)) > 0
// in float32, the arithmetic deberta_bucket divides by.
// Messages start with the names given, as check_t5_config's.
void check_deberta_config(int64_t position_buckets, int64_t max_relative_positions,
                          const std::string& position_buckets_name = "relpos: deberta.position_buckets",
                          const std::string& max_relative_positions_name = "relpos: deberta.max_relative_positions");

// ---- Positions on a grid (SAM, Swin) ----------------------------------------

// The index of the offset between a query cell at coordinate yq of an axis of
// q_size cells and a key cell at yk of k_size cells, in [0, grid_offset_rows):
// SAM's get_rel_pos (transformers' SamVisionAttention), which scales the
// coordinates of the shorter axis: floor(yq max(k_size / q_size, 1) -
// yk max(q_size / k_size, 1) + (k_size - 1) max(q_size / k_size, 1)), in
// float32 as PyTorch evaluates it; yq - yk + k_size - 1 where the sizes agree.
int64_t grid_offset_index(int64_t yq, int64_t yk, int64_t q_size, int64_t k_size);

// The rows of an axis's table of offsets: 2 max(q_size, k_size) - 1.
inline int64_t grid_offset_rows(int64_t q_size, int64_t k_size) {
  return 2 * (q_size > k_size ? q_size : k_size) - 1;
}

// ---- ALiBi ----------------------------------------------------------------

// Head slopes m_h of Press et al.: the geometric sequence 2^(-8/n)... for a
// power-of-two n, and for any other n the slopes of the next lower power of two
// followed by every other slope of twice that power. num_heads in [1, 65536],
// else std::invalid_argument.
std::vector<double> alibi_slopes(int64_t num_heads);

// ---- RoPE -----------------------------------------------------------------

// half_split pairs feature i with i + dims/2 (GPT-NeoX, Llama);
// interleaved pairs 2i with 2i + 1 (GPT-J, the RoFormer paper).
enum class RopeStyle { half_split, interleaved };

// Inverse frequencies theta_i = base^(-2i / dims), i < dims / 2.
std::vector<double> rope_inv_freq(int64_t rotary_dims, double base);

// The two features rotated by frequency i.
inline std::pair<int64_t, int64_t> rope_pair(int64_t i, int64_t rotary_dims, RopeStyle style) {
  return style == RopeStyle::half_split ? std::pair{i, i + rotary_dims / 2}
                                        : std::pair{2 * i, 2 * i + 1};
}

// Rotates x (dims entries at stride `stride`) in place by the angles pos*theta_i.
// direction = -1 applies the inverse (transposed) rotation, used by backward.
template <class T>
void rope_rotate(T* x, int64_t stride, double pos, const std::vector<double>& inv_freq,
                 RopeStyle style, int direction = 1);

// ---- Transformer-XL sinusoid --------------------------------------------

// Transformer-XL's positional embedding R(p) of even size dim, in its
// [sin(p f_0), ..., sin(p f_{dim/2-1}), cos(p f_0), ...] order, f_i = 10000^(-2i/dim).
template <class T>
void sinusoid(double p, int64_t dim, T* out);

// The same with the frequencies f_i computed once (sinusoid_inv_freq(dim)),
// for callers that evaluate R at many distances.
std::vector<double> sinusoid_inv_freq(int64_t dim);
template <class T>
void sinusoid(double p, const std::vector<double>& inv_freq, T* out);

// The distance fed to R for a pair at relative distance r: -r (how far the key
// lies in the past), limited to [-clamp_len, clamp_len] when clamp_len > 0.
inline int64_t xl_distance(int64_t r, int64_t clamp_len) {
  int64_t p = -r;
  if (clamp_len > 0) p = p > clamp_len ? clamp_len : (p < -clamp_len ? -clamp_len : p);
  return p;
}

}  // namespace relpos
