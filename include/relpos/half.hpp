// Half-width storage types: bfloat16 and IEEE float16.
//
// relpos stores q, k, v, out, dout, the gradients and the positional tables in
// these types when a call is made with them, and computes in float32 (its
// `compute_t`): logits, softmax statistics, the output accumulator and the
// parameter-gradient partials are float32, lse is float32, and every stored
// result is rounded once, to nearest even, at the end. The structs hold the
// 16 bits and convert to and from float; they do no arithmetic of their own.
#pragma once

#include <cstdint>
#include <cstring>
#include <type_traits>

namespace relpos {

namespace half_bits {

inline uint32_t of(float x) {
  uint32_t u;
  std::memcpy(&u, &x, 4);
  return u;
}
inline float from(uint32_t u) {
  float x;
  std::memcpy(&x, &u, 4);
  return x;
}

// float -> bfloat16 bits, to nearest even; NaN stays NaN (quiet), infinities stay.
inline uint16_t bf16_from_float(float x) {
  const uint32_t u = of(x);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40u);
  return static_cast<uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}
inline float float_from_bf16(uint16_t b) { return from(uint32_t(b) << 16); }

// float -> IEEE binary16 bits, to nearest even, with subnormals; beyond
// 65504 (after rounding) infinity, NaN stays NaN (quiet).
inline uint16_t f16_from_float(float x) {
  const uint32_t u = of(x);
  const uint16_t sign = static_cast<uint16_t>((u >> 16) & 0x8000u);
  const uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return sign | 0x7e00u;      // NaN
  if (a >= 0x477ff000u) return sign | 0x7c00u;     // rounds to >= 65520: infinity
  if (a < 0x38800000u) {                           // below 2^-14: subnormal or zero
    // a's value in units of 2^-24, rounded to nearest even, by float addition
    // of 0.5 (the float sum rounds exactly as binary16 would).
    const float scaled = from(a) + 0.5f;           // 0.5 = 2^-1: puts 2^-24 at the last mantissa bit
    return sign | static_cast<uint16_t>(of(scaled) - 0x3f000000u);
  }
  const uint32_t mant_odd = (a >> 13) & 1u;
  return sign | static_cast<uint16_t>((a - 0x38000000u + 0xfffu + mant_odd) >> 13);
}
inline float float_from_f16(uint16_t h) {
  const uint32_t sign = uint32_t(h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
  if (e == 0x1f) return from(sign | 0x7f800000u | (m << 13));  // infinity, NaN
  if (e == 0) return from(sign | of(float(m) * 5.9604644775390625e-08f));  // m * 2^-24, exact
  return from(sign | ((e + 112u) << 23) | (m << 13));
}

}  // namespace half_bits

struct bfloat16 {
  uint16_t bits = 0;
  bfloat16() = default;
  explicit bfloat16(float x) : bits(half_bits::bf16_from_float(x)) {}
  explicit bfloat16(double x) : bfloat16(static_cast<float>(x)) {}  // double -> float -> bf16: see README
  operator float() const { return half_bits::float_from_bf16(bits); }
};

struct float16 {
  uint16_t bits = 0;
  float16() = default;
  explicit float16(float x) : bits(half_bits::f16_from_float(x)) {}
  explicit float16(double x) : float16(static_cast<float>(x)) {}
  operator float() const { return half_bits::float_from_f16(bits); }
};

template <class T>
inline constexpr bool is_half_v = std::is_same_v<T, bfloat16> || std::is_same_v<T, float16>;

// The type a call stored in T computes in: float32 for the half types.
template <class T>
using compute_t = std::conditional_t<is_half_v<T>, float, T>;

}  // namespace relpos
