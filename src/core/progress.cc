// ProgressLine: what long work shows while it runs.
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <ctime>

#include "lockstep/core.h"

namespace lockstep {
namespace {

double Now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

}  // namespace

ProgressLine::ProgressLine(std::string label, uint64_t total_bytes, bool enabled)
    : ProgressLine(std::move(label), total_bytes, enabled, "", 0) {}

ProgressLine::ProgressLine(std::string label, uint64_t total, bool enabled, std::string unit,
                           double delay_seconds)
    : label_(std::move(label)),
      unit_(std::move(unit)),
      total_(total),
      enabled_(enabled),
      terminal_(::isatty(STDERR_FILENO) == 1),
      start_(Now()),
      delay_(delay_seconds) {}

ProgressLine::~ProgressLine() { Finish(); }

void ProgressLine::Add(uint64_t bytes) {
  done_ += bytes;
  if (!enabled_) return;
  const int decile = total_ == 0 ? 10 : static_cast<int>(10 * done_ / total_);
  const double now = Now();
  if (now - start_ < delay_) return;
  if (terminal_ ? now - last_draw_ >= 0.2 : decile > last_decile_ && decile < 10) {
    last_draw_ = now;
    last_decile_ = decile;
    Draw(false);
  }
}

void ProgressLine::Finish() {
  if (finished_) return;
  finished_ = true;
  if (enabled_ && (drawn_ || Now() - start_ >= delay_)) Draw(true);
}

void ProgressLine::Draw(bool final) {
  drawn_ = true;
  const double fraction = total_ == 0 ? 1.0 : static_cast<double>(done_) / total_;
  const double gib = 1024.0 * 1024.0 * 1024.0, elapsed = Now() - start_;
  const std::string amount =
      unit_.empty() ? fmt::format("{:.2f} / {:.2f} GiB", done_ / gib, total_ / gib)
                    : fmt::format("{} / {} {}", done_, total_, unit_);
  // What is left at the rate so far.
  const std::string left = done_ > 0 && done_ < total_
                               ? fmt::format(", {:.0f} s left", elapsed * (1 / fraction - 1))
                               : "";
  std::fprintf(stderr, "%s%s: %3.0f%% (%s, %.0f s%s)%s", terminal_ ? "\r" : "", label_.c_str(),
               100.0 * fraction, amount.c_str(), elapsed, left.c_str(),
               terminal_ ? (final ? "\033[K\n" : "\033[K") : "\n");
}

std::string UtcNow() {
  const std::time_t now = std::time(nullptr);
  std::tm utc{};
  gmtime_r(&now, &utc);
  char text[32];
  std::strftime(text, sizeof text, "%Y-%m-%dT%H:%M:%SZ", &utc);
  return text;
}

}  // namespace lockstep
