// Target selection for the SIMD loops of simd.hpp, which live one family per
// file (simd.hpp lists them): the names RELPOS_SIMD and limit_targets take, and the
// target dispatch chooses now: relpos's own chosen target (simd_dispatch.h),
// one for the process, so limiting it here limits every file's dispatch. This file is
// compiled once per target (foreach_target.h) for TargetName alone.
#include "simd_dispatch.h"  // first: the targets to compile

#include <atomic>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "src/backend/simd.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>

HWY_BEFORE_NAMESPACE();
namespace relpos::simd::HWY_NAMESPACE {

const char* TargetName() { return hwy::TargetName(HWY_TARGET); }

}  // namespace relpos::simd::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace relpos::simd {

HWY_EXPORT(TargetName);

namespace {

// Targets by the name RELPOS_SIMD and limit_targets take, each with the
// targets no better than it.
int64_t targets_up_to(const std::string& name) {
  struct Named {
    const char* name;
    int64_t target;
  };
  const Named order[] = {{"scalar", HWY_SCALAR | HWY_EMU128}, {"sse4", HWY_SSSE3 | HWY_SSE4},
                         {"avx2", HWY_AVX2}, {"avx512", HWY_AVX3 | HWY_AVX3_DL}};
  int64_t mask = 0;
  for (const Named& n : order) {
    mask |= n.target;
    if (name == n.name) return mask;
  }
  throw std::invalid_argument("relpos: RELPOS_SIMD: unknown target '" + name + "' (avx512, avx2, sse4, scalar)");
}

std::vector<std::string> names(int64_t targets) {
  std::vector<std::string> out;
  for (int64_t t = targets; t != 0; t &= t - 1) out.push_back(hwy::TargetName(t & -t));
  return out;
}

// The targets limit_targets last allowed (dispatch picks the best of them).
std::atomic<int64_t> allowed_targets{0};

}  // namespace

std::string active_target() { return RELPOS_SIMD_DISPATCH(TargetName)(); }
std::vector<std::string> compiled_targets() { return names(HWY_TARGETS); }
std::vector<std::string> supported_targets() {
  detail::apply_environment();
  return names(allowed_targets.load());
}

void limit_targets(const std::string& name) {
  detail::apply_environment();  // first, so that RELPOS_SIMD's first application cannot undo this limit
  detail::set_targets(name);
}

namespace detail {

void set_targets(const std::string& name) {
  int64_t allowed = hwy::SupportedTargets() & HWY_TARGETS;
  if (!name.empty()) {
    allowed &= targets_up_to(name);
    if (allowed == 0) throw std::invalid_argument("relpos: RELPOS_SIMD: no target up to '" + name + "' runs here");
  }
  allowed_targets.store(allowed);
  chosen_target().Update(allowed);
}

hwy::ChosenTarget& chosen_target() {
  static hwy::ChosenTarget target;  // GetIndex() 0 (Highway's first-call trampoline) until limit_targets
  return target;
}

}  // namespace detail

}  // namespace relpos::simd
#endif  // HWY_ONCE
