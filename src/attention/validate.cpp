// Input validation at the API boundary: every check names the argument it
// rejects, so a user sees "shaw.wk: expected shape (1 or H=8, 2k+1=33, d=64)"
// instead of a crash or silent garbage.
#include <algorithm>
#include <cmath>
#include <sstream>
#include <stdexcept>

#include "relpos/attention.hpp"

namespace relpos {
namespace {

[[noreturn]] void fail(const std::string& msg) { throw std::invalid_argument("relpos: " + msg); }

template <std::size_t N>
std::string shape_str(const std::array<int64_t, N>& s) {
  std::ostringstream o;
  o << '(';
  for (std::size_t a = 0; a < N; ++a) o << (a ? ", " : "") << s[a];
  o << ')';
  return o.str();
}

// `expected` uses -1 for "any extent >= 1".
template <class T, std::size_t N>
void check_shape(const char* name, const View<T, N>& v, const std::array<int64_t, N>& expected,
                 const std::string& meaning) {
  if (v.data == nullptr) fail(std::string(name) + ": missing (null data pointer)");
  bool ok = true;
  for (std::size_t a = 0; a < N; ++a) {
    if (v.shape[a] < 1) fail(std::string(name) + ": every dimension must be >= 1, got shape " + shape_str<N>(v.shape));
    ok = ok && (expected[a] < 0 || v.shape[a] == expected[a]);
  }
  if (!ok) fail(std::string(name) + ": expected shape " + meaning + ", got " + shape_str<N>(v.shape));
}

// An output must not map two indices to one address, or writes would race
// and accumulate into each other.
template <class T, std::size_t N>
void check_writable(const char* name, const View<T, N>& v) {
  std::array<std::size_t, N> order;
  for (std::size_t a = 0; a < N; ++a) order[a] = a;
  std::sort(order.begin(), order.end(),
            [&](std::size_t x, std::size_t y) { return std::llabs(v.stride[x]) < std::llabs(v.stride[y]); });
  int64_t span = 1;  // elements covered by the dimensions seen so far
  for (std::size_t a : order) {
    if (v.shape[a] == 1) continue;
    if (std::llabs(v.stride[a]) < span)
      fail(std::string(name) + ": output strides overlap (two indices share memory); pass a dense buffer");
    span = std::llabs(v.stride[a]) * v.shape[a];
  }
}

template <class T, std::size_t N>
void check_output(const char* name, const View<T, N>& v, const std::array<int64_t, N>& expected,
                  const std::string& meaning) {
  check_shape(name, v, expected, meaning);
  check_writable(name, v);
}

template <class T, std::size_t N>
void check_optional_grad(const char* name, const View<T, N>& g, const std::array<int64_t, N>& shape) {
  if (g.empty()) return;
  check_output(name, g, shape, "equal to its parameter's " + shape_str<N>(shape));
}

std::string dims(const char* what, int64_t n) { return std::string(what) + "=" + std::to_string(n); }

template <class T>
void check_position(const AttentionForward<T>& p) {
  const int64_t H = p.q.shape[1], d = p.q.shape[3], dv = p.v.shape[3];
  const PositionParams<T>& pos = p.pos;
  switch (pos.scheme) {
    case Scheme::none:
      break;
    case Scheme::shaw: {
      const ShawParams<T>& s = pos.shaw;
      if (s.k < 0 || s.k > kMaxPosition)
        fail("shaw.k: the clipping distance must be in [0, 2^40], got " + std::to_string(s.k));
      if (s.wk.empty() && s.wv.empty()) fail("shaw: give wk, wv or both (K-only, V-only, K+V)");
      const int64_t rows = 2 * s.k + 1;
      struct Table {
        const char* name;
        const View3<const T>* view;
        int64_t width;
      };
      for (const Table& tab : {Table{"shaw.wk", &s.wk, d}, Table{"shaw.wv", &s.wv, dv}}) {
        const char* name = tab.name;
        const View3<const T>* table = tab.view;
        const int64_t width = tab.width;
        if (table->empty()) continue;
        const std::string meaning =
            "(1 or " + dims("H", H) + ", " + dims("2k+1", rows) + ", " + std::to_string(width) + ")";
        check_shape(name, *table, {-1, rows, width}, meaning);
        if (table->shape[0] != 1 && table->shape[0] != H) fail(std::string(name) + ": expected shape " + meaning);
      }
      break;
    }
    case Scheme::t5: {
      const T5Params<T>& t = pos.t5;
      check_shape("t5.table", t.table, {H, -1}, "(" + dims("H", H) + ", num_buckets)");
      check_t5_config(t.bidirectional, t.table.shape[1], t.max_distance);
      break;
    }
    case Scheme::alibi:
      if (!pos.alibi.slopes.empty()) {
        check_shape("alibi.slopes", pos.alibi.slopes, {H}, "(" + dims("H", H) + ")");
        for (int64_t h = 0; h < H; ++h)
          if (!std::isfinite(double(pos.alibi.slopes(h)))) fail("alibi.slopes: every slope must be finite");
      }
      break;
    case Scheme::rope: {
      const RopeParams& r = pos.rope;
      const int64_t rd = r.rotary_dims ? r.rotary_dims : d;
      if (r.rotary_dims < 0 || rd < 2 || rd % 2 != 0 || rd > d)
        fail("rope.rotary_dims: must be even, >= 2 and <= d=" + std::to_string(d) + ", got " + std::to_string(rd) +
             (r.rotary_dims ? "" : " (0 means d)"));
      if (!(std::isfinite(r.base) && r.base > 1.0)) fail("rope.base: must be finite and > 1");
      break;
    }
    case Scheme::xl: {
      const XLParams<T>& x = pos.xl;
      const std::string hd = "(" + dims("H", H) + ", " + dims("d", d) + ")";
      check_shape("xl.u", x.u, {H, d}, hd);
      check_shape("xl.v", x.v, {H, d}, hd);
      check_shape("xl.w_r", x.w_r, {H, d, -1}, "(" + dims("H", H) + ", " + dims("d", d) + ", pos_dim)");
      if (x.w_r.shape[2] % 2 != 0) fail("xl.w_r: pos_dim (last dimension) must be even for [sin, cos]");
      if (x.clamp_len < 0 || x.clamp_len > kMaxPosition) fail("xl.clamp_len: must be in [0, 2^40] (0 = unclamped)");
      break;
    }
  }
}

}  // namespace

template <class T>
void validate_forward(const AttentionForward<T>& p) {
  check_shape("q", p.q, {-1, -1, -1, -1}, "(B, H, Lq, d)");
  const int64_t B = p.q.shape[0], H = p.q.shape[1], Lq = p.q.shape[2], d = p.q.shape[3];
  const std::string bh = dims("B", B) + ", " + dims("H", H);
  check_shape("k", p.k, {B, H, -1, d}, "(" + bh + ", Lk, " + dims("d", d) + ")");
  const int64_t Lk = p.k.shape[2];
  check_shape("v", p.v, {B, H, Lk, -1}, "(" + bh + ", " + dims("Lk", Lk) + ", dv)");
  const int64_t dv = p.v.shape[3];
  check_output("out", p.out, {B, H, Lq, dv}, "(" + bh + ", " + dims("Lq", Lq) + ", " + dims("dv", dv) + ")");
  check_output("lse", p.lse, {B, H, Lq}, "(" + bh + ", " + dims("Lq", Lq) + ")");
  if (!p.key_padding.empty())
    check_shape("key_padding", p.key_padding, {B, Lk}, "(" + dims("B", B) + ", " + dims("Lk", Lk) + ")");
  // Offsets are absolute positions: non-negative, and small enough that
  // positions and distances stay exact in double and int64.
  if (p.q_offset < 0 || p.q_offset > kMaxPosition) fail("q_offset: must be in [0, 2^40], got " + std::to_string(p.q_offset));
  if (p.k_offset < 0 || p.k_offset > kMaxPosition) fail("k_offset: must be in [0, 2^40], got " + std::to_string(p.k_offset));
  if (p.scale && !(std::isfinite(*p.scale) && *p.scale > 0)) fail("scale: must be finite and > 0");
  if (p.num_threads < 0 || p.num_threads > 4096)
    fail("num_threads: must be in [0, 4096] (0 = OpenMP's maximum), got " + std::to_string(p.num_threads));
  check_position(p);
  check_algorithm(p);
}

template <class T>
void validate_backward(const AttentionBackward<T>& p) {
  validate_forward<T>(p);
  const auto& q = p.q.shape;
  check_shape("dout", p.dout, p.out.shape, "equal to out's " + shape_str<4>(p.out.shape));
  check_optional_grad("dq", p.dq, q);
  check_optional_grad("dk", p.dk, p.k.shape);
  check_optional_grad("dv", p.dv, p.v.shape);
  const PositionParams<T>& pos = p.pos;
  const PositionGrads<T>& g = p.dpos;
  auto unused = [&](bool given, Scheme s, const char* name) {
    if (given && pos.scheme != s)
      fail(std::string(name) + ": gradient requested for a parameter of scheme " + to_string(s) +
           " but the scheme is " + to_string(pos.scheme));
  };
  unused(!g.shaw_wk.empty() || !g.shaw_wv.empty(), Scheme::shaw, "dpos.shaw");
  unused(!g.t5_table.empty(), Scheme::t5, "dpos.t5_table");
  unused(!g.alibi_slopes.empty(), Scheme::alibi, "dpos.alibi_slopes");
  unused(!g.xl_u.empty() || !g.xl_v.empty() || !g.xl_w_r.empty(), Scheme::xl, "dpos.xl");
  if (!g.shaw_wk.empty() && pos.shaw.wk.empty()) fail("dpos.shaw_wk: no wk table was given");
  if (!g.shaw_wv.empty() && pos.shaw.wv.empty()) fail("dpos.shaw_wv: no wv table was given");
  if (!g.alibi_slopes.empty() && pos.alibi.slopes.empty())
    fail("dpos.alibi_slopes: slopes are learnable only when given explicitly");
  check_optional_grad("dpos.shaw_wk", g.shaw_wk, pos.shaw.wk.shape);
  check_optional_grad("dpos.shaw_wv", g.shaw_wv, pos.shaw.wv.shape);
  check_optional_grad("dpos.t5_table", g.t5_table, pos.t5.table.shape);
  check_optional_grad("dpos.alibi_slopes", g.alibi_slopes, pos.alibi.slopes.shape);
  check_optional_grad("dpos.xl_u", g.xl_u, pos.xl.u.shape);
  check_optional_grad("dpos.xl_v", g.xl_v, pos.xl.v.shape);
  check_optional_grad("dpos.xl_w_r", g.xl_w_r, pos.xl.w_r.shape);
}

template void validate_forward<float>(const AttentionForward<float>&);
template void validate_forward<double>(const AttentionForward<double>&);
template void validate_backward<float>(const AttentionBackward<float>&);
template void validate_backward<double>(const AttentionBackward<double>&);

}  // namespace relpos
