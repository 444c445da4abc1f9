// Runs a fuzz target on every file of the corpus directories given (what CI does with the seed
// corpora): exit 0 when none crashed. Built with the target instead of libFuzzer's main.
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <vector>

#include "lockstep/core.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);

int main(int argc, char** argv) {
  size_t inputs = 0;
  for (int i = 1; i < argc; ++i) {
    for (const auto& entry : std::filesystem::recursive_directory_iterator(argv[i])) {
      if (!entry.is_regular_file()) continue;
      const std::vector<uint8_t> bytes = lockstep::ReadFileBytes(entry.path());
      LLVMFuzzerTestOneInput(bytes.data(), bytes.size());
      ++inputs;
    }
  }
  std::printf("%zu inputs replayed without a crash\n", inputs);
  return inputs > 0 ? 0 : 1;
}
