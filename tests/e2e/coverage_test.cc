// Many auditors, one record: `audit --receipt` writes a signed receipt whose proof of replay is
// re-derived here from docs/formats/receipt.md and the publisher's metrics.jsonl alone, and
// `coverage` counts distinct keys, shows conflicts and refuses receipts that were not made by
// replaying this kit (echoed proofs, copied proofs, forged signatures, other kits).
#include <gtest/gtest.h>

#include <bit>
#include <filesystem>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "common/chromium.h"
#include "common/kit_edit.h"
#include "common/run_lockstep.h"
#include "common/scratch_dir.h"
#include "lockstep/json.h"
#include "lockstep/state.h"
#include "lockstep/train.h"

namespace lockstep {
namespace {
namespace fs = std::filesystem;
using Json = nlohmann::json;
using test::Lockstep;
using test::Result;

class Coverage : public test::ScratchDirTest {
 protected:
  std::string Path(const std::string& name) const { return (dir_ / name).string(); }

  // A receipt made by editing another one's `receipt` object and signing it with `key`.
  std::string Forged(const std::string& from, const std::string& key, const std::string& to,
                     const std::function<void(Json&)>& edit) {
    Json receipt = Json::parse(ReadFileText(Path(from)))["receipt"];
    edit(receipt);
    const Ed25519Seed seed = ReadSigningKey(Path(key));
    WriteFileSynced(Path(to), SealReceipt(receipt, &seed));
    return Path(to);
  }

  Json CoverageJson(const std::string& receipts, const std::string& extra, int* exit_code) {
    const Result r = Lockstep("coverage --kit " + Path("kit") + " " + receipts + " --out " +
                              Path("coverage.html") + " --json " + Path("coverage.json") + extra);
    *exit_code = r.exit_code;
    EXPECT_NE(r.exit_code, 2) << r.output;
    return Json::parse(ReadFileText(dir_ / "coverage.json"));
  }
};

const Json& UnitOf(const Json& coverage, const std::string& name) {
  for (const Json& u : coverage["units"]) {
    if (u["unit"] == name) return u;
  }
  ADD_FAILURE() << "no unit " << name;
  return coverage;
}

// A step's backward digest, as a proof binds it.
using BackwardOf = std::function<std::vector<uint8_t>(uint64_t step)>;

// The publisher's: metrics.jsonl's backward_blake2b.
BackwardOf Backward(const std::vector<train::MetricsLine>& metrics) {
  return [&metrics](uint64_t step) {
    const Digest d = metrics[step - 1].backward_blake2b.value();
    return std::vector<uint8_t>(d.begin(), d.end());
  };
}

// The proof of replay of unit `u` (a receipt's unit object) by `key`, derived by hand from
// docs/formats/receipt.md ("The proof of replay") with the losses of `metrics` and the backward
// digests `backward` gives; `prefix` the proof's version string.
std::string ProofFromMetrics(const Ed25519PublicKey& key, const std::string& kit_sha256,
                             const Json& u, const std::vector<train::MetricsLine>& metrics,
                             const BackwardOf& backward,
                             std::string_view prefix = "lockstep/replay-proof/v2") {
  std::vector<uint8_t> message(prefix.begin(), prefix.end());
  message.push_back(0);
  message.insert(message.end(), key.begin(), key.end());
  const Digest kit = DigestFromHex(kit_sha256, "kit");
  message.insert(message.end(), kit.begin(), kit.end());
  const std::string name = u["unit"].get<std::string>();
  message.insert(message.end(), name.begin(), name.end());
  message.push_back(0);
  const auto u64 = [&](uint64_t v) {
    for (int i = 0; i < 8; ++i) message.push_back(static_cast<uint8_t>(v >> (8 * i)));
  };
  u64(u["start_step"]);
  u64(u["until_step"]);
  for (uint64_t step = u["start_step"].get<uint64_t>() + 1; step <= u["until_step"]; ++step) {
    EXPECT_EQ(metrics[step - 1].step, step);
    const uint32_t bits = std::bit_cast<uint32_t>(static_cast<float>(metrics[step - 1].loss));
    for (int i = 0; i < 4; ++i) message.push_back(static_cast<uint8_t>(bits >> (8 * i)));
    const std::vector<uint8_t> b = backward(step);
    message.insert(message.end(), b.begin(), b.end());
  }
  return ToHex(Blake2b256(message));
}

const Json& ReceiptOf(const Json& coverage, const std::string& file) {
  for (const Json& r : coverage["receipts"]) {
    if (r["file"] == file) return r;
  }
  ADD_FAILURE() << "no receipt " << file;
  return coverage;
}

TEST_F(Coverage, DistinctKeysCountOnceConflictsShowAndReceiptsWithoutAReplayAreRefused) {
  for (const std::string& command :
       {"data synth --out " + Path("data") + " --seed 5 --tokens 200000",
        "train --config tiny --data " + Path("data") + " --out " + Path("run") +
            " --steps 20 --no-progress",
        "kit build --run " + Path("run") + " --data " + Path("data") + " --out " + Path("kit"),
        "keygen --out " + Path("A"), "keygen --out " + Path("B"), "keygen --out " + Path("C"),
        "keygen --out " + Path("D")}) {
    const Result r = Lockstep(command);
    ASSERT_EQ(r.exit_code, 0) << command << ": " << r.output;
  }
  // Auditor A audits every unit (with a human report), and the last unit again; B every unit;
  // someone audits without signing.
  Result r = Lockstep("audit " + Path("kit") + " --receipt " + Path("rA.json") + " --sign-key " +
                      Path("A") + " --report " + Path("audit.md"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  r = Lockstep("audit " + Path("kit") + " --unit interval_10_20 --threads 2 --receipt " +
               Path("rA2.json") + " --sign-key " + Path("A"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  r = Lockstep("audit " + Path("kit") + " --receipt " + Path("rB.json") + " --sign-key " +
               Path("B"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  r = Lockstep("audit " + Path("kit") + " --unit init --receipt " + Path("rU.json"));
  ASSERT_EQ(r.exit_code, 0) << r.output;

  // The receipt, read as docs/formats/receipt.md says: signed by A, of this kit, every unit
  // MATCH; the proof of an interval unit re-derived from the run's metrics.jsonl by hand.
  const Json file = Json::parse(ReadFileText(dir_ / "rA.json"));
  const Json& receipt = file["receipt"];
  EXPECT_EQ(receipt["kind"], "audit");
  const Ed25519PublicKey a = ReadPublicKey(Path("A.pub"));
  EXPECT_EQ(file["signature"]["ed25519"], ToHex(a));
  const std::string kit_sha256 = ToHex(Sha256(ReadFileBytes(dir_ / "kit/kit.json")));
  EXPECT_EQ(receipt["kit"]["kit_json_sha256"], kit_sha256);
  ASSERT_EQ(receipt["units"].size(), 3u);
  const std::vector<train::MetricsLine> metrics = train::ReadMetrics(dir_ / "run/metrics.jsonl");
  for (const Json& u : receipt["units"]) {
    EXPECT_EQ(u["verdict"], "MATCH") << u.dump();
    EXPECT_EQ(u["replayed"], u["expected"]) << u.dump();
    if (u["kind"] == "init") {
      EXPECT_TRUE(u["proof"].is_null());
      continue;
    }
    EXPECT_EQ(u["proof"], ProofFromMetrics(a, kit_sha256, u, metrics, Backward(metrics)))
        << u["unit"];
  }
  // The human report holds the kit, the checksums, the result and the limits.
  const std::string report = ReadFileText(dir_ / "audit.md");
  EXPECT_NE(report.find("# Audit of kit " + kit_sha256), std::string::npos) << report;
  EXPECT_NE(report.find("3 of 3 units MATCH"), std::string::npos) << report;
  EXPECT_NE(report.find(ToHex(kit::ReadManifest(dir_ / "kit").files.front().sha256)),
            std::string::npos);
  EXPECT_NE(report.find("What this audit shows, and what it does not"), std::string::npos);

  // Receipts that must not count.
  ASSERT_EQ(receipt["units"][1]["unit"], "interval_0_10");
  const std::string echoed = Forged("rA.json", "D", "echoed.json", [](Json& r) {
    r["units"] = Json::array({r["units"][1]});
    r["units"][0]["proof"] = r["units"][0]["expected"];  // the public hash echoed
  });
  const std::string copied = Forged("rA.json", "D", "copied.json", [](Json&) {});
  const std::string other_kit = Forged("rA.json", "C", "other_kit.json", [](Json& r) {
    r["kit"]["kit_json_sha256"] = std::string(64, '0');
  });
  const std::string late = Forged("rA.json", "C", "late.json", [](Json& r) {
    r["started"] = "2026-12-03 07:46:36";  // not the documented YYYY-MM-DDTHH:MM:SSZ
  });
  const std::string feb31 = Forged("rA.json", "C", "feb31.json", [](Json& r) {
    r["started"] = "2026-02-31T12:00:00Z";  // the form, but no such day
  });
  const std::string leap = Forged("rA.json", "C", "leap.json", [](Json& r) {
    r["started"] = "2026-02-28T12:00:60Z";  // a leap second, but not at the end of a month
  });
  const std::string control = Forged("rA.json", "C", "control.json", [](Json& r) {
    r["machine"]["cpu"] = std::string(
                              "\xE2\x80\xAE"
                              "evil") +
                          '\0' + "x";  // U+202E, NUL
  });
  const std::string mismatch = Forged("rB.json", "C", "mismatch.json", [](Json& r) {
    r["units"] = Json::array({r["units"][1]});
    r["units"][0]["verdict"] = "MISMATCH";
    r["units"][0]["replayed"] = std::string(64, 'e');
  });
  Json forged_file = Json::parse(ReadFileText(dir_ / "rB.json"));
  std::string signature = forged_file["signature"]["signature"];
  signature[0] = signature[0] == '0' ? '1' : '0';
  forged_file["signature"]["signature"] = signature;
  WriteFileSynced(dir_ / "forged.json", forged_file.dump(2));

  // Two receipts of one key count once; two keys twice; unsigned counts for nobody.
  int exit_code = 0;
  Json c = CoverageJson(
      Path("rA.json") + " " + Path("rA2.json") + " " + Path("rB.json") + " " + Path("rU.json"),
      " --threshold 2", &exit_code);
  EXPECT_EQ(exit_code, 0);
  EXPECT_EQ(UnitOf(c, "interval_10_20")["match_keys"].size(), 2u);
  EXPECT_EQ(UnitOf(c, "interval_10_20")["receipts"].size(), 3u);  // A twice, B once
  EXPECT_EQ(UnitOf(c, "init")["match_keys"].size(), 2u);
  for (const Json& u : c["units"]) EXPECT_EQ(u["status"], "confirmed") << u.dump();
  EXPECT_EQ(ReceiptOf(c, Path("rU.json"))["status"], "unsigned");
  EXPECT_EQ(c["proofs_checked"], false);
  c = CoverageJson(Path("rA.json") + " " + Path("rA2.json"), " --threshold 2", &exit_code);
  EXPECT_EQ(exit_code, 1) << "one key cannot confirm a unit twice";
  EXPECT_EQ(UnitOf(c, "interval_10_20")["status"], "below threshold");

  // With the publisher's losses, every proof is checked: an echoed hash or a proof copied under
  // another key is refused, as are a forged signature and a receipt of another kit; a MISMATCH
  // is shown as a conflict beside the MATCHes.
  const std::string all = Path("rA.json") + " " + Path("rB.json") + " " + echoed + " " + copied +
                          " " + other_kit + " " + mismatch + " " + Path("forged.json") + " " +
                          late + " " + feb31 + " " + leap + " " + control;
  c = CoverageJson(all, " --metrics " + Path("run/metrics.jsonl"), &exit_code);
  EXPECT_EQ(exit_code, 1);
  EXPECT_EQ(c["proofs_checked"], true);
  EXPECT_EQ(ReceiptOf(c, Path("rA.json"))["status"], "counted");
  EXPECT_EQ(ReceiptOf(c, Path("rB.json"))["status"], "counted");
  for (const auto& [file, why] : std::vector<std::pair<std::string, std::string>>{
           {echoed, "the proof of replay does not check"},
           {copied, "the proof of replay does not check"},
           {other_kit, "a receipt of another kit"},
           {late, "started = \"2026-12-03 07:46:36\": not a UTC time"},
           {feb31, "started = \"2026-02-31T12:00:00Z\": not a UTC time"},
           {leap, "started = \"2026-02-28T12:00:60Z\": not a UTC time"},
           {control, "cpu = \"\\u202eevil\\u0000x\": a text direction control at byte 0"},
           {Path("forged.json"), "the signature does not verify"}}) {
    const Json& rr = ReceiptOf(c, file);
    EXPECT_EQ(rr["status"], "refused") << file;
    EXPECT_NE(rr["reason"].get<std::string>().find(why), std::string::npos) << rr.dump();
  }
  EXPECT_EQ(ReceiptOf(c, mismatch)["status"], "counted");
  const Json& disputed = UnitOf(c, "interval_0_10");
  EXPECT_EQ(disputed["status"], "conflict");
  EXPECT_EQ(disputed["match_keys"].size(), 2u);
  EXPECT_EQ(disputed["mismatch_keys"].size(), 1u);
  for (const Json& row : disputed["receipts"]) {
    if (row["verdict"] == "MATCH") {
      EXPECT_EQ(row["proof"], "checked") << row.dump();
    }
  }
  EXPECT_EQ(UnitOf(c, "interval_10_20")["status"], "confirmed");
  // Without the losses the echoed proof cannot be told apart: it counts, marked unchecked.
  c = CoverageJson(echoed, "", &exit_code);
  EXPECT_EQ(ReceiptOf(c, echoed)["status"], "counted");
  EXPECT_EQ(UnitOf(c, "interval_0_10")["receipts"][0]["proof"], "unchecked");
  // Only trusted keys count.
  WriteFileSynced(dir_ / "trusted.txt",
                  "# auditors we trust\n" + ToHex(ReadPublicKey(Path("B.pub"))) + "\n");
  c = CoverageJson(Path("rA.json") + " " + Path("rB.json"),
                   " --trusted-keys " + Path("trusted.txt"), &exit_code);
  EXPECT_EQ(ReceiptOf(c, Path("rA.json"))["status"], "untrusted");
  EXPECT_EQ(UnitOf(c, "init")["match_keys"].size(), 1u);

  // The kit's report page shows the same coverage; a run is not what receipts are of.
  r = Lockstep("report " + Path("kit") + " --receipt " + Path("rA.json") + " --out " +
               Path("kit.html"));
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(ReadFileText(dir_ / "kit.html").find("id=\"coverage\""), std::string::npos);
  r = Lockstep("report " + Path("run") + " --receipt " + Path("rA.json") + " --out " +
               Path("run.html"));
  EXPECT_EQ(r.exit_code, 2) << r.output;

  // Bad input is refused before anything is written: two outputs that are one file, metrics that
  // are not the whole run's, a kit whose files no longer match its kit.json.
  r = Lockstep("coverage --kit " + Path("kit") + " " + Path("rA.json") + " --out " + Path("same") +
               " --json " + Path("same"));
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("are the same file"), std::string::npos) << r.output;
  const std::vector<std::string> lines = Lines(ReadFileText(dir_ / "run/metrics.jsonl"));
  std::string gap;
  for (size_t i = 0; i < lines.size(); ++i) gap += i == 4 ? "" : lines[i] + "\n";
  WriteFileSynced(dir_ / "gap.jsonl", gap);
  r = Lockstep("coverage --kit " + Path("kit") + " " + Path("rA.json") + " --metrics " +
               Path("gap.jsonl") + " --out " + Path("gap.html"));
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("no line for step 5"), std::string::npos) << r.output;
  // Another run's metrics (here: one step's time differs) are refused as such, not held against
  // the auditors' proofs.
  Json slower = Json::parse(lines[12]);
  slower["step_seconds"] = slower["step_seconds"].get<double>() + 0.5;
  std::string other;
  for (size_t i = 0; i < lines.size(); ++i) other += (i == 12 ? slower.dump() : lines[i]) + "\n";
  WriteFileSynced(dir_ / "other.jsonl", other);
  r = Lockstep("coverage --kit " + Path("kit") + " " + Path("rA.json") + " --metrics " +
               Path("other.jsonl") + " --out " + Path("other.html"));
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("interval_10_20 add up to"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("not the metrics.jsonl of the run this kit was built from"),
            std::string::npos)
      << r.output;
  // The same receipt twice (the same bytes under any name) is listed twice and counted once.
  fs::copy_file(dir_ / "rA.json", dir_ / "rA-copy.json");
  c = CoverageJson(Path("rA.json") + " " + Path("rA-copy.json"), "", &exit_code);
  ASSERT_EQ(c["receipts"].size(), 2u);
  EXPECT_EQ(c["receipts"][0]["status"], "counted");
  EXPECT_EQ(c["receipts"][1]["status"], "duplicate");
  EXPECT_NE(c["receipts"][1]["reason"].get<std::string>().find("rA.json, listed before"),
            std::string::npos);
  EXPECT_EQ(UnitOf(c, "interval_10_20")["receipts"].size(), 1u);
  EXPECT_EQ(c["summary"]["receipts_not_counted"], 1);
  fs::copy(dir_ / "kit", dir_ / "kit2", fs::copy_options::recursive);
  WriteFileSynced(dir_ / "kit2/trajectory.json", "{}");
  r = Lockstep("coverage --kit " + Path("kit2") + " " + Path("rA.json") + " --out " +
               Path("kit2.html"));
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("the kit does not verify"), std::string::npos) << r.output;
  EXPECT_FALSE(fs::exists(dir_ / "kit2.html"));

  // The page, rendered: one row per unit with its status and number of keys, the disputed
  // unit's receipts side by side, the refused receipts listed.
  CoverageJson(all, " --metrics " + Path("run/metrics.jsonl"), &exit_code);
  const std::string page = ReadFileText(dir_ / "coverage.html");
  for (const char* forbidden : {"<script", "<link", "<img", "src=", "url(", "http"}) {
    EXPECT_EQ(page.find(forbidden), std::string::npos) << forbidden;
  }
  if (!test::Have("chromium --version")) {
    GTEST_SKIP() << "chromium is not installed (scripts/install-deps.sh installs it): the page "
                    "was checked as text only";
  }
  const std::string dom = test::RenderedDom(dir_ / "coverage.html", dir_);
  EXPECT_NE(dom.find("data-unit=\"interval_0_10\" data-status=\"conflict\" data-keys=\"2\""),
            std::string::npos);
  EXPECT_NE(dom.find("data-unit=\"interval_10_20\" data-status=\"confirmed\" data-keys=\"2\""),
            std::string::npos);
  EXPECT_EQ(test::Count(dom, "class=\"dispute\" data-unit=\"interval_0_10\""), 3u);
  EXPECT_EQ(test::Count(dom, "class=\"receipt\" data-status=\"refused\""), 8u);
}

// A unit of one step: its loss is a forward of the public start checkpoint, so a proof that
// bound the losses alone was made without any backward (coverage confirmed every unit of such a
// kit). The proof binds each step's backward digest too: a forger holding every loss to the bit
// (here taken from the publisher's own metrics.jsonl, more than forwards give) but no backward
// is refused, in either form of the proof, while an honest replay's proof checks.
TEST_F(Coverage, AOneStepUnitIsNotProvenByForwardsAlone) {
  test::WriteTinyWithCheckpointEvery(dir_ / "tiny1.yaml", 1);
  for (const std::string& command :
       {"data synth --out " + Path("data") + " --seed 3 --tokens 100000",
        "train --config " + Path("tiny1.yaml") + " --data " + Path("data") + " --out " +
            Path("run") + " --steps 2 --no-progress",
        "kit build --run " + Path("run") + " --data " + Path("data") + " --out " + Path("kit"),
        "keygen --out " + Path("H"), "keygen --out " + Path("F"),
        "audit " + Path("kit") + " --receipt " + Path("honest.json") + " --sign-key " +
            Path("H")}) {
    const Result r = Lockstep(command);
    ASSERT_EQ(r.exit_code, 0) << command << ": " << r.output;
  }
  const std::vector<train::MetricsLine> metrics = train::ReadMetrics(dir_ / "run/metrics.jsonl");
  const std::string kit_sha256 = ToHex(Sha256(ReadFileBytes(dir_ / "kit/kit.json")));
  const Ed25519PublicKey f = ReadPublicKey(Path("F.pub"));
  const BackwardOf unknown = [](uint64_t) { return std::vector<uint8_t>(32, 0); };
  const auto forge = [&](const std::string& name, const BackwardOf& backward,
                         std::string_view prefix) {
    return Forged("honest.json", "F", name, [&](Json& r) {
      for (Json& u : r["units"]) {
        if (u["kind"] == "interval") {
          u["proof"] = ProofFromMetrics(f, kit_sha256, u, metrics, backward, prefix);
        }
      }
    });
  };
  const std::string zeros = forge("zeros.json", unknown, "lockstep/replay-proof/v2");
  const std::string losses_only = forge(
      "losses_only.json", [](uint64_t) { return std::vector<uint8_t>(); },
      "lockstep/replay-proof/v1");
  // With the backward digests, the forger's proof would check: the test's derivation is right.
  const std::string with_backward =
      forge("with_backward.json", Backward(metrics), "lockstep/replay-proof/v2");
  int exit_code = 0;
  const Json c =
      CoverageJson(Path("honest.json") + " " + zeros + " " + losses_only + " " + with_backward,
                   " --metrics " + Path("run/metrics.jsonl"), &exit_code);
  EXPECT_EQ(ReceiptOf(c, Path("honest.json"))["status"], "counted");
  for (const char* unit : {"interval_0_1", "interval_1_2"}) {
    const Json& u = UnitOf(c, unit);
    ASSERT_FALSE(u["receipts"].empty()) << u.dump();
    EXPECT_EQ(u["receipts"][0]["proof"], "checked") << u.dump();
  }
  for (const std::string& forged : {zeros, losses_only}) {
    const Json& rr = ReceiptOf(c, forged);
    EXPECT_EQ(rr["status"], "refused") << rr.dump();
    EXPECT_NE(rr["reason"].get<std::string>().find("the proof of replay does not check"),
              std::string::npos)
        << rr.dump();
  }
  EXPECT_EQ(ReceiptOf(c, with_backward)["status"], "counted");
}

}  // namespace
}  // namespace lockstep
