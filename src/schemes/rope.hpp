// RoPE (Su et al.): a rotation of q by its absolute position and of k by its;
// every algorithm rotates a head's rows once as it loads them (head.hpp's
// load_head, the reference) through this scheme's Rotation.
#pragma once

#include <cmath>
#include <vector>

#include "../backend/row_ops.hpp"
#include "../backend/scratch.hpp"
#include "checks.hpp"
#include "relpos/position.hpp"
#include "scheme.hpp"

namespace relpos {

struct RopeScheme : NoLearnableTensors {
  static constexpr Scheme id = Scheme::rope;
  static constexpr const char* name = "rope";
  static constexpr AlgorithmSet algorithms = {Algorithm::reference, Algorithm::gather, Algorithm::fused};

  static constexpr ModelOption kBase = {.key = "rope_base",
                                        .integer = false,
                                        .fallback = 10000.0,
                                        .low = 1,
                                        .high = std::numeric_limits<double>::max(),
                                        .help = "RoPE frequency base"};
  static constexpr std::array<ModelOption, 1> model_options = {kBase};

  static void check_model(const SchemeModelConfig& c) {
    if ((c.width / c.heads) % 2 != 0)
      model_config_error("heads", "RoPE needs an even head dimension width / heads, got " + std::to_string(c.width / c.heads));
  }

  // The model: base rope_base, half-split, over the whole head dimension.
  template <class T>
  static std::vector<ModelTensor> model(PositionParams<T>& p, const SchemeModelConfig& c) {
    p.rope.base = kBase.value_in(c);
    return {};
  }

  // Its options other than tensors, each once: f(its SchemeOption, the member of each of pos...).
  template <class F, class... Params>
  static void for_each_option(F&& f, Params&... pos) {
    f(SchemeOption{.name = "rope_base", .member = "rope.base", .low = 1, .low_open = true}, pos.rope.base...);
    // 0 rotates the whole head (None in Python); d bounds it too (check).
    f(SchemeOption{.name = "rope_dims",
                   .member = "rope.rotary_dims",
                   .low = 2,
                   .even = true,
                   .zero_is_none = true,
                   .note = "rotates all of d"},
      pos.rope.rotary_dims...);
    f(SchemeOption{.name = "rope_style", .member = "rope.style", .choices = {"half_split", "interleaved"}},
      pos.rope.style...);
  }

  template <class T>
  static void check(const AttentionForward<T>& p) {
    using checks::fail;
    const RopeParams& r = p.pos.rope;
    const int64_t d = p.q.shape[3], rd = r.rotary_dims ? r.rotary_dims : d;
    if (rd % 2 != 0 || rd > d)  // rotary_dims given is even and >= 2 (its SchemeOption)
      fail("rope.rotary_dims: the rotated dimensions (RoPE's dims in Python) must be even, >= 2 and <= d=" +
           std::to_string(d) + ", got " + std::to_string(rd) + (r.rotary_dims ? "" : " (none given: the whole head)"));
  }

  // cos and sin of the angles of `count` consecutive positions from `first`,
  // (count, dims / 2), and the rotation of rows by them.
  template <class T>
  class Angles {
   public:
    // Position first + i advances every angle by f_a, so a row follows from
    // the one before by the angle-addition formulas in double; every
    // kAnchorRows-th row is computed exactly, which keeps the error near
    // 1e-15. A sine and a cosine per entry cost as much as the attention
    // itself at L = 512.
    Angles(int64_t first, int64_t count, const RopeParams& rope, int64_t d) : style_(rope.style), d_(d) {
      constexpr int64_t kAnchorRows = 32;
      const std::vector<double> f = rope_inv_freq(rope.rotary_dims ? rope.rotary_dims : d, rope.base);
      half_ = static_cast<int64_t>(f.size());
      cos_.resize(count * half_), sin_.resize(count * half_);
      std::vector<double> c(half_), s(half_), step_c(half_), step_s(half_);
      for (int64_t a = 0; a < half_; ++a) step_c[a] = std::cos(f[a]), step_s[a] = std::sin(f[a]);
      for (int64_t i = 0; i < count; ++i)
        for (int64_t a = 0; a < half_; ++a) {
          if (i % kAnchorRows == 0) {
            const double angle = double(first + i) * f[a];
            c[a] = std::cos(angle), s[a] = std::sin(angle);
          } else {
            const double c0 = c[a], s0 = s[a];
            c[a] = c0 * step_c[a] - s0 * step_s[a];
            s[a] = s0 * step_c[a] + c0 * step_s[a];
          }
          cos_[i * half_ + a] = T(c[a]), sin_[i * half_ + a] = T(s[a]);
        }
    }

    // Rotates row i of x (count rows of d) by its angles; direction -1 undoes it.
    void rotate(T* x, int direction) const {
      const int64_t count = half_ ? static_cast<int64_t>(cos_.size()) / half_ : 0;
      for (int64_t i = 0; i < count; ++i) {
        T* row = x + i * d_;
        if (style_ == RopeStyle::half_split) {  // pairs (a, a + half): contiguous halves
          rows::rotate_pairs(row, row + half_, &cos_[i * half_], &sin_[i * half_], T(direction), half_);
          continue;
        }
        for (int64_t a = 0; a < half_; ++a) {
          const auto [u, w] = rope_pair(a, 2 * half_, style_);
          const T c = cos_[i * half_ + a], s = direction * sin_[i * half_ + a];
          const T x1 = row[u], x2 = row[w];
          row[u] = x1 * c - x2 * s;
          row[w] = x2 * c + x1 * s;
        }
      }
    }

   private:
    RopeStyle style_;
    int64_t d_, half_ = 0;
    Scratch<T> cos_, sin_;
  };

  template <class T>
  class Rotation final : public PositionRotation<T> {
   public:
    explicit Rotation(const AttentionForward<T>& p)
        : q_(p.q_offset, p.q.shape[2], p.pos.rope, p.q.shape[3]), k_(p.k_offset, p.k.shape[2], p.pos.rope, p.k.shape[3]) {}
    void queries(T* rows, int direction) const override { q_.rotate(rows, direction); }
    void keys(T* rows, int direction) const override { k_.rotate(rows, direction); }

   private:
    Angles<T> q_, k_;
  };
};

template <>
struct SchemeOf<Scheme::rope> : std::type_identity<RopeScheme> {};

}  // namespace relpos
