// A fresh scratch directory per test, removed afterwards: the fixture every test that writes
// files can derive from.
#pragma once

#include <gtest/gtest.h>

#include <filesystem>
#include <string>

namespace lockstep::test {

class ScratchDirTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    dir_ = std::filesystem::path(::testing::TempDir()) /
           (std::string("lockstep_") + info->test_suite_name() + "_" + info->name());
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  std::filesystem::path dir_;
};

}  // namespace lockstep::test
