// The one place where a call is validated and routed to an algorithm.
#include <stdexcept>

#include "../backend/scratch.hpp"
#include "fused.hpp"
#include "reference.hpp"
#include "unfused.hpp"
#include "relpos/attention.hpp"

namespace relpos {

namespace {
constexpr std::pair<Scheme, const char*> kSchemeNames[] = {
    {Scheme::none, "none"}, {Scheme::shaw, "shaw"}, {Scheme::t5, "t5"},
    {Scheme::alibi, "alibi"}, {Scheme::rope, "rope"}, {Scheme::xl, "xl"}};
constexpr std::pair<Algorithm, const char*> kAlgorithmNames[] = {
    {Algorithm::automatic, "auto"},     {Algorithm::reference, "reference"},
    {Algorithm::split, "split"},        {Algorithm::gather, "gather"},
    {Algorithm::skew, "skew"},          {Algorithm::generalized_skew, "generalized_skew"},
    {Algorithm::relshift, "relshift"},  {Algorithm::fused, "fused"}};

template <class E, size_t N>
E parse(const std::pair<E, const char*> (&names)[N], const std::string& s, const char* what) {
  std::string known;
  for (const auto& [e, n] : names) {
    if (s == n) return e;
    known += (known.empty() ? "" : ", ") + std::string(n);
  }
  throw std::invalid_argument(std::string("relpos: unknown ") + what + " '" + s + "' (known: " + known + ")");
}

template <class E, size_t N>
const char* name_of(const std::pair<E, const char*> (&names)[N], E e) {
  for (const auto& [x, n] : names)
    if (x == e) return n;
  return "?";
}
}  // namespace

const char* to_string(Scheme s) { return name_of(kSchemeNames, s); }
const char* to_string(Algorithm a) { return name_of(kAlgorithmNames, a); }
Scheme parse_scheme(const std::string& name) { return parse(kSchemeNames, name, "scheme"); }
Algorithm parse_algorithm(const std::string& name) { return parse(kAlgorithmNames, name, "algorithm"); }

// The fused kernel serves every call, needs no (L, L) buffer and was the
// fastest in `relpos bench attention` for every scheme at every length
// measured (see README), so it is the automatic choice.
template <class T>
Algorithm resolve_algorithm(const AttentionForward<T>& p) {
  return p.algorithm == Algorithm::automatic ? Algorithm::fused : p.algorithm;
}

template <class T>
void check_algorithm(const AttentionForward<T>& p) {
  const Algorithm a = resolve_algorithm(p);
  if (a != Algorithm::reference && a != Algorithm::fused)  // those two serve every call
    unfused::make_term<T>(a, p, nullptr);                  // throws if a does not serve p
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

template <class T>
void attention_forward(const AttentionForward<T>& p) {
  validate_forward(p);
  run(p, reference::forward<T>, fused::forward<T>, unfused::forward<T>);
}

namespace {
// Grouped-query attention: the query heads of a group run in parallel and
// would add into one key head's dk, dv at once. Each query head's gradients
// go to its own slice of a (B, H, Lk, .) buffer instead, summed per group in
// head order afterwards: the same bits on every run.
template <class T>
void backward_grouped(const AttentionBackward<T>& p) {
  const int64_t B = p.q.shape[0], H = p.q.shape[1], Hkv = p.k.shape[1], group = H / Hkv, Lk = p.k.shape[2];
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
  run(per_head, reference::backward<T>, fused::backward<T>, unfused::backward<T>);
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
  validate_backward(p);
  if (p.k.shape[1] != p.q.shape[1])
    backward_grouped(p);
  else
    run(p, reference::backward<T>, fused::backward<T>, unfused::backward<T>);
}

template void attention_forward<float>(const AttentionForward<float>&);
template void attention_forward<double>(const AttentionForward<double>&);
template void attention_backward<float>(const AttentionBackward<float>&);
template void attention_backward<double>(const AttentionBackward<double>&);
template Algorithm resolve_algorithm<float>(const AttentionForward<float>&);
template Algorithm resolve_algorithm<double>(const AttentionForward<double>&);
template void check_algorithm<float>(const AttentionForward<float>&);
template void check_algorithm<double>(const AttentionForward<double>&);

}  // namespace relpos
