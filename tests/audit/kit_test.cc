// Kits through the lockstep binary: build, verify (exact file set, sizes, sha256), inspect, and
// audit every unit at 1 and 2 threads; a tampered kit fails naming the file.
#include <nlohmann/json.hpp>

#include <fstream>

#include "audit/kit_test_util.h"
#include "common/kit_edit.h"
#include "lockstep/kit.h"
#include "lockstep/state.h"

namespace lockstep::kit_test {
namespace {

size_t Count(const std::string& text, const std::string& word) {
  size_t n = 0;
  for (size_t at = text.find(word); at != std::string::npos; at = text.find(word, at + 1)) ++n;
  return n;
}

TEST_F(KitTest, BuildWritesEveryUnitWithTheRunsHashes) {
  const Published& p = published();
  const kit::Trajectory trajectory = kit::ReadTrajectory(p.kit);
  const std::vector<StateHashLine> chain = ReadStateHashLines(p.run / "state_hashes.jsonl");
  ASSERT_EQ(chain.size(), 21u);
  ASSERT_EQ(trajectory.units.size(), 3u);

  const kit::Unit& init = trajectory.units[0];
  EXPECT_EQ(init.name, "init");
  EXPECT_EQ(init.kind, kit::UnitKind::kInit);
  EXPECT_EQ(init.seed, 1234u);  // configs/tiny.yaml train.seed
  EXPECT_EQ(init.expected_hash, chain[0].hash);
  EXPECT_FALSE(init.publisher_wall_seconds.has_value());

  for (size_t i = 1; i < 3; ++i) {
    const kit::Unit& u = trajectory.units[i];
    const uint64_t start = (i - 1) * 10, until = i * 10;
    EXPECT_EQ(u.name, fmt::format("interval_{}_{}", start, until));
    EXPECT_EQ(u.kind, kit::UnitKind::kInterval);
    EXPECT_EQ(u.start_step, start);
    EXPECT_EQ(u.until_step, until);
    EXPECT_EQ(u.start_checkpoint, fmt::format("checkpoints/step_{:09}", start));
    EXPECT_EQ(u.target_checkpoint, fmt::format("checkpoints/step_{:09}", until));
    EXPECT_EQ(u.expected_hash, chain[until].hash);
    ASSERT_TRUE(u.publisher_wall_seconds.has_value());
    EXPECT_GT(*u.publisher_wall_seconds, 0);
    EXPECT_FALSE(u.publisher_peak_rss_bytes.has_value());  // lockstep train does not measure it
  }

  // The dataset, the config and three checkpoints of four files each (gradients as digests),
  // besides trajectory.json.
  const kit::KitManifest manifest = kit::ReadManifest(p.kit);
  std::vector<std::string> paths;
  for (const kit::KitFile& f : manifest.files) paths.push_back(f.path);
  EXPECT_TRUE(std::is_sorted(paths.begin(), paths.end()));
  EXPECT_EQ(paths.size(), 3u /*data*/ + 1u /*config*/ + 12u + 1u /*trajectory*/);
  EXPECT_EQ(paths.front(), "checkpoints/step_000000000/COMPLETE");
  EXPECT_EQ(paths.back(), "trajectory.json");
  for (const kit::KitFile& f : manifest.files) {
    EXPECT_EQ(f.sha256, Sha256(ReadFileBytes(p.kit / f.path))) << f.path;
  }
}

TEST_F(KitTest, BuildIsDeterministicAndRefusesAnExistingDirectory) {
  const Published& p = published();
  const std::string build =
      "kit build --run " + p.run.string() + " --data " + p.data.string() + " --out ";
  const Result again = Lockstep(build + (dir_ / "again").string());
  ASSERT_EQ(again.exit_code, 0) << again.output;
  for (const char* name : {"kit.json", "trajectory.json", "config.yaml"}) {
    EXPECT_EQ(ReadFileText(p.kit / name), ReadFileText(dir_ / "again" / name)) << name;
  }
  const Result exists = Lockstep(build + (dir_ / "again").string());
  EXPECT_EQ(exists.exit_code, 2);
  EXPECT_NE(exists.output.find("a directory that is not empty"), std::string::npos)
      << exists.output;
}

// A receipt records the audit's command line as text: a path that is not UTF-8 is refused
// before anything is replayed, naming the option, and nothing is written.
TEST_F(KitTest, AnAuditWhosePathsAreNotUtf8IsRefusedBeforeItReplays) {
  const fs::path link = dir_ / "kit\xff";
  fs::create_directory_symlink(published().kit, link);
  const Result r =
      Lockstep("audit '" + link.string() + "' --unit init --receipt " + (dir_ / "r.json").string());
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("KIT (the receipt records it as text: rename it): invalid UTF-8"),
            std::string::npos)
      << r.output;
  EXPECT_EQ(r.output.find("MATCH"), std::string::npos) << r.output;
  EXPECT_FALSE(fs::exists(dir_ / "r.json"));
}

TEST_F(KitTest, BuildRefusesADatasetTheRunDidNotTrainOn) {
  const Published& p = published();
  const fs::path other = dir_ / "other";
  ASSERT_EQ(Lockstep("data synth --out " + other.string() + " --seed 8 --tokens 200000").exit_code,
            0);
  const Result r = Lockstep("kit build --run " + p.run.string() + " --data " + other.string() +
                            " --out " + (dir_ / "kit").string());
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.output.find("data_manifest_blake2b"), std::string::npos) << r.output;
  EXPECT_FALSE(fs::exists(dir_ / "kit"));
}

TEST_F(KitTest, VerifyAndInspectAPublishedKit) {
  const Result verify = Lockstep("kit verify " + published().kit.string());
  EXPECT_EQ(verify.exit_code, 0) << verify.output;
  EXPECT_NE(verify.output.find("kit verify: OK"), std::string::npos) << verify.output;
  const Result inspect = Lockstep("kit inspect " + published().kit.string());
  EXPECT_EQ(inspect.exit_code, 0) << inspect.output;
  for (const char* word : {"interval_0_10", "interval_10_20", "init", "not measured",
                           "checkpoints/step_000000010/model.safetensors"}) {
    EXPECT_NE(inspect.output.find(word), std::string::npos) << word << "\n" << inspect.output;
  }
}

TEST_F(KitTest, AFlippedBitInACheckpointTensorFailsVerifyNamingTheFile) {
  const fs::path kit = CopyKit();
  const fs::path model = kit / "checkpoints/step_000000010/model.safetensors";
  FlipBitFromEnd(model, 0);  // the last byte of the last tensor's data
  const Result r = Lockstep("kit verify " + kit.string());
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find(model.string() + ": sha256"), std::string::npos) << r.output;
  EXPECT_EQ(Count(r.output, "kit verify: /"), 1u) << r.output;  // nothing else is reported
}

TEST_F(KitTest, AnExtraOrAMissingFileFailsVerify) {
  const fs::path kit = CopyKit();
  WriteFileSynced(kit / "data" / "notes.txt", std::string_view("unlisted\n"));
  fs::remove(kit / "config.yaml");
  const Result r = Lockstep("kit verify " + kit.string());
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find((kit / "data/notes.txt").string() + ": not listed in kit.json"),
            std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find((kit / "config.yaml").string() + ": missing"), std::string::npos)
      << r.output;
}

TEST_F(KitTest, AListedFileThatIsADirectoryFailsVerify) {
  const fs::path kit = CopyKit();
  fs::remove(kit / "config.yaml");
  fs::create_directories(kit / "config.yaml" / "inside");
  const Result r = Lockstep("kit verify " + kit.string());
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find((kit / "config.yaml").string() + ": a directory, listed in kit.json"),
            std::string::npos)
      << r.output;
}

TEST_F(KitTest, ATruncatedFileOrAnUnreadableManifestFailsVerify) {
  const fs::path kit = CopyKit();
  const fs::path config = kit / "config.yaml";
  const std::string text = ReadFileText(config);
  WriteFileSynced(config, std::string_view(text).substr(0, text.size() - 1));
  Result r = Lockstep("kit verify " + kit.string());
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find(config.string() + ": size"), std::string::npos) << r.output;

  WriteFileSynced(kit / "kit.json", std::string_view("{\"format\": \"lockstep-kit\""));
  r = Lockstep("kit verify " + kit.string());
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find((kit / "kit.json").string()), std::string::npos) << r.output;
}

TEST_F(KitTest, AuditMatchesEveryUnitAtOneAndTwoThreads) {
  const std::string kit = published().kit.string();
  const Result one = Lockstep("audit " + kit + " --all --threads 1");
  EXPECT_EQ(one.exit_code, 0) << one.output;
  // The table (stderr) and the JSON report (stdout) both give each unit's verdict.
  EXPECT_EQ(Count(one.output, "MATCH "), 3u) << one.output;
  EXPECT_EQ(Count(one.output, "\"verdict\": \"MATCH\""), 3u) << one.output;
  EXPECT_EQ(Count(one.output, "MISMATCH"), 0u) << one.output;

  const fs::path report = dir_ / "report.json";
  const Result two = Lockstep("audit " + kit + " --threads 2 --json-out " + report.string());
  EXPECT_EQ(two.exit_code, 0) << two.output;
  const nlohmann::json j = nlohmann::json::parse(ReadFileText(report));
  ASSERT_EQ(j.size(), 3u);
  for (const auto& unit : j) {
    EXPECT_EQ(unit["verdict"], "MATCH") << unit.dump(2);
    EXPECT_EQ(unit["replay"]["threads"], 2) << unit.dump(2);
    EXPECT_EQ(unit["replay"]["state_hash"], unit["expected"]) << unit.dump(2);
  }
  EXPECT_EQ(j[2]["unit"], "interval_10_20");
  EXPECT_EQ(j[2]["replay"]["losses"].size(), 10u);
}

TEST_F(KitTest, AuditOfATamperedStartCheckpointMismatchesAndNamesTheTensor) {
  const fs::path kit = CopyKit();
  const fs::path model = kit / "checkpoints/step_000000010/model.safetensors";
  const std::string last_tensor = ReadSafetensors(model).tensors().back().name;
  FlipBitFromEnd(model, 0);
  const std::string audit = "audit " + kit.string() + " --unit interval_10_20";

  const Result refused = Lockstep(audit);
  EXPECT_EQ(refused.exit_code, 1) << refused.output;
  EXPECT_NE(refused.output.find("nothing replayed"), std::string::npos) << refused.output;

  const fs::path receipt = dir_ / "forced.json", report = dir_ / "forced.md",
                 json_out = dir_ / "forced-out.json";
  const Result forced = Lockstep(audit + " --force --receipt " + receipt.string() + " --report " +
                                 report.string() + " --json-out " + json_out.string());
  EXPECT_EQ(forced.exit_code, 1) << forced.output;
  EXPECT_NE(forced.output.find("MISMATCH"), std::string::npos) << forced.output;
  EXPECT_NE(forced.output.find("param:" + last_tensor), std::string::npos) << forced.output;
  // The report says the kit did not verify (it said every file was checked), and the receipt's
  // command is the whole command line, --json-out included.
  const std::string md = ReadFileText(report);
  EXPECT_NE(md.find("the kit did not verify, and was replayed anyway (`--force`)"),
            std::string::npos)
      << md;
  EXPECT_EQ(md.find("every one checked"), std::string::npos) << md;
  const std::string command =
      nlohmann::json::parse(ReadFileText(receipt))["receipt"]["command"].get<std::string>();
  EXPECT_NE(command.find(" --force --json-out " + json_out.string() + " --receipt "),
            std::string::npos)
      << command;
}

// The receipt binds the kit.json that was verified before the replay, not the file as it is when
// the receipt is written.
TEST_F(KitTest, AnAuditReceiptBindsTheKitAsItWasVerified) {
  const fs::path kit = CopyKit();
  const std::string before = ReadFileText(kit / "kit.json");
  audit::AuditReceiptContext context{.command = "lockstep audit",
                                     .device = "cpu",
                                     .threads = 1,
                                     .started = "2026-01-01T00:00:00Z",
                                     .kit = audit::ReadAuditedKit(kit, true)};
  { std::ofstream(kit / "kit.json", std::ios::app) << " "; }
  const nlohmann::json r =
      nlohmann::json::parse(audit::AuditReceipt({}, context, nullptr))["receipt"];
  const auto sha = [](const std::string& text) {
    return ToHex(Sha256({reinterpret_cast<const uint8_t*>(text.data()), text.size()}));
  };
  EXPECT_EQ(r["kit"]["kit_json_sha256"], sha(before));
  EXPECT_NE(r["kit"]["kit_json_sha256"], sha(ReadFileText(kit / "kit.json")));
}

// Units that each replay to their own hash but do not link (an interval starting from a state
// no earlier unit ends at) prove nothing about the run: kit verify, and so audit, refuse them.
TEST_F(KitTest, AnIntervalThatDoesNotContinueTheChainFailsVerify) {
  const fs::path kit = CopyKit();
  kit::Trajectory t = kit::ReadTrajectory(kit);
  ASSERT_EQ(t.units.size(), 3u);
  t.units[1].expected_hash = t.units[0].expected_hash;  // interval_0_10 now "ends" elsewhere
  WriteFileSynced(kit / kit::kTrajectoryName, kit::TrajectoryJson(t));
  test::RelistKitFile(kit, std::string(kit::kTrajectoryName));
  const Result r = Lockstep("kit verify " + kit.string());
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("unit interval_10_20: starts from " +
                          (kit / "checkpoints/step_000000010").string() + ", whose state hash"),
            std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("that unit interval_0_10 ends at (step 10): the interval does not "
                          "continue the chain"),
            std::string::npos)
      << r.output;
  EXPECT_EQ(Count(r.output, "kit verify: unit "), 1u) << r.output;  // that one link, nothing else
  const Result audit = Lockstep("audit " + kit.string());
  EXPECT_EQ(audit.exit_code, 1) << audit.output;
  EXPECT_NE(audit.output.find("nothing replayed"), std::string::npos) << audit.output;
}

TEST_F(KitTest, AuditRefusesAnUnknownUnit) {
  const Result r = Lockstep("audit " + published().kit.string() + " --unit interval_5_6");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("units: init, interval_0_10, interval_10_20"), std::string::npos)
      << r.output;
}

}  // namespace
}  // namespace lockstep::kit_test
