// Strided, non-owning views over caller memory.
//
// relpos never owns the tensors it computes on: callers (C++, NumPy, PyTorch)
// hand in a pointer, a shape and strides counted in elements, so any layout
// (B, H, L, D) or (B, L, H, D) or a slice of a larger buffer works without a copy.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <type_traits>

namespace relpos {

template <class T, std::size_t N>
struct View {
  T* data = nullptr;
  std::array<int64_t, N> shape{};
  std::array<int64_t, N> stride{};

  bool empty() const { return data == nullptr; }

  int64_t numel() const {
    int64_t n = 1;
    for (int64_t s : shape) n *= s;
    return n;
  }

  template <class... I>
  T& operator()(I... idx) const {
    static_assert(sizeof...(I) == N, "one index per dimension");
    const int64_t ix[N] = {static_cast<int64_t>(idx)...};
    int64_t off = 0;
    for (std::size_t a = 0; a < N; ++a) off += ix[a] * stride[a];
    return data[off];
  }

  // Row-major view of a dense buffer.
  static View contiguous(T* data, std::array<int64_t, N> shape) {
    View v;
    v.data = data;
    v.shape = shape;
    int64_t s = 1;
    for (std::size_t a = N; a-- > 0;) {
      v.stride[a] = s;
      s *= shape[a];
    }
    return v;
  }

  // The same memory seen as read-only.
  operator View<const T, N>() const
    requires(!std::is_const_v<T>)
  {
    return {data, shape, stride};
  }
};

template <class T>
using View1 = View<T, 1>;
template <class T>
using View2 = View<T, 2>;
template <class T>
using View3 = View<T, 3>;
template <class T>
using View4 = View<T, 4>;

}  // namespace relpos
