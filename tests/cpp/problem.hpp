// One generic builder of random attention problems for every position scheme,
// in float or double, shared by every test file.
//
// A Spec describes a problem (shapes, layout, mask, offsets, scale, scheme and
// its parameters); Problem<T> owns the memory, fills it from a seeded RNG and
// hands out the AttentionForward / AttentionBackward argument structs. The RNG
// draws every value in double in one fixed order, so Problem<float> and
// Problem<double> of one Spec hold the same numbers up to float rounding, and a
// dense and a strided Problem of one Spec hold exactly the same numbers.
#pragma once

#include <gtest/gtest.h>

#include <array>
#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <optional>
#include <ostream>
#include <random>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "relpos/attention.hpp"

namespace relpos_test {

using relpos::Beyond;
using relpos::RopeStyle;
using relpos::Scheme;
using relpos::View;

// How the logical (B, H, L, D) tensors are laid out in memory. `strided` stores
// them as (B, L, H, D) with one unused element after every innermost run (a
// slice of a larger buffer); tables are stored transposed in the same way.
enum class Layout { dense, strided };

// Masks of the problem. padding masks key j of batch b when (j + b) % 3 == 2;
// all_keys_of_batch0 pads every key of batch 0 (fully masked rows) and uses the
// ordinary pattern for the other batches.
enum class MaskKind { none, causal, padding, causal_padding, all_keys_of_batch0 };

enum class ShawTables { k_and_v, k_only, v_only };

struct Spec {
  std::string label = "problem";  // readable, unique among a list of cases
  Scheme scheme = Scheme::none;
  int64_t B = 2, H = 3, Lq = 4, Lk = 4, d = 6, dv = 3;
  Layout layout = Layout::dense;
  MaskKind mask = MaskKind::none;
  int64_t q_offset = 0, k_offset = 0;
  std::optional<double> scale;  // empty = the library default 1/sqrt(d)
  // Shaw
  int64_t shaw_k = 2;
  Beyond shaw_beyond = Beyond::clip;
  bool shaw_wk_per_head = false, shaw_wv_per_head = false;  // tables (H, ...) instead of (1, ...)
  ShawTables shaw_tables = ShawTables::k_and_v;
  // T5
  bool t5_bidirectional = true;
  int64_t t5_num_buckets = 10, t5_max_distance = 6;
  // ALiBi
  bool alibi_explicit_slopes = false;
  // RoPE
  relpos::RopeParams rope;
  // Transformer-XL
  int64_t xl_pos_dim = 4, xl_clamp_len = 0;
  // DeBERTa: log buckets past |r| = 2 (span 4, 8 table rows) by default
  int64_t deberta_position_buckets = 4, deberta_max_relative_positions = 8;
  bool deberta_c2p = true, deberta_p2c = true, deberta_per_head = false;
  // Segments: query and key rows at absolute position pos of batch row b lie in
  // segment (pos + b) / segment_length (packed documents); 0 = no segments.
  int64_t segment_length = 0;
  // Positions on a grid (SAM's query and key grids; Swin's window is the query grid)
  int64_t grid_qh = 0, grid_qw = 0, grid_kh = 0, grid_kw = 0;  // key grid 0: the query grid's
  uint64_t seed = 1;
  // Attention dropout (relpos/dropout.hpp); p = 0: none.
  relpos::AttentionDropout dropout;
  // How the library computes it (every algorithm must give the reference's
  // result, with any number of threads; 0 = OpenMP's maximum).
  relpos::Algorithm algorithm = relpos::Algorithm::automatic;
  int num_threads = 0;

  bool causal() const { return mask == MaskKind::causal || mask == MaskKind::causal_padding; }
  bool has_padding() const {
    return mask == MaskKind::padding || mask == MaskKind::causal_padding || mask == MaskKind::all_keys_of_batch0;
  }
  bool padded(int64_t b, int64_t j) const {
    if (!has_padding()) return false;
    if (mask == MaskKind::all_keys_of_batch0 && b == 0) return true;
    return (j + b) % 3 == 2;
  }
  bool has_wk() const { return scheme == Scheme::shaw && shaw_tables != ShawTables::v_only; }
  bool has_wv() const { return scheme == Scheme::shaw && shaw_tables != ShawTables::k_only; }
  int64_t deberta_span() const {
    return deberta_position_buckets > 0 ? deberta_position_buckets : deberta_max_relative_positions;
  }
  int64_t segment(int64_t b, int64_t pos) const { return (pos + b) / segment_length; }
  int64_t key_grid_h() const { return grid_kh ? grid_kh : grid_qh; }
  int64_t key_grid_w() const { return grid_kw ? grid_kw : grid_qw; }
};

inline void PrintTo(const Spec& s, std::ostream* os) { *os << s.label; }

// ---- owning strided tensors -------------------------------------------------

template <class T, std::size_t N>
class Tensor {
 public:
  Tensor() = default;

  Tensor(std::array<int64_t, N> shape, Layout layout) {
    std::array<std::size_t, N> order;  // storage order of the logical dimensions, outermost first
    for (std::size_t a = 0; a < N; ++a) order[a] = a;
    int64_t pad = 0;
    if (layout == Layout::strided) {
      if constexpr (N >= 3) std::swap(order[1], order[2]);
      if constexpr (N == 2) std::swap(order[0], order[1]);
      pad = 1;
    }
    int64_t size = 1;
    for (std::size_t a = N; a-- > 0;) {
      view_.stride[order[a]] = size;
      size *= shape[order[a]] + (a == N - 1 ? pad : 0);
    }
    // Floating buffers start as NaN: an unwritten output or a read of padding shows.
    if constexpr (relpos::is_half_v<T>)
      storage_.assign(size, T(std::numeric_limits<float>::quiet_NaN()));
    else
      storage_.assign(size, std::is_floating_point_v<T> ? std::numeric_limits<T>::quiet_NaN() : T{});
    view_.shape = shape;
    view_.data = storage_.data();
  }

  Tensor(const Tensor& o) : storage_(o.storage_), view_(o.view_) { rebase(); }
  Tensor& operator=(const Tensor& o) {
    storage_ = o.storage_;
    view_ = o.view_;
    rebase();
    return *this;
  }
  Tensor(Tensor&&) noexcept = default;
  Tensor& operator=(Tensor&&) noexcept = default;

  bool empty() const { return storage_.empty(); }
  const std::array<int64_t, N>& shape() const { return view_.shape; }
  View<T, N> view() { return empty() ? View<T, N>{} : view_; }
  View<const T, N> cview() const {
    return empty() ? View<const T, N>{} : View<const T, N>{view_.data, view_.shape, view_.stride};
  }

  template <class... I>
  T& operator()(I... idx) {
    return view_(idx...);
  }
  template <class... I>
  const T& operator()(I... idx) const {
    return view_(idx...);
  }

  // Pointers to every logical element, in row-major logical order.
  std::vector<T*> elements() {
    std::vector<T*> out;
    if (empty()) return out;
    std::array<int64_t, N> ix{};
    for (int64_t n = 0; n < view_.numel(); ++n) {
      int64_t off = 0;
      for (std::size_t a = 0; a < N; ++a) off += ix[a] * view_.stride[a];
      out.push_back(view_.data + off);
      for (std::size_t a = N; a-- > 0;) {  // odometer increment
        if (++ix[a] < view_.shape[a]) break;
        ix[a] = 0;
      }
    }
    return out;
  }
  std::vector<double> values() const {
    std::vector<double> out;
    for (T* e : const_cast<Tensor*>(this)->elements()) out.push_back(static_cast<double>(*e));
    return out;
  }
  void fill(T value) {
    for (T* e : elements()) *e = value;
  }
  // True when no storage slot outside the logical elements was written.
  bool padding_untouched() {
    std::vector<char> is_element(storage_.size(), 0);
    for (T* e : elements()) is_element[e - storage_.data()] = 1;
    for (std::size_t n = 0; n < storage_.size(); ++n)
      if (!is_element[n] && !std::isnan(static_cast<double>(storage_[n]))) return false;
    return true;
  }

 private:
  void rebase() { view_.data = storage_.empty() ? nullptr : storage_.data(); }
  std::vector<T> storage_;
  View<T, N> view_;
};

// A differentiable input and its gradient buffer, element by element.
template <class T>
struct Param {
  std::string name;
  std::vector<T*> value, grad;
};

// ---- the problem ------------------------------------------------------------

template <class T>
class Problem {
 public:
  Spec spec;
  Tensor<T, 4> q, k, v, out, dout, dq, dk, dv;
  Tensor<relpos::compute_t<T>, 3> lse;  // float32 for the half types
  Tensor<uint8_t, 2> key_padding;
  Tensor<int32_t, 2> q_segments, k_segments;
  Tensor<T, 3> shaw_wk, shaw_wv, grad_shaw_wk, grad_shaw_wv;
  Tensor<T, 2> t5_table, grad_t5_table;
  Tensor<T, 1> alibi_slopes, grad_alibi_slopes;
  Tensor<T, 2> xl_u, xl_v, grad_xl_u, grad_xl_v;
  Tensor<T, 3> xl_w_r, grad_xl_w_r;
  Tensor<T, 1> kerple_r1, kerple_r2, grad_kerple_r1, grad_kerple_r2;
  Tensor<T, 1> kerple_power_r1, kerple_power_r2, grad_kerple_power_r1, grad_kerple_power_r2;
  Tensor<T, 3> deberta_c2p, deberta_p2c, grad_deberta_c2p, grad_deberta_p2c;
  Tensor<T, 2> sam_rel_h, sam_rel_w, grad_sam_rel_h, grad_sam_rel_w;
  Tensor<T, 2> swin_table, grad_swin_table;

  explicit Problem(const Spec& s) : spec(s), rng_(s.seed) {
    random(q, {s.B, s.H, s.Lq, s.d}, -1, 1);
    random(k, {s.B, s.H, s.Lk, s.d}, -1, 1);
    random(v, {s.B, s.H, s.Lk, s.dv}, -1, 1);
    random(dout, {s.B, s.H, s.Lq, s.dv}, -1, 1);
    out = {{s.B, s.H, s.Lq, s.dv}, s.layout};
    lse = {{s.B, s.H, s.Lq}, s.layout};
    zeros_like(dq, q);
    zeros_like(dk, k);
    zeros_like(dv, v);
    if (s.has_padding()) {
      key_padding = {{s.B, s.Lk}, s.layout};
      for (int64_t b = 0; b < s.B; ++b)
        for (int64_t j = 0; j < s.Lk; ++j) key_padding(b, j) = s.padded(b, j) ? 1 : 0;
    }
    if (s.segment_length > 0) {
      q_segments = {{s.B, s.Lq}, s.layout}, k_segments = {{s.B, s.Lk}, s.layout};
      for (int64_t b = 0; b < s.B; ++b) {
        for (int64_t i = 0; i < s.Lq; ++i) q_segments(b, i) = int32_t(s.segment(b, s.q_offset + i));
        for (int64_t j = 0; j < s.Lk; ++j) k_segments(b, j) = int32_t(s.segment(b, s.k_offset + j));
      }
    }
    const int64_t rows = 2 * s.shaw_k + 1;
    if (s.has_wk()) {
      random(shaw_wk, {s.shaw_wk_per_head ? s.H : 1, rows, s.d}, -1, 1);
      zeros_like(grad_shaw_wk, shaw_wk);
    }
    if (s.has_wv()) {
      random(shaw_wv, {s.shaw_wv_per_head ? s.H : 1, rows, s.dv}, -1, 1);
      zeros_like(grad_shaw_wv, shaw_wv);
    }
    if (s.scheme == Scheme::t5) {
      random(t5_table, {s.H, s.t5_num_buckets}, -1, 1);
      zeros_like(grad_t5_table, t5_table);
    }
    if (s.scheme == Scheme::alibi && s.alibi_explicit_slopes) {
      random(alibi_slopes, {s.H}, 0.1, 0.6);
      zeros_like(grad_alibi_slopes, alibi_slopes);
    }
    if (s.scheme == Scheme::xl) {
      random(xl_u, {s.H, s.d}, -0.5, 0.5);
      random(xl_v, {s.H, s.d}, -0.5, 0.5);
      random(xl_w_r, {s.H, s.d, s.xl_pos_dim}, -0.5, 0.5);
      zeros_like(grad_xl_u, xl_u);
      zeros_like(grad_xl_v, xl_v);
      zeros_like(grad_xl_w_r, xl_w_r);
    }
    if (s.scheme == Scheme::kerple) {
      random(kerple_r1, {s.H}, 0.2, 1.5);
      random(kerple_r2, {s.H}, 0.1, 1.0);
      zeros_like(grad_kerple_r1, kerple_r1);
      zeros_like(grad_kerple_r2, kerple_r2);
    }
    if (s.scheme == Scheme::kerple_power) {  // r2 across the power's range (0, 2]
      random(kerple_power_r1, {s.H}, 0.2, 1.5);
      random(kerple_power_r2, {s.H}, 0.1, 2.0);
      zeros_like(grad_kerple_power_r1, kerple_power_r1);
      zeros_like(grad_kerple_power_r2, kerple_power_r2);
    }
    if (s.scheme == Scheme::deberta) {
      const std::array<int64_t, 3> shape = {s.deberta_per_head ? s.H : 1, 2 * s.deberta_span(), s.d};
      if (s.deberta_c2p) random(deberta_c2p, shape, -1, 1), zeros_like(grad_deberta_c2p, deberta_c2p);
      if (s.deberta_p2c) random(deberta_p2c, shape, -1, 1), zeros_like(grad_deberta_p2c, deberta_p2c);
    }
    if (s.scheme == Scheme::sam) {  // rows 2 max(query cells, key cells) - 1 per axis
      random(sam_rel_h, {2 * std::max(s.grid_qh, s.key_grid_h()) - 1, s.d}, -1, 1);
      random(sam_rel_w, {2 * std::max(s.grid_qw, s.key_grid_w()) - 1, s.d}, -1, 1);
      zeros_like(grad_sam_rel_h, sam_rel_h), zeros_like(grad_sam_rel_w, sam_rel_w);
    }
    if (s.scheme == Scheme::swin) {
      random(swin_table, {s.H, (2 * s.grid_qh - 1) * (2 * s.grid_qw - 1)}, -1, 1);
      zeros_like(grad_swin_table, swin_table);
    }
  }

  // The scheme's default scale: 1 for T5, 1 / sqrt(d (1 + its position
  // terms)) for DeBERTa (the root in float32), 1 / sqrt(d) for the others.
  double scale() const {
    if (spec.scale) return *spec.scale;
    if (spec.scheme == Scheme::t5) return 1.0;
    if (spec.scheme != Scheme::deberta) return 1.0 / std::sqrt(double(spec.d));
    return 1.0 / double(std::sqrt(float(spec.d * (1 + spec.deberta_c2p + spec.deberta_p2c))));  // transformers' float32 root
  }

  relpos::AttentionForward<T> forward_args() {
    relpos::AttentionForward<T> a;
    a.q = q.cview();
    a.k = k.cview();
    a.v = v.cview();
    a.out = out.view();
    a.lse = lse.view();
    a.causal = spec.causal();
    a.key_padding = key_padding.cview();
    a.q_segments = q_segments.cview(), a.k_segments = k_segments.cview();
    a.q_offset = spec.q_offset;
    a.k_offset = spec.k_offset;
    a.scale = spec.scale;
    relpos::PositionParams<T>& pos = a.pos;
    pos.scheme = spec.scheme;
    pos.shaw = {spec.shaw_k, spec.shaw_beyond, shaw_wk.cview(), shaw_wv.cview()};
    pos.t5 = {spec.t5_bidirectional, spec.t5_max_distance, t5_table.cview()};
    pos.alibi.slopes = alibi_slopes.cview();
    pos.rope = spec.rope;
    pos.xl = {xl_u.cview(), xl_v.cview(), xl_w_r.cview(), spec.xl_clamp_len};
    pos.kerple = {kerple_r1.cview(), kerple_r2.cview()};
    pos.kerple_power = {kerple_power_r1.cview(), kerple_power_r2.cview()};
    pos.deberta = {spec.deberta_position_buckets, spec.deberta_max_relative_positions, deberta_c2p.cview(),
                   deberta_p2c.cview()};
    pos.sam = {spec.grid_qh, spec.grid_qw, spec.grid_kh, spec.grid_kw, sam_rel_h.cview(), sam_rel_w.cview()};
    pos.swin = {spec.grid_qh, spec.grid_qw, swin_table.cview()};
    a.dropout = spec.dropout;
    a.algorithm = spec.algorithm;
    a.num_threads = spec.num_threads;
    return a;
  }

  // Forward arguments plus dout and every gradient buffer this problem has.
  relpos::AttentionBackward<T> backward_args() {
    relpos::AttentionBackward<T> a;
    static_cast<relpos::AttentionForward<T>&>(a) = forward_args();
    a.dout = dout.cview();
    a.dq = dq.view();
    a.dk = dk.view();
    a.dv = dv.view();
    a.dpos = {grad_shaw_wk.view(), grad_shaw_wv.view(), grad_t5_table.view(), grad_alibi_slopes.view(),
              grad_xl_u.view(),    grad_xl_v.view(),    grad_xl_w_r.view(),       grad_kerple_r1.view(),
              grad_kerple_r2.view(), grad_kerple_power_r1.view(), grad_kerple_power_r2.view(),
              grad_deberta_c2p.view(), grad_deberta_p2c.view(), grad_sam_rel_h.view(), grad_sam_rel_w.view(),
              grad_swin_table.view()};
    return a;
  }

  void forward() { relpos::attention_forward(forward_args()); }
  void backward() { relpos::attention_backward(backward_args()); }

  // Every differentiable input of this problem with its gradient buffer.
  std::vector<Param<T>> params() {
    std::vector<Param<T>> ps;
    auto add = [&](const char* name, auto& value, auto& grad) {
      if (!value.empty()) ps.push_back({name, value.elements(), grad.elements()});
    };
    add("q", q, dq);
    add("k", k, dk);
    add("v", v, dv);
    add("shaw.wk", shaw_wk, grad_shaw_wk);
    add("shaw.wv", shaw_wv, grad_shaw_wv);
    add("t5.table", t5_table, grad_t5_table);
    add("alibi.slopes", alibi_slopes, grad_alibi_slopes);
    add("xl.u", xl_u, grad_xl_u);
    add("xl.v", xl_v, grad_xl_v);
    add("xl.w_r", xl_w_r, grad_xl_w_r);
    add("kerple.r1", kerple_r1, grad_kerple_r1);
    add("kerple.r2", kerple_r2, grad_kerple_r2);
    add("kerple_power.r1", kerple_power_r1, grad_kerple_power_r1);
    add("kerple_power.r2", kerple_power_r2, grad_kerple_power_r2);
    add("deberta.c2p", deberta_c2p, grad_deberta_c2p);
    add("deberta.p2c", deberta_p2c, grad_deberta_p2c);
    add("sam.rel_h", sam_rel_h, grad_sam_rel_h);
    add("sam.rel_w", sam_rel_w, grad_sam_rel_w);
    add("swin.table", swin_table, grad_swin_table);
    return ps;
  }

  void fill_grads(T value) {
    for (Param<T>& p : params())
      for (T* g : p.grad) *g = value;
  }

  // True when no output (out, lse, gradients) was written outside its elements.
  bool outputs_padding_untouched() {
    bool ok = out.padding_untouched() && lse.padding_untouched() && dq.padding_untouched() && dk.padding_untouched() &&
              dv.padding_untouched();
    for (auto* g : {&grad_shaw_wk, &grad_shaw_wv, &grad_xl_w_r, &grad_deberta_c2p, &grad_deberta_p2c}) ok = ok && g->padding_untouched();
    for (auto* g : {&grad_t5_table, &grad_xl_u, &grad_xl_v, &grad_sam_rel_h, &grad_sam_rel_w, &grad_swin_table})
      ok = ok && g->padding_untouched();
    for (auto* g : {&grad_alibi_slopes, &grad_kerple_r1, &grad_kerple_r2, &grad_kerple_power_r1, &grad_kerple_power_r2})
      ok = ok && g->padding_untouched();
    return ok;
  }

 private:
  template <std::size_t N>
  void random(Tensor<T, N>& t, std::array<int64_t, N> shape, double lo, double hi) {
    t = Tensor<T, N>(shape, spec.layout);
    std::uniform_real_distribution<double> u(lo, hi);
    for (T* e : t.elements()) *e = static_cast<T>(u(rng_));
  }
  template <std::size_t N>
  void zeros_like(Tensor<T, N>& grad, const Tensor<T, N>& t) {
    grad = Tensor<T, N>(t.shape(), spec.layout);
    grad.fill(T(0.0));
  }
  std::mt19937_64 rng_;
};

// ---- comparing results --------------------------------------------------------

// actual[n] == expected[n] within atol + rtol * |expected[n]|; equal infinities
// match, NaN never does. The message names the first mismatches.
inline ::testing::AssertionResult all_near(const std::string& what, const std::vector<double>& actual,
                                           const std::vector<double>& expected, double atol, double rtol = 0) {
  if (actual.size() != expected.size())
    return ::testing::AssertionFailure() << what << ": " << actual.size() << " values, expected " << expected.size();
  int bad = 0;
  ::testing::AssertionResult res = ::testing::AssertionFailure();
  for (std::size_t n = 0; n < actual.size(); ++n) {
    const double a = actual[n], e = expected[n];
    const bool ok = (std::isinf(e) && a == e) || (std::isfinite(a) && std::abs(a - e) <= atol + rtol * std::abs(e));
    if (!ok && bad++ < 5) res << what << "[" << n << "] = " << a << ", expected " << e << "\n";
  }
  if (bad == 0) return ::testing::AssertionSuccess();
  return res << bad << " of " << actual.size() << " " << what << " values differ";
}

// Everything a forward + backward call produces, by name: out, lse and the
// gradient of every input and parameter (gradient buffers zeroed first).
using Outcome = std::vector<std::pair<std::string, std::vector<double>>>;

template <class T>
Outcome run_forward_backward(Problem<T>& p) {
  p.forward();
  p.fill_grads(T(0.0));
  p.backward();
  Outcome o = {{"out", p.out.values()}, {"lse", p.lse.values()}};
  for (Param<T>& param : p.params()) {
    std::vector<double> g;
    for (T* e : param.grad) g.push_back(static_cast<double>(*e));
    o.push_back({"d" + param.name, g});
  }
  return o;
}

inline ::testing::AssertionResult same_outcome(const Outcome& actual, const Outcome& expected, double atol,
                                               double rtol = 0) {
  if (actual.size() != expected.size()) return ::testing::AssertionFailure() << "different tensors";
  for (std::size_t n = 0; n < actual.size(); ++n) {
    if (actual[n].first != expected[n].first)
      return ::testing::AssertionFailure() << actual[n].first << " vs " << expected[n].first;
    ::testing::AssertionResult r = all_near(actual[n].first, actual[n].second, expected[n].second, atol, rtol);
    if (!r) return r;
  }
  return ::testing::AssertionSuccess();
}

// ---- the generated lists of cases --------------------------------------------

// Every scheme with each of its options worth telling apart, on the default
// shapes (B=2, H=3, L=4, d=6, dv=3), no mask, zero offsets.
inline std::vector<Spec> scheme_variants() {
  std::vector<Spec> out;
  auto add = [&](std::string label, Scheme scheme, const std::function<void(Spec&)>& set = {}) {
    Spec s;
    s.label = std::move(label);
    s.scheme = scheme;
    if (set) set(s);
    out.push_back(s);
  };
  add("none", Scheme::none);
  add("shaw_kv_shared_clip", Scheme::shaw);
  add("shaw_k_only_per_head", Scheme::shaw,
      [](Spec& s) { s.shaw_tables = ShawTables::k_only, s.shaw_wk_per_head = true; });
  add("shaw_v_only_shared", Scheme::shaw, [](Spec& s) { s.shaw_tables = ShawTables::v_only; });
  add("shaw_kv_per_head_zero", Scheme::shaw,
      [](Spec& s) { s.shaw_wk_per_head = s.shaw_wv_per_head = true, s.shaw_beyond = Beyond::zero; });
  add("shaw_k_per_head_v_shared", Scheme::shaw, [](Spec& s) { s.shaw_wk_per_head = true; });
  add("t5_bidirectional", Scheme::t5);
  add("t5_causal", Scheme::t5,
      [](Spec& s) { s.t5_bidirectional = false, s.t5_num_buckets = 6, s.t5_max_distance = 8; });
  add("alibi_default_slopes", Scheme::alibi);
  add("alibi_explicit_slopes", Scheme::alibi, [](Spec& s) { s.alibi_explicit_slopes = true; });
  add("rope_half_split_full", Scheme::rope);
  add("rope_interleaved_rot4", Scheme::rope,
      [](Spec& s) { s.rope.style = RopeStyle::interleaved, s.rope.rotary_dims = 4; });
  add("rope_half_split_rot4_base100", Scheme::rope, [](Spec& s) { s.rope.rotary_dims = 4, s.rope.base = 100.0; });
  add("xl_unclamped", Scheme::xl);
  add("xl_clamp2", Scheme::xl, [](Spec& s) { s.xl_clamp_len = 2; });
  add("kerple", Scheme::kerple);
  add("kerple_power", Scheme::kerple_power);
  add("deberta_both_shared", Scheme::deberta);
  add("deberta_c2p_per_head", Scheme::deberta, [](Spec& s) { s.deberta_p2c = false, s.deberta_per_head = true; });
  add("deberta_p2c_no_buckets", Scheme::deberta,
      [](Spec& s) { s.deberta_c2p = false, s.deberta_position_buckets = -1, s.deberta_max_relative_positions = 3; });
  return out;
}

struct NamedMask {
  const char* name;
  MaskKind kind;
};
inline const std::vector<NamedMask>& masks() {
  static const std::vector<NamedMask> m = {{"nomask", MaskKind::none},
                                           {"causal", MaskKind::causal},
                                           {"padding", MaskKind::padding},
                                           {"causal_padding", MaskKind::causal_padding}};
  return m;
}

// Where queries and keys sit, and how memory is laid out.
struct Geometry {
  const char* name;
  std::function<void(Spec&)> apply;
};
inline const std::vector<Geometry>& geometries() {
  static const std::vector<Geometry> g = {
      {"self", [](Spec&) {}},
      // end-aligned decoding against a KV cache: Lq < Lk, q_offset = Lk - Lq
      {"kv_cache_strided",
       [](Spec& s) { s.Lq = 2, s.Lk = 5, s.q_offset = 3, s.k_offset = 0, s.layout = Layout::strided; }},
      // queries start before the keys (early rows see no key under causal), explicit
      // scale; the last query reaches distance 2 (at distances 0 and 1 alone a
      // power of the distance would not depend on its exponent)
      {"query_before_keys_scaled",
       [](Spec& s) { s.Lq = 5, s.Lk = 3, s.q_offset = 1, s.k_offset = 3, s.layout = Layout::strided, s.scale = 0.7; }},
      // one decoding step (Lq = 1) over 6 cached keys, T5's scale of 1
      {"decode_one_query", [](Spec& s) { s.Lq = 1, s.Lk = 6, s.q_offset = 5, s.k_offset = 0, s.scale = 1.0; }},
  };
  return g;
}

inline Spec with_mask_and_geometry(Spec s, const NamedMask& m, const Geometry& g) {
  s.mask = m.kind;
  g.apply(s);
  s.label += std::string("__") + m.name + "__" + g.name;
  return s;
}

// Attention dropout (p = 0.3 unless given; a seed and offset of its own) added to a case.
inline Spec with_dropout(Spec s, double p = 0.3) {
  s.dropout = {p, 0x9e3779b97f4a7c15ull ^ s.seed, 12345, 0};
  s.label += "__dropout";
  return s;
}

// Every scheme variant x mask x geometry.
inline std::vector<Spec> all_cases() {
  std::vector<Spec> out;
  for (const Spec& s : scheme_variants())
    for (const NamedMask& m : masks())
      for (const Geometry& g : geometries()) out.push_back(with_mask_and_geometry(s, m, g));
  return out;
}

// Positions on a grid: SAM's tables on equal query and key grids (3 x 4,
// strided), with the key grid pooled (queries 4 x 6, keys 2 x 3: MViTv2's
// pooled keys) and the reverse, on a single row (1 x 5); Swin's bias in
// windows of 3 x 4 (strided) and 2 x 2 cells; every mask each.
inline std::vector<Spec> grid_cases() {
  struct Grid {
    const char* name;
    Scheme scheme;
    int64_t qh, qw, kh, kw;
    Layout layout;
  };
  const Grid grids[] = {{"sam_3x4", Scheme::sam, 3, 4, 0, 0, Layout::strided},
                        {"sam_4x6_keys_2x3", Scheme::sam, 4, 6, 2, 3, Layout::dense},
                        {"sam_2x3_keys_4x6", Scheme::sam, 2, 3, 4, 6, Layout::dense},
                        {"sam_1x5", Scheme::sam, 1, 5, 0, 0, Layout::dense},
                        {"swin_3x4", Scheme::swin, 3, 4, 0, 0, Layout::strided},
                        {"swin_2x2", Scheme::swin, 2, 2, 0, 0, Layout::dense}};
  std::vector<Spec> out;
  for (const Grid& g : grids)
    for (const NamedMask& m : masks()) {
      Spec s;
      s.scheme = g.scheme, s.layout = g.layout, s.mask = m.kind;
      s.grid_qh = g.qh, s.grid_qw = g.qw, s.grid_kh = g.kh, s.grid_kw = g.kw;
      s.Lq = g.qh * g.qw, s.Lk = s.key_grid_h() * s.key_grid_w();
      s.label = std::string(g.name) + "__" + m.name;
      out.push_back(s);
    }
  return out;
}

// Segments of 3 positions on every scheme variant, unmasked and causal, in
// self-attention and against a KV cache (strided), and on a Swin window (its
// shifted windows' regions).
inline std::vector<Spec> segment_cases() {
  std::vector<Spec> out;
  for (const Spec& variant : scheme_variants())
    for (const NamedMask& m : {masks()[0], masks()[3]})
      for (int g = 0; g < 2; ++g) {
        Spec s = with_mask_and_geometry(variant, m, geometries()[g]);
        s.Lq = std::max<int64_t>(s.Lq, 2), s.Lk = 7, s.segment_length = 3;
        if (g == 1) s.Lq = 2, s.q_offset = 5;  // the cache's last queries
        s.label += "__segments";
        out.push_back(s);
      }
  for (const Spec& grid : grid_cases())
    if (grid.scheme == Scheme::swin && grid.mask == MaskKind::none) {
      Spec s = grid;
      s.segment_length = 5;
      s.label += "__segments";
      out.push_back(s);
    }
  return out;
}

// Whether a grid case's rows each see the keys of one key grid row only (a
// single grid row; a causal mask that shows 6 queries only the first 6 of 24
// keys): SAM's y table then adds one value to all of a row's logits, which
// the softmax cancels, and a gradient check of it has nothing to check.
inline bool grid_rows_see_one_key_row(const Spec& s) { return s.grid_qh == 1 || (s.causal() && s.Lq < s.Lk); }

// Only the cases whose scheme variant passes `keep`.
inline std::vector<Spec> cases_where(const std::function<bool(const Spec&)>& keep) {
  std::vector<Spec> out;
  for (const Spec& s : all_cases())
    if (keep(s)) out.push_back(s);
  return out;
}

inline std::string spec_name(const ::testing::TestParamInfo<Spec>& info) { return info.param.label; }

}  // namespace relpos_test
