// Pages lockstep writes (report, coverage), rendered by headless Chromium cut off from every
// network, for tests that check the DOM a browser builds.
#pragma once

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <string>

#include "lockstep/core.h"

namespace lockstep::test {

inline bool Have(const std::string& command) {
  return std::system((command + " > /dev/null 2>&1").c_str()) == 0;
}

inline size_t Count(const std::string& text, const std::string& needle) {
  size_t n = 0;
  for (size_t at = text.find(needle); at != std::string::npos; at = text.find(needle, at + 1)) ++n;
  return n;
}

// The DOM Chromium builds from the page, with the process cut off from every network (a fresh
// network namespace where unshare may make one, as root in CI).
inline std::string RenderedDom(const std::filesystem::path& page,
                               const std::filesystem::path& scratch) {
  const std::string isolate = Have("unshare -n true") ? "unshare -n " : "";
  const std::filesystem::path dom = scratch / "dom.html";
  const std::string command = fmt::format(
      "timeout 120 {}chromium --headless --no-sandbox --disable-gpu --user-data-dir={} "
      "--dump-dom file://{} > {} 2>/dev/null",
      isolate, (scratch / "chromium-profile").string(), std::filesystem::absolute(page).string(),
      dom.string());
  EXPECT_EQ(std::system(command.c_str()), 0) << command;
  return ReadFileText(dom);
}

}  // namespace lockstep::test
