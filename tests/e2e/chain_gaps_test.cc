// A kit's units must cover the chain with no gap, and each unit's every field must agree with the
// kit's files; a chain line between checkpoints, which no checkpoint anchors, must be the one
// signed in a signed run (docs/kits.md, "kit verify" and "What a kit proves").
//
// Each test failed before the fix: kit verify checked only that an interval's start checkpoint
// had the hash of a unit ending at its start step (so dropping a unit, or forging a name, a
// target checkpoint, an until_step, the init's seed or the last unit's expected hash, verified),
// and a signed run's resume re-signed whatever chain lines it kept (so an edited unanchored line
// was resumed, and signed anew).
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <nlohmann/json.hpp>
#include <span>
#include <string>

#include "common/kit_edit.h"
#include "common/run_lockstep.h"
#include "lockstep/core.h"
#include "lockstep/state.h"

namespace lockstep {
namespace {
namespace fs = std::filesystem;
using test::Lockstep;
using test::Result;

class ChainGaps : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = fs::temp_directory_path() / ("lockstep_chain_gaps_" + std::to_string(::getpid()));
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    // tiny with a checkpoint every 2 steps: checkpoints 0, 2, 4, 6 and units init, interval_0_2,
    // interval_2_4, interval_4_6.
    test::WriteTinyWithCheckpointEvery(dir_ / "tiny2.yaml", 2);
    for (const std::string& cmd :
         {"data synth --out " + Path("data") + " --seed 7 --tokens 100000",
          "keygen --out " + Path("key"),
          "train --config " + Path("tiny2.yaml") + " --data " + Path("data") + " --out " +
              Path("run") + " --no-progress --steps 6",
          "kit build --run " + Path("run") + " --data " + Path("data") + " --out " + Path("kit"),
          // Signed, checkpoints 0, 10, 12: lines 1 to 8 are anchored by no checkpoint.
          "train --config tiny --data " + Path("data") + " --out " + Path("signed") +
              " --no-progress --steps 12 --sign-key " + Path("key")}) {
      const Result r = Lockstep(cmd);
      ASSERT_EQ(r.exit_code, 0) << cmd << ": " << r.output;
    }
  }
  static void TearDownTestSuite() { fs::remove_all(dir_); }
  static std::string Path(const std::string& name) { return (dir_ / name).string(); }

  // A copy of the kit with trajectory.json edited by `edit` and relisted in kit.json, as a
  // dishonest publisher would make it.
  template <typename Edit>
  static std::string Forged(const std::string& name, Edit edit) {
    fs::copy(dir_ / "kit", dir_ / name, fs::copy_options::recursive);
    nlohmann::json t = nlohmann::json::parse(ReadFileText(dir_ / name / "trajectory.json"));
    edit(t["units"]);
    WriteFileSynced(dir_ / name / "trajectory.json", t.dump(2) + "\n");
    test::RelistKitFile(dir_ / name, "trajectory.json");
    return Path(name);
  }
  static void ExpectRefused(const std::string& kit, const std::string& message) {
    const Result verify = Lockstep("kit verify " + kit);
    EXPECT_EQ(verify.exit_code, 1) << verify.output;
    EXPECT_NE(verify.output.find(message), std::string::npos) << verify.output;
    const Result audit = Lockstep("audit " + kit);
    EXPECT_EQ(audit.exit_code, 1) << audit.output;
    EXPECT_NE(audit.output.find("nothing replayed"), std::string::npos) << audit.output;
  }
  static fs::path dir_;
};
fs::path ChainGaps::dir_;

TEST_F(ChainGaps, TheKitAsBuiltVerifies) {
  const Result r = Lockstep("kit verify " + Path("kit"));
  EXPECT_EQ(r.exit_code, 0) << r.output;
}

// Units init, 0->2, 4->6: each replays to its hash, but nothing links step 4's checkpoint to
// step 2. Likewise a kit whose last unit is dropped proves nothing about its last steps.
TEST_F(ChainGaps, AKitWithADroppedUnitIsRefusedNamingTheGap) {
  ExpectRefused(Forged("no_2_4", [](nlohmann::json& units) { units.erase(2); }),
                "unit interval_4_6: field \"start_step\" is 4, but the unit before it, "
                "interval_0_2, ends at step 2: steps 3 to 4 are in no unit (a gap in the chain)");
  ExpectRefused(Forged("no_4_6", [](nlohmann::json& units) { units.erase(3); }),
                "the units end at step 4 (unit interval_2_4), but the kit's last checkpoint is "
                "step 6: steps 5 to 6 are in no unit");
  ExpectRefused(Forged("no_0_2", [](nlohmann::json& units) { units.erase(1); }),
                "unit interval_2_4: field \"start_step\" is 2, but the unit before it, init, ends "
                "at step 0: steps 1 to 2 are in no unit");
}

TEST_F(ChainGaps, ForgedUnitFieldsAreRefusedNamingTheUnitAndTheField) {
  ExpectRefused(Forged("name", [](nlohmann::json& u) { u[1]["name"] = "interval_0_3"; }),
                "unit interval_0_3: field \"name\" is \"interval_0_3\", but its steps make it "
                "\"interval_0_2\"");
  ExpectRefused(Forged("init_name", [](nlohmann::json& u) { u[0]["name"] = "start"; }),
                "unit start: field \"name\" is \"start\", expected \"init\"");
  ExpectRefused(
      Forged("target",
             [](nlohmann::json& u) { u[3]["target_checkpoint"] = "checkpoints/step_000000004"; }),
      "unit interval_4_6: field \"target_checkpoint\" is \"checkpoints/step_000000004\", "
      "but the checkpoint of step 6 is \"checkpoints/step_000000006\"");
  ExpectRefused(Forged("until",
                       [](nlohmann::json& u) {
                         u[3]["until_step"] = uint64_t{18446744073709551615u};
                         u[3]["name"] = "interval_4_18446744073709551615";
                       }),
                "unit interval_4_18446744073709551615: field \"until_step\" is "
                "18446744073709551615, out of range");
  ExpectRefused(
      Forged("seed", [](nlohmann::json& u) { u[0]["seed"] = u[0]["seed"].get<uint64_t>() + 1; }),
      "unit init: field \"seed\" is 1235, but the run's train.seed is 1234");
  ExpectRefused(
      Forged("expected", [](nlohmann::json& u) { u[3]["expected_hash"] = u[2]["expected_hash"]; }),
      "unit interval_4_6: field \"expected_hash\" is ");
  ExpectRefused(Forged("init_expected",
                       [](nlohmann::json& u) { u[0]["expected_hash"] = u[1]["expected_hash"]; }),
                "unit init: field \"expected_hash\" is ");
}

// Signed run, checkpoints 0, 10, 12: step 5's line is anchored by no checkpoint (step 10's
// prev_hash is step 9's line), only by its signature. Before the fix a resume with --sign-key
// kept the edited line and signed it anew, after which kit build published it. kit build of the
// edited run itself was already refused (pinned here).
TEST_F(ChainGaps, AnEditedUnanchoredLineOfASignedRunIsRefusedByResumeAndKitBuild) {
  fs::copy(dir_ / "signed", dir_ / "edited", fs::copy_options::recursive);
  const std::vector<StateHashLine> lines = ReadStateHashLines(dir_ / "edited/state_hashes.jsonl");
  ASSERT_EQ(lines.size(), 13u);
  std::vector<StateHashLine> edited = lines;
  edited[5].hash = lines[6].hash;
  WriteStateHashLines(dir_ / "edited/state_hashes.jsonl", edited);
  const std::string message = "step 5 holds " + ToHex(lines[6].hash) + ", but " +
                              Path("edited/signatures.jsonl") + " signs " + ToHex(lines[5].hash) +
                              " for it";

  Result r = Lockstep("train --config tiny --data " + Path("data") + " --out " + Path("edited") +
                      " --no-progress --steps 13 --resume --sign-key " + Path("key"));
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find(message), std::string::npos) << r.output;
  // Nothing was rewritten: the signatures still sign the original line.
  EXPECT_EQ(ReadSignedChain(dir_ / "edited/signatures.jsonl").lines[5].hash, lines[5].hash);

  r = Lockstep("kit build --run " + Path("edited") + " --data " + Path("data") + " --out " +
               Path("edited-kit"));
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("step 5 is signed as " + ToHex(lines[5].hash)), std::string::npos)
      << r.output;
  EXPECT_FALSE(fs::exists(dir_ / "edited-kit"));

  // The untouched run resumes, and its kit builds.
  fs::copy(dir_ / "signed", dir_ / "honest", fs::copy_options::recursive);
  r = Lockstep("train --config tiny --data " + Path("data") + " --out " + Path("honest") +
               " --no-progress --steps 13 --resume --sign-key " + Path("key"));
  EXPECT_EQ(r.exit_code, 0) << r.output;
  r = Lockstep("kit build --run " + Path("honest") + " --data " + Path("data") + " --out " +
               Path("honest-kit"));
  EXPECT_EQ(r.exit_code, 0) << r.output;
}

// In an unsigned run too, a line between two checkpoints is pinned: the next checkpoint's
// meta.json holds the chain of every line before it (chain_blake2b), so an edited line is
// refused by resume and kit build, naming the checkpoint (it was resumed and published).
TEST_F(ChainGaps, AnEditedUnanchoredLineOfAnUnsignedRunIsRefusedByResumeAndKitBuild) {
  fs::copy(dir_ / "signed", dir_ / "unsigned", fs::copy_options::recursive);
  fs::remove(dir_ / "unsigned/signatures.jsonl");
  const std::vector<StateHashLine> lines = ReadStateHashLines(dir_ / "unsigned/state_hashes.jsonl");
  ASSERT_EQ(lines.size(), 13u);
  std::vector<StateHashLine> edited = lines;
  edited[5].hash = lines[6].hash;
  WriteStateHashLines(dir_ / "unsigned/state_hashes.jsonl", edited);
  const std::string message = "a line from step 1 to step 10 is not the one checkpoint " +
                              (dir_ / "unsigned/checkpoints/step_000000010").string() + " recorded";
  Result r = Lockstep("train --config tiny --data " + Path("data") + " --out " + Path("unsigned") +
                      " --no-progress --steps 13 --resume");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find(message), std::string::npos) << r.output;
  r = Lockstep("kit build --run " + Path("unsigned") + " --data " + Path("data") + " --out " +
               Path("unsigned-kit"));
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find(message), std::string::npos) << r.output;
  EXPECT_FALSE(fs::exists(dir_ / "unsigned-kit"));
  // The line put back, both go through.
  WriteStateHashLines(dir_ / "unsigned/state_hashes.jsonl", lines);
  r = Lockstep("kit build --run " + Path("unsigned") + " --data " + Path("data") + " --out " +
               Path("unsigned-kit"));
  EXPECT_EQ(r.exit_code, 0) << r.output;
  r = Lockstep("train --config tiny --data " + Path("data") + " --out " + Path("unsigned") +
               " --no-progress --steps 13 --resume");
  EXPECT_EQ(r.exit_code, 0) << r.output;
}

// A signed kit holds every chain line (signatures.jsonl), so kit verify checks each checkpoint's
// chain_blake2b against them: a publisher who re-signs a history with one line between two
// checkpoints changed is refused, naming the checkpoint whose chain it contradicts (kit verify
// checked the signed lines at the units' ends only).
TEST_F(ChainGaps, ASignedKitWhoseLinesAreNotItsCheckpointsChainIsRefused) {
  Result r = Lockstep("kit build --run " + Path("signed") + " --data " + Path("data") + " --out " +
                      Path("signed-kit"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  r = Lockstep("kit verify " + Path("signed-kit") + " --trusted-key " + Path("key.pub"));
  EXPECT_EQ(r.exit_code, 0) << r.output;

  // Step 5's line replaced and every signature made anew with the publisher's key.
  fs::copy(dir_ / "signed-kit", dir_ / "resigned-kit", fs::copy_options::recursive);
  const fs::path file = dir_ / "resigned-kit/signatures.jsonl";
  SignedChain chain = ReadSignedChain(file);
  ASSERT_EQ(chain.lines.size(), 13u);
  chain.lines[5].hash = chain.lines[6].hash;
  const Ed25519Seed seed = ReadSigningKey(Path("key"));
  fs::remove(file);
  StartSignedChain(file, chain.key);
  size_t written = 0;
  const auto write_lines = [&](size_t until) {
    for (; written < until; ++written) {
      SignedLine& line = chain.lines[written];
      line.signature = SignMessage(seed, ChainLineMessage(line.step, line.hash));
      AppendSignedLine(file, line);
    }
  };
  for (SignedRoot& root : chain.roots) {
    write_lines(root.steps);
    root.root = ChainRoot(std::span(chain.lines).first(root.steps));
    root.signature = SignMessage(seed, ChainRootMessage(root.steps, root.root));
    AppendSignedRoot(file, root);
  }
  write_lines(chain.lines.size());
  test::RelistKitFile(dir_ / "resigned-kit", "signatures.jsonl");
  ASSERT_TRUE(VerifySignedChain(ReadSignedChain(file), nullptr).empty());
  const std::string message = "a line from step 1 to step 10 is not the one checkpoint " +
                              Path("resigned-kit/checkpoints/step_000000010") + " recorded";
  for (const std::string& key : {std::string(), " --trusted-key " + Path("key.pub")}) {
    r = Lockstep("kit verify " + Path("resigned-kit") + key);
    EXPECT_EQ(r.exit_code, 1) << r.output;
    EXPECT_NE(r.output.find(message), std::string::npos) << r.output;
  }
}

// A signed run's chain line with no signature (signatures.jsonl cut short) is not published.
TEST_F(ChainGaps, AnUnsignedLineOfASignedRunIsNotPublished) {
  fs::copy(dir_ / "signed", dir_ / "cut", fs::copy_options::recursive);
  const std::string text = ReadFileText(dir_ / "cut/signatures.jsonl");
  // Drop the last two entries: step 12's line and the root after checkpoint 12.
  size_t end = text.size() - 1;
  for (int i = 0; i < 2; ++i) end = text.rfind('\n', end - 1);
  WriteFileSynced(dir_ / "cut/signatures.jsonl", text.substr(0, end + 1));
  const Result r = Lockstep("kit build --run " + Path("cut") + " --data " + Path("data") +
                            " --out " + Path("cut-kit"));
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("signs 12 chain lines, but"), std::string::npos) << r.output;
  EXPECT_FALSE(fs::exists(dir_ / "cut-kit"));
}

}  // namespace
}  // namespace lockstep
