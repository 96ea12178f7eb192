#include "interrupt.hpp"

#include <signal.h>

namespace relpos::cli {

namespace {

volatile sig_atomic_t received = 0;
struct sigaction previous_int, previous_term;

void on_signal(int sig) {
  received = sig;
  signal(sig, SIG_DFL);  // the next one ends the process
}

}  // namespace

StopOnSignal::StopOnSignal() {
  received = 0;
  struct sigaction action {};
  action.sa_handler = on_signal;
  sigemptyset(&action.sa_mask);
  sigaction(SIGINT, &action, &previous_int);
  sigaction(SIGTERM, &action, &previous_term);
}

StopOnSignal::~StopOnSignal() {
  sigaction(SIGINT, &previous_int, nullptr);
  sigaction(SIGTERM, &previous_term, nullptr);
}

bool StopOnSignal::requested() { return received != 0; }
const char* StopOnSignal::signal_name() { return received == SIGTERM ? "SIGTERM" : "SIGINT"; }
int StopOnSignal::exit_status() { return 128 + (received ? int(received) : SIGINT); }

}  // namespace relpos::cli
