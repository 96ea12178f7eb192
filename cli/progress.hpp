// A progress bar on stderr for long runs: steps done, loss, tokens per
// second and the estimated time left. On a terminal it redraws one line
// (carriage return, at most ten times a second); into a file or pipe it
// writes a plain line every tenth of the run or every 30 s, whichever comes
// first, so logs stay readable. Thread-safe (the demo trains models side by side).
#pragma once

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <mutex>
#include <string>

namespace relpos::cli {

class Progress {
 public:
  // `first`: the step the run starts at (a resumed run), so that speed and
  // time left come from the steps of this invocation.
  Progress(std::string label, int64_t total, int64_t first = 0, std::FILE* to = stderr);
  // `done` steps of `total`, after `tokens` tokens in all (0: no speed shown);
  // `loss` is shown as is (NaN: not shown).
  void update(int64_t done, int64_t tokens, double loss);
  // Ends the line (terminal) or writes a last line (file).
  void finish();
  // Prints a line of its own (above the bar on a terminal).
  void note(const std::string& line);

 private:
  void draw(int64_t done, int64_t tokens, double loss, bool last);

  std::string label_;
  int64_t total_, first_;
  std::FILE* to_;
  bool tty_;
  std::mutex mutex_;
  std::chrono::steady_clock::time_point start_, last_draw_;
  int64_t last_done_ = 0, last_tokens_ = 0, last_drawn_ = -1;
  double last_loss_ = 0;
  bool finished_ = false;
};

// "1:05", "12:00:03"
std::string clock_text(double seconds);

}  // namespace relpos::cli
