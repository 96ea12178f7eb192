// Rows of values converted between a storage type and a compute type:
// float32 / float64 copied, bfloat16 / float16 widened to float32 and
// rounded back through the SIMD layer when the row is contiguous.
#pragma once

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "relpos/half.hpp"
#include "simd.hpp"

namespace relpos::convert {

// dst[c * dst_stride] = To(src[c * src_stride]) for c < n.
template <class To, class From>
void row(const From* src, int64_t src_stride, To* dst, int64_t dst_stride, int64_t n) {
  const bool dense = src_stride == 1 && dst_stride == 1;
  if constexpr (std::is_same_v<To, float> && is_half_v<From>) {
    if (dense) {
      const auto* bits = reinterpret_cast<const uint16_t*>(src);
      return std::is_same_v<From, bfloat16> ? simd::widen_bf16(bits, dst, n) : simd::widen_f16(bits, dst, n);
    }
  } else if constexpr (is_half_v<To> && std::is_same_v<From, float>) {
    if (dense) {
      auto* bits = reinterpret_cast<uint16_t*>(dst);
      return std::is_same_v<To, bfloat16> ? simd::narrow_bf16(src, bits, n) : simd::narrow_f16(src, bits, n);
    }
  }
  for (int64_t c = 0; c < n; ++c) dst[c * dst_stride] = To(src[c * src_stride]);
}

// dst[c * stride] = S(T(dst[c * stride]) + src[c]): a sum formed in the
// compute type T and stored once.
template <class T, class S>
void add_into(S* dst, int64_t stride, const T* src, int64_t n) {
  if constexpr (std::is_same_v<S, T>) {
    for (int64_t c = 0; c < n; ++c) dst[c * stride] += src[c];
  } else {
    constexpr int64_t kChunk = 256;
    T wide[kChunk];
    for (int64_t c0 = 0; c0 < n; c0 += kChunk) {
      const int64_t m = std::min(kChunk, n - c0);
      row(dst + c0 * stride, stride, wide, 1, m);
      for (int64_t c = 0; c < m; ++c) wide[c] += src[c0 + c];
      row(wide, 1, dst + c0 * stride, stride, m);
    }
  }
}

// x[c] = T(bfloat16(x[c])): each value rounded to the nearest bfloat16 (ties
// to even) in place, as storing it in bfloat16 and reading it back would.
template <class T>
void round_to_bf16(T* x, int64_t n) {
  if constexpr (std::is_same_v<T, float>) {
    constexpr int64_t kChunk = 256;
    uint16_t bits[kChunk];
    for (int64_t c0 = 0; c0 < n; c0 += kChunk) {
      const int64_t m = std::min(kChunk, n - c0);
      simd::narrow_bf16(x + c0, bits, m);
      simd::widen_bf16(bits, x + c0, m);
    }
  } else {
    for (int64_t c = 0; c < n; ++c) x[c] = T(float(bfloat16(float(x[c]))));
  }
}

}  // namespace relpos::convert
