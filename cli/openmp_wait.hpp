// Idle OpenMP threads spin by default: with another process on the cores, a
// spinning team slowed training 7-14x. The relpos command runs its OpenMP
// runtime (shared with the GEMM library) with the passive wait policy, unless
// the user set OMP_WAIT_POLICY or GOMP_SPINCOUNT.
#pragma once

namespace relpos::cli {

// Call first thing in main(): re-executes the program once with
// OMP_WAIT_POLICY=passive in its environment, or returns.
void use_passive_openmp_wait(char** argv);

}  // namespace relpos::cli
