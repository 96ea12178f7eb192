// Parallel loops of the attention algorithms over OpenMP threads.
#pragma once

#include <omp.h>

#include <algorithm>
#include <cstdint>
#include <exception>

namespace relpos {

// Threads for `items` independent work items: `requested` (0 = OpenMP's
// maximum), never more than there are items.
inline int thread_count(int64_t requested, int64_t items) {
  const int64_t want = requested > 0 ? requested : omp_get_max_threads();
  return static_cast<int>(std::max<int64_t>(1, std::min(want, items)));
}

// Runs body(thread, item) for item = 0 .. items-1 on `threads` OpenMP threads
// (static split: the same items go to the same thread on every call), after
// init(thread) built each thread's state. GEMMs inside run on the calling
// thread only. An exception on any thread is rethrown here, never lost.
template <class Init, class Body>
void parallel_for(int64_t items, int threads, Init init, Body body) {
  std::exception_ptr error;
#pragma omp parallel num_threads(threads)
  {
    omp_set_num_threads(1);  // this thread's nested regions (the GEMM library's) stay on it
    const int t = omp_get_thread_num();
    bool ready = false;
    try {
      init(t);
      ready = true;
    } catch (...) {
#pragma omp critical(relpos_error)
      if (!error) error = std::current_exception();
    }
#pragma omp for schedule(static)
    for (int64_t item = 0; item < items; ++item) {
      if (!ready) continue;
      try {
        body(t, item);
      } catch (...) {
#pragma omp critical(relpos_error)
        if (!error) error = std::current_exception();
      }
    }
  }
  if (error) std::rethrow_exception(error);
}

}  // namespace relpos
