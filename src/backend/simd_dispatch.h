// What the files of SIMD loops (simd_*.cpp), simd.cpp and the SIMD test
// (tests/cpp/backend/simd_test.cpp) share outside Highway's per-target code:
// which targets they compile, so that a target's index means the same in each
// file's tables, and a dispatch to relpos's chosen target that applies
// RELPOS_SIMD first. Include it before any Highway header.
#pragma once

#include <cstddef>
#include <cstdlib>
#include <string>

#include "simd.hpp"

// Every target this compiler can build, also those below the build's -march
// (so that RELPOS_SIMD=sse4 runs an SSE4 variant on any machine). Here, so
// that every file compiles the same targets: relpos's one chosen target then
// means the same in each file's tables.
#ifndef HWY_COMPILE_ALL_ATTAINABLE
#define HWY_COMPILE_ALL_ATTAINABLE
#endif

namespace hwy {
struct ChosenTarget;
}

namespace relpos::simd::detail {

// The target every relpos SIMD loop dispatches to: relpos's own
// hwy::ChosenTarget (simd.cpp), set from the targets this CPU supports and
// RELPOS_SIMD before the first dispatch, and by limit_targets. Highway's
// process-wide one is not used: Highway 1.0.3's SupportedTargets() resets it
// to every target the CPU has (relpos.info() asks after a dispatch), which
// dropped a limit, and holding one through Highway meant its test hook
// SetSupportedTargetsForTest.
hwy::ChosenTarget& chosen_target();

// Sets chosen_target to the best target up to `name` ("" for the CPU's
// best); limit_targets without RELPOS_SIMD's first application.
void set_targets(const std::string& name);

// Applies RELPOS_SIMD (or the CPU's best) once, before the first dispatch or
// limit_targets (a throw leaves it to the next call). A static's initialiser,
// not std::call_once: every later call is one inlined check, and the row loops
// call through here per row. Inline, so that the files of loops share the one
// static.
inline void apply_environment() {
  static const bool applied = [] {
    const char* limit = std::getenv("RELPOS_SIMD");
    set_targets(limit ? limit : "");
    return true;
  }();
  (void)applied;
}

// The entry of a dispatch table (HWY_EXPORT's) for `target` (a
// hwy::ChosenTarget): GetIndex reads the mask of the targets compiled in the
// calling file, as HWY_DYNAMIC_DISPATCH does; a build of one target has a
// table of one entry, the function itself. The SIMD test picks each target's
// entry of its own table with it.
template <class Function, size_t kEntries, class Target>
Function* table_entry(Function* const (&table)[kEntries], const Target& target) {
  return table[kEntries == 1 ? 0 : target.GetIndex()];
}

}  // namespace relpos::simd::detail

// Name's dispatch table entry for relpos's chosen target, once RELPOS_SIMD is
// applied: the comma reads the target only after apply_environment may have
// set it.
#define RELPOS_SIMD_DISPATCH(Name)                 \
  (::relpos::simd::detail::apply_environment(),    \
   ::relpos::simd::detail::table_entry(HWY_DISPATCH_TABLE(Name), ::relpos::simd::detail::chosen_target()))
