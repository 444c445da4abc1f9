// @huggingface/tokenizers, the independent JavaScript implementation of tokenizer.json, as an
// outside client for the tests that compare lockstep's ids with it (run by node).
#pragma once

#include <fmt/format.h>

#include <cstdlib>
#include <filesystem>
#include <string>

namespace lockstep::test {

inline constexpr const char* kTokenizersJsVersion = "0.2.0";

// The package's directory: $LOCKSTEP_TOKENIZERS_JS, or installed once from npm into a cache
// under the temp directory. Empty when neither is possible (no node, no network): the caller
// skips, saying so.
inline std::string TokenizersJs() {
  namespace fs = std::filesystem;
  if (const char* dir = std::getenv("LOCKSTEP_TOKENIZERS_JS")) return dir;
  if (std::system("node --version > /dev/null 2>&1") != 0) return {};
  const fs::path prefix =
      fs::temp_directory_path() / fmt::format("lockstep-npm-{}", kTokenizersJsVersion);
  const fs::path module = prefix / "node_modules/@huggingface/tokenizers";
  if (!fs::exists(module / "dist/tokenizers.mjs")) {
    const std::string install = fmt::format(
        "timeout 180 npm install --silent --no-audit --no-fund --prefix {} "
        "@huggingface/tokenizers@{} > /dev/null 2>&1",
        prefix.string(), kTokenizersJsVersion);
    (void)std::system(install.c_str());
  }
  return fs::exists(module / "dist/tokenizers.mjs") ? module.string() : std::string();
}

}  // namespace lockstep::test
