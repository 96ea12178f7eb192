#include "problem.hpp"

#include <algorithm>
#include <cmath>
#include <random>

#include "../src/schemes/registry.hpp"

namespace relpos::cli {

std::vector<SchemeCase> cases_of_every_scheme(const std::vector<SchemeCase>& variants) {
  std::vector<SchemeCase> cases;
  AllSchemes::for_each([&](auto scheme) {
    using S = decltype(scheme);
    const size_t before = cases.size();
    for (const SchemeCase& c : variants)
      if (c.scheme == S::id) cases.push_back(c);
    if (cases.size() == before) cases.push_back(SchemeCase{S::name, S::id});
  });
  return cases;
}

std::vector<SchemeCase> check_cases() {
  std::vector<SchemeCase> variants;
  auto add = [&](std::string label, Scheme s) -> SchemeCase& {
    variants.push_back(SchemeCase{std::move(label), s});
    return variants.back();
  };
  add("shaw k=16 K+V", Scheme::shaw);
  add("shaw k=16 K+V beyond=zero", Scheme::shaw).beyond = Beyond::zero;
  add("t5 causal buckets", Scheme::t5);
  add("t5 bidirectional", Scheme::t5).t5_bidirectional = true;
  add("rope half-split", Scheme::rope);
  add("rope interleaved", Scheme::rope).rope_style = RopeStyle::interleaved;
  add("transformer-xl mem=L/2", Scheme::xl).mem_len = -1;  // resolved to length/2
  return cases_of_every_scheme(variants);
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
  for (std::vector<T>* g : {&dq, &dk, &dv}) std::fill(g->begin(), g->end(), T(0.0f));
  for (std::vector<T>& g : dtables) std::fill(g.begin(), g.end(), T(0.0f));
}

template <class T>
std::vector<const std::vector<T>*> Problem<T>::grads() const {
  std::vector<const std::vector<T>*> all = {&dq, &dk, &dv};
  for (const std::vector<T>& g : dtables) all.push_back(&g);
  return all;
}

template <class T>
std::vector<std::vector<T>*> Problem<T>::inputs() {
  std::vector<std::vector<T>*> all = {&q, &k, &v, &dout};
  for (std::vector<T>& t : tables) all.push_back(&t);
  return all;
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

  // The scheme's tables as the byte-level model holds them (shapes for H
  // heads of dimension d), then the case's options. Bounded tables (KERPLE's)
  // get values in [0.5, 1.5] clamped to their bounds, the others
  // normal(0, 1/sqrt(last dimension)).
  PositionParams<T>& pos = p.pos;
  nn::ModelConfig model;
  model.heads = int(H), model.width = int(H * d), model.shaw_k = int(c.shaw_k);
  std::vector<ModelTensor> tensors;
  AllSchemes::visit(c.scheme, [&](auto scheme) { tensors = decltype(scheme)::model(pos, model); });
  pos.scheme = c.scheme;
  pos.shaw.beyond = c.beyond;
  pos.t5.bidirectional = c.t5_bidirectional;
  pos.rope.style = c.rope_style;
  pb.tables.resize(tensors.size());
  pb.dtables.resize(tensors.size());
  std::uniform_real_distribution<double> unit(0.0, 1.0);
  for (size_t i = 0; i < tensors.size(); ++i) {
    const ModelTensor& t = tensors[i];
    const int64_t n = t.size();
    fill(pb.tables[i], n, 1.0 / std::sqrt(double(t.shape.back())));
    if (t.bounded())
      for (T& x : pb.tables[i]) x = static_cast<T>(static_cast<float>(std::clamp(0.5 + unit(rng), t.floor, t.ceiling)));
    pb.dtables[i].assign(n, T(0.0f));
  }
  // Binds each table (and its gradient) to the scheme's member of that name.
  for_each_model_tensor(
      tensors, pos,
      [&](size_t i, auto& view, auto& grad) {
        tensors[i].bind(view, pb.tables[i].data());
        tensors[i].bind(grad, pb.dtables[i].data());
      },
      p.dpos);
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
