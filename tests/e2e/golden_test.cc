// The golden chains (tests/fixtures/tiny_chain.jsonl, tiny_int8_chain.jsonl and
// tiny_bf16_chain.jsonl, regenerated only by scripts/golden-chain.sh):
// every other determinism test compares two computations of this build with each other, so a
// compiler, library or code change that moves the reference and every variant together would pass
// them. This one pins the bits themselves: any change to a constant of the numerics contract fails
// here. (The property behind it -- the chain does not depend on threads, SIMD width, storage or
// processes -- is tested on its own in train_test.cc and distributed_test.cc.)
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <string>

#include "common/run_lockstep.h"
#include "lockstep/core.h"

namespace lockstep {
namespace {
namespace fs = std::filesystem;

// tiny's, tiny-int8's and tiny-bf16's chains (20 steps, 2 threads) are the pinned ones.
TEST(Golden, TinyChainsAreThePinnedOnes) {
  const fs::path dir = fs::temp_directory_path() / ("lockstep_golden_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  test::Result r = test::Lockstep("data synth --out " + (dir / "data").string() +
                                  " --seed 7 --tokens 200000");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  for (const std::string config : {"tiny", "tiny-int8", "tiny-bf16"}) {
    // The variables that once injected test faults are set, and must change nothing: only
    // --test-fault-* flags do (no variable can change a run's bits).
    r = test::Shell("env LOCKSTEP_TEST_FAULT_OP=3:0 LOCKSTEP_TEST_FAULT_TOKEN=3:0 " +
                    std::string(LOCKSTEP_BINARY) + " train --config " + config + " --data " +
                    (dir / "data").string() + " --out " + (dir / config).string() +
                    " --steps 20 --threads 2 --no-progress");
    ASSERT_EQ(r.exit_code, 0) << r.output;
    std::string fixture = config + "_chain.jsonl";
    std::ranges::replace(fixture, '-', '_');
    EXPECT_EQ(ReadFileText(dir / config / "state_hashes.jsonl"),
              ReadFileText(fs::path(LOCKSTEP_SOURCE_DIR) / "tests/fixtures" / fixture))
        << "the " << config
        << " chain moved: if the numerics contract, a format or the run descriptor changed on "
           "purpose, bump its version and regenerate with scripts/golden-chain.sh";
  }
  fs::remove_all(dir);
}

}  // namespace
}  // namespace lockstep
