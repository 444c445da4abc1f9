// A fuzz target: LOCKSTEP_FUZZ_TARGET(body) defines LLVMFuzzerTestOneInput running `body` on the
// input as a string_view `text`. A lockstep::Error is the expected answer to bad input; anything
// else -- another exception, a crash, a sanitizer report, a hang -- is a finding. Built two ways
// (tests/CMakeLists.txt): with libFuzzer (scripts/fuzz.sh) and as a replay of the seed corpus
// tests/fuzz/corpus/<target>/ (a ctest each).
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <string>
#include <string_view>
#include <unistd.h>

#include "lockstep/core.h"

namespace lockstep::fuzz {

// A scratch directory of this process, for readers that take a path.
inline const std::filesystem::path& Scratch() {
  static const std::filesystem::path dir = [] {
    const auto d = std::filesystem::temp_directory_path() /
                   ("lockstep_fuzz_" + std::to_string(::getpid()));
    std::filesystem::create_directories(d);
    return d;
  }();
  return dir;
}

}  // namespace lockstep::fuzz

#define LOCKSTEP_FUZZ_TARGET(body)                                                   \
  extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {           \
    const std::string_view text(reinterpret_cast<const char*>(data), size);           \
    try {                                                                            \
      body;                                                                          \
    } catch (const lockstep::Error&) {                                               \
    }                                                                                \
    return 0;                                                                        \
  }
