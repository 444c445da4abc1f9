// The version `lockstep --version` prints is the release at the top of CHANGELOG.md, so a user
// reading the changelog reads the section of the binary they run.
#include <gtest/gtest.h>

#include <regex>
#include <string>

#include "common/run_lockstep.h"
#include "lockstep/build_info.h"
#include "lockstep/core.h"

namespace lockstep {
namespace {

TEST(Release, TheVersionIsTheChangelogsTopRelease) {
  const std::string changelog = ReadFileText(std::string(LOCKSTEP_SOURCE_DIR) + "/CHANGELOG.md");
  std::smatch top;
  ASSERT_TRUE(std::regex_search(changelog, top, std::regex(R"(\n## (\d+\.\d+\.\d+)\b)")))
      << "CHANGELOG.md has no \"## X.Y.Z\" release section";
  const size_t unreleased = changelog.find("\n## Unreleased");
  ASSERT_TRUE(unreleased == std::string::npos || unreleased < static_cast<size_t>(top.position(0)))
      << "an Unreleased section must come before the releases";
  EXPECT_EQ(top[1].str(), build::kVersion);
  const test::Result r = test::Lockstep("--version");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(r.output.substr(0, r.output.find('\n')), "lockstep " + top[1].str());
}

}  // namespace
}  // namespace lockstep
