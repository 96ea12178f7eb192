// Per-thread partial gradients of the positional parameters. Threads that
// work on different heads may share a parameter (a Shaw table shared by heads,
// a T5 table row shared by the batch), so each thread adds into its own zeroed
// copy and the copies are summed into the caller's buffers in thread order:
// the result does not depend on thread timing.
#pragma once

#include "../backend/scratch.hpp"
#include "../schemes/registry.hpp"
#include "relpos/attention.hpp"

namespace relpos {

// dst += src, elementwise, any strides.
template <class T, std::size_t N>
void add_view(const View<T, N>& dst, const View<T, N>& src) {
  std::array<int64_t, N> idx{};
  const int64_t n = dst.numel();
  for (int64_t flat = 0; flat < n; ++flat) {
    int64_t od = 0, os = 0;
    for (std::size_t a = 0; a < N; ++a) od += idx[a] * dst.stride[a], os += idx[a] * src.stride[a];
    dst.data[od] += src.data[os];
    for (std::size_t a = N; a-- > 0;) {  // odometer increment, last index fastest
      if (++idx[a] < dst.shape[a]) break;
      idx[a] = 0;
    }
  }
}

// Calls f(a.x, b.x) for every gradient member x of two PositionGrads.
template <class T, class B, class F>
void for_each_grad(const PositionGrads<T>& a, B& b, F&& f) {
  const PositionParams<T> no_params;
  for_each_scheme_param(no_params, [&](const char*, const auto&, auto& x, auto& y) { f(x, y); }, a, b);
}

template <class T>
class GradPartials {
 public:
  // Zeroed buffers shaped like target's non-empty views.
  explicit GradPartials(const PositionGrads<T>& target) {
    int64_t total = 0;
    for_each_grad(target, views_, [&](const auto& t, auto&) { total += t.empty() ? 0 : t.numel(); });
    storage_.assign(total, T(0));
    int64_t offset = 0;
    for_each_grad(target, views_, [&](const auto& t, auto& mine) {
      if (t.empty()) return;
      mine = std::remove_reference_t<decltype(mine)>::contiguous(storage_.data() + offset, t.shape);
      offset += t.numel();
    });
  }
  GradPartials(const GradPartials&) = delete;
  GradPartials& operator=(const GradPartials&) = delete;

  const PositionGrads<T>& grads() const { return views_; }

  void add_into(const PositionGrads<T>& target) const {
    for_each_grad(target, views_, [](const auto& t, const auto& mine) {
      if (!t.empty()) add_view(t, mine);
    });
  }

 private:
  Scratch<T> storage_;
  PositionGrads<T> views_;
};

}  // namespace relpos
