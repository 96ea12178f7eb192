#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>

#include "relpos/position.hpp"

namespace relpos {

namespace {

// The float32 logarithm rounded correctly: computed in long double, rounded once.
float log_f32(float v) { return static_cast<float>(std::log(static_cast<long double>(v))); }

// Upstream's denominator: the Python double (max - 1) / mid cast to float, its float32 log.
float log_ratio(int64_t position_buckets, int64_t max_relative_positions) {
  const int64_t mid = position_buckets / 2;
  return log_f32(static_cast<float>(static_cast<double>(max_relative_positions - 1) / static_cast<double>(mid)));
}

// A name as another argument's message mentions it: without the "relpos: " a
// message starts with.
std::string bare_name(const std::string& name) {
  const size_t colon = name.rfind(": ");
  return colon == std::string::npos ? name : name.substr(colon + 2);
}

}  // namespace

void check_deberta_config(int64_t position_buckets, int64_t max_relative_positions,
                          const std::string& position_buckets_name, const std::string& max_relative_positions_name) {
  if (max_relative_positions < 1 || max_relative_positions > kMaxPosition)
    throw std::invalid_argument(max_relative_positions_name + ": must be in [1, 2^40], got " +
                                std::to_string(max_relative_positions));
  if (position_buckets <= 0) return;
  if (position_buckets < 2 || position_buckets > kMaxPosition)
    throw std::invalid_argument(position_buckets_name + ": must be <= 0 (no buckets) or in [2, 2^40], got " +
                                std::to_string(position_buckets));
  // (max - 1) / mid must exceed 1 in float32 too (2^26 buckets reaching 2^25 + 2 rounds to 1).
  if (max_relative_positions - 1 <= position_buckets / 2 || !(log_ratio(position_buckets, max_relative_positions) > 0))
    throw std::invalid_argument(max_relative_positions_name + ": with " + bare_name(position_buckets_name) + " " +
                                std::to_string(position_buckets) + " must exceed " +
                                std::to_string(position_buckets / 2 + 1) + " (the log ratio would be <= 0), got " +
                                std::to_string(max_relative_positions));
}

int64_t deberta_bucket(int64_t x, int64_t position_buckets, int64_t max_relative_positions) {
  // Every |x| past 2^41 lands on an edge row of any table; clamping first keeps -x defined.
  x = std::clamp(x, -2 * kMaxPosition, 2 * kMaxPosition);
  const int64_t mid = position_buckets / 2;
  const int64_t n = x < 0 ? -x : x;
  if (position_buckets <= 0 || n <= mid) return x;
  // Upstream's float32 steps, each IEEE-exact as there: |x| and mid cast to
  // float and divided, its logarithm over log_ratio, times mid - 1, ceil,
  // plus mid. A bucket past 2^42 (a log ratio near 0) is held there: every
  // such bucket is past any table's edge.
  const float scaled = log_f32(static_cast<float>(n) / static_cast<float>(mid)) /
                       log_ratio(position_buckets, max_relative_positions) * static_cast<float>(mid - 1);
  const int64_t bucket = static_cast<int64_t>(std::ceil(std::min(scaled, 0x1p42f))) + mid;
  return x < 0 ? -bucket : bucket;
}

int64_t deberta_row(int64_t x, int64_t position_buckets, int64_t max_relative_positions) {
  const int64_t span = position_buckets > 0 ? position_buckets : max_relative_positions;
  return std::clamp(deberta_bucket(x, position_buckets, max_relative_positions) + span, int64_t(0), 2 * span - 1);
}

}  // namespace relpos
