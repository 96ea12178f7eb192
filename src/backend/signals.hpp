// While a relpos call computes, the calling thread takes no asynchronous
// signal: oneDNN's JIT GEMM kernels point the stack register into heap
// memory while they run, so a signal handler entered on such a thread
// writes its frame over the heap (oneDNN issue 4845: "corrupted size vs.
// prev_size" aborts, seen with Ctrl-C during training). Signals that arrive
// during the call are delivered when it returns (or to a thread outside
// relpos). Worker threads that OpenMP starts inside a call inherit the
// mask, so relpos's own pool never takes them either. Synchronous signals
// (SIGSEGV, SIGFPE, ...) are not held. Two system calls per call.
#pragma once

#include <pthread.h>
#include <signal.h>

namespace relpos {

class AsyncSignalsHeld {
 public:
  AsyncSignalsHeld() {
    sigset_t held;
    sigemptyset(&held);
    for (int sig : {SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGALRM, SIGVTALRM, SIGPROF, SIGUSR1, SIGUSR2, SIGCHLD, SIGWINCH})
      sigaddset(&held, sig);
    pthread_sigmask(SIG_BLOCK, &held, &saved_);
  }
  ~AsyncSignalsHeld() { pthread_sigmask(SIG_SETMASK, &saved_, nullptr); }
  AsyncSignalsHeld(const AsyncSignalsHeld&) = delete;
  AsyncSignalsHeld& operator=(const AsyncSignalsHeld&) = delete;

 private:
  sigset_t saved_;
};

}  // namespace relpos
