// Measurements shared by `relpos check` and `relpos bench`: wall time, the
// library's scratch peak, the process's peak RSS, and which algorithms serve
// a call.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "relpos/attention.hpp"
#include "relpos/memory.hpp"

namespace relpos::cli {

// Best wall time of `reps` runs of f, in milliseconds.
template <class F>
double best_ms(F&& f, int reps) {
  double best = 1e300;
  for (int r = 0; r < reps; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    f();
    const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    best = ms < best ? ms : best;
  }
  return best;
}

// Peak RSS since the last reset (VmHWM) and current RSS (VmRSS), from
// /proc/self/status; -1 if unknown.
int64_t peak_rss_bytes();
int64_t current_rss_bytes();
// Starts a new peak-RSS measurement (/proc/self/clear_refs); false if the
// kernel does not allow it, in which case peak_rss_bytes is the process peak.
bool reset_peak_rss();

struct Footprint {
  int64_t scratch_peak = 0;  // bytes the library held at once beyond what it held before
  int64_t rss_growth = -1;   // process peak RSS during f minus RSS before it (-1 when unknown)
};

template <class F>
Footprint measure_footprint(F&& f) {
  const int64_t before = memory_stats().current_bytes;
  reset_peak_memory();
  const bool rss_ok = reset_peak_rss();
  const int64_t rss_before = current_rss_bytes();
  f();
  return {memory_stats().peak_bytes - before, rss_ok && rss_before >= 0 ? peak_rss_bytes() - rss_before : -1};
}

// The algorithms (not automatic) that serve p, in enum order.
template <class T>
std::vector<Algorithm> serving_algorithms(AttentionForward<T> p) {
  std::vector<Algorithm> out;
  for (Algorithm a : {Algorithm::reference, Algorithm::split, Algorithm::gather, Algorithm::skew,
                      Algorithm::generalized_skew, Algorithm::relshift, Algorithm::fused}) {
    p.algorithm = a;
    try {
      check_algorithm(p);
      out.push_back(a);
    } catch (const std::invalid_argument&) {
    }
  }
  return out;
}

// "1.5 GB", "12.0 MB", "640 kB"
std::string human_bytes(double bytes);

}  // namespace relpos::cli
