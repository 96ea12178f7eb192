// Scratch buffers whose bytes are counted in relpos::memory_stats().
#pragma once

#include <cstddef>
#include <new>
#include <vector>

#include "relpos/memory.hpp"

namespace relpos {

namespace detail {
void count_allocation(std::ptrdiff_t bytes);  // negative for a release
}

template <class T>
struct TrackingAllocator {
  using value_type = T;
  TrackingAllocator() = default;
  template <class U>
  TrackingAllocator(const TrackingAllocator<U>&) {}

  T* allocate(std::size_t n) {
    T* p = std::allocator<T>{}.allocate(n);
    detail::count_allocation(static_cast<std::ptrdiff_t>(n * sizeof(T)));
    return p;
  }
  void deallocate(T* p, std::size_t n) {
    detail::count_allocation(-static_cast<std::ptrdiff_t>(n * sizeof(T)));
    std::allocator<T>{}.deallocate(p, n);
  }
  template <class U>
  bool operator==(const TrackingAllocator<U>&) const {
    return true;
  }
};

// A counted, zero-initialised std::vector.
template <class T>
using Scratch = std::vector<T, TrackingAllocator<T>>;

}  // namespace relpos
