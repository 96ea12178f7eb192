#include "progress.hpp"

#include <unistd.h>

#include <cmath>

namespace relpos::cli {

std::string clock_text(double seconds) {
  if (!std::isfinite(seconds) || seconds < 0) return "?";
  const long s = std::lround(seconds);
  char buf[32];
  if (s >= 3600)
    std::snprintf(buf, sizeof buf, "%ld:%02ld:%02ld", s / 3600, s / 60 % 60, s % 60);
  else
    std::snprintf(buf, sizeof buf, "%ld:%02ld", s / 60, s % 60);
  return buf;
}

Progress::Progress(std::string label, int64_t total, int64_t first, std::FILE* to)
    : label_(std::move(label)),
      total_(total > 0 ? total : 1),
      first_(first),
      to_(to),
      tty_(isatty(fileno(to)) != 0),
      start_(std::chrono::steady_clock::now()),
      last_draw_(start_) {}

void Progress::update(int64_t done, int64_t tokens, double loss) {
  std::lock_guard lock(mutex_);
  const auto now = std::chrono::steady_clock::now();
  const double since = std::chrono::duration<double>(now - last_draw_).count();
  const bool due = tty_ ? since >= 0.1 : (since >= 30 || (done * 10 / total_ > last_done_ * 10 / total_));
  last_tokens_ = tokens;
  last_loss_ = loss;
  if (due) draw(done, tokens, loss, false);
  last_done_ = done;
}

void Progress::finish() {
  std::lock_guard lock(mutex_);
  if (finished_) return;
  finished_ = true;
  if (tty_ || last_drawn_ != last_done_) draw(last_done_, last_tokens_, last_loss_, true);
}

void Progress::note(const std::string& line) {
  std::lock_guard lock(mutex_);
  std::fprintf(to_, tty_ ? "\r\033[K%s\n" : "%s\n", line.c_str());
  std::fflush(to_);
}

void Progress::draw(int64_t done, int64_t tokens, double loss, bool last) {
  const auto now = std::chrono::steady_clock::now();
  last_draw_ = now;
  last_drawn_ = done;
  const double elapsed = std::chrono::duration<double>(now - start_).count();
  const double rate = elapsed > 0 ? double(tokens) / elapsed : 0;
  const double eta = done > first_ ? elapsed * double(total_ - done) / double(done - first_) : NAN;
  // Loss and speed only when the caller reports them (NaN loss / zero tokens: not).
  std::string stats = std::to_string(done) + "/" + std::to_string(total_);
  char buf[96];
  if (!std::isnan(loss)) stats += (std::snprintf(buf, sizeof buf, "  loss %.3f", loss), buf);
  if (tokens > 0) stats += (std::snprintf(buf, sizeof buf, "  %.0f tok/s", rate), buf);
  stats += "  " + clock_text(elapsed) + " elapsed  ETA " + (last ? std::string("0:00") : clock_text(eta));
  if (tty_) {
    constexpr int kWidth = 24;
    const int filled = int(kWidth * done / total_);
    std::string bar(size_t(filled), '#');
    bar.resize(kWidth, '.');
    std::fprintf(to_, "\r\033[K%s [%s] %s%s", label_.c_str(), bar.c_str(), stats.c_str(), last ? "\n" : "");
  } else {
    std::fprintf(to_, "%s %s\n", label_.c_str(), stats.c_str());
  }
  std::fflush(to_);
}

}  // namespace relpos::cli
