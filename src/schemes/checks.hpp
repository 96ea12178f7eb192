// The argument checks shared by validation (src/attention/validate.cpp) and the
// scheme files: each names the argument it rejects, in a std::invalid_argument
// that starts with "relpos: ".
#pragma once

#include <array>
#include <cstdlib>
#include <sstream>
#include <stdexcept>
#include <string>

#include "relpos/attention.hpp"

namespace relpos::checks {

[[noreturn]] inline void fail(const std::string& msg) { throw std::invalid_argument("relpos: " + msg); }

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

inline std::string dims(const char* what, int64_t n) { return std::string(what) + "=" + std::to_string(n); }

template <class T>
const char* precision_name() {
  if constexpr (std::is_same_v<T, bfloat16>) return "bfloat16";
  if constexpr (std::is_same_v<T, float16>) return "float16";
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

}  // namespace relpos::checks
