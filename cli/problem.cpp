#include "problem.hpp"

#include <algorithm>
#include <cmath>
#include <random>
#include <type_traits>

#include "../src/schemes/registry.hpp"
#include "measure.hpp"

namespace relpos::cli {

std::vector<SchemeCase> cases_of_every_scheme(const std::vector<SchemeCase>& variants) {
  std::vector<SchemeCase> cases;
  AllSchemes::for_each([&](auto scheme) {
    using S = decltype(scheme);
    if constexpr (!ModelScheme<S>) return;  // positions on a grid: the test suite's, bench/sam.py's
    const size_t before = cases.size();
    for (const SchemeCase& c : variants)
      if (c.scheme == S::id) cases.push_back(c);
    if (cases.size() == before) cases.push_back(SchemeCase{S::name, S::id});
  });
  return cases;
}

std::vector<std::string> scheme_name_list(bool on_a_line) {
  std::vector<std::string> names;
  AllSchemes::for_each([&](auto scheme) {
    if (!on_a_line || ModelScheme<decltype(scheme)>) names.push_back(decltype(scheme)::name);
  });
  return names;
}

std::string scheme_names(bool on_a_line) {
  std::string names;
  for (const std::string& name : scheme_name_list(on_a_line)) names += (names.empty() ? "" : ", ") + name;
  return names;
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

namespace {

// Transformer-XL memory keys before the queries.
int64_t memory_keys(const ProblemShape& s, const SchemeCase& c) { return c.mem_len < 0 ? s.length / 2 : c.mem_len; }

// The scheme's tables as the byte-level model holds them (shapes for H heads
// of dimension d; kMaxHeads x kMaxDim fits the config's int width), with the
// scheme's options set in pos.
template <class T>
std::vector<ModelTensor> scheme_tables(const ProblemShape& s, const SchemeCase& c, PositionParams<T>& pos) {
  SchemeModelConfig model;
  model.heads = int(s.heads), model.width = int(s.heads * s.dim);
  model.scheme_options[ShawScheme::kClip.key] = double(c.shaw_k);
  std::vector<ModelTensor> tensors;
  AllSchemes::visit(c.scheme, [&](auto scheme) {
    if constexpr (ModelScheme<decltype(scheme)>) tensors = decltype(scheme)::model(pos, model);
  });
  pos.scheme = c.scheme;
  pos.shaw.beyond = c.beyond;
  pos.t5.bidirectional = c.t5_bidirectional;
  pos.rope.style = c.rope_style;
  return tensors;
}

// A problem's buffers and the views of its params into them. `place(buffer,
// size)` gives each buffer its size and returns the data its views point to:
// make_problem allocates; shaped_problem allocates nothing and points every
// view at one element no one reads, for the library's estimates and checks
// of algorithms, which read shapes only.
template <class T, class Place>
Problem<T> laid_out(const ProblemShape& s, const SchemeCase& c, std::vector<ModelTensor>& tensors, Place&& place) {
  Problem<T> pb;
  const int64_t B = s.batch, H = s.heads, L = s.length, d = s.dim, mem = memory_keys(s, c), Lk = L + mem;
  AttentionBackward<T>& p = pb.params;
  const auto view4 = [&](std::vector<T>& buffer, int64_t rows) {
    return View4<T>::contiguous(place(buffer, B * H * rows * d), {B, H, rows, d});
  };
  p.q = view4(pb.q, L);
  p.k = view4(pb.k, Lk);
  p.v = view4(pb.v, Lk);
  p.dout = view4(pb.dout, L);
  p.out = view4(pb.out, L);
  p.lse = View3<compute_t<T>>::contiguous(place(pb.lse, B * H * L), {B, H, L});
  p.dq = view4(pb.dq, L);
  p.dk = view4(pb.dk, Lk);
  p.dv = view4(pb.dv, Lk);
  p.causal = s.causal;
  p.q_offset = mem;  // memory keys sit before the queries
  tensors = scheme_tables(s, c, p.pos);
  pb.tables.resize(tensors.size());
  pb.dtables.resize(tensors.size());
  // Binds each table (and its gradient) to the scheme's member of that name.
  for_each_model_tensor(
      tensors, p.pos,
      [&](size_t i, auto& view, auto& grad) {
        tensors[i].bind(view, place(pb.tables[i], tensors[i].size()));
        tensors[i].bind(grad, place(pb.dtables[i], tensors[i].size()));
      },
      p.dpos);
  return pb;
}

// Whether the views of make_problem(s, c) can be shaped: View::contiguous
// multiplies each view's extents in int64 (the tables' stay far below with
// kMaxHeads and kMaxDim). Where they cannot, the buffers could never be
// allocated, and problem_bytes, far beyond any machine's memory, says so.
bool shapes_fit_int64(const ProblemShape& s, const SchemeCase& c) {
  return double(s.batch) * double(s.heads) * double(s.length + memory_keys(s, c)) * double(s.dim) <= 0x1p62;
}

// The element every view of a shaped problem points at.
template <class E>
E* unread_element() {
  static E element{};
  return &element;
}

template <class T>
Problem<T> shaped_problem(const ProblemShape& s, const SchemeCase& c) {
  std::vector<ModelTensor> tensors;
  return laid_out<T>(s, c, tensors, [](auto& buffer, int64_t) {
    return unread_element<typename std::remove_reference_t<decltype(buffer)>::value_type>();
  });
}

}  // namespace

template <class T>
Problem<T> make_problem(const ProblemShape& s, const SchemeCase& c, uint64_t seed) {
  std::vector<ModelTensor> tensors;
  Problem<T> pb = laid_out<T>(s, c, tensors, [](auto& buffer, int64_t size) {
    buffer.resize(size_t(size));  // zeroes: out, lse and the gradients start so
    return buffer.data();
  });
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> normal(0.0, 1.0);
  auto fill = [&](std::vector<T>& buf, double sd) {
    for (T& x : buf) x = static_cast<T>(static_cast<float>(sd * normal(rng)));
  };
  for (std::vector<T>* input : {&pb.q, &pb.k, &pb.v, &pb.dout}) fill(*input, 1.0);
  // Bounded tables (KERPLE's) get values in [0.5, 1.5] clamped to their
  // bounds, the others normal(0, 1/sqrt(last dimension)).
  std::uniform_real_distribution<double> unit(0.0, 1.0);
  for (size_t i = 0; i < tensors.size(); ++i) {
    const ModelTensor& t = tensors[i];
    fill(pb.tables[i], 1.0 / std::sqrt(double(t.shape.back())));
    if (t.bounded())
      for (T& x : pb.tables[i]) x = static_cast<T>(static_cast<float>(std::clamp(0.5 + unit(rng), t.floor, t.ceiling)));
  }
  return pb;
}

template <class T>
double problem_bytes(const ProblemShape& s, const SchemeCase& c) {
  const double heads = double(s.batch) * double(s.heads), L = double(s.length), d = double(s.dim);
  const double Lk = L + double(memory_keys(s, c));
  PositionParams<T> pos;
  double tables = 0;
  for (const ModelTensor& t : scheme_tables(s, c, pos)) tables += double(t.size());
  // q, dout, out, dq; k, v, dk, dv; the tables and their gradients; lse.
  return double(sizeof(T)) * (4 * heads * (L + Lk) * d + 2 * tables) + double(sizeof(compute_t<T>)) * heads * L;
}

template <class T>
std::vector<Algorithm> serving_algorithms(const ProblemShape& s, const SchemeCase& c) {
  if (!shapes_fit_int64(s, c)) return {};
  return serving_algorithms<T>(shaped_problem<T>(s, c).params);
}

template <class T>
double scratch_bytes(const ProblemShape& s, const SchemeCase& c, const std::vector<Algorithm>& algorithms,
                     int threads) {
  if (!shapes_fit_int64(s, c)) return 0;
  Problem<T> shaped = shaped_problem<T>(s, c);
  shaped.params.num_threads = threads;
  double most = 0;
  for (Algorithm a : algorithms) {
    shaped.params.algorithm = a;
    most = std::max(most, estimated_scratch_bytes<T>(shaped.params));
  }
  return most;
}

#define RELPOS_INSTANTIATE(T)                                                                               \
  template struct Problem<T>;                                                                               \
  template Problem<T> make_problem<T>(const ProblemShape&, const SchemeCase&, uint64_t);                     \
  template double problem_bytes<T>(const ProblemShape&, const SchemeCase&);                                  \
  template std::vector<Algorithm> serving_algorithms<T>(const ProblemShape&, const SchemeCase&);             \
  template double scratch_bytes<T>(const ProblemShape&, const SchemeCase&, const std::vector<Algorithm>&, int);
RELPOS_INSTANTIATE(float)
RELPOS_INSTANTIATE(double)
RELPOS_INSTANTIATE(bfloat16)
RELPOS_INSTANTIATE(float16)
#undef RELPOS_INSTANTIATE

}  // namespace relpos::cli
