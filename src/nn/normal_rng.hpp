// The model's own random numbers: splitmix64 for uniform 64-bit words and
// Box-Muller for normals, so an initialisation depends only on the seed, never
// on the standard library's distributions (which differ between vendors).
#pragma once

#include <cmath>
#include <cstdint>

namespace relpos::nn {

class NormalRng {
 public:
  explicit NormalRng(uint64_t seed) : state_(seed) {}

  uint64_t next_u64() {
    uint64_t z = (state_ += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }

  // Uniform in (0, 1): the top 53 bits, offset by half a step so log() never sees 0.
  double uniform() { return (static_cast<double>(next_u64() >> 11) + 0.5) * 0x1.0p-53; }

  // Standard normal; Box-Muller yields two per pair of uniforms, the second is kept.
  double normal() {
    if (has_spare_) {
      has_spare_ = false;
      return spare_;
    }
    const double radius = std::sqrt(-2.0 * std::log(uniform()));
    const double angle = 2.0 * 3.14159265358979323846 * uniform();
    spare_ = radius * std::sin(angle);
    has_spare_ = true;
    return radius * std::cos(angle);
  }

 private:
  uint64_t state_;
  double spare_ = 0;
  bool has_spare_ = false;
};

}  // namespace relpos::nn
