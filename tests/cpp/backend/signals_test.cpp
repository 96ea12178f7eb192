// Asynchronous signals sent to a thread inside an attention call or a model
// step wait until the call returns (src/backend/signals.hpp): a handler
// entered inside oneDNN's JIT GEMM kernels would write over the heap.
#include <gtest/gtest.h>
#include <pthread.h>
#include <signal.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <thread>

#include "problem.hpp"

namespace relpos_test {
namespace {

std::atomic<int> handled{0};

void on_usr1(int) { handled.fetch_add(1); }

TEST(Signals, HandlersWaitUntilAnAttentionCallReturns) {
  struct sigaction action {}, previous {};
  action.sa_handler = on_usr1;
  sigemptyset(&action.sa_mask);
  ASSERT_EQ(sigaction(SIGUSR1, &action, &previous), 0);
  Spec spec;
  spec.scheme = Scheme::t5, spec.B = 2, spec.H = 4, spec.Lq = spec.Lk = 1000, spec.d = 32, spec.dv = 32;
  spec.mask = MaskKind::causal;
  Problem<float> p(spec);
  const pthread_t computing = pthread_self();
  std::atomic<bool> stop{false};
  std::atomic<int> sent{0};
  std::thread sender([&] {
    while (!stop) {
      pthread_kill(computing, SIGUSR1);
      sent.fetch_add(1);
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
  });
  while (sent.load() == 0) std::this_thread::yield();
  constexpr int kCalls = 4;
  for (int rep = 0; rep < kCalls / 2; ++rep) {
    p.forward();
    p.backward();
  }
  stop = true;
  sender.join();
  sigaction(SIGUSR1, &previous, nullptr);
  // Held during a call, the signals sent in it merge into one pending signal,
  // delivered as the call returns: at most one handler per call and one per
  // gap between calls. Taken as they come, there would be one per send.
  EXPECT_GT(sent.load(), 50) << "the sender had too little time to test anything";
  std::printf("%d signals sent, %d handled\n", sent.load(), handled.load());
  EXPECT_LE(handled.load(), 2 * kCalls + 2) << "handlers ran inside attention calls (" << sent.load() << " sent)";
}

}  // namespace
}  // namespace relpos_test
