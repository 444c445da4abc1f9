// ProgressLine: what long work shows while it runs.
#include <unistd.h>

#include <chrono>
#include <cstdio>

#include "lockstep/core.h"

namespace lockstep {
namespace {

double Now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

}  // namespace

ProgressLine::ProgressLine(std::string label, uint64_t total_bytes, bool enabled)
    : label_(std::move(label)),
      total_(total_bytes),
      enabled_(enabled),
      terminal_(::isatty(STDERR_FILENO) == 1),
      start_(Now()) {}

ProgressLine::~ProgressLine() { Finish(); }

void ProgressLine::Add(uint64_t bytes) {
  done_ += bytes;
  if (!enabled_) return;
  const int decile = total_ == 0 ? 10 : static_cast<int>(10 * done_ / total_);
  const double now = Now();
  if (terminal_ ? now - last_draw_ >= 0.2 : decile > last_decile_ && decile < 10) {
    last_draw_ = now;
    last_decile_ = decile;
    Draw(false);
  }
}

void ProgressLine::Finish() {
  if (finished_) return;
  finished_ = true;
  if (enabled_) Draw(true);
}

void ProgressLine::Draw(bool final) {
  const double fraction = total_ == 0 ? 1.0 : static_cast<double>(done_) / total_;
  const double gib = 1024.0 * 1024.0 * 1024.0;
  std::fprintf(stderr, "%s%s: %3.0f%% (%.2f / %.2f GiB, %.0f s)%s", terminal_ ? "\r" : "",
               label_.c_str(), 100.0 * fraction, done_ / gib, total_ / gib, Now() - start_,
               terminal_ ? (final ? "\033[K\n" : "\033[K") : "\n");
}

}  // namespace lockstep
