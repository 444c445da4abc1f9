// Shared by the kit tests: running the lockstep binary, a scratch directory per test, and one
// published kit (a tiny run with checkpoints at steps 0, 10 and 20) built once per lockstep binary.
#pragma once

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <string>

#include "common/run_lockstep.h"
#include "lockstep/core.h"

namespace lockstep::kit_test {
namespace fs = std::filesystem;

using test::Lockstep;
using test::Result;

// The kit every test starts from, with the run and dataset it was built from. ctest runs each
// test in its own process, so it is built once per lockstep binary (about 3 s) into the build
// tree, keyed by the binary's size and time, and reused; tests copy it before changing anything.
struct Published {
  fs::path root, data, run, kit;
};

class PublishedKit {
 public:
  static const Published& Get() {
    static const Published published = Build();
    return published;
  }

 private:
  static Published Build() {
    const fs::path binary = LOCKSTEP_BINARY;
    const auto stamp = static_cast<uint64_t>(fs::last_write_time(binary).time_since_epoch().count());
    const std::string name = fmt::format("kit_fixture_{:x}_{:x}", fs::file_size(binary), stamp);
    const fs::path root = binary.parent_path() / "tests" / name;
    const Published p{root, root / "data", root / "run", root / "kit"};
    if (fs::exists(root)) return p;

    // Built in a directory of this process and renamed: parallel tests never see half a fixture.
    const fs::path tmp = root.string() + ".tmp-" + std::to_string(::getpid());
    fs::remove_all(tmp);
    fs::create_directories(tmp);
    auto run = [](const std::string& args) {
      const Result r = Lockstep(args);
      if (r.exit_code != 0) ADD_FAILURE() << "lockstep " << args << "\n" << r.output;
    };
    run("data synth --out " + (tmp / "data").string() + " --seed 7 --tokens 200000");
    // --steps 0 writes the init as checkpoint step 0; the resume then checkpoints steps 10 and
    // 20 (tiny: ckpt_every 10), so the kit has intervals 0-10 and 10-20.
    const std::string train = "train --config tiny --no-progress --data " +
                              (tmp / "data").string() + " --out " + (tmp / "run").string();
    run(train + " --steps 0");
    run(train + " --steps 20 --resume");
    run("kit build --run " + (tmp / "run").string() + " --data " + (tmp / "data").string() +
        " --out " + (tmp / "kit").string());
    // Fixtures of earlier binaries are stale (those of this one may be in the making elsewhere).
    for (const auto& entry : fs::directory_iterator(root.parent_path())) {
      const std::string other = entry.path().filename().string();
      if (other.starts_with("kit_fixture_") && !other.starts_with(name)) {
        fs::remove_all(entry.path());
      }
    }
    std::error_code ec;
    fs::rename(tmp, root, ec);  // fails when a parallel test got there first: use theirs
    if (ec) fs::remove_all(tmp);
    return p;
  }
};

// A scratch directory per test, removed afterwards unless the test failed.
class KitTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    dir_ = fs::temp_directory_path() / (std::string("lockstep_kit_") + info->test_suite_name() +
                                        "_" + info->name() + "_" + std::to_string(::getpid()));
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override {
    if (!HasFailure()) fs::remove_all(dir_);
  }

  static const Published& published() { return PublishedKit::Get(); }

  // A private copy of the published kit, to tamper with.
  fs::path CopyKit(const std::string& name = "kit") {
    const fs::path copy = dir_ / name;
    fs::copy(published().kit, copy, fs::copy_options::recursive);
    return copy;
  }

  fs::path dir_;
};

// Flips the lowest bit of the byte at `offset` from the end of the file.
inline void FlipBitFromEnd(const fs::path& path, size_t offset) {
  std::vector<uint8_t> bytes = ReadFileBytes(path);
  ASSERT_GT(bytes.size(), offset);
  bytes[bytes.size() - 1 - offset] ^= 1;
  WriteFileSynced(path, bytes);
}

}  // namespace lockstep::kit_test
