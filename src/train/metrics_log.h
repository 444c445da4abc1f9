// metrics.jsonl as `lockstep train` keeps it (docs/training.md, "metrics.jsonl"): appended as
// durably as the chain, and cut back on resume through the one reader of its lines.
#pragma once

#include <cstdint>
#include <filesystem>
#include <utility>

#include "lockstep/state.h"
#include "lockstep/train.h"

namespace lockstep::train {

class MetricsLog {
 public:
  explicit MetricsLog(std::filesystem::path path) : path_(std::move(path)) {}

  // Keeps the lines of steps <= last_step (a resume drops what followed its checkpoint), byte
  // for byte. The file is read by ReadMetrics with TornLine::kDrop, as the chain is on resume:
  // a torn last line (a crash mid-append) is dropped, any other line that is not a metrics line
  // is refused naming the file, line and field. The file is replaced as the chain's is (temporary
  // file, fsync, rename, fsync of the directory). Nothing when the file does not exist.
  void TruncateAfter(uint64_t last_step) const;
  // Appends step r's line (MetricsLineJson and "\n") with O_APPEND and fsyncs, as the chain's
  // lines are (AppendFileSynced).
  void Append(const StepReport& r, const StepState& state) const;

 private:
  std::filesystem::path path_;
};

}  // namespace lockstep::train
