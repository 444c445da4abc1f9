// metrics.jsonl's one writer and one reader (docs/training.md, "metrics.jsonl"): what is written
// reads back, a line of an older lockstep (without comm_hidden_seconds) still reads, and a line
// missing any other field does not.
#include <gtest/gtest.h>

#include <fstream>
#include <string>

#include "common/scratch_dir.h"
#include "lockstep/core.h"
#include "lockstep/train.h"

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

}  // namespace
}  // namespace lockstep
