// `lockstep kit build|inspect|verify|fetch`, `lockstep audit` (docs/kits.md) and `lockstep report`.
#include "lockstep/kit.h"

#include <fmt/format.h>

#include <algorithm>
#include <memory>
#include <string>
#include <vector>

#include "lockstep/core.h"
#include "lockstep/data.h"
#include "tools/lockstep/commands.h"

namespace lockstep::cli {
namespace {
namespace fs = std::filesystem;

uint64_t TotalBytes(const kit::KitManifest& manifest) {
  uint64_t total = 0;
  for (const kit::KitFile& f : manifest.files) total += f.size;
  return total;
}

std::string Optional(const std::optional<double>& seconds) {
  return seconds ? fmt::format("{:.2f} s", *seconds) : "not measured";
}

int RunBuild(const audit::KitBuildOptions& options) {
  RefuseOutputsOntoInputs({{"--out", options.out_dir}},
                          {{"--run", options.run_dir}, {"--data", options.data_dir}});
  const kit::Trajectory trajectory = audit::BuildKit(options);
  const kit::KitManifest manifest = kit::ReadManifest(options.out_dir);
  fmt::print("kit: {}\n", options.out_dir.string());
  fmt::print("units: {}\n", trajectory.units.size());
  for (const kit::Unit& u : trajectory.units) fmt::print("  {}\n", u.name);
  fmt::print("files: {} ({}) + kit.json\n", manifest.files.size(), MiB(TotalBytes(manifest)));
  fmt::print("kit.json sha256: {}\n",
             ToHex(Sha256(ReadFileBytes(options.out_dir / kit::kManifestName))));
  return 0;
}

int RunInspect(const fs::path& kit_dir) {
  const kit::KitManifest manifest = kit::ReadManifest(kit_dir);
  const kit::Trajectory trajectory = kit::ReadTrajectory(kit_dir);
  fmt::print("kit: {}\n", kit_dir.string());
  fmt::print("built by lockstep {} (commit {}), numerics contract v{}\n", manifest.lockstep_version,
             manifest.git_commit, manifest.contract_version);
  fmt::print("run descriptor: {}\n", trajectory.descriptor);
  fmt::print("\nunits ({}):\n", trajectory.units.size());
  for (const kit::Unit& u : trajectory.units) {
    if (u.kind == kit::UnitKind::kInit) {
      fmt::print("  {:<24} init      seed {}, config {}, data {}\n", u.name, u.seed, u.config,
                 u.data);
    } else {
      fmt::print("  {:<24} interval  steps {} -> {} from {}\n", u.name, u.start_step, u.until_step,
                 u.start_checkpoint);
    }
    fmt::print("  {:<24} expected  {}\n", "", ToHex(u.expected_hash));
    fmt::print("  {:<24} publisher wall time {}, peak RSS {}\n", "",
               Optional(u.publisher_wall_seconds),
               u.publisher_peak_rss_bytes ? MiB(*u.publisher_peak_rss_bytes) : "not measured");
  }
  fmt::print("\nfiles ({}, {}):\n", manifest.files.size(), MiB(TotalBytes(manifest)));
  for (const kit::KitFile& f : manifest.files) {
    fmt::print("  {:>12}  {}  {}\n", f.size, ToHex(f.sha256).substr(0, 16), f.path);
  }
  return 0;
}

// Prints each problem on stderr; returns how many there were.
size_t ReportProblems(const std::vector<std::string>& problems, std::string_view prefix) {
  for (const std::string& p : problems) fmt::print(stderr, "{}: {}\n", prefix, p);
  return problems.size();
}

// kit verify's and audit's checks: the files, then (with a trusted key) the signatures.
struct VerifyFlags {
  std::string trusted_key;
  std::vector<fs::path> known_histories;
};

std::vector<std::string> KitProblems(const fs::path& kit_dir, const VerifyFlags& flags) {
  std::vector<std::string> problems = kit::VerifyKit(kit_dir);
  if (!flags.trusted_key.empty()) {
    const Ed25519PublicKey trusted = ReadPublicKey(flags.trusted_key);
    for (std::string& p : kit::VerifyKitSignatures(kit_dir, trusted, flags.known_histories)) {
      problems.push_back(std::move(p));
    }
  } else if (!flags.known_histories.empty()) {
    Fail("--known-history needs --trusted-key (a history is evidence only under a trusted key)");
  }
  return problems;
}

void AddTrustOptions(CLI::App* cmd, VerifyFlags& flags) {
  cmd->add_option(
      "--trusted-key", flags.trusted_key,
      "the publisher's public key (KEY.pub from lockstep keygen): the kit must carry "
      "signatures.jsonl signed by it, every signature and signed root must verify, "
      "and every unit's expected hash, and every interval's start checkpoint's state hash, "
      "must be a signed chain line");
  cmd->add_option("--known-history", flags.known_histories,
                  "a signatures.jsonl obtained earlier from the same publisher (repeatable): a "
                  "kit whose signed history contradicts it is reported as equivocation, naming "
                  "the step");
}

int RunVerify(const fs::path& kit_dir, const VerifyFlags& flags) {
  const std::vector<std::string> problems = KitProblems(kit_dir, flags);
  if (ReportProblems(problems, "kit verify") > 0) {
    fmt::print("kit verify: FAILED ({} problem{})\n", problems.size(),
               problems.size() == 1 ? "" : "s");
    return 1;
  }
  const kit::KitManifest manifest = kit::ReadManifest(kit_dir);
  fmt::print("kit verify: OK: {} files ({}) match kit.json (sha256 {}){}\n", manifest.files.size(),
             MiB(TotalBytes(manifest)), ToHex(Sha256(ReadFileBytes(kit_dir / kit::kManifestName))),
             flags.trusted_key.empty() ? "" : "; signed by the trusted key");
  return 0;
}

int RunFetch(const audit::KitFetchOptions& options) {
  const audit::KitFetchReport report = audit::FetchKit(options);
  fmt::print("kit fetch: {} fetched ({} resumed), {} already present, {} failed\n",
             report.fetched.size(), report.resumed.size(), report.present.size(),
             report.failed.size());
  fmt::print("kit.json sha256: {} (compare with the published one)\n",
             ToHex(report.manifest_sha256));
  return ReportProblems(report.failed, "kit fetch") > 0 ? 1 : 0;
}

struct AuditCommand {
  audit::KitAuditOptions options;
  std::string device = "cpu";
  bool all = false;
  std::string json_out;
  VerifyFlags trust;
  std::string receipt, sign_key, report;
};

// The audit as a command line, for the receipt and its report.
std::string AuditCommandLine(const AuditCommand& c) {
  std::string line = "lockstep audit " + c.options.kit_dir.string();
  for (const std::string& unit : c.options.units) line += " --unit " + unit;
  if (c.all) line += " --all";
  line += fmt::format(" --threads {} --device {}", c.options.threads, c.device);
  if (!c.trust.trusted_key.empty()) line += " --trusted-key " + c.trust.trusted_key;
  for (const fs::path& h : c.trust.known_histories) line += " --known-history " + h.string();
  if (c.options.force) line += " --force";
  if (!c.json_out.empty()) line += " --json-out " + c.json_out;
  line += " --receipt " + c.receipt;
  if (!c.sign_key.empty()) line += " --sign-key " + c.sign_key;
  if (!c.report.empty()) line += " --report " + c.report;
  return line;
}

int RunAudit(const AuditCommand& command) {
  if (command.receipt.empty() && (!command.sign_key.empty() || !command.report.empty())) {
    Fail("{} needs --receipt", command.sign_key.empty() ? "--report" : "--sign-key");
  }
  // A receipt records the command line as JSON text: a path that is not UTF-8 is refused now,
  // not after hours of replay.
  if (!command.receipt.empty()) {
    std::vector<std::pair<std::string_view, std::string>> paths = {
        {"KIT", command.options.kit_dir.string()}, {"--trusted-key", command.trust.trusted_key},
        {"--json-out", command.json_out},          {"--receipt", command.receipt},
        {"--sign-key", command.sign_key},          {"--report", command.report}};
    for (const fs::path& h : command.trust.known_histories) {
      paths.emplace_back("--known-history", h.string());
    }
    for (const auto& [name, path] : paths) {
      data::ValidateUtf8(std::span(reinterpret_cast<const uint8_t*>(path.data()), path.size()),
                         fmt::format("{} (the receipt records it as text: rename it)", name));
    }
  }
  RefuseOutputsOntoInputs({{"--json-out", command.json_out},
                           {"--receipt", command.receipt},
                           {"--report", command.report}},
                          {{"KIT", command.options.kit_dir},
                           {"--trusted-key", command.trust.trusted_key},
                           {"--sign-key", command.sign_key}});
  std::optional<Ed25519Seed> key;
  if (!command.sign_key.empty()) key = ReadSigningKey(command.sign_key);
  const std::vector<std::string> problems = KitProblems(command.options.kit_dir, command.trust);
  // What the receipt binds is the kit as verified now, not as it may be after the replay.
  const audit::AuditedKit kit =
      command.receipt.empty() ? audit::AuditedKit{}
                              : audit::ReadAuditedKit(command.options.kit_dir, problems.empty());
  if (ReportProblems(problems, "audit: kit verify") > 0) {
    if (!command.options.force) {
      fmt::print(stderr,
                 "audit: the kit does not verify: nothing replayed (--force replays "
                 "anyway)\n");
      return 1;
    }
    fmt::print(stderr, "audit: --force: replaying a kit that does not verify\n");
  }
  audit::KitAuditOptions options = command.options;
  const std::unique_ptr<OpExecutor> executor = MakeExecutor(command.device, &options.device);
  options.executor = executor.get();
  const audit::AuditReceiptContext context{.command = AuditCommandLine(command),
                                           .device = command.device,
                                           .threads = options.threads,
                                           .started = UtcNow(),
                                           .kit = kit};
  const std::vector<audit::UnitOutcome> outcomes = audit::AuditKit(options);
  const std::string table = audit::KitAuditTable(outcomes), json = audit::KitAuditJson(outcomes);
  if (!command.receipt.empty()) {
    const Digest now = Sha256(ReadFileBytes(options.kit_dir / kit::kManifestName));
    if (now != kit.kit_json_sha256) {
      Fail(
          "{}: kit.json changed while the audit ran (sha256 {} when it was verified, {} now): no "
          "receipt written",
          options.kit_dir.string(), ToHex(kit.kit_json_sha256), ToHex(now));
    }
    const std::string receipt = audit::AuditReceipt(outcomes, context, key ? &*key : nullptr);
    ReplaceFileSynced(command.receipt, receipt);
    fmt::print(stderr, "audit: wrote the receipt {}{}\n", command.receipt,
               key ? " (signed)" : " (unsigned: it counts on no coverage page)");
    if (!command.report.empty()) {
      ReplaceFileSynced(command.report, audit::AuditReportMarkdown(kit, receipt));
      fmt::print(stderr, "audit: wrote the report {}\n", command.report);
    }
  }
  // stdout holds one kind of content: the JSON report, or the table when the JSON goes to a file.
  if (command.json_out.empty()) {
    fmt::print(stderr, "{}", table);
    fmt::print("{}", json);
  } else {
    ReplaceFileSynced(command.json_out, json);
    fmt::print("{}", table);
  }
  const bool all_match = std::all_of(outcomes.begin(), outcomes.end(),
                                     [](const audit::UnitOutcome& o) { return o.match(); });
  return all_match && problems.empty() ? 0 : 1;
}

// --trusted-keys FILE: one Ed25519 public key per line (64 hex digits, as in KEY.pub); blank
// lines and lines starting with '#' are skipped.
std::vector<Ed25519PublicKey> ReadTrustedKeys(const fs::path& path) {
  return ParseTrustedKeys(ReadFileText(path, kMaxTrustedKeysBytes, "a --trusted-keys list"),
                          path.string());
}

// The coverage options `coverage` and `report` share.
struct CoverageFlags {
  std::vector<fs::path> receipts;
  std::string trusted_keys, metrics;
  int threshold = 1;
};

void AddCoverageFlags(CLI::App* cmd, CoverageFlags& flags, bool receipts_positional) {
  if (receipts_positional) {
    cmd->add_option("RECEIPT", flags.receipts, "audit receipts (lockstep audit --receipt)")
        ->required()
        ->check(CLI::ExistingFile);
  } else {
    cmd->add_option("--receipt", flags.receipts,
                    "an audit receipt of the kit (repeatable): the page shows its coverage")
        ->check(CLI::ExistingFile);
  }
  cmd->add_option("--trusted-keys", flags.trusted_keys,
                  "only receipts signed by a key in this file count (one 64-hex public key per "
                  "line, '#' comments)")
      ->check(CLI::ExistingFile);
  cmd->add_option("--threshold", flags.threshold,
                  "a unit is confirmed when at least this many distinct keys' receipts MATCH it "
                  "and none MISMATCH")
      ->capture_default_str()
      ->check(IntegerIn(1, 1 << 20));
  cmd->add_option(
         "--metrics", flags.metrics,
         "the publisher's metrics.jsonl of the run: every MATCH's proof of replay is "
         "checked against its losses and backward digests, and a proof that does not check is "
         "refused")
      ->check(CLI::ExistingFile);
}

audit::CoverageOptions CoverageOptionsOf(const fs::path& kit_dir, const CoverageFlags& flags) {
  audit::CoverageOptions o{.kit_dir = kit_dir,
                           .receipts = flags.receipts,
                           .trusted_keys = {},
                           .threshold = flags.threshold,
                           .metrics = {}};
  if (!flags.trusted_keys.empty()) o.trusted_keys = ReadTrustedKeys(flags.trusted_keys);
  if (!flags.metrics.empty()) o.metrics = flags.metrics;
  return o;
}

std::vector<NamedPath> CoverageInputs(const CoverageFlags& flags) {
  std::vector<NamedPath> inputs = {{"--trusted-keys", flags.trusted_keys},
                                   {"--metrics", flags.metrics}};
  for (const fs::path& r : flags.receipts) inputs.push_back({"a receipt", r});
  return inputs;
}

struct CoverageCommand {
  fs::path kit_dir, out, json_out;
  CoverageFlags flags;
};

int RunCoverage(const CoverageCommand& c) {
  std::vector<NamedPath> inputs = CoverageInputs(c.flags);
  inputs.push_back({"--kit", c.kit_dir});
  RefuseOutputsOntoInputs({{"--out", c.out}, {"--json", c.json_out}}, inputs);
  const nlohmann::json coverage = audit::Coverage(CoverageOptionsOf(c.kit_dir, c.flags));
  ReplaceFileSynced(c.out, audit::CoveragePage(coverage));
  if (!c.json_out.empty()) {
    // File names and refusal messages may hold bytes that are not UTF-8: shown as U+FFFD.
    ReplaceFileSynced(
        c.json_out, coverage.dump(2, ' ', false, nlohmann::json::error_handler_t::replace) + "\n");
  }
  const nlohmann::json& sum = coverage["summary"];
  fmt::print(
      "coverage: {} of {} units confirmed (threshold {}), {} unaudited, {} disputed; "
      "receipts: {} counted, {} not counted, {} refused; wrote {}\n",
      sum["confirmed"].get<size_t>(), sum["units"].get<size_t>(), c.flags.threshold,
      sum["unaudited"].get<size_t>(), sum["disputed"].get<size_t>(),
      sum["receipts_counted"].get<size_t>(), sum["receipts_not_counted"].get<size_t>(),
      sum["receipts_refused"].get<size_t>(), c.out.string());
  for (const nlohmann::json& r : coverage["receipts"]) {
    if (r["status"] != "counted") {
      fmt::print(stderr, "coverage: {}: {}: {}\n", r["file"].get<std::string>(),
                 r["status"].get<std::string>(), r["reason"].get<std::string>());
    }
  }
  return sum["confirmed"] == sum["units"] ? 0 : 1;
}

}  // namespace

void AddKitCommands(CLI::App& app, int* exit_code) {
  CLI::App* kit_cmd =
      app.add_subcommand("kit", "build, inspect, verify and fetch audit kits (docs/kits.md)");
  kit_cmd->require_subcommand(1);

  auto build = std::make_shared<audit::KitBuildOptions>();
  CLI::App* build_cmd = kit_cmd->add_subcommand(
      "build",
      "copy a run's dataset, config and checkpoints into a new kit directory with "
      "trajectory.json (the units and their expected hashes) and kit.json (sha256 of "
      "every file)");
  build_cmd->add_option("--run", build->run_dir, "run directory (lockstep train --out)")
      ->required();
  build_cmd->add_option("--data", build->data_dir, "the dataset the run trained on")->required();
  build_cmd->add_option("--out", build->out_dir, "kit directory to create (absent or empty)")
      ->required()
      ->check(OutputPath(OutputKind::kNewDirectory));
  build_cmd->final_callback([build, exit_code] { *exit_code = RunBuild(*build); });

  auto inspect_dir = std::make_shared<std::string>();
  CLI::App* inspect_cmd =
      kit_cmd->add_subcommand("inspect", "summarise a kit's units and files (verifies nothing)");
  inspect_cmd->add_option("KIT", *inspect_dir, "kit directory")->required();
  inspect_cmd->final_callback([inspect_dir, exit_code] { *exit_code = RunInspect(*inspect_dir); });

  auto verify_dir = std::make_shared<std::string>();
  auto verify_flags = std::make_shared<VerifyFlags>();
  CLI::App* verify_cmd = kit_cmd->add_subcommand(
      "verify",
      "check a kit's exact file set, sizes and sha256 against kit.json (and, with "
      "--trusted-key, its signed commitments). Exit 0 when it verifies, 1 when it does "
      "not, 2 when kit.json cannot be read");
  verify_cmd->add_option("KIT", *verify_dir, "kit directory")->required();
  AddTrustOptions(verify_cmd, *verify_flags);
  verify_cmd->final_callback([verify_dir, verify_flags, exit_code] {
    *exit_code = RunVerify(*verify_dir, *verify_flags);
  });

  auto fetch = std::make_shared<audit::KitFetchOptions>();
  CLI::App* fetch_cmd = kit_cmd->add_subcommand(
      "fetch",
      "download a kit (file://, http://, https://): kit.json first, then every file it "
      "lists into DEST/<path>.part, resuming partial downloads, verified before it is "
      "renamed. Exit 1 when a file fails verification (it is deleted)");
  fetch_cmd->add_option("URL", fetch->url, "the kit's base URL (holding kit.json)")->required();
  fetch_cmd->add_option("DEST", fetch->dest, "destination directory")
      ->required()
      ->check(OutputPath(OutputKind::kDirectory));
  fetch_cmd
      ->add_option("--stall-timeout", fetch->stall_seconds,
                   "seconds a server may fail to connect, or send under --min-rate, before "
                   "the fetch stops with an error (run it again to resume)")
      ->capture_default_str()
      ->check(IntegerIn(1, 86400));
  fetch_cmd
      ->add_option("--min-rate", fetch->min_rate,
                   "bytes per second a transfer must keep up (over --stall-timeout); a file "
                   "of N bytes must also arrive within stall-timeout + N / min-rate seconds")
      ->capture_default_str()
      ->check(IntegerIn(1, uint64_t{1} << 40));
  fetch_cmd->add_flag("--progress,!--no-progress", fetch->progress,
                      "show (default, on a terminal) or hide progress bars on stderr");
  fetch_cmd->final_callback([fetch, exit_code] { *exit_code = RunFetch(*fetch); });

  auto audit = std::make_shared<AuditCommand>();
  CLI::App* audit_cmd = app.add_subcommand(
      "audit",
      "verify a kit and replay its units; prints a results table and a JSON report. "
      "Exit 0 when every unit matches, 1 otherwise, 2 on bad input");
  audit_cmd->add_option("KIT", audit->options.kit_dir, "kit directory")->required();
  auto* unit_opt = audit_cmd->add_option("--unit", audit->options.units,
                                         "a unit to replay (repeatable; see kit inspect)");
  auto* all_opt = audit_cmd->add_flag("--all", audit->all, "replay every unit (the default)");
  unit_opt->excludes(all_opt);
  audit_cmd
      ->add_option("--threads", audit->options.threads,
                   "worker threads (results do not depend on it)")
      ->capture_default_str()
      ->check(IntegerIn(1, 1024));
  audit_cmd
      ->add_option("--json-out", audit->json_out,
                   "write the JSON report here; the table then goes to stdout")
      ->check(OutputPath(OutputKind::kFile));
  AddTrustOptions(audit_cmd, audit->trust);
  audit_cmd->add_flag("--force", audit->options.force,
                      "replay even when the kit does not verify or the memory plan exceeds the "
                      "machine (the verdict still counts every problem)");
  AddDeviceOption(audit_cmd, &audit->device);
  audit_cmd
      ->add_option("--receipt", audit->receipt,
                   "write an audit receipt here (docs/formats/receipt.md, kind \"audit\"): "
                   "per unit the verdict, the hashes and a proof of replay, with this "
                   "machine, binary and resources; written for failed replays too")
      ->check(OutputPath(OutputKind::kFile));
  audit_cmd->add_option("--sign-key", audit->sign_key,
                        "sign the receipt with this key (lockstep keygen); only signed receipts "
                        "count on a coverage page");
  audit_cmd
      ->add_option("--report", audit->report,
                   "also write the receipt's facts as a human report (Markdown): kit, "
                   "toolchain, command, checksums, result, resources, limits")
      ->check(OutputPath(OutputKind::kFile));
  audit_cmd->final_callback([audit, exit_code] { *exit_code = RunAudit(*audit); });

  auto coverage = std::make_shared<CoverageCommand>();
  CLI::App* coverage_cmd = app.add_subcommand(
      "coverage",
      "gather many auditors' receipts of one kit into a self-contained HTML page (and JSON): per "
      "unit the distinct keys that confirmed it, their hardware and compilers, conflicts with "
      "every receipt, units nobody audited; receipts that do not verify, are of another kit or "
      "whose proof of replay does not check are listed as refused and never counted. Exit 0 when "
      "every unit is confirmed, 1 otherwise, 2 on bad input");
  coverage_cmd->add_option("--kit", coverage->kit_dir, "the kit the receipts are of")
      ->required()
      ->check(CLI::ExistingDirectory);
  AddCoverageFlags(coverage_cmd, coverage->flags, true);
  coverage_cmd->add_option("--out", coverage->out, "the HTML page to write")
      ->required()
      ->check(OutputPath(OutputKind::kFile));
  coverage_cmd
      ->add_option("--json", coverage->json_out, "also write the coverage as JSON (docs/audit.md)")
      ->check(OutputPath(OutputKind::kFile));
  coverage_cmd->final_callback([coverage, exit_code] { *exit_code = RunCoverage(*coverage); });

  auto report = std::make_shared<audit::ReportOptions>();
  auto report_audit = std::make_shared<std::string>();
  auto report_coverage = std::make_shared<CoverageFlags>();
  CLI::App* report_cmd = app.add_subcommand(
      "report",
      "write one self-contained HTML page (works offline, no scripts) about a run directory or a "
      "kit: loss, z-loss, gradient norm with clipping and skipped steps marked, learning rate and "
      "tokens/s against the step with the checkpoints marked, the chain's head, with --audit "
      "the audit table (verdicts, wall time, peak RSS against plan), and with --compare another "
      "run's curves on the same plots");
  report_cmd
      ->add_option("SOURCE", report->source,
                   "a run directory (lockstep train --out) or a kit (lockstep kit build)")
      ->required()
      ->check(CLI::ExistingDirectory);
  report_cmd
      ->add_option("--audit", *report_audit,
                   "the JSON report of `lockstep audit KIT --json-out PATH`")
      ->check(CLI::ExistingFile);
  auto report_compare = std::make_shared<std::string>();
  report_cmd
      ->add_option("--compare", *report_compare,
                   "another run directory: its loss, gradient norm, learning rate and tokens/s "
                   "drawn dashed on SOURCE's plots, and a table of both runs' mean loss over "
                   "their last 50 steps and its ratio (SOURCE must be a run too)")
      ->check(CLI::ExistingDirectory);
  AddCoverageFlags(report_cmd, *report_coverage, false);
  report_cmd->add_option("--out", report->out, "the HTML file to write")
      ->required()
      ->check(OutputPath(OutputKind::kFile));
  report_cmd->final_callback([report, report_audit, report_compare, report_coverage, exit_code] {
    if (!report_audit->empty()) report->audit = *report_audit;
    if (!report_compare->empty()) report->compare = *report_compare;
    std::vector<NamedPath> inputs = CoverageInputs(*report_coverage);
    inputs.push_back({"SOURCE", report->source});
    inputs.push_back({"--audit", *report_audit});
    inputs.push_back({"--compare", *report_compare});
    RefuseOutputsOntoInputs({{"--out", report->out}}, inputs);
    if (!report_coverage->receipts.empty()) {
      if (!fs::exists(report->source / kit::kManifestName)) {
        Fail("--receipt: receipts are of a kit, and SOURCE {} is not one (no kit.json)",
             report->source.string());
      }
      report->coverage = audit::Coverage(CoverageOptionsOf(report->source, *report_coverage));
    } else if (!report_coverage->trusted_keys.empty() || !report_coverage->metrics.empty()) {
      Fail("--trusted-keys and --metrics need --receipt");
    }
    audit::WriteReport(*report);
    fmt::print("wrote {}\n", report->out.string());
    *exit_code = 0;
  });
}

}  // namespace lockstep::cli
