// What the files of SIMD loops (simd_*.cpp) and simd.cpp share outside
// Highway's per-target code: which targets they compile, and a dispatch that
// applies RELPOS_SIMD first. Include it before any Highway header.
#pragma once

#include <cstdlib>

#include "simd.hpp"

// Every target this compiler can build, also those below the build's -march
// (so that RELPOS_SIMD=sse4 runs an SSE4 variant on any machine). Here, so
// that every file compiles the same targets: the one chosen target Highway
// keeps for the process then means the same in each file's tables.
#ifndef HWY_COMPILE_ALL_ATTAINABLE
#define HWY_COMPILE_ALL_ATTAINABLE
#endif

namespace relpos::simd::detail {

// Applies RELPOS_SIMD once, before the first dispatch (a throw leaves it to
// the next call). A static's initialiser, not std::call_once: every later
// call is one inlined check, and the row loops call through here per row.
// Inline, so that the files of loops share the one static.
inline void apply_environment() {
  static const bool applied = [] {
    if (const char* limit = std::getenv("RELPOS_SIMD"); limit && *limit) limit_targets(limit);
    return true;
  }();
  (void)applied;
}

}  // namespace relpos::simd::detail

// HWY_DYNAMIC_DISPATCH(Name) once RELPOS_SIMD is applied: the comma reads the
// chosen target only after apply_environment may have limited it.
#define RELPOS_SIMD_DISPATCH(Name) (::relpos::simd::detail::apply_environment(), HWY_DYNAMIC_DISPATCH(Name))
