#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>

#include "relpos/position.hpp"

namespace relpos {

void check_t5_config(bool bidirectional, int64_t num_buckets, int64_t max_distance, const std::string& num_buckets_name,
                     const std::string& max_distance_name) {
  const int64_t max_exact = (bidirectional ? num_buckets / 2 : num_buckets) / 2;
  if (num_buckets < 2 || max_exact < 1 || num_buckets > kMaxPosition)
    throw std::invalid_argument(num_buckets_name + ": need >= 2 (causal) or >= 4 (bidirectional), got " +
                                std::to_string(num_buckets));
  if (max_distance <= max_exact || max_distance > kMaxPosition)
    throw std::invalid_argument(max_distance_name + ": must exceed the exact range " + std::to_string(max_exact) +
                                " (and be <= 2^40), got " + std::to_string(max_distance));
}

namespace {

// The float32 logarithm rounded correctly: computed in long double (64-bit
// significand on x86-64) and rounded once to float. Over every float32 in
// [1, 2^42) this differs from rounding the double log at two inputs, where the
// double log lies exactly on a rounding boundary, and there (and at the four
// other near-boundary inputs) matches the 60-digit logarithm. A platform's
// float log may be an ulp off (glibc's logf by up to 0.82 ulp, vectorised ones
// often), which moves a bucket where the scaled value is near an integer.
float log_correctly_rounded(float x) { return static_cast<float>(std::log(static_cast<long double>(x))); }

}  // namespace

int64_t t5_bucket(int64_t r, bool bidirectional, int64_t num_buckets, int64_t max_distance) {
  // Every distance beyond kMaxPosition >= max_distance lands in the last
  // bucket; clamping first keeps -r defined for r = INT64_MIN.
  r = std::clamp(r, -kMaxPosition, kMaxPosition);
  int64_t bucket = 0;
  int64_t n = r;  // becomes the non-negative distance
  if (bidirectional) {
    num_buckets /= 2;
    if (r > 0) bucket += num_buckets;
    n = r < 0 ? -r : r;
  } else {
    n = r < 0 ? -r : 0;  // future keys share bucket 0
  }
  const int64_t max_exact = num_buckets / 2;
  if (n < max_exact) return bucket + n;
  // Upstream evaluates this in float32: the distance is cast to float, the
  // Python scalars (max_exact, the double log ratio, the bucket span) are cast
  // to float, and .to(long) truncates. Each float32 step here is IEEE-exact as
  // there; the logarithm is the correctly rounded one (docs/design.md, section 1).
  const float log_ratio = static_cast<float>(std::log(static_cast<double>(max_distance) / max_exact));
  const float scaled = log_correctly_rounded(static_cast<float>(n) / static_cast<float>(max_exact)) / log_ratio *
                       static_cast<float>(num_buckets - max_exact);
  int64_t large = max_exact + static_cast<int64_t>(scaled);
  if (large > num_buckets - 1) large = num_buckets - 1;
  return bucket + large;
}

}  // namespace relpos
