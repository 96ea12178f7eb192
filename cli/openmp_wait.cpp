#include "openmp_wait.hpp"

#include <unistd.h>

#include <cstdlib>

namespace relpos::cli {

// libgomp reads its wait policy once, while it is loaded, before main() runs;
// setting the variable now only reaches a fresh image of this program.
void use_passive_openmp_wait(char** argv) {
  if (std::getenv("OMP_WAIT_POLICY") || std::getenv("GOMP_SPINCOUNT")) return;  // the user decided
  if (setenv("OMP_WAIT_POLICY", "passive", 1) != 0) return;
  execv("/proc/self/exe", argv);
  // Only reached when the re-execution failed (no /proc): run with the runtime's
  // default policy rather than not at all.
}

}  // namespace relpos::cli
