// Ctrl-C (SIGINT) and SIGTERM during a long run ask it to stop after its
// current step, save its work and exit non-zero, instead of killing it with
// everything since the last checkpoint lost. A second signal ends the
// process at once (the default action).
#pragma once

namespace relpos::cli {

class StopOnSignal {
 public:
  StopOnSignal();   // installs the handlers
  ~StopOnSignal();  // restores the previous ones
  StopOnSignal(const StopOnSignal&) = delete;
  StopOnSignal& operator=(const StopOnSignal&) = delete;

  static bool requested();
  static const char* signal_name();  // "SIGINT" or "SIGTERM"
  static int exit_status();          // 128 + the signal, as a shell reports it
};

}  // namespace relpos::cli
