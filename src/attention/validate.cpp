// Input validation at the API boundary: every check names the argument it
// rejects, so a user sees "shaw.wk: expected shape (1 or H=8, 2k+1=33, d=64)"
// instead of a crash or silent garbage.
#include <algorithm>
#include <cmath>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

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

// The memory a view touches, for overlap checks between arguments: the
// address range, and the element layout for an exact test between views that
// share their strides (dq, dk, dv interleaved in one (B, L, 3, H, d) buffer).
struct Region {
  const char* name = nullptr;
  uintptr_t base = 0;        // address of element 0
  uintptr_t lo = 0, hi = 0;  // bytes [lo, hi)
  std::size_t item = 0;
  std::vector<int64_t> shape, stride;
};

template <class T, std::size_t N>
Region region(const char* name, const View<T, N>& v) {
  Region r{name, reinterpret_cast<uintptr_t>(v.data), 0, 0, sizeof(T), {v.shape.begin(), v.shape.end()},
           {v.stride.begin(), v.stride.end()}};
  if (v.empty()) return r;
  int64_t lo = 0, hi = 0;  // element offsets of the first and last element touched
  for (std::size_t a = 0; a < N; ++a) {
    int64_t reach = 0;
    if (__builtin_mul_overflow(v.stride[a], v.shape[a] - 1, &reach) ||
        __builtin_add_overflow(reach < 0 ? lo : hi, reach, reach < 0 ? &lo : &hi))
      fail(std::string(name) + ": shape " + shape_str<N>(v.shape) + " and strides " + shape_str<N>(v.stride) +
           " reach beyond the address space");
  }
  int64_t lo_bytes = 0, hi_bytes = 0;
  if (__builtin_mul_overflow(lo, int64_t(sizeof(T)), &lo_bytes) ||
      __builtin_mul_overflow(hi + 1, int64_t(sizeof(T)), &hi_bytes))
    fail(std::string(name) + ": shape " + shape_str<N>(v.shape) + " reaches beyond the address space");
  r.lo = reinterpret_cast<uintptr_t>(v.data) + uintptr_t(lo_bytes);
  r.hi = reinterpret_cast<uintptr_t>(v.data) + uintptr_t(hi_bytes);
  return r;
}

int64_t floor_div(int64_t a, int64_t b) { return a / b - ((a % b != 0) && ((a < 0) != (b < 0))); }
int64_t ceil_div(int64_t a, int64_t b) { return -floor_div(-a, b); }

// One dimension of two views with equal strides: the stride, and the range
// [-lo, hi] of the index difference c = i_a - i_b.
struct Difference {
  int64_t stride, lo, hi;
};

// Whether delta = sum_d c_d stride_d has a solution within the ranges:
// largest stride first, trying only the c_d that leave a remainder the
// smaller dimensions can still reach (one or two values for dense layouts).
bool reachable(int64_t delta, const std::vector<Difference>& dims, std::size_t i) {
  if (i == dims.size()) return delta == 0;
  int64_t rest = 0;  // largest |sum| the dimensions after i can make
  for (std::size_t j = i + 1; j < dims.size(); ++j) rest += std::llabs(dims[j].stride) * std::max(dims[j].lo, dims[j].hi);
  const Difference& dim = dims[i];
  if (dim.stride == 0) return reachable(delta, dims, i + 1);
  // |delta - c s| <= rest  <=>  c in [(delta - rest) / s, (delta + rest) / s] (bounds swap for s < 0)
  const int64_t a = dim.stride > 0 ? ceil_div(delta - rest, dim.stride) : ceil_div(delta + rest, dim.stride);
  const int64_t b = dim.stride > 0 ? floor_div(delta + rest, dim.stride) : floor_div(delta - rest, dim.stride);
  for (int64_t c = std::max(a, -dim.lo); c <= std::min(b, dim.hi); ++c)
    if (reachable(delta - c * dim.stride, dims, i + 1)) return true;
  return false;
}

bool share_elements(const Region& a, const Region& b) {
  if (a.hi <= b.lo || b.hi <= a.lo) return false;  // disjoint address ranges
  const intptr_t bytes = intptr_t(b.base) - intptr_t(a.base);
  if (a.item != b.item || a.stride != b.stride || bytes % intptr_t(a.item) != 0) return true;  // no exact test
  // a's element i and b's element j coincide iff b.base - a.base = sum (i - j) * stride.
  std::vector<Difference> dims;
  for (std::size_t d = 0; d < a.shape.size(); ++d) dims.push_back({a.stride[d], b.shape[d] - 1, a.shape[d] - 1});
  std::sort(dims.begin(), dims.end(),
            [](const Difference& x, const Difference& y) { return std::llabs(x.stride) > std::llabs(y.stride); });
  return reachable(bytes / intptr_t(a.item), dims, 0);
}

// Outputs may not share memory with inputs or with each other: a kernel
// writing one while reading or writing the other races on several threads.
void check_no_overlap(const std::vector<Region>& inputs, const std::vector<Region>& outputs) {
  for (std::size_t o = 0; o < outputs.size(); ++o) {
    if (outputs[o].lo == outputs[o].hi) continue;
    for (const Region& in : inputs)
      if (in.lo != in.hi && share_elements(outputs[o], in))
        fail(std::string(outputs[o].name) + ": shares memory with the input " + in.name +
             "; outputs need their own buffers");
    for (std::size_t other = o + 1; other < outputs.size(); ++other)
      if (outputs[other].lo != outputs[other].hi && share_elements(outputs[o], outputs[other]))
        fail(std::string(outputs[o].name) + ": shares memory with the output " + outputs[other].name);
  }
}

template <class T>
std::vector<Region> input_regions(const AttentionForward<T>& p) {
  const PositionParams<T>& pos = p.pos;
  return {region("q", p.q), region("k", p.k), region("v", p.v), region("key_padding", p.key_padding),
          region("shaw.wk", pos.shaw.wk), region("shaw.wv", pos.shaw.wv), region("t5.table", pos.t5.table),
          region("alibi.slopes", pos.alibi.slopes), region("xl.u", pos.xl.u), region("xl.v", pos.xl.v),
          region("xl.w_r", pos.xl.w_r)};
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
const char* precision_name() {
  return sizeof(T) == 4 ? "float32" : "float64";
}

// The largest |r| among the call's (query, key) pairs (offsets and lengths are
// bounded by 2^40, so this cannot overflow).
template <class T>
int64_t farthest_distance(const AttentionForward<T>& p) {
  const int64_t first = p.k_offset - (p.q_offset + p.q.shape[2] - 1);  // last query, first key
  const int64_t last = p.k_offset + p.k.shape[2] - 1 - p.q_offset;     // first query, last key
  return std::max(std::llabs(first), std::llabs(last));
}

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
        // The bias -m |r| is computed in T; the farthest distance of the call must not overflow it.
        const double far = double(farthest_distance(p));
        for (int64_t h = 0; h < H; ++h) {
          const double m = double(pos.alibi.slopes(h));
          if (!std::isfinite(m)) fail("alibi.slopes: every slope must be finite");
          if (!std::isfinite(static_cast<T>(std::abs(m) * far)))
            fail("alibi.slopes: slope " + std::to_string(m) + " of head " + std::to_string(h) + " times the farthest distance " +
                 std::to_string(int64_t(far)) + " overflows " + precision_name<T>());
        }
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
  check_shape("k", p.k, {B, -1, -1, d}, "(" + dims("B", B) + ", Hkv, Lk, " + dims("d", d) + ")");
  const int64_t Hkv = p.k.shape[1], Lk = p.k.shape[2];
  if (Hkv == 0 || H % Hkv != 0)
    fail("k: its head count Hkv=" + std::to_string(Hkv) + " must divide q's H=" + std::to_string(H) +
         " (grouped-query attention: H / Hkv query heads share a key head)");
  check_shape("v", p.v, {B, Hkv, Lk, -1},
              "(" + dims("B", B) + ", " + dims("Hkv", Hkv) + ", " + dims("Lk", Lk) + ", dv)");
  const int64_t dv = p.v.shape[3];
  check_output("out", p.out, {B, H, Lq, dv}, "(" + bh + ", " + dims("Lq", Lq) + ", " + dims("dv", dv) + ")");
  check_output("lse", p.lse, {B, H, Lq}, "(" + bh + ", " + dims("Lq", Lq) + ")");
  if (!p.key_padding.empty())
    check_shape("key_padding", p.key_padding, {B, Lk}, "(" + dims("B", B) + ", " + dims("Lk", Lk) + ")");
  // Offsets are absolute positions: non-negative, and small enough that
  // positions and distances stay exact in double and int64.
  if (p.q_offset < 0 || p.q_offset > kMaxPosition) fail("q_offset: must be in [0, 2^40], got " + std::to_string(p.q_offset));
  if (p.k_offset < 0 || p.k_offset > kMaxPosition) fail("k_offset: must be in [0, 2^40], got " + std::to_string(p.k_offset));
  // The kernels compute in T: a scale finite in double may overflow or vanish in float.
  if (p.scale && !(std::isfinite(static_cast<T>(*p.scale)) && static_cast<T>(*p.scale) > 0))
    fail("scale: must be finite and > 0 in the inputs' precision (" + std::string(precision_name<T>()) + "), got " +
         std::to_string(*p.scale));
  if (p.num_threads < 0 || p.num_threads > kMaxThreads)
    fail("num_threads: must be in [0, " + std::to_string(kMaxThreads) + "] (0 = OpenMP's maximum), got " +
         std::to_string(p.num_threads));
  check_position(p);
  check_algorithm(p);
  check_scratch_fits(p);
  check_no_overlap(input_regions(p), {region("out", p.out), region("lse", p.lse)});
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
  std::vector<Region> inputs = input_regions(p);  // backward reads out, lse and dout too
  for (Region r : {region("out", p.out), region("lse", p.lse), region("dout", p.dout)}) inputs.push_back(r);
  check_no_overlap(inputs, {region("dq", p.dq), region("dk", p.dk), region("dv", p.dv),
                            region("dpos.shaw_wk", g.shaw_wk), region("dpos.shaw_wv", g.shaw_wv),
                            region("dpos.t5_table", g.t5_table), region("dpos.alibi_slopes", g.alibi_slopes),
                            region("dpos.xl_u", g.xl_u), region("dpos.xl_v", g.xl_v), region("dpos.xl_w_r", g.xl_w_r)});
}

template void validate_forward<float>(const AttentionForward<float>&);
template void validate_forward<double>(const AttentionForward<double>&);
template void validate_backward<float>(const AttentionBackward<float>&);
template void validate_backward<double>(const AttentionBackward<double>&);

}  // namespace relpos
