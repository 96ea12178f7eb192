// The one place where a call is validated and routed to an algorithm.
#include <array>
#include <cmath>
#include <limits>
#include <optional>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

#include "../backend/row_ops.hpp"
#include "../backend/scratch.hpp"
#include "../backend/signals.hpp"
#include "../schemes/registry.hpp"
#include "fused.hpp"
#include "grad_partials.hpp"
#include "half_storage.hpp"
#include "reference.hpp"
#include "unfused.hpp"
#include "relpos/attention.hpp"

namespace relpos {

namespace {
constexpr std::pair<Algorithm, const char*> kAlgorithmNames[] = {
    {Algorithm::automatic, "auto"},     {Algorithm::reference, "reference"},
    {Algorithm::split, "split"},        {Algorithm::gather, "gather"},
    {Algorithm::skew, "skew"},          {Algorithm::generalized_skew, "generalized_skew"},
    {Algorithm::relshift, "relshift"},  {Algorithm::fused, "fused"}};

[[noreturn]] void unknown(const char* what, const std::string& name, const std::string& known) {
  throw std::invalid_argument(std::string("relpos: unknown ") + what + " '" + name + "' (known: " + known + ")");
}
}  // namespace

const char* to_string(Scheme s) {
  const char* name = "?";
  AllSchemes::visit(s, [&](auto scheme) { name = decltype(scheme)::name; });
  return name;
}

const char* to_string(Algorithm a) {
  for (const auto& [x, n] : kAlgorithmNames)
    if (x == a) return n;
  return "?";
}

Scheme parse_scheme(const std::string& name) {
  std::optional<Scheme> found;
  std::string known;
  AllSchemes::for_each([&](auto scheme) {
    if (name == decltype(scheme)::name) found = decltype(scheme)::id;
    known += (known.empty() ? "" : ", ") + std::string(decltype(scheme)::name);
  });
  if (!found) unknown("scheme", name, known);
  return *found;
}

Algorithm parse_algorithm(const std::string& name) {
  std::string known;
  for (const auto& [a, n] : kAlgorithmNames) {
    if (name == n) return a;
    known += (known.empty() ? "" : ", ") + std::string(n);
  }
  unknown("algorithm", name, known);
}

// The fused kernel serves every call, needs no (L, L) buffer and was the
// fastest in `relpos bench attention` for every scheme at every length
// measured (see README), so it is the automatic choice.
template <class T>
Algorithm resolve_algorithm(const AttentionForward<T>& p) {
  return p.algorithm == Algorithm::automatic ? Algorithm::fused : p.algorithm;
}

namespace {
// Why algorithm a cannot serve p's mask and shapes (empty: it can). The
// schemes an algorithm serves are the schemes' own capability tables.
template <class T>
std::string geometry_refusal(Algorithm a, const AttentionForward<T>& p) {
  const int64_t lq = p.q.shape[2], lk = p.k.shape[2];
  if (a == Algorithm::skew && !(p.causal && lq == lk && p.q_offset == p.k_offset))
    return "'skew' needs causal self-attention (Lq == Lk, q_offset == k_offset); "
           "use 'generalized_skew' for other masks and shapes";
  if (a == Algorithm::relshift && !(p.causal && p.k_offset + lk == p.q_offset + lq))
    return "'relshift' needs a causal mask and queries end-aligned with the keys "
           "(k_offset + Lk == q_offset + Lq, as with memory); use 'generalized_skew' otherwise";
  return {};
}
}  // namespace

template <class T>
void check_algorithm(const AttentionForward<T>& p) {
  const Algorithm a = resolve_algorithm(p);
  if (!scheme_serves(p.pos.scheme, a))
    throw std::invalid_argument(std::string("relpos: algorithm: '") + to_string(a) + "' does not serve scheme '" +
                                to_string(p.pos.scheme) + "'");
  if (const std::string why = geometry_refusal(a, p); !why.empty())
    throw std::invalid_argument("relpos: algorithm: " + why);
}

template <class T>
std::vector<Algorithm> available_algorithms(const AttentionForward<T>& p) {
  AttentionForward<T> each = p;
  each.algorithm = Algorithm::fused;  // serves every call in the least memory: validates the rest
  validate_forward(each);
  std::vector<Algorithm> served;
  for (const auto& [a, name] : kAlgorithmNames) {
    if (a == Algorithm::automatic) continue;
    each.algorithm = a;
    if (!scheme_serves(p.pos.scheme, a) || !geometry_refusal(a, each).empty()) continue;
    try {
      check_scratch_fits(each);
      served.push_back(a);
    } catch (const std::invalid_argument&) {  // needs more memory than the machine has
    }
  }
  return served;
}

namespace {
// The one switch from algorithm to implementation; P is AttentionForward or
// AttentionBackward, run_reference / run_unfused the matching entry points.
template <class P, class Reference, class Fused, class Unfused>
void run(const P& p, Reference run_reference, Fused run_fused, Unfused run_unfused) {
  P resolved = p;
  resolved.algorithm = resolve_algorithm(p);
  if (resolved.algorithm == Algorithm::reference)
    run_reference(resolved);
  else if (resolved.algorithm == Algorithm::fused)
    run_fused(resolved);
  else
    run_unfused(resolved);
}
}  // namespace

namespace {
// Whether every element of v is finite (an absent view is).
template <class T, std::size_t N>
bool all_finite(const View<const T, N>& v) {
  if (v.empty()) return true;
  std::array<int64_t, N> at{};
  for (int64_t left = v.numel(); left > 0; --left) {
    int64_t offset = 0;
    for (std::size_t a = 0; a < N; ++a) offset += at[a] * v.stride[a];
    if (!std::isfinite(static_cast<compute_t<T>>(v.data[offset]))) return false;
    for (std::size_t a = N; a-- > 0 && ++at[a] == v.shape[a];) at[a] = 0;
  }
  return true;
}

// A row's lse NaN or infinite from finite inputs: its scores overflowed the
// compute type (+inf: NaN rows; all -inf: zero rows, as if masked), so the
// forward refuses the call by name, as a scheme's parameters whose bias
// overflows are refused before it. -inf is right for a row with no visible key
// (every key padded, or all in its future). A NaN or infinite input propagates
// to the rows it reaches instead, as in PyTorch: the inputs read are the row's
// own (its query, its key head's keys and values that are not padded, the
// scheme's parameters), so a NaN elsewhere in the call hides no overflow. Which
// logit overflows first depends on where an algorithm applies the scale: near
// the limit one may refuse what another computes.
template <class T>
void check_scores_stayed_finite(const AttentionForward<T>& p) {
  using C = compute_t<T>;
  const View3<C>& lse = p.lse;
  const int64_t B = lse.shape[0], H = lse.shape[1], Lq = lse.shape[2], Lk = p.k.shape[2];
  const int64_t Hkv = p.k.shape[1], d = p.q.shape[3], dv = p.v.shape[3];
  const auto padded = [&](int64_t b, int64_t j) { return !p.key_padding.empty() && p.key_padding(b, j) != 0; };
  // Per batch entry the first key not padded (Lk: none): row i sees a key iff it
  // is there and, under a causal mask, at r <= 0.
  std::vector<int64_t> first_seen(B, 0);
  for (int64_t b = 0; b < B; ++b)
    while (first_seen[b] < Lk && padded(b, first_seen[b])) ++first_seen[b];
  const auto sees_a_key = [&](int64_t b, int64_t i) {
    if (p.q_segments.empty()) return first_seen[b] < Lk && (!p.causal || p.k_offset + first_seen[b] <= p.q_offset + i);
    for (int64_t j = first_seen[b]; j < Lk && (!p.causal || p.k_offset + j <= p.q_offset + i); ++j)
      if (!padded(b, j) && p.k_segments(b, j) == p.q_segments(b, i)) return true;  // rows of -inf lse only: rare
    return false;
  };
  // Whether the inputs a row reads are finite; a key head's keys and values,
  // and the parameters, read once.
  std::vector<int8_t> keys_finite(B * Hkv, -1);  // -1: not read yet
  int8_t params_finite = -1;
  const auto row_inputs_finite = [&](int64_t b, int64_t h, int64_t i) {
    const auto row = [](const auto& x, int64_t b, int64_t h, int64_t i, int64_t n) {
      return View<const T, 1>{&x(b, h, i, 0), {n}, {x.stride[3]}};
    };
    if (!all_finite(row(p.q, b, h, i, d))) return false;
    const int64_t g = h / (H / Hkv);  // the key head
    int8_t& kv = keys_finite[b * Hkv + g];
    for (int64_t j = 0; kv < 0 && j < Lk; ++j)
      if (!padded(b, j) && !(all_finite(row(p.k, b, g, j, d)) && all_finite(row(p.v, b, g, j, dv)))) kv = 0;
    if (kv < 0) kv = 1;
    if (params_finite < 0) {
      params_finite = 1;
      for_each_scheme_param(p.pos, [&](const char*, const auto& x) { params_finite &= int8_t(all_finite(x)); });
    }
    return kv == 1 && params_finite == 1;
  };
  bool overflowed = false;
  for (int64_t b = 0; b < B && !overflowed; ++b)
    for (int64_t h = 0; h < H && !overflowed; ++h)
      for (int64_t i = 0; i < Lq && !overflowed; ++i) {
        const C x = lse(b, h, i);
        overflowed = (std::isnan(x) || x == std::numeric_limits<C>::infinity() ||
                      (x == -std::numeric_limits<C>::infinity() && sees_a_key(b, i))) &&
                     row_inputs_finite(b, h, i);
      }
  if (!overflowed) return;
  const bool wider = !std::is_same_v<C, double>;
  throw ScoresOverflow(std::string("relpos: q, k: the attention scores overflow ") + checks::precision_name<C>() +
                              " (a logit q.k, scaled or not, with the scheme's terms, past " +
                              (wider ? "3.4e38" : "1.8e308") + ") for finite inputs: scale q and k down" +
                              (wider ? ", or compute in float64" : ""));
}

// Segments hide a key from the queries of other segments but not from its
// own, so a key or value that is not finite cannot be zeroed the way a padded
// key is, and 0 x inf would reach the other segments' rows as NaN: such a
// call is refused by name instead (a padded key may hold anything).
template <class T>
void check_segmented_keys_finite(const AttentionForward<T>& p) {
  if (p.q_segments.empty()) return;
  const int64_t B = p.k.shape[0], Hkv = p.k.shape[1], Lk = p.k.shape[2];
  const auto refuse = [](int64_t b, int64_t j) {
    throw std::invalid_argument("relpos: k, v: key " + std::to_string(j) + " of batch row " + std::to_string(b) +
                                " holds a value that is not finite, beside segments (q_segments, k_segments), which "
                                "would reach other segments' rows as NaN; pad such a key (key_padding) instead");
  };
  const auto row_finite = [](const View4<const T>& x, int64_t b, int64_t h, int64_t j) {
    return all_finite(View<const T, 1>{&x(b, h, j, 0), {x.shape[3]}, {x.stride[3]}});
  };
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < Hkv; ++h) {
      // A head's rows at once where the vector check reads them (the common case), else row by row.
      if constexpr (std::is_same_v<T, float> || std::is_same_v<T, double>)
        if (p.key_padding.empty() && p.k.stride[3] == 1 && p.v.stride[3] == 1 &&
            rows::rows_finite(&p.k(b, h, 0, 0), Lk, p.k.shape[3], p.k.stride[2]) &&
            rows::rows_finite(&p.v(b, h, 0, 0), Lk, p.v.shape[3], p.v.stride[2]))
          continue;
      for (int64_t j = 0; j < Lk; ++j)
        if (!(!p.key_padding.empty() && p.key_padding(b, j) != 0) &&
            !(row_finite(p.k, b, h, j) && row_finite(p.v, b, h, j)))
          refuse(b, j);
    }
}
}  // namespace

namespace half_storage {
void forward_chunk(const AttentionForward<float>& p) {
  run(p, reference::forward<float>, fused::forward<float>, unfused::forward<float>);
}
}  // namespace half_storage

template <class T>
void attention_forward(const AttentionForward<T>& p) {
  const AsyncSignalsHeld signals;
  validate_forward(p);
  check_segmented_keys_finite(p);
  if constexpr (is_half_v<T>)
    half_storage::forward(p);
  else
    run(p, reference::forward<T>, fused::forward<T>, unfused::forward<T>);
  check_scores_stayed_finite(p);
}

namespace {
// A backward whose dk, dv cover keys key_grads_from .. Lk - 1: the fused
// kernel skips the other keys itself; the other algorithms compute every
// key's gradient into full-length buffers, whose rows from there on are added
// into the caller's.
template <class T>
void run_backward(const AttentionBackward<T>& p) {
  const int64_t from = p.key_grads_from;
  if (from == 0 || resolve_algorithm(p) == Algorithm::fused)
    return run(p, reference::backward<T>, fused::backward<T>, unfused::backward<T>);
  AttentionBackward<T> every_key = p;
  every_key.key_grads_from = 0;
  Scratch<T> dk, dv;
  const auto full_length = [&](const View4<T>& given, Scratch<T>& storage) {  // given's shape with Lk rows
    if (given.empty()) return given;
    std::array<int64_t, 4> shape = given.shape;
    shape[2] = p.k.shape[2];
    storage.resize(shape[0] * shape[1] * shape[2] * shape[3]);
    return View4<T>::contiguous(storage.data(), shape);
  };
  every_key.dk = full_length(p.dk, dk);
  every_key.dv = full_length(p.dv, dv);
  run(every_key, reference::backward<T>, fused::backward<T>, unfused::backward<T>);
  for (const auto& [into, all] : {std::pair{p.dk, every_key.dk}, {p.dv, every_key.dv}})
    if (!into.empty()) add_view(into, View4<T>{all.data + from * all.stride[2], into.shape, all.stride});
}

// Grouped-query attention: the query heads of a group run in parallel and
// would add into one key head's dk, dv at once. Each query head's gradients
// go to its own slice of a (B, H, Lk, .) buffer instead, summed per group in
// head order afterwards: the same bits on every run.
template <class T>
void backward_grouped(const AttentionBackward<T>& p) {
  const int64_t B = p.q.shape[0], H = p.q.shape[1], Hkv = p.k.shape[1], group = H / Hkv;
  const int64_t Lk = p.k.shape[2] - p.key_grads_from;  // rows of dk, dv
  AttentionBackward<T> per_head = p;
  Scratch<T> dk, dv;
  if (!p.dk.empty()) {
    dk.resize(B * H * Lk * p.k.shape[3]);
    per_head.dk = View4<T>::contiguous(dk.data(), {B, H, Lk, p.k.shape[3]});
  }
  if (!p.dv.empty()) {
    dv.resize(B * H * Lk * p.v.shape[3]);
    per_head.dv = View4<T>::contiguous(dv.data(), {B, H, Lk, p.v.shape[3]});
  }
  run_backward(per_head);
  const auto sum_groups = [&](const View4<T>& into, const View4<T>& heads) {
    if (into.empty()) return;
    for (int64_t b = 0; b < B; ++b)
      for (int64_t hk = 0; hk < Hkv; ++hk)
        for (int64_t g = 0; g < group; ++g)
          for (int64_t j = 0; j < Lk; ++j)
            for (int64_t c = 0; c < into.shape[3]; ++c) into(b, hk, j, c) += heads(b, hk * group + g, j, c);
  };
  sum_groups(p.dk, per_head.dk);
  sum_groups(p.dv, per_head.dv);
}
}  // namespace

template <class T>
void attention_backward(const AttentionBackward<T>& p) {
  const AsyncSignalsHeld signals;
  validate_backward(p);
  check_segmented_keys_finite(p);
  if constexpr (is_half_v<T>)
    half_storage::backward(p);
  else if (p.k.shape[1] != p.q.shape[1])
    backward_grouped(p);
  else
    run_backward(p);
}

#define RELPOS_INSTANTIATE(T)                                                        \
  template void attention_forward<T>(const AttentionForward<T>&);                  \
  template void attention_backward<T>(const AttentionBackward<T>&);                \
  template Algorithm resolve_algorithm<T>(const AttentionForward<T>&);             \
  template void check_algorithm<T>(const AttentionForward<T>&);                    \
  template std::vector<Algorithm> available_algorithms<T>(const AttentionForward<T>&);
RELPOS_INSTANTIATE(float)
RELPOS_INSTANTIATE(double)
RELPOS_INSTANTIATE(bfloat16)
RELPOS_INSTANTIATE(float16)
#undef RELPOS_INSTANTIATE

}  // namespace relpos
