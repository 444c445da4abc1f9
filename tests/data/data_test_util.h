// Helpers shared by the data tests: scratch directories and small datasets.
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "common/expect_error.h"
#include "lockstep/data.h"

namespace lockstep::data::testing {

// A fresh directory under the system temp dir, removed with everything in it at scope exit.
class TempDir {
 public:
  TempDir() {
    static std::atomic<int> next{0};
    const auto* test = ::testing::UnitTest::GetInstance()->current_test_info();
    path_ = std::filesystem::temp_directory_path() / fmt::format("lockstep_data_{}_{}_{}_{}",
                                                                 test->test_suite_name(),
                                                                 test->name(), ::getpid(), next++);
    std::filesystem::remove_all(path_);
    std::filesystem::create_directories(path_);
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::filesystem::path& path() const { return path_; }
  std::filesystem::path operator/(const std::string& name) const { return path_ / name; }

 private:
  std::filesystem::path path_;
};

inline std::vector<uint32_t> Tokens(std::string_view text) {
  return TokenizeBytes(std::span(reinterpret_cast<const uint8_t*>(text.data()), text.size()));
}

// Writes `documents` as a dataset in dir (which must not exist yet or be empty).
inline void WriteDataset(const std::filesystem::path& dir,
                         const std::vector<std::vector<uint32_t>>& documents,
                         uint64_t max_shard_tokens = kDefaultShardTokens) {
  ShardWriter writer(dir, max_shard_tokens);
  for (const auto& d : documents) writer.AddDocument(d);
  writer.Finish(nlohmann::ordered_json::object());
}

}  // namespace lockstep::data::testing
