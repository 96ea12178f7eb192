// Ctrl-C (SIGINT) and SIGTERM during a long run ask it to stop after its
// current step, save its work and exit non-zero, instead of killing it with
// everything since the last checkpoint lost. A second signal ends the
// process at once (the default action), as does any signal while no
// StopOnSignal is alive.
//
// No signal handler ever runs on a computing thread: oneDNN's JIT GEMM
// kernels point the stack register into heap memory while they run, so a
// handler entered there writes its frame over the heap (oneDNN issue 4845;
// this tool aborted with "corrupted size vs. prev_size" about once in ten
// interrupted training runs on a loaded machine). main() blocks SIGINT and
// SIGTERM before any thread exists, so every thread inherits the block, and
// one dedicated thread takes them with sigwait().
#pragma once

namespace relpos::cli {

// Blocks SIGINT and SIGTERM in this (the only) thread and starts the thread
// that takes them. Call first in main(), before anything starts a thread.
void take_signals_on_their_own_thread();

class StopOnSignal {
 public:
  StopOnSignal();   // the first signal now asks to stop
  ~StopOnSignal();  // signals end the process again
  StopOnSignal(const StopOnSignal&) = delete;
  StopOnSignal& operator=(const StopOnSignal&) = delete;

  static bool requested();
  static const char* signal_name();  // "SIGINT" or "SIGTERM"
  static int exit_status();          // 128 + the signal, as a shell reports it
};

}  // namespace relpos::cli
