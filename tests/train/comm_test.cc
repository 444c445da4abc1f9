// The launcher's world size, which decides whether a process may run alone: a binary built
// without MPI refuses to start as one of several processes (src/train/comm.h).
#include <gtest/gtest.h>

#include <cstdlib>
#include <optional>
#include <string>
#include <vector>

#include "common/expect_error.h"
#include "train/comm.h"

namespace lockstep::train {
namespace {

// Sets the launcher variables for one test and restores them after.
class LauncherEnvironment : public ::testing::Test {
 protected:
  void SetUp() override {
    for (const char* name : kNames) {
      const char* value = std::getenv(name);
      saved_.emplace_back(value == nullptr ? std::nullopt : std::optional<std::string>(value));
      unsetenv(name);
    }
  }
  void TearDown() override {
    for (size_t i = 0; i < saved_.size(); ++i) {
      if (saved_[i]) {
        setenv(kNames[i], saved_[i]->c_str(), 1);
      } else {
        unsetenv(kNames[i]);
      }
    }
  }
  static constexpr const char* kNames[] = {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE"};
  std::vector<std::optional<std::string>> saved_;
};

TEST_F(LauncherEnvironment, WorldSizeIsTheLaunchersAndOneWithoutOne) {
  EXPECT_EQ(LauncherWorldSize(), 1);
  setenv("PMI_SIZE", "3", 1);
  EXPECT_EQ(LauncherWorldSize(), 3);
  setenv("OMPI_COMM_WORLD_SIZE", "4", 1);  // Open MPI's own variable first
  EXPECT_EQ(LauncherWorldSize(), 4);
  for (const char* bad : {"", "0", "-2", "4x", "99999999999"}) {
    setenv("OMPI_COMM_WORLD_SIZE", bad, 1);
    test::ExpectError([] { LauncherWorldSize(); }, {"OMPI_COMM_WORLD_SIZE=" + std::string(bad)});
  }
}

}  // namespace
}  // namespace lockstep::train
