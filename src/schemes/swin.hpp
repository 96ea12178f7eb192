// Swin's relative position bias (Liu et al. 2021): queries and keys on one
// window's grid (window_height x window_width cells; windows are batch
// entries, as Swin lays them out), the logit of (i, j) gains table[h, y (2 ww
// - 1) + x], y = yi - yj + wh - 1 and x = xi - xj + ww - 1 (Swin's
// relative_position_index; grid_offset_index of equal grids).
#pragma once

#include "checks.hpp"
#include "scheme.hpp"

namespace relpos {

struct SwinScheme {
  static constexpr Scheme id = Scheme::swin;
  static constexpr const char* name = "swin";
  static constexpr AlgorithmSet algorithms = {Algorithm::reference, Algorithm::fused};

  template <class Params, class F, class... Grads>
  static void for_each_param(Params& pos, F&& f, Grads&... g) {
    f("swin_table", pos.swin.table, g.swin_table...);
  }

  template <class F, class... Params>
  static void for_each_option(F&& f, Params&... pos) {
    constexpr double kMaxCells = double(int64_t(1) << 20);
    f(SchemeOption{.name = "swin_window_height", .member = "swin.window_height", .low = 1, .high = kMaxCells},
      pos.swin.window_height...);
    f(SchemeOption{.name = "swin_window_width", .member = "swin.window_width", .low = 1, .high = kMaxCells},
      pos.swin.window_width...);
  }

  template <class T>
  static GridShape grid_shape(const AttentionForward<T>& p) {
    const SwinParams<T>& s = p.pos.swin;
    return {s.window_height, s.window_width, s.window_height, s.window_width};
  }

  template <class T>
  static void check(const AttentionForward<T>& p) {
    using namespace checks;
    const GridShape g = grid_shape(p);
    check_grid(p, g, "swin.window_height x swin.window_width", "swin.window_height x swin.window_width");
    const int64_t H = p.q.shape[1], offsets = g.rows_y() * g.rows_x();
    check_shape("swin.table", p.pos.swin.table, {H, offsets},
                "(" + dims("H", H) + ", " + dims("(2 window_height - 1)(2 window_width - 1)", offsets) + ")");
  }

  template <class T>
  class GridBias final : public relpos::GridBias<T> {
   public:
    explicit GridBias(const AttentionForward<T>& p) : relpos::GridBias<T>(grid_shape(p)), table_(p.pos.swin.table) {}
    void values(int64_t h, T* table) const override {
      for (int64_t n = 0; n < table_.shape[1]; ++n) table[n] = table_(h, n);
    }
    bool wants_grad(const PositionGrads<T>& g) const override { return !g.swin_table.empty(); }
    void add_grad(const PositionGrads<T>& g, int64_t h, const T* dtable) const override {
      if (g.swin_table.empty()) return;
      for (int64_t n = 0; n < table_.shape[1]; ++n) g.swin_table(h, n) += dtable[n];
    }

   private:
    View2<const T> table_;
  };
};

template <>
struct SchemeOf<Scheme::swin> : std::type_identity<SwinScheme> {};

}  // namespace relpos
