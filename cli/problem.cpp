#include "problem.hpp"

#include <algorithm>
#include <random>
#include <tuple>

namespace relpos::cli {

std::vector<SchemeCase> check_cases() {
  std::vector<SchemeCase> cases;
  auto add = [&](std::string label, Scheme s) -> SchemeCase& {
    cases.push_back(SchemeCase{});
    cases.back().label = std::move(label);
    cases.back().scheme = s;
    return cases.back();
  };
  add("none", Scheme::none);
  add("shaw k=16 K+V", Scheme::shaw);
  add("shaw k=16 K+V beyond=zero", Scheme::shaw).beyond = Beyond::zero;
  add("t5 causal buckets", Scheme::t5);
  add("t5 bidirectional", Scheme::t5).t5_bidirectional = true;
  add("alibi", Scheme::alibi);
  add("rope half-split", Scheme::rope);
  add("rope interleaved", Scheme::rope).rope_style = RopeStyle::interleaved;
  add("transformer-xl mem=L/2", Scheme::xl).mem_len = -1;  // resolved to length/2
  add("kerple", Scheme::kerple);
  return cases;
}

namespace {

template <class T>
View4<T> view4(std::vector<T>& buf, int64_t b, int64_t h, int64_t l, int64_t d) {
  buf.resize(b * h * l * d);
  return View4<T>::contiguous(buf.data(), {b, h, l, d});
}

}  // namespace

template <class T>
void Problem<T>::clear_grads() {
  for (std::vector<T>* g : {&dq, &dk, &dv, &dwk, &dwv, &dt5_table, &du, &dxv, &dw_r, &dkerple_r1, &dkerple_r2})
    std::fill(g->begin(), g->end(), T(0.0f));
}

template <class T>
std::vector<const std::vector<T>*> Problem<T>::grads() const {
  return {&dq, &dk, &dv, &dwk, &dwv, &dt5_table, &du, &dxv, &dw_r, &dkerple_r1, &dkerple_r2};
}

template <class T>
std::vector<std::vector<T>*> Problem<T>::inputs() {
  return {&q, &k, &v, &dout, &wk, &wv, &t5_table, &u, &xv, &w_r, &kerple_r1, &kerple_r2};
}

template <class T>
Problem<T> make_problem(const ProblemShape& s, const SchemeCase& c, uint64_t seed) {
  Problem<T> pb;
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> normal(0.0, 1.0);
  auto fill = [&](std::vector<T>& buf, size_t n, double sd) {
    buf.resize(n);
    for (T& x : buf) x = static_cast<T>(static_cast<float>(sd * normal(rng)));
  };
  const int64_t B = s.batch, H = s.heads, L = s.length, d = s.dim;
  const int64_t mem = c.mem_len < 0 ? L / 2 : c.mem_len;
  const int64_t Lk = L + mem;
  AttentionBackward<T>& p = pb.params;
  fill(pb.q, B * H * L * d, 1.0);
  fill(pb.k, B * H * Lk * d, 1.0);
  fill(pb.v, B * H * Lk * d, 1.0);
  fill(pb.dout, B * H * L * d, 1.0);
  p.q = view4(pb.q, B, H, L, d);
  p.k = view4(pb.k, B, H, Lk, d);
  p.v = view4(pb.v, B, H, Lk, d);
  p.dout = view4(pb.dout, B, H, L, d);
  p.out = view4(pb.out, B, H, L, d);
  pb.lse.resize(B * H * L);
  p.lse = View3<compute_t<T>>::contiguous(pb.lse.data(), {B, H, L});
  p.dq = view4(pb.dq, B, H, L, d);
  p.dk = view4(pb.dk, B, H, Lk, d);
  p.dv = view4(pb.dv, B, H, Lk, d);
  p.causal = s.causal;
  p.q_offset = mem;  // memory keys sit before the queries

  PositionParams<T>& pos = p.pos;
  PositionGrads<T>& g = p.dpos;
  pos.scheme = c.scheme;
  auto param = [&](std::vector<T>& w, std::vector<T>& dw, auto shape, double sd) {
    using V = View<T, std::tuple_size_v<decltype(shape)>>;
    int64_t n = 1;
    for (int64_t e : shape) n *= e;
    fill(w, n, sd);
    dw.assign(n, T(0.0f));
    return std::pair{V::contiguous(w.data(), shape), V::contiguous(dw.data(), shape)};
  };
  switch (c.scheme) {
    case Scheme::shaw: {
      pos.shaw.k = c.shaw_k;
      pos.shaw.beyond = c.beyond;
      const std::array<int64_t, 3> table{1, 2 * c.shaw_k + 1, d};
      std::tie(pos.shaw.wk, g.shaw_wk) = param(pb.wk, pb.dwk, table, 0.5);
      std::tie(pos.shaw.wv, g.shaw_wv) = param(pb.wv, pb.dwv, table, 0.5);
      break;
    }
    case Scheme::t5:
      pos.t5.bidirectional = c.t5_bidirectional;
      std::tie(pos.t5.table, g.t5_table) = param(pb.t5_table, pb.dt5_table, std::array<int64_t, 2>{H, 32}, 1.0);
      break;
    case Scheme::rope:
      pos.rope.style = c.rope_style;
      break;
    case Scheme::xl:
      std::tie(pos.xl.u, g.xl_u) = param(pb.u, pb.du, std::array<int64_t, 2>{H, d}, 0.5);
      std::tie(pos.xl.v, g.xl_v) = param(pb.xv, pb.dxv, std::array<int64_t, 2>{H, d}, 0.5);
      std::tie(pos.xl.w_r, g.xl_w_r) = param(pb.w_r, pb.dw_r, std::array<int64_t, 3>{H, d, d}, 0.1);
      break;
    case Scheme::kerple: {  // r1 in (0.5, 1.5), r2 in (0.25, 0.75): positive, as KERPLE requires
      const std::array<int64_t, 1> heads{H};
      std::tie(pos.kerple.r1, g.kerple_r1) = param(pb.kerple_r1, pb.dkerple_r1, heads, 0.0);
      std::tie(pos.kerple.r2, g.kerple_r2) = param(pb.kerple_r2, pb.dkerple_r2, heads, 0.0);
      for (int64_t h = 0; h < H; ++h)
        pb.kerple_r1[h] = T(0.5 + double(h % 4) / 4), pb.kerple_r2[h] = T(0.25 + double(h % 3) / 4);
      break;
    }
    case Scheme::none:
    case Scheme::alibi:
      break;
  }
  return pb;
}

#define RELPOS_INSTANTIATE(T) \
  template struct Problem<T>; \
  template Problem<T> make_problem<T>(const ProblemShape&, const SchemeCase&, uint64_t);
RELPOS_INSTANTIATE(float)
RELPOS_INSTANTIATE(double)
RELPOS_INSTANTIATE(bfloat16)
RELPOS_INSTANTIATE(float16)
#undef RELPOS_INSTANTIATE

}  // namespace relpos::cli
