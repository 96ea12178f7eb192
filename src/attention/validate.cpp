// Input validation at the API boundary: every check names the argument it
// rejects, so a user sees "shaw.wk: expected shape (1 or H=8, 2k+1=33, d=64)"
// instead of a crash or silent garbage.
#include <algorithm>
#include <cmath>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "../schemes/checks.hpp"
#include "../schemes/registry.hpp"
#include "relpos/attention.hpp"

namespace relpos {
namespace {

using namespace checks;


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
  std::string name;
  uintptr_t base = 0;        // address of element 0
  uintptr_t lo = 0, hi = 0;  // bytes [lo, hi)
  std::size_t item = 0;
  std::vector<int64_t> shape, stride;
};

template <class T, std::size_t N>
Region region(const std::string& name, const View<T, N>& v) {
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
  std::vector<Region> regions = {region("q", p.q), region("k", p.k), region("v", p.v),
                                 region("key_padding", p.key_padding), region("q_segments", p.q_segments),
                                 region("k_segments", p.k_segments)};
  for_each_scheme_param(p.pos, [&](const char* name, const auto& param) {
    std::string label = name;  // "xl_w_r" is the argument xl.w_r
    label[label.find('_')] = '.';
    regions.push_back(region(label, param));
  });
  return regions;
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

// Dropout's probability, and the batch rows and heads its counter word
// (batch_offset + b) * H + h numbers in 32 bits (relpos/dropout.hpp).
template <class T>
void check_dropout(const AttentionForward<T>& p) {
  const AttentionDropout& d = p.dropout;
  if (!(d.p >= 0 && d.p < 1))
    fail("dropout.p: must be in [0, 1) (the probability of dropping an entry), got " + shortest_text(d.p));
  if (!d.active()) return;
  const int64_t B = p.q.shape[0], H = p.q.shape[1];
  if (d.batch_offset < 0 || d.batch_offset > (int64_t(1) << 32) / H - B)
    fail("dropout.batch_offset: (batch_offset + B) x H must be <= 2^32 (the mask's counter numbers batch rows "
         "and heads in 32 bits), got batch_offset " + std::to_string(d.batch_offset) + " with B=" +
         std::to_string(B) + ", H=" + std::to_string(H));
}

template <class T>
void check_position(const AttentionForward<T>& p) {
  check_scheme_options(p);
  AllSchemes::visit(p.pos.scheme, [&](auto scheme) { decltype(scheme)::check(p); });
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
  if (p.q_segments.empty() != p.k_segments.empty())
    fail(std::string(p.q_segments.empty() ? "q_segments" : "k_segments") +
         ": segments need both q_segments and k_segments (a query sees the keys of its own segment)");
  if (!p.q_segments.empty()) {
    check_shape("q_segments", p.q_segments, {B, Lq}, "(" + dims("B", B) + ", " + dims("Lq", Lq) + ")");
    check_shape("k_segments", p.k_segments, {B, Lk}, "(" + dims("B", B) + ", " + dims("Lk", Lk) + ")");
  }
  // Offsets are absolute positions: non-negative, and small enough that
  // positions and distances stay exact in double and int64.
  if (p.q_offset < 0 || p.q_offset > kMaxPosition) fail("q_offset: must be in [0, 2^40], got " + std::to_string(p.q_offset));
  if (p.k_offset < 0 || p.k_offset > kMaxPosition) fail("k_offset: must be in [0, 2^40], got " + std::to_string(p.k_offset));
  // The kernels compute in compute_t<T>: a scale finite in double may overflow or vanish in float.
  using C = compute_t<T>;
  if (p.scale && !(std::isfinite(static_cast<C>(*p.scale)) && static_cast<C>(*p.scale) > 0))
    fail("scale: must be finite and > 0 in the precision the call computes in (" + std::string(precision_name<C>()) +
         "), got " +
         std::to_string(*p.scale));
  if (p.num_threads < 0 || p.num_threads > kMaxThreads)
    fail("num_threads: must be in [0, " + std::to_string(kMaxThreads) + "] (0 = OpenMP's maximum), got " +
         std::to_string(p.num_threads));
  check_dropout(p);
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
  const int64_t Lk = p.k.shape[2], from = p.key_grads_from;
  if (from < 0 || from > Lk)
    fail("key_grads_from: must be in [0, Lk = " + std::to_string(Lk) + "], got " + std::to_string(from));
  const auto graded_keys = [&](std::array<int64_t, 4> shape) {  // the rows of dk, dv: keys from .. Lk - 1
    shape[2] -= from;
    return shape;
  };
  check_optional_grad("dk", p.dk, graded_keys(p.k.shape));
  check_optional_grad("dv", p.dv, graded_keys(p.v.shape));
  std::vector<Region> inputs = input_regions(p);  // backward reads out, lse and dout too
  for (Region r : {region("out", p.out), region("lse", p.lse), region("dout", p.dout)}) inputs.push_back(r);
  std::vector<Region> outputs = {region("dq", p.dq), region("dk", p.dk), region("dv", p.dv)};
  // A scheme's parameter gradients: wanted only for the call's scheme and a
  // parameter it was given, shaped like that parameter.
  AllSchemes::for_each([&](auto scheme) {
    using S = decltype(scheme);
    S::for_each_param(p.pos, [&](const char* name, const auto& param, const auto& grad) {
      const std::string what = std::string("dpos.") + name;
      if (!grad.empty() && p.pos.scheme != S::id)
        fail(what + ": gradient requested for a parameter of scheme " + S::name + " but the scheme is " +
             to_string(p.pos.scheme));
      if (!grad.empty() && param.empty())
        fail(what + ": no " + name + " was given (a parameter is learnable only when given explicitly)");
      check_optional_grad(what.c_str(), grad, param.shape);
      outputs.push_back(region(what, grad));
    }, p.dpos);
  });
  check_no_overlap(inputs, outputs);
}

#define RELPOS_INSTANTIATE(T)                                       \
  template void validate_forward<T>(const AttentionForward<T>&); \
  template void validate_backward<T>(const AttentionBackward<T>&);
RELPOS_INSTANTIATE(float)
RELPOS_INSTANTIATE(double)
RELPOS_INSTANTIATE(bfloat16)
RELPOS_INSTANTIATE(float16)
#undef RELPOS_INSTANTIATE

}  // namespace relpos
