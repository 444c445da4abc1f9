// Audit receipts (docs/formats/receipt.md, kind "audit"), the human report made from one
// (docs/audit.md, "Receipts"), and the coverage of a kit by many auditors' receipts.
#include <fmt/format.h>
#include <sys/utsname.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "lockstep/build_info.h"
#include "lockstep/json.h"
#include "lockstep/kernels.h"
#include "lockstep/kit.h"
#include "lockstep/train.h"

namespace lockstep::audit {
namespace {
namespace fs = std::filesystem;
using json = nlohmann::json;

constexpr char kProofPrefix[] = "lockstep/replay-proof/v2";

// The first value of a "key : value" line of a /proc or /etc file, or "".
std::string FileField(const char* path, std::string_view key, char separator) {
  try {
    for (const std::string& line : Lines(ReadFileText(path))) {
      if (!line.starts_with(key)) continue;
      const size_t at = line.find(separator);
      if (at == std::string::npos) continue;
      std::string value = line.substr(at + 1);
      value.erase(0, value.find_first_not_of(" \t\""));
      while (!value.empty() && (value.back() == '"' || value.back() == ' ')) value.pop_back();
      return value;
    }
  } catch (const Error&) {
  }
  return "";
}

// What a replay of an interval unit computed per step that its proof binds.
std::vector<ReplayedStep> Replayed(const ReplayResult& result) {
  if (result.losses.size() != result.backward_digests.size()) {
    LOCKSTEP_INTERNAL("{} losses, {} backward digests", result.losses.size(),
                      result.backward_digests.size());
  }
  std::vector<ReplayedStep> steps;
  for (size_t i = 0; i < result.losses.size(); ++i) {
    steps.push_back({result.losses[i], result.backward_digests[i]});
  }
  return steps;
}

json MachineFacts(const AuditReceiptContext& context) {
  utsname u{};
  uname(&u);
  const std::string os_release = FileField("/etc/os-release", "PRETTY_NAME", '=');
  return {{"cpu", FileField("/proc/cpuinfo", "model name", ':')},
          {"simd_variant", rk::ActiveIsa().name},
          {"threads", context.threads},
          {"device", context.device},
          {"os", fmt::format("{} {} {}{}", u.sysname, u.release, u.machine,
                             os_release.empty() ? "" : " (" + os_release + ")")}};
}

}  // namespace

Digest ReplayProof(const Ed25519PublicKey& signer, const Digest& kit_sha256, const kit::Unit& unit,
                   std::span<const ReplayedStep> steps) {
  Blake2b h;
  h.Update(std::string_view(kProofPrefix, sizeof kProofPrefix));  // with its zero byte
  h.Update(signer).Update(kit_sha256);
  h.Update(std::string_view(unit.name.c_str(), unit.name.size() + 1));
  h.UpdateU64(unit.start_step).UpdateU64(unit.until_step);
  for (const ReplayedStep& s : steps) h.Update(std::span(&s.loss, 1)).Update(s.backward);
  return h.Final();
}

AuditedKit ReadAuditedKit(const fs::path& kit_dir, bool verified) {
  const fs::path path = kit_dir / kit::kManifestName;
  const std::string text = ReadFileText(path, kMaxJsonBytes, "a kit.json");
  AuditedKit kit;
  kit.kit_json_sha256 = Sha256({reinterpret_cast<const uint8_t*>(text.data()), text.size()});
  kit.manifest = kit::ParseManifest(text, path.string());
  kit.descriptor_blake2b = Blake2b().Update(kit::ReadTrajectory(kit_dir).descriptor).Final();
  kit.verified = verified;
  return kit;
}

std::string AuditReceipt(const std::vector<UnitOutcome>& outcomes,
                         const AuditReceiptContext& context, const Ed25519Seed* key) {
  const Digest& kit_sha256 = context.kit.kit_json_sha256;
  const Ed25519PublicKey signer = key != nullptr ? PublicKeyOf(*key) : Ed25519PublicKey{};
  json units = json::array();
  for (const UnitOutcome& o : outcomes) {
    const kit::Unit& u = o.unit;
    const bool proven = o.result && u.kind == kit::UnitKind::kInterval;
    units.push_back(
        {{"unit", u.name},
         {"kind", kit::UnitKindName(u.kind)},
         {"start_step", u.start_step},
         {"until_step", u.until_step},
         {"expected", ToHex(u.expected_hash)},
         {"replayed", o.result ? json(ToHex(o.result->state_hash)) : json(nullptr)},
         {"verdict", o.verdict()},
         {"error", o.result ? json(nullptr) : json(o.error)},
         {"proof", proven ? json(ToHex(ReplayProof(signer, kit_sha256, u, Replayed(*o.result))))
                          : json(nullptr)},
         {"wall_ms", o.result ? static_cast<uint64_t>(o.result->wall_seconds * 1000 + 0.5) : 0},
         {"peak_rss_bytes", o.result ? o.result->peak_rss_bytes : 0},
         {"read_bytes", o.read_bytes}});
  }
  const json receipt = {
      {"format", kReceiptFormat},
      {"format_version", kAuditReceiptFormatVersion},
      {"kind", "audit"},
      {"lockstep_version", build::kVersion},
      {"contract_version", build::kContractVersion},
      {"binary", {{"git_commit", build::kGitCommit}, {"compiler", build::kCompiler}}},
      {"machine", MachineFacts(context)},
      {"kit",
       {{"kit_json_sha256", ToHex(kit_sha256)},
        {"descriptor_blake2b", ToHex(context.kit.descriptor_blake2b)}}},
      {"command", context.command},
      {"started", context.started},
      {"units", std::move(units)}};
  return SealReceipt(receipt, key);
}

std::string AuditReportMarkdown(const AuditedKit& kit, const std::string& receipt_text) {
  const OpenedReceipt opened = OpenReceipt(receipt_text, "the audit receipt", nullptr);
  const json& r = opened.receipt;
  const json& m = r.at("machine");
  const kit::KitManifest& manifest = kit.manifest;
  std::string md =
      fmt::format("# Audit of kit {}\n\n", r["kit"]["kit_json_sha256"].get<std::string>());
  md += fmt::format(
      "Replayed on {} by lockstep {}; the receipt is {}.\n\n## Kit\n\n"
      "- `kit.json` sha256: `{}` (compare with the one the publisher announced)\n"
      "- run descriptor BLAKE2b: `{}`\n- numerics contract: v{}\n- {} files, {}\n\n",
      r["started"].get<std::string>(), r["lockstep_version"].get<std::string>(),
      opened.signer ? fmt::format("signed by Ed25519 key `{}`", ToHex(*opened.signer))
                    : std::string("unsigned"),
      r["kit"]["kit_json_sha256"].get<std::string>(),
      r["kit"]["descriptor_blake2b"].get<std::string>(), r["contract_version"].get<int>(),
      manifest.files.size(),
      kit.verified ? "every one checked against `kit.json` (size and sha256) before anything was "
                     "replayed"
                   : "**which did not all match `kit.json`**: the kit did not verify, and was "
                     "replayed anyway (`--force`)");
  md += fmt::format(
      "## Toolchain and machine\n\n| | |\n|---|---|\n| lockstep | {} (commit {}) |\n"
      "| compiler | {} |\n| CPU | {} |\n| SIMD variant | {} |\n| threads | {} |\n"
      "| device | {} |\n| OS | {} |\n\n",
      r["lockstep_version"].get<std::string>(), r["binary"]["git_commit"].get<std::string>(),
      r["binary"]["compiler"].get<std::string>(), m["cpu"].get<std::string>(),
      m["simd_variant"].get<std::string>(), m["threads"].get<int>(), m["device"].get<std::string>(),
      m["os"].get<std::string>());
  md += fmt::format("## Command\n\n```\n{}\n```\n\n", r["command"].get<std::string>());
  md += "## Checksums (from `kit.json`)\n\n| file | bytes | sha256 |\n|---|---:|---|\n";
  for (const kit::KitFile& f : manifest.files) {
    md += fmt::format("| `{}` | {} | `{}` |\n", f.path, f.size, ToHex(f.sha256));
  }
  md +=
      "\n## Result\n\n| unit | steps | expected | replayed | verdict | proof of replay |\n"
      "|---|---|---|---|---|---|\n";
  size_t matched = 0;
  for (const json& u : r["units"]) {
    const std::string verdict = u["verdict"].get<std::string>();
    matched += verdict == "MATCH";
    md += fmt::format("| {} | {} | `{}` | {} | **{}** | {} |\n", u["unit"].get<std::string>(),
                      u["kind"] == "init" ? std::string("init (step 0)")
                                          : fmt::format("{} → {}", u["start_step"].get<uint64_t>(),
                                                        u["until_step"].get<uint64_t>()),
                      u["expected"].get<std::string>(),
                      u["replayed"].is_null() ? "error: " + u["error"].get<std::string>()
                                              : "`" + u["replayed"].get<std::string>() + "`",
                      verdict,
                      u["proof"].is_null()
                          ? std::string("none (nothing withheld)")
                          : "`" + u["proof"].get<std::string>().substr(0, 16) + "…`");
  }
  md += fmt::format("\n{} of {} units MATCH.\n\n", matched, r["units"].size());
  md += "## Resources\n\n| unit | wall s | peak RSS | read |\n|---|---:|---:|---:|\n";
  for (const json& u : r["units"]) {
    md +=
        fmt::format("| {} | {:.2f} | {} | {} |\n", u["unit"].get<std::string>(),
                    static_cast<double>(u["wall_ms"].get<uint64_t>()) / 1000,
                    MiB(u["peak_rss_bytes"].get<uint64_t>()), MiB(u["read_bytes"].get<uint64_t>()));
  }
  md += R"(
## What this audit shows, and what it does not

- It shows that this binary, on this machine, recomputed each MATCH unit's state from the kit's
  files and reached the hash the publisher committed to, bit for bit; a MISMATCH or an error is
  reported as it happened.
- The proof of replay of an interval unit is a digest of the loss and the backward digest (the
  gradients at every layer's input, which only a backward computes) of every replayed step, bound
  to the signer's key and this kit. Neither is in any kit, so the publisher, holding the run's
  `metrics.jsonl`, can check that the signer computed them (`lockstep coverage --metrics`). It
  does not show that the signer computed them alone: someone who gives the signer them
  (the publisher, or another auditor's `--json-out` report) makes the proof possible without a
  replay. An init unit has no proof: its state is the kit's step-0 checkpoint.
- The machine and toolchain above are what the binary read on the machine it ran on, stated by
  the signer; nothing proves them.
- It says nothing about units not listed, and nothing about whether the run's data or
  configuration were sound: only that the published states follow from them.
)";
  return md;
}

namespace {

// One receipt read for coverage: refused (with the reason) or its checked units.
struct ReadReceipt {
  std::string file, status, reason;  // status: counted|unsigned|untrusted|duplicate|refused
  std::optional<Ed25519PublicKey> signer;
  json receipt;
  std::map<std::string, std::string> proof;  // unit -> checked | unchecked | none | fails
};

// Whether `text` is a time as UtcNow writes it, YYYY-MM-DDTHH:MM:SSZ (docs/formats/receipt.md),
// with a month, day, hour, minute and second in range.
bool IsUtcTime(std::string_view text) {
  constexpr std::string_view kForm = "dddd-dd-ddTdd:dd:ddZ";
  if (text.size() != kForm.size()) return false;
  for (size_t i = 0; i < kForm.size(); ++i) {
    if (kForm[i] == 'd' ? !(text[i] >= '0' && text[i] <= '9') : text[i] != kForm[i]) return false;
  }
  const auto field = [&](size_t at) { return (text[at] - '0') * 10 + (text[at + 1] - '0'); };
  const int year = field(0) * 100 + field(2), month = field(5), day = field(8);
  if (month < 1 || month > 12 || day < 1) return false;
  const bool leap = year % 4 == 0 && (year % 100 != 0 || year % 400 == 0);
  constexpr int kDays[] = {31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31};
  const int days = kDays[month - 1] + (month == 2 && leap ? 1 : 0);
  // 60: a leap second, which UTC inserts only as the last second of a month, at 23:59.
  const bool leap_second = field(17) == 60 && field(11) == 23 && field(14) == 59 && day == days;
  return day <= days && field(11) <= 23 && field(14) <= 59 && (field(17) <= 59 || leap_second);
}

// A fact a page shows (a version, a command, the machine): at most 4096 bytes (a page repeats
// it per unit), with no control character and no Unicode direction override or isolate
// (U+202A..U+202E, U+2066..U+2069), which would make a page show other text than it holds.
void CheckFact(const std::string& value, const char* key, const std::string& where) {
  constexpr size_t kMaxFact = 4096;
  if (value.size() > kMaxFact) {
    Fail("{}: {} is {} bytes long, more than the {} a receipt's facts may hold", where, key,
         value.size(), kMaxFact);
  }
  for (size_t i = 0; i < value.size(); ++i) {
    const auto c = static_cast<unsigned char>(value[i]);
    const bool control = c < 0x20 || c == 0x7F;
    const bool direction =
        c == 0xE2 && i + 2 < value.size() &&
        ((value[i + 1] == '\x80' && value[i + 2] >= '\xAA' && value[i + 2] <= '\xAE') ||
         (value[i + 1] == '\x81' && value[i + 2] >= '\xA6' && value[i + 2] <= '\xA9'));
    if (control || direction) {
      // Shown as ASCII: the refusal itself is shown on the page.
      Fail("{}: {} = {}: a {} at byte {} (a receipt's facts are shown as text)", where, key,
           json(value).dump(-1, ' ', /*ensure_ascii=*/true).substr(0, 80),
           control ? "control character" : "text direction control", i);
    }
  }
}

// Checks one receipt against the kit; Error on anything that makes it not count.
void CheckReceipt(ReadReceipt& rr, const CoverageOptions& o, const kit::KitManifest& manifest,
                  const Digest& kit_sha256, const kit::Trajectory& trajectory,
                  const std::optional<std::map<uint64_t, ReplayedStep>>& losses) {
  const std::string what = rr.file + ": receipt";
  const json& r = rr.receipt;
  RequireKeys(r,
              {"format", "format_version", "kind", "lockstep_version", "contract_version", "binary",
               "machine", "kit", "command", "started", "units"},
              what);
  if (r.at("format_version") == 1 && r.at("kind") == "audit") {
    Fail(
        "{}: an audit receipt of format version 1, made by an earlier lockstep: its proofs of "
        "replay bind the losses alone, which forwards give without a backward; audit again "
        "with this lockstep",
        what);
  }
  RequireFormat(r, kReceiptFormat, kAuditReceiptFormatVersion, what);
  if (StringField(r, "kind", what) != "audit") {
    Fail("{}: kind = {}, not \"audit\"", what, ShownJson(r.at("kind")));
  }
  const auto fact = [](const json& object, const char* key, const std::string& where) {
    CheckFact(StringField(object, key, where), key, where);
  };
  for (const char* key : {"lockstep_version", "command", "started"}) fact(r, key, what);
  if (!IsUtcTime(r.at("started").get<std::string>())) {
    Fail("{}: started = {}: not a UTC time of the form YYYY-MM-DDTHH:MM:SSZ", what,
         ShownJson(r.at("started")));
  }
  RequireKeys(r.at("binary"), {"git_commit", "compiler"}, what + ": binary");
  for (const char* key : {"git_commit", "compiler"}) fact(r.at("binary"), key, what + ": binary");
  RequireKeys(r.at("machine"), {"cpu", "simd_variant", "threads", "device", "os"},
              what + ": machine");
  for (const char* key : {"cpu", "simd_variant", "device", "os"}) {
    fact(r.at("machine"), key, what + ": machine");
  }
  U64Field(r.at("machine"), "threads", what + ": machine");
  RequireKeys(r.at("kit"), {"kit_json_sha256", "descriptor_blake2b"}, what + ": kit");
  const Digest their_kit = DigestField(r.at("kit"), "kit_json_sha256", what + ": kit");
  if (their_kit != kit_sha256) {
    Fail("{}: a receipt of another kit (kit.json sha256 {}, this kit's is {})", what,
         ToHex(their_kit), ToHex(kit_sha256));
  }
  if (DigestField(r.at("kit"), "descriptor_blake2b", what + ": kit") !=
      Blake2b().Update(trajectory.descriptor).Final()) {
    Fail("{}: kit.descriptor_blake2b is not this kit's run descriptor's", what);
  }
  const uint64_t contract = U64Field(r, "contract_version", what);
  if (contract != static_cast<uint64_t>(manifest.contract_version)) {
    Fail("{}: made under numerics contract v{}, the kit's is v{}", what, contract,
         manifest.contract_version);
  }
  const json& units = r.at("units");
  if (!units.is_array() || units.empty()) Fail("{}: units is not a non-empty array", what);
  const Ed25519PublicKey signer = rr.signer.value_or(Ed25519PublicKey{});
  for (size_t i = 0; i < units.size(); ++i) {
    const json& u = units[i];
    const std::string at = fmt::format("{}: units[{}]", what, i);
    RequireKeys(u,
                {"unit", "kind", "start_step", "until_step", "expected", "replayed", "verdict",
                 "error", "proof", "wall_ms", "peak_rss_bytes", "read_bytes"},
                at);
    const std::string name = StringField(u, "unit", at);
    const std::string shown = ShownJson(u.at("unit"));
    if (rr.proof.contains(name)) Fail("{}: unit {} appears twice", at, shown);
    const Digest expected = DigestField(u, "expected", at);
    const kit::Unit* const unit =
        &KitUnitOf(trajectory, kit::kTrajectoryName, name, StringField(u, "kind", at),
                   U64Field(u, "start_step", at), U64Field(u, "until_step", at), expected, at);
    for (const char* key : {"wall_ms", "peak_rss_bytes", "read_bytes"}) U64Field(u, key, at);
    const std::optional<Digest> replayed =
        u.at("replayed").is_null() ? std::nullopt : std::optional(DigestField(u, "replayed", at));
    if (!u.at("error").is_null()) StringField(u, "error", at);
    CheckVerdictAgreesWithHashes(StringField(u, "verdict", at), expected, replayed,
                                 !u.at("error").is_null(), at);
    std::string& proof = rr.proof[name];
    if (u.at("proof").is_null()) {
      if (unit->kind == kit::UnitKind::kInterval && replayed) {
        Fail("{}: an interval unit that was replayed has no proof of replay", at);
      }
      proof = "none";
      continue;
    }
    if (unit->kind != kit::UnitKind::kInterval || !replayed) {
      Fail("{}: a proof of replay where there can be none (an init unit or an error)", at);
    }
    const Digest claimed = DigestField(u, "proof", at);
    proof = "unchecked";
    if (!losses || u.at("verdict") != "MATCH") continue;
    std::vector<ReplayedStep> steps;
    for (uint64_t step = unit->start_step + 1; step <= unit->until_step; ++step) {
      const auto it = losses->find(step);
      if (it == losses->end()) break;
      steps.push_back(it->second);
    }
    if (steps.size() != unit->until_step - unit->start_step) continue;  // a non-finite loss
    if (ReplayProof(signer, kit_sha256, *unit, steps) != claimed) {
      Fail(
          "{}: unit {}: the proof of replay does not check against the publisher's losses and "
          "backward digests ({}): it was not made from a replay of this unit by this key",
          at, name, o.metrics->string());
    }
    proof = "checked";
  }
}

std::vector<std::string> Sorted(const std::set<std::string>& set) {
  return {set.begin(), set.end()};
}

// The publisher's loss and backward digest by step from --metrics (a step with a non-finite
// loss absent: its bits are not in the file), after checking that the file is the whole
// metrics.jsonl of the kit's run, with every step's backward digest.
std::map<uint64_t, ReplayedStep> PublisherLosses(const fs::path& metrics,
                                                 const kit::Trajectory& trajectory) {
  std::map<uint64_t, ReplayedStep> losses;
  const std::vector<train::MetricsLine> lines = train::ReadMetrics(metrics);
  for (const train::MetricsLine& m : lines) {
    if (!m.backward_blake2b) {
      Fail(
          "--metrics {}: step {} has no backward_blake2b: a metrics.jsonl of an earlier "
          "lockstep, against which no proof of replay can be checked",
          metrics.string(), m.step);
    }
    if (std::isfinite(m.loss)) losses[m.step] = {static_cast<float>(m.loss), *m.backward_blake2b};
  }
  const uint64_t last = trajectory.units.empty() ? 0 : trajectory.units.back().until_step;
  for (uint64_t step = 1; step <= last; ++step) {
    if (step > lines.size() || lines[step - 1].step != step) {
      Fail(
          "--metrics {}: no line for step {} where the kit's units reach step {}: not the "
          "whole metrics.jsonl of this run",
          metrics.string(), step, last);
    }
  }
  // The kit records the publisher's time over each interval, added up from this file's
  // step_seconds in step order when the kit was built: another run's file adds up to another.
  for (const kit::Unit& unit : trajectory.units) {
    if (!unit.publisher_wall_seconds) continue;
    double total = 0;
    for (uint64_t step = unit.start_step + 1; step <= unit.until_step; ++step) {
      total += lines[step - 1].step_seconds;
    }
    if (total != *unit.publisher_wall_seconds) {
      Fail(
          "--metrics {}: its step_seconds over {} add up to {} s, but the kit's "
          "trajectory.json records publisher_wall_seconds {} s: not the metrics.jsonl of the "
          "run this kit was built from",
          metrics.string(), unit.name, total, *unit.publisher_wall_seconds);
    }
  }
  return losses;
}

// Every receipt file given, read and checked on its own (ReadReceipt::status says how it counts).
std::vector<ReadReceipt> ReadReceipts(
    const CoverageOptions& o, const kit::KitManifest& manifest, const Digest& kit_sha256,
    const kit::Trajectory& trajectory,
    const std::optional<std::map<uint64_t, ReplayedStep>>& losses) {
  std::vector<ReadReceipt> receipts;
  std::map<Digest, std::string> seen;  // each receipt's bytes (SHA-256) -> the first file
  for (const fs::path& path : o.receipts) {
    ReadReceipt rr{.file = path.string(),
                   .status = "counted",
                   .reason = {},
                   .signer = {},
                   .receipt = {},
                   .proof = {}};
    try {
      if (!fs::is_regular_file(path)) Fail("{}: not a regular file", rr.file);
      // A receipt of a kit of 10,000 units is about 7 MiB.
      constexpr uint64_t kMaxReceiptBytes = uint64_t{16} << 20;
      const std::string text = ReadFileText(path, kMaxReceiptBytes, "an audit receipt");
      const auto [first, fresh] = seen.emplace(
          Sha256({reinterpret_cast<const uint8_t*>(text.data()), text.size()}), rr.file);
      if (!fresh) {
        rr.status = "duplicate";
        rr.reason = fmt::format("the same bytes as {}, listed before: counted once", first->second);
        receipts.push_back(std::move(rr));
        continue;
      }
      OpenedReceipt opened = OpenReceipt(text, rr.file, nullptr);
      rr.signer = opened.signer;
      rr.receipt = std::move(opened.receipt);
      CheckReceipt(rr, o, manifest, kit_sha256, trajectory, losses);
      if (!rr.signer) {
        rr.status = "unsigned";
        rr.reason = "not signed: nobody vouches for it, so it is not counted";
      } else if (o.trusted_keys &&
                 std::ranges::find(*o.trusted_keys, *rr.signer) == o.trusted_keys->end()) {
        rr.status = "untrusted";
        rr.reason = "signed by a key not in --trusted-keys: not counted";
      }
    } catch (const std::exception& e) {  // Error, or the file system's
      constexpr size_t kMaxReason = 1000;
      rr.status = "refused";
      rr.reason = e.what();
      if (rr.reason.size() > kMaxReason) rr.reason = rr.reason.substr(0, kMaxReason) + "…";
    }
    receipts.push_back(std::move(rr));
  }

  return receipts;
}

}  // namespace

json Coverage(const CoverageOptions& o) {
  if (o.threshold < 1) Fail("--threshold {}: must be at least 1", o.threshold);
  // Receipts name the kit by its kit.json, which vouches for the rest only when the files agree.
  const std::vector<std::string> problems = kit::VerifyKit(o.kit_dir);
  if (!problems.empty()) {
    Fail(
        "{}: the kit does not verify ({} problem{}; the first: {}): lockstep kit verify {} "
        "lists them",
        o.kit_dir.string(), problems.size(), problems.size() == 1 ? "" : "s", problems.front(),
        o.kit_dir.string());
  }
  const kit::KitManifest manifest = kit::ReadManifest(o.kit_dir);
  const Digest kit_sha256 = Sha256(ReadFileBytes(o.kit_dir / kit::kManifestName));
  const kit::Trajectory trajectory = kit::ReadTrajectory(o.kit_dir);
  std::optional<std::map<uint64_t, ReplayedStep>> losses;
  if (o.metrics) losses = PublisherLosses(*o.metrics, trajectory);
  const std::vector<ReadReceipt> receipts =
      ReadReceipts(o, manifest, kit_sha256, trajectory, losses);

  json doc = {{"kit_json_sha256", ToHex(kit_sha256)},
              {"threshold", o.threshold},
              {"proofs_checked", o.metrics.has_value()},
              {"receipts", json::array()},
              {"units", json::array()}};
  for (const ReadReceipt& rr : receipts) {
    doc["receipts"].push_back({{"file", rr.file},
                               {"status", rr.status},
                               {"reason", rr.reason.empty() ? json(nullptr) : json(rr.reason)},
                               {"signer", rr.signer ? json(ToHex(*rr.signer)) : json(nullptr)}});
  }
  size_t confirmed = 0, unaudited = 0, conflicts = 0, unchecked = 0;
  for (const kit::Unit& unit : trajectory.units) {
    std::map<std::string, std::set<std::string>> keys;  // verdict -> distinct signers
    std::set<std::string> cpus, variants, devices, compilers;
    json rows = json::array();
    for (const ReadReceipt& rr : receipts) {
      if (rr.status != "counted") continue;
      for (const json& u : rr.receipt["units"]) {
        if (u["unit"] != unit.name) continue;
        const std::string verdict = u["verdict"].get<std::string>(), key = ToHex(*rr.signer);
        keys[verdict].insert(key);
        const json& m = rr.receipt["machine"];
        cpus.insert(m["cpu"].get<std::string>());
        variants.insert(m["simd_variant"].get<std::string>());
        devices.insert(m["device"].get<std::string>());
        compilers.insert(rr.receipt["binary"]["compiler"].get<std::string>());
        unchecked += rr.proof.at(unit.name) == "unchecked";
        rows.push_back({{"file", rr.file},
                        {"signer", key},
                        {"verdict", verdict},
                        {"replayed", u["replayed"]},
                        {"proof", rr.proof.at(unit.name)},
                        {"cpu", m["cpu"]},
                        {"simd_variant", m["simd_variant"]},
                        {"device", m["device"]},
                        {"compiler", rr.receipt["binary"]["compiler"]}});
      }
    }
    const size_t matches = keys["MATCH"].size(), mismatches = keys["MISMATCH"].size();
    const bool is_confirmed = mismatches == 0 && matches >= static_cast<size_t>(o.threshold);
    const std::string status = mismatches > 0 && matches > 0 ? "conflict"
                               : mismatches > 0              ? "mismatch"
                               : is_confirmed                ? "confirmed"
                               : matches > 0                 ? "below threshold"
                               : rows.empty()                ? "unaudited"
                                                             : "errors only";
    confirmed += is_confirmed;
    unaudited += rows.empty();
    conflicts += mismatches > 0;
    doc["units"].push_back({{"unit", unit.name},
                            {"kind", kit::UnitKindName(unit.kind)},
                            {"start_step", unit.start_step},
                            {"until_step", unit.until_step},
                            {"expected", ToHex(unit.expected_hash)},
                            {"status", status},
                            {"confirmed", is_confirmed},
                            {"match_keys", Sorted(keys["MATCH"])},
                            {"mismatch_keys", Sorted(keys["MISMATCH"])},
                            {"error_keys", Sorted(keys["ERROR"])},
                            {"cpus", Sorted(cpus)},
                            {"simd_variants", Sorted(variants)},
                            {"devices", Sorted(devices)},
                            {"compilers", Sorted(compilers)},
                            {"receipts", std::move(rows)}});
  }
  const auto count = [&](std::string_view status) {
    return std::ranges::count_if(receipts,
                                 [&](const ReadReceipt& r) { return r.status == status; });
  };
  doc["summary"] = {
      {"units", trajectory.units.size()},
      {"confirmed", confirmed},
      {"unaudited", unaudited},
      {"disputed", conflicts},
      {"receipts_counted", count("counted")},
      {"receipts_not_counted", count("unsigned") + count("untrusted") + count("duplicate")},
      {"receipts_refused", count("refused")},
      {"proofs_unchecked", unchecked}};
  return doc;
}

}  // namespace lockstep::audit
