// Transformer-XL (Dai et al. 2019): a content bias u added to the query, and a
// per-distance key embedding W_R R(-r) (R the sinusoid, clamped at clamp_len)
// read by q + v. Memory is expressed by the offsets.
#pragma once

#include "checks.hpp"
#include "scheme.hpp"

namespace relpos {

struct XLScheme {
  static constexpr Scheme id = Scheme::xl;
  static constexpr const char* name = "xl";
  static constexpr AlgorithmSet algorithms = {Algorithm::reference, Algorithm::generalized_skew, Algorithm::relshift,
                                              Algorithm::fused};

  template <class Params, class F, class... Grads>
  static void for_each_param(Params& pos, F&& f, Grads&... g) {
    f("xl_u", pos.xl.u, g.xl_u...);
    f("xl_v", pos.xl.v, g.xl_v...);
    f("xl_w_r", pos.xl.w_r, g.xl_w_r...);
  }

  // The model: u, v shared by all layers, W_R per layer, a sinusoid of size
  // width; no absolute embeddings.
  template <class T>
  static std::vector<ModelTensor> model(PositionParams<T>&, const nn::ModelConfig& c) {
    const int64_t dh = c.width / c.heads;
    return {{"xl_u", {c.heads, dh}, true}, {"xl_v", {c.heads, dh}, true}, {"xl_w_r", {c.heads, dh, c.width}}};
  }

  template <class T>
  static void check(const AttentionForward<T>& p) {
    using namespace checks;
    const XLParams<T>& x = p.pos.xl;
    const int64_t H = p.q.shape[1], d = p.q.shape[3];
    const std::string hd = "(" + dims("H", H) + ", " + dims("d", d) + ")";
    check_shape("xl.u", x.u, {H, d}, hd);
    check_shape("xl.v", x.v, {H, d}, hd);
    check_shape("xl.w_r", x.w_r, {H, d, -1}, "(" + dims("H", H) + ", " + dims("d", d) + ", pos_dim)");
    if (x.w_r.shape[2] % 2 != 0) fail("xl.w_r: pos_dim (last dimension) must be even for [sin, cos]");
    if (x.clamp_len < 0 || x.clamp_len > kMaxPosition) fail("xl.clamp_len: must be in [0, 2^40] (0 = unclamped)");
  }
};

}  // namespace relpos
