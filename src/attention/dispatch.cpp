// The one place where a call is validated and routed to an algorithm.
#include <stdexcept>

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

template <class T>
void attention_backward(const AttentionBackward<T>& p) {
  validate_backward(p);
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
