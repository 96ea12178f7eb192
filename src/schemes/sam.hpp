// SAM's decomposed relative positions (Li et al. 2022, "Exploring Plain Vision
// Transformer Backbones"; SAM, ViTDet, MViTv2): queries and keys on grids, the
// logit of (i, j) gains q_i . rel_h[y(i, j)] + q_i . rel_w[x(i, j)], unscaled,
// with each axis's offset index as SAM's get_rel_pos takes it (the shorter of
// two different grids scaled: grid_offset_index). Tables shared by the heads.
#pragma once

#include "checks.hpp"
#include "scheme.hpp"

namespace relpos {

struct SamScheme {
  static constexpr Scheme id = Scheme::sam;
  static constexpr const char* name = "sam";
  static constexpr AlgorithmSet algorithms = {Algorithm::reference, Algorithm::fused};

  template <class Params, class F, class... Grads>
  static void for_each_param(Params& pos, F&& f, Grads&... g) {
    f("sam_rel_h", pos.sam.rel_h, g.sam_rel_h...);
    f("sam_rel_w", pos.sam.rel_w, g.sam_rel_w...);
  }

  template <class F, class... Params>
  static void for_each_option(F&& f, Params&... pos) {
    constexpr double kMaxCells = double(int64_t(1) << 20);  // per axis: SAM's 64, a grid far past any image's
    f(SchemeOption{.name = "sam_q_height", .member = "sam.q_height", .low = 1, .high = kMaxCells}, pos.sam.q_height...);
    f(SchemeOption{.name = "sam_q_width", .member = "sam.q_width", .low = 1, .high = kMaxCells}, pos.sam.q_width...);
    f(SchemeOption{.name = "sam_k_height",
                   .member = "sam.k_height",
                   .low = 1,
                   .high = kMaxCells,
                   .zero_is_none = true,
                   .note = "the query grid's"},
      pos.sam.k_height...);
    f(SchemeOption{.name = "sam_k_width",
                   .member = "sam.k_width",
                   .low = 1,
                   .high = kMaxCells,
                   .zero_is_none = true,
                   .note = "the query grid's"},
      pos.sam.k_width...);
  }

  template <class T>
  static GridShape grid_shape(const AttentionForward<T>& p) {
    const SamParams<T>& s = p.pos.sam;
    return {s.q_height, s.q_width, s.k_height ? s.k_height : s.q_height, s.k_width ? s.k_width : s.q_width};
  }

  template <class T>
  static void check(const AttentionForward<T>& p) {
    using namespace checks;
    const GridShape g = grid_shape(p);
    check_grid(p, g, "sam.q_height x sam.q_width", "sam.k_height x sam.k_width");
    const int64_t d = p.q.shape[3];
    check_shape("sam.rel_h", p.pos.sam.rel_h, {g.rows_y(), d},
                "(" + dims("2 max(q_height, k_height) - 1", g.rows_y()) + ", " + dims("d", d) + ")");
    check_shape("sam.rel_w", p.pos.sam.rel_w, {g.rows_x(), d},
                "(" + dims("2 max(q_width, k_width) - 1", g.rows_x()) + ", " + dims("d", d) + ")");
  }

  template <class T>
  class GridEmbedding final : public relpos::GridEmbedding<T> {
   public:
    explicit GridEmbedding(const AttentionForward<T>& p)
        : relpos::GridEmbedding<T>(grid_shape(p)), rel_h_(p.pos.sam.rel_h), rel_w_(p.pos.sam.rel_w) {}
    void tables(T* ryx) const override {
      const int64_t d = rel_h_.shape[1], ny = rel_h_.shape[0];
      for (int64_t r = 0; r < ny; ++r)
        for (int64_t x = 0; x < d; ++x) ryx[r * d + x] = rel_h_(r, x);
      for (int64_t r = 0; r < rel_w_.shape[0]; ++r)
        for (int64_t x = 0; x < d; ++x) ryx[(ny + r) * d + x] = rel_w_(r, x);
    }
    bool wants_grad(const PositionGrads<T>& g) const override { return !g.sam_rel_h.empty() || !g.sam_rel_w.empty(); }
    void add_grad(const PositionGrads<T>& g, const T* dryx) const override {
      const int64_t d = rel_h_.shape[1], ny = rel_h_.shape[0];
      if (!g.sam_rel_h.empty())
        for (int64_t r = 0; r < ny; ++r)
          for (int64_t x = 0; x < d; ++x) g.sam_rel_h(r, x) += dryx[r * d + x];
      if (!g.sam_rel_w.empty())
        for (int64_t r = 0; r < rel_w_.shape[0]; ++r)
          for (int64_t x = 0; x < d; ++x) g.sam_rel_w(r, x) += dryx[(ny + r) * d + x];
    }

   private:
    View2<const T> rel_h_, rel_w_;
  };
};

template <>
struct SchemeOf<Scheme::sam> : std::type_identity<SamScheme> {};

}  // namespace relpos
