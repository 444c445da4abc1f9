// Signed commitments end to end (docs/formats/signatures.md, docs/kits.md): a signed run's kit
// verifies under the publisher's key; an edited line, another key and a second, different
// history signed by the same key are each caught; a resumed signed run signs exactly what a
// straight one does.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
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

class Signing : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = fs::temp_directory_path() / ("lockstep_signing_" + std::to_string(::getpid()));
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    for (const std::string& cmd :
         {"data synth --out " + Path("data") + " --seed 7 --tokens 200000",
          "keygen --out " + Path("key"),
          Train("A", "--steps 12"),
          "kit build --run " + Path("A") + " --data " + Path("data") + " --out " + Path("KA")}) {
      const Result r = Lockstep(cmd);
      ASSERT_EQ(r.exit_code, 0) << cmd << ": " << r.output;
    }
  }
  static void TearDownTestSuite() { fs::remove_all(dir_); }

  static std::string Path(const std::string& name) { return (dir_ / name).string(); }
  static std::string Train(const std::string& run, const std::string& extra) {
    return "train --config tiny --data " + Path("data") + " --out " + Path(run) +
           " --no-progress --sign-key " + Path("key") + " " + extra;
  }
  static Result Verify(const std::string& kit, const std::string& extra = "") {
    return Lockstep("kit verify " + Path(kit) + " --trusted-key " + Path("key.pub") + " " + extra);
  }
  static fs::path dir_;
};
fs::path Signing::dir_;

TEST_F(Signing, ASignedKitVerifiesAndAuditsUnderThePublishersKey) {
  Result r = Verify("KA");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("signed by the trusted key"), std::string::npos) << r.output;
  r = Lockstep("audit " + Path("KA") + " --trusted-key " + Path("key.pub"));
  EXPECT_EQ(r.exit_code, 0) << r.output;
  // Every line and a root after every checkpoint (steps 0, 10, 12) are signed.
  const SignedChain chain = ReadSignedChain(dir_ / "A/signatures.jsonl");
  EXPECT_EQ(chain.lines.size(), 13u);
  ASSERT_EQ(chain.roots.size(), 3u);
  EXPECT_EQ(chain.roots[1].steps, 11u);
  EXPECT_TRUE(VerifySignedChain(chain, nullptr).empty());
}

TEST_F(Signing, AnEditedLineOrAnotherKeyFails) {
  fs::copy(dir_ / "KA", dir_ / "edited", fs::copy_options::recursive);
  std::string text = ReadFileText(dir_ / "edited/signatures.jsonl");
  // The line of step 3 gets another hash; kit.json is made to match, so only the signature can
  // tell.
  const SignedChain chain = ReadSignedChain(dir_ / "KA/signatures.jsonl");
  const std::string hash = ToHex(chain.lines[3].hash);
  const size_t at = text.find(hash);
  ASSERT_NE(at, std::string::npos);
  text[at] = text[at] == '0' ? '1' : '0';
  WriteFileSynced(dir_ / "edited/signatures.jsonl", text);
  test::RelistKitFile(dir_ / "edited", "signatures.jsonl");
  Result r = Verify("edited");
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("step 3: the signature of hash"), std::string::npos) << r.output;

  ASSERT_EQ(Lockstep("keygen --out " + Path("other")).exit_code, 0);
  r = Lockstep("kit verify " + Path("KA") + " --trusted-key " + Path("other.pub"));
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("not the trusted key"), std::string::npos) << r.output;
  // Without signatures a kit cannot pass a trusted-key check.
  fs::copy(dir_ / "KA", dir_ / "unsigned", fs::copy_options::recursive);
  fs::remove(dir_ / "unsigned/signatures.jsonl");
  kit::KitManifest m = kit::ReadManifest(dir_ / "unsigned");
  std::erase_if(m.files, [](const kit::KitFile& f) { return f.path == "signatures.jsonl"; });
  WriteFileSynced(dir_ / "unsigned" / kit::kManifestName, kit::ManifestJson(m));
  r = Verify("unsigned");
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("the kit is not signed"), std::string::npos) << r.output;
  // A signatures.jsonl that does not parse is a kit that does not verify (1), not bad input (2).
  fs::copy(dir_ / "KA", dir_ / "garbled", fs::copy_options::recursive);
  WriteFileSynced(dir_ / "garbled/signatures.jsonl", std::string_view("{not json\n"));
  test::RelistKitFile(dir_ / "garbled", "signatures.jsonl");
  r = Verify("garbled");
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find((dir_ / "garbled/signatures.jsonl").string()), std::string::npos)
      << r.output;
}

TEST_F(Signing, ASecondHistorySignedByTheSameKeyIsEquivocation) {
  // The publisher re-runs with a one-ulp fault at step 7 (op 31 of tiny's step: layer 1's
  // swiglu_fwd, which propagates) and signs the new history too.
  Result r = Lockstep(Train("B", "--steps 12 --test-fault-op 7:31"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  r = Lockstep("kit build --run " + Path("B") + " --data " + Path("data") + " --out " + Path("KB"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(Verify("KB").exit_code, 0);  // on its own, the second history is well signed
  r = Verify("KB", "--known-history " + Path("KA/signatures.jsonl"));
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("equivocation at step 7"), std::string::npos) << r.output;
}

TEST_F(Signing, AResumedRunSignsWhatAStraightRunSigns) {
  ASSERT_EQ(Lockstep(Train("R", "--steps 6")).exit_code, 0);
  Result r = Lockstep("train --config tiny --data " + Path("data") + " --out " + Path("R") +
                      " --no-progress --steps 12 --resume");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("resume it with --sign-key"), std::string::npos) << r.output;
  // A crash in the middle of an append left a torn last line: the resume drops it, as it drops
  // a torn chain line, and signs on.
  {
    std::ofstream torn(dir_ / "R/signatures.jsonl", std::ios::app);
    torn << "{\"kind\": \"line\", \"st";
  }
  r = Lockstep(Train("R", "--steps 12 --resume"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(ReadFileText(dir_ / "R/state_hashes.jsonl"), ReadFileText(dir_ / "A/state_hashes.jsonl"));
  // The straight run has a root at 0, 10, 12; the resumed one also at 6 (its checkpoint).
  const SignedChain straight = ReadSignedChain(dir_ / "A/signatures.jsonl");
  const SignedChain resumed = ReadSignedChain(dir_ / "R/signatures.jsonl");
  ASSERT_EQ(resumed.lines.size(), straight.lines.size());
  for (size_t s = 0; s < straight.lines.size(); ++s) {
    EXPECT_EQ(resumed.lines[s].signature, straight.lines[s].signature) << s;
  }
  EXPECT_TRUE(VerifySignedChain(resumed, nullptr).empty());
  EXPECT_FALSE(FindEquivocation(straight, resumed).has_value());
}

}  // namespace
}  // namespace lockstep
