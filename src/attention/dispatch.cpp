// The one place where a call is validated and routed to an algorithm.
#include <stdexcept>

#include "reference.hpp"
#include "relpos/attention.hpp"

namespace relpos {

namespace {
constexpr std::pair<Scheme, const char*> kSchemeNames[] = {
    {Scheme::none, "none"}, {Scheme::shaw, "shaw"}, {Scheme::t5, "t5"},
    {Scheme::alibi, "alibi"}, {Scheme::rope, "rope"}, {Scheme::xl, "xl"}};
constexpr std::pair<Algorithm, const char*> kAlgorithmNames[] = {
    {Algorithm::automatic, "auto"}, {Algorithm::reference, "reference"}};

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

template <class T>
void attention_forward(const AttentionForward<T>& p) {
  validate_forward(p);
  switch (p.algorithm) {
    case Algorithm::automatic:
    case Algorithm::reference:
      reference::forward(p);
      return;
  }
  throw std::invalid_argument("relpos: algorithm out of range");
}

template <class T>
void attention_backward(const AttentionBackward<T>& p) {
  validate_backward(p);
  switch (p.algorithm) {
    case Algorithm::automatic:
    case Algorithm::reference:
      reference::backward(p);
      return;
  }
  throw std::invalid_argument("relpos: algorithm out of range");
}

template void attention_forward<float>(const AttentionForward<float>&);
template void attention_forward<double>(const AttentionForward<double>&);
template void attention_backward<float>(const AttentionBackward<float>&);
template void attention_backward<double>(const AttentionBackward<double>&);

}  // namespace relpos
