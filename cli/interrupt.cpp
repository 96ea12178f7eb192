#include "interrupt.hpp"

#include <pthread.h>
#include <signal.h>

#include <atomic>
#include <cstdlib>
#include <thread>

namespace relpos::cli {

namespace {

std::atomic<int> received{0};
std::atomic<bool> stopping_allowed{false};

sigset_t stop_signals() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGTERM);
  return set;
}

// The default action of `sig` (terminate), taken by this thread.
[[noreturn]] void die_of(int sig) {
  signal(sig, SIG_DFL);
  sigset_t only;
  sigemptyset(&only);
  sigaddset(&only, sig);
  pthread_sigmask(SIG_UNBLOCK, &only, nullptr);
  raise(sig);
  std::_Exit(128 + sig);  // not reached: the default action ends the process
}

void take_signals() {
  const sigset_t set = stop_signals();
  for (;;) {
    int sig = 0;
    if (sigwait(&set, &sig) != 0) continue;
    int none = 0;
    if (stopping_allowed.load() && received.compare_exchange_strong(none, sig)) continue;  // stop after this step
    die_of(sig);
  }
}

}  // namespace

void take_signals_on_their_own_thread() {
  const sigset_t set = stop_signals();
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
  std::thread(take_signals).detach();
}

StopOnSignal::StopOnSignal() {
  received = 0;
  stopping_allowed = true;
}

StopOnSignal::~StopOnSignal() { stopping_allowed = false; }

bool StopOnSignal::requested() { return received.load() != 0; }
const char* StopOnSignal::signal_name() { return received.load() == SIGTERM ? "SIGTERM" : "SIGINT"; }
int StopOnSignal::exit_status() { return 128 + (received.load() ? received.load() : SIGINT); }

}  // namespace relpos::cli
