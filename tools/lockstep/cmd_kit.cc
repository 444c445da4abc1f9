// `lockstep kit build|inspect|verify|fetch`, `lockstep audit` (docs/kits.md) and `lockstep report`.
#include "lockstep/kit.h"

#include <fmt/format.h>

#include <algorithm>
#include <memory>
#include <string>
#include <vector>

#include "lockstep/core.h"
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
  fmt::print("built by lockstep {} (commit {}), numerics contract v{}\n",
             manifest.lockstep_version, manifest.git_commit, manifest.contract_version);
  fmt::print("run descriptor: {}\n", trajectory.descriptor);
  fmt::print("\nunits ({}):\n", trajectory.units.size());
  for (const kit::Unit& u : trajectory.units) {
    if (u.kind == kit::UnitKind::kInit) {
      fmt::print("  {:<24} init      seed {}, config {}, data {}\n", u.name, u.seed, u.config,
                 u.data);
    } else {
      fmt::print("  {:<24} interval  steps {} -> {} from {}\n", u.name, u.start_step,
                 u.until_step, u.start_checkpoint);
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
  fmt::print("kit verify: OK: {} files ({}) match kit.json (sha256 {}){}\n",
             manifest.files.size(), MiB(TotalBytes(manifest)),
             ToHex(Sha256(ReadFileBytes(kit_dir / kit::kManifestName))),
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
};

int RunAudit(const AuditCommand& command) {
  RefuseOutputsOntoInputs(
      {{"--json-out", command.json_out}},
      {{"KIT", command.options.kit_dir}, {"--trusted-key", command.trust.trusted_key}});
  const std::vector<std::string> problems = KitProblems(command.options.kit_dir, command.trust);
  if (ReportProblems(problems, "audit: kit verify") > 0) {
    if (!command.options.force) {
      fmt::print(stderr, "audit: the kit does not verify: nothing replayed (--force replays "
                         "anyway)\n");
      return 1;
    }
    fmt::print(stderr, "audit: --force: replaying a kit that does not verify\n");
  }
  audit::KitAuditOptions options = command.options;
  const std::unique_ptr<OpExecutor> executor = MakeExecutor(command.device, &options.device);
  options.executor = executor.get();
  const std::vector<audit::UnitOutcome> outcomes = audit::AuditKit(options);
  const std::string table = audit::KitAuditTable(outcomes), json = audit::KitAuditJson(outcomes);
  // stdout holds one kind of content: the JSON report, or the table when the JSON goes to a file.
  if (command.json_out.empty()) {
    fmt::print(stderr, "{}", table);
    fmt::print("{}", json);
  } else {
    WriteFileSynced(command.json_out, json);
    fmt::print("{}", table);
  }
  const bool all_match = std::all_of(outcomes.begin(), outcomes.end(),
                                     [](const audit::UnitOutcome& o) { return o.match(); });
  return all_match && problems.empty() ? 0 : 1;
}

}  // namespace

void AddKitCommands(CLI::App& app, int* exit_code) {
  CLI::App* kit_cmd = app.add_subcommand(
      "kit", "build, inspect, verify and fetch audit kits (docs/kits.md)");
  kit_cmd->require_subcommand(1);

  auto build = std::make_shared<audit::KitBuildOptions>();
  CLI::App* build_cmd = kit_cmd->add_subcommand(
      "build", "copy a run's dataset, config and checkpoints into a new kit directory with "
               "trajectory.json (the units and their expected hashes) and kit.json (sha256 of "
               "every file)");
  build_cmd->add_option("--run", build->run_dir, "run directory (lockstep train --out)")
      ->required();
  build_cmd->add_option("--data", build->data_dir, "the dataset the run trained on")->required();
  build_cmd->add_option("--out", build->out_dir, "kit directory to create")->required();
  build_cmd->final_callback([build, exit_code] { *exit_code = RunBuild(*build); });

  auto inspect_dir = std::make_shared<std::string>();
  CLI::App* inspect_cmd =
      kit_cmd->add_subcommand("inspect", "summarise a kit's units and files (verifies nothing)");
  inspect_cmd->add_option("KIT", *inspect_dir, "kit directory")->required();
  inspect_cmd->final_callback([inspect_dir, exit_code] { *exit_code = RunInspect(*inspect_dir); });

  auto verify_dir = std::make_shared<std::string>();
  auto verify_flags = std::make_shared<VerifyFlags>();
  CLI::App* verify_cmd = kit_cmd->add_subcommand(
      "verify", "check a kit's exact file set, sizes and sha256 against kit.json (and, with "
                "--trusted-key, its signed commitments). Exit 0 when it verifies, 1 when it does "
                "not, 2 when kit.json cannot be read");
  verify_cmd->add_option("KIT", *verify_dir, "kit directory")->required();
  AddTrustOptions(verify_cmd, *verify_flags);
  verify_cmd->final_callback([verify_dir, verify_flags, exit_code] {
    *exit_code = RunVerify(*verify_dir, *verify_flags);
  });

  auto fetch = std::make_shared<audit::KitFetchOptions>();
  CLI::App* fetch_cmd = kit_cmd->add_subcommand(
      "fetch", "download a kit (file://, http://, https://): kit.json first, then every file it "
               "lists into DEST/<path>.part, resuming partial downloads, verified before it is "
               "renamed. Exit 1 when a file fails verification (it is deleted)");
  fetch_cmd->add_option("URL", fetch->url, "the kit's base URL (holding kit.json)")->required();
  fetch_cmd->add_option("DEST", fetch->dest, "destination directory")->required();
  fetch_cmd->add_option("--stall-timeout", fetch->stall_seconds,
                        "seconds a server may fail to connect, or send under --min-rate, before "
                        "the fetch stops with an error (run it again to resume)")
      ->capture_default_str()
      ->check(CLI::Range(1L, 86400L));
  fetch_cmd->add_option("--min-rate", fetch->min_rate,
                        "bytes per second a transfer must keep up (over --stall-timeout); a file "
                        "of N bytes must also arrive within stall-timeout + N / min-rate seconds")
      ->capture_default_str()
      ->check(CLI::Range(1L, 1L << 40));
  fetch_cmd->add_flag("--progress,!--no-progress", fetch->progress,
                      "show (default, on a terminal) or hide progress bars on stderr");
  fetch_cmd->final_callback([fetch, exit_code] { *exit_code = RunFetch(*fetch); });

  auto audit = std::make_shared<AuditCommand>();
  CLI::App* audit_cmd = app.add_subcommand(
      "audit", "verify a kit and replay its units; prints a results table and a JSON report. "
               "Exit 0 when every unit matches, 1 otherwise, 2 on bad input");
  audit_cmd->add_option("KIT", audit->options.kit_dir, "kit directory")->required();
  auto* unit_opt = audit_cmd->add_option("--unit", audit->options.units,
                                         "a unit to replay (repeatable; see kit inspect)");
  auto* all_opt = audit_cmd->add_flag("--all", audit->all, "replay every unit (the default)");
  unit_opt->excludes(all_opt);
  audit_cmd->add_option("--threads", audit->options.threads,
                        "worker threads (results do not depend on it)")
      ->capture_default_str()
      ->check(CLI::Range(1, 1024));
  audit_cmd->add_option("--json-out", audit->json_out,
                        "write the JSON report here; the table then goes to stdout");
  AddTrustOptions(audit_cmd, audit->trust);
  audit_cmd->add_flag("--force", audit->options.force,
                      "replay even when the kit does not verify or the memory plan exceeds the "
                      "machine (the verdict still counts every problem)");
  AddDeviceOption(audit_cmd, &audit->device);
  audit_cmd->final_callback([audit, exit_code] { *exit_code = RunAudit(*audit); });

  auto report = std::make_shared<audit::ReportOptions>();
  auto report_audit = std::make_shared<std::string>();
  CLI::App* report_cmd = app.add_subcommand(
      "report",
      "write one self-contained HTML page (works offline, no scripts) about a run directory or a "
      "kit: loss, z-loss, gradient norm with clipping and skipped steps marked, learning rate and "
      "tokens/s against the step with the checkpoints marked, the chain's head, and with --audit "
      "the audit table (verdicts, wall time, peak RSS against plan)");
  report_cmd->add_option("SOURCE", report->source,
                         "a run directory (lockstep train --out) or a kit (lockstep kit build)")
      ->required()
      ->check(CLI::ExistingDirectory);
  report_cmd->add_option("--audit", *report_audit,
                         "the JSON report of `lockstep audit KIT --json-out PATH`")
      ->check(CLI::ExistingFile);
  report_cmd->add_option("--out", report->out, "the HTML file to write")->required();
  report_cmd->final_callback([report, report_audit, exit_code] {
    if (!report_audit->empty()) report->audit = *report_audit;
    RefuseOutputsOntoInputs({{"--out", report->out}},
                            {{"SOURCE", report->source}, {"--audit", *report_audit}});
    audit::WriteReport(*report);
    fmt::print("wrote {}\n", report->out.string());
    *exit_code = 0;
  });
}

}  // namespace lockstep::cli
