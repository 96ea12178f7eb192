// Attention dropout as the kernels apply it to one head (relpos/dropout.hpp):
// the multipliers z(i, j) = keep(i, j) / (1 - p) of a run of a query row's
// keys, drawn where a tile needs them (the forward and again the backward),
// by the vector Philox of simd.hpp's dropout_row. Shared by the unfused
// pipeline and the fused kernel; the reference draws entry by entry
// (dropout_keeps) instead.
#pragma once

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "../backend/simd.hpp"
#include "relpos/attention.hpp"

namespace relpos {

template <class T>
class DropoutRows {
 public:
  DropoutRows() = default;
  // Head (b, h) of call p; inactive where p has no dropout.
  template <class S>
  DropoutRows(const AttentionForward<S>& p, int64_t b, int64_t h) {
    const AttentionDropout& d = p.dropout;
    active_ = d.active();
    if (!active_) return;
    row_.k0 = uint32_t(d.seed), row_.k1 = uint32_t(d.seed >> 32);
    row_.c2 = uint32_t((d.batch_offset + b) * p.q.shape[1] + h), row_.c3 = d.offset;
    row_.threshold = philox::keep_threshold(d.p);
    scale_ = T(dropout_scale(d));
    // float kernels take the multipliers as drawn; double ones draw 0 / 1 and scale in double
    row_.scale = std::is_same_v<T, float> ? float(scale_) : 1.0f;
    q_offset_ = p.q_offset, k_offset_ = p.k_offset;
  }

  bool active() const { return active_; }
  T scale() const { return scale_; }

  // z[jj] = the multiplier of (query i, key j0 + jj), jj < n.
  void fill(int64_t i, int64_t j0, int64_t n, T* z) const { apply(i, j0, n, nullptr, nullptr, z); }

  // out[jj] = x[jj] times the multiplier of (query i, key j0 + jj) (out may
  // be x), and z[jj] = the multiplier where z is not null; jj < n.
  void apply(int64_t i, int64_t j0, int64_t n, const T* x, T* out, T* z) const {
    simd::DropoutRow r = row_;
    r.c1 = uint32_t(q_offset_ + i);
    const uint32_t kp0 = uint32_t(k_offset_ + j0);
    if constexpr (std::is_same_v<T, float>) {
      if (out)
        simd::dropout_times(r, kp0, x, out, z, n);
      else
        simd::dropout_row(r, kp0, z, n);
    } else {
      float bits[256];  // 0 / 1, then scaled in T
      for (int64_t done = 0; done < n; done += 256) {
        const int64_t count = std::min<int64_t>(256, n - done);
        simd::dropout_row(r, kp0 + uint32_t(done), bits, count);
        for (int64_t jj = done; jj < done + count; ++jj) {
          const T multiplier = T(bits[jj - done]) * scale_;
          if (z) z[jj] = multiplier;
          if (out) out[jj] = x[jj] * multiplier;
        }
      }
    }
  }

 private:
  bool active_ = false;
  simd::DropoutRow row_;
  T scale_ = T(1);
  int64_t q_offset_ = 0, k_offset_ = 0;
};

}  // namespace relpos
