// metrics.jsonl's one writer and one reader (docs/training.md, "metrics.jsonl"): what is written
// reads back, a line of an older lockstep (without comm_hidden_seconds) still reads, and a line
// missing any other field does not; the resume's cut (MetricsLog::TruncateAfter) goes through
// that reader.
#include <gtest/gtest.h>

#include <fstream>
#include <limits>
#include <string>

#include "common/expect_error.h"
#include "common/scratch_dir.h"
#include "lockstep/core.h"
#include "lockstep/train.h"
#include "train/metrics_log.h"

namespace lockstep {
namespace {

class Metrics : public test::ScratchDirTest {
 protected:
  std::filesystem::path Write(const std::string& line) {
    const std::filesystem::path path = dir_ / "metrics.jsonl";
    std::ofstream(path) << line << "\n";
    return path;
  }
};

TEST_F(Metrics, WhatIsWrittenReadsBackAndAnOlderLineWithoutTheHiddenSecondsReadsAsZero) {
  train::StepReport r;
  r.step = 3;
  r.tokens = 256;
  r.seconds = 0.5;
  r.comm_seconds = 0.25;
  r.comm_hidden_seconds = 0.125;
  r.comm_bytes = 1000;
  const std::string line = train::MetricsLineJson(r, StepState{});
  const std::vector<train::MetricsLine> read = train::ReadMetrics(Write(line));
  ASSERT_EQ(read.size(), 1u);
  EXPECT_EQ(read[0].step, 3u);
  EXPECT_EQ(read[0].tokens, 768u);
  EXPECT_EQ(read[0].comm_seconds, 0.25);
  EXPECT_EQ(read[0].comm_hidden_seconds, 0.125);
  EXPECT_EQ(read[0].comm_bytes, 1000u);

  const std::string field = "\"comm_hidden_seconds\":0.125,";
  const size_t at = line.find(field);
  ASSERT_NE(at, std::string::npos) << line;
  std::string older = line;
  older.erase(at, field.size());
  const std::vector<train::MetricsLine> old = train::ReadMetrics(Write(older));
  ASSERT_EQ(old.size(), 1u);
  EXPECT_EQ(old[0].comm_hidden_seconds, 0.0);
  EXPECT_EQ(old[0].comm_seconds, 0.25);

  std::string missing = line;
  const std::string bytes = "\"comm_bytes\":1000,";
  ASSERT_NE(missing.find(bytes), std::string::npos) << line;
  missing.erase(missing.find(bytes), bytes.size());
  try {
    train::ReadMetrics(Write(missing));
    ADD_FAILURE() << "a line without comm_bytes was read";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("missing field \"comm_bytes\""), std::string::npos)
        << e.what();
  }
}

// A resume keeps the lines up to its checkpoint's step byte for byte, drops a line torn by a
// crash mid-append as the chain's reader does, and refuses a line that is not a metrics line
// instead of taking it for the end of the log.
TEST_F(Metrics, TheResumesCutKeepsLinesByteForByteDropsATornTailAndRefusesAnythingElse) {
  const std::filesystem::path path = dir_ / "metrics.jsonl";
  const train::MetricsLog log(path);
  std::string lines;
  for (uint64_t step = 1; step <= 4; ++step) {
    train::StepReport r;
    r.step = step;
    r.tokens = 256;
    r.seconds = 0.25 * static_cast<double>(step);
    r.loss = step == 3 ? std::numeric_limits<float>::quiet_NaN() : 1.0f / static_cast<float>(step);
    log.Append(r, StepState{});
    lines += train::MetricsLineJson(r, StepState{}) + "\n";
  }
  ASSERT_EQ(ReadFileText(path), lines);  // Append writes the writer's line and its newline
  const size_t third = lines.find('\n', lines.find('\n') + 1) + 1;  // where line 3 begins
  AppendFileSynced(path, lines.substr(third, 40));                  // a torn fifth line

  log.TruncateAfter(10);  // past every step: only the torn line goes
  EXPECT_EQ(ReadFileText(path), lines);
  AppendFileSynced(path, lines.substr(third, 40));
  log.TruncateAfter(2);
  EXPECT_EQ(ReadFileText(path), lines.substr(0, third));
  log.TruncateAfter(0);
  EXPECT_EQ(ReadFileText(path), "");

  // A line in the middle that is no metrics line: the old cut stopped there silently.
  WriteFileSynced(path, lines.substr(0, third) + "{\"step\": 3}\n" + lines.substr(third));
  test::ExpectError([&] { log.TruncateAfter(10); }, {path.string(), "line 3", "missing field"});
  EXPECT_TRUE(std::filesystem::exists(path));
  // No file (a run stopped before its first step): nothing to cut, nothing made.
  const train::MetricsLog none(dir_ / "none.jsonl");
  none.TruncateAfter(5);
  EXPECT_FALSE(std::filesystem::exists(dir_ / "none.jsonl"));
}

}  // namespace
}  // namespace lockstep
