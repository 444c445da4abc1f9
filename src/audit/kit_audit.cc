// `lockstep audit KIT`: replay a kit's units and compare each with the hash it must reach.
#include <algorithm>
#include <cstdio>
#include <nlohmann/json.hpp>

#include "lockstep/build_info.h"
#include "lockstep/kit.h"

namespace lockstep::audit {
// The kit formats (the state layer's, state.h).
using kit::KitManifest;
using kit::kManifestName;
using kit::kTrajectoryName;
using kit::ReadManifest;
using kit::ReadTrajectory;
using kit::Trajectory;
using kit::Unit;
using kit::UnitKind;
using kit::UnitKindName;

namespace {
namespace fs = std::filesystem;

ReplayOptions ReplayOptionsFor(const Unit& unit, const KitAuditOptions& options) {
  const fs::path& kit = options.kit_dir;
  ReplayOptions replay;
  replay.data_dir = kit / unit.data;
  replay.expect_hash = unit.expected_hash;
  replay.threads = options.threads;
  replay.force = options.force;
  if (unit.kind == UnitKind::kInit) {
    replay.from_init = true;
    replay.config = (kit / unit.config).string();
    replay.seed = unit.seed;
  } else {
    replay.checkpoint = kit / unit.start_checkpoint;
    replay.until_step = unit.until_step;
    replay.compare_checkpoint = kit / unit.target_checkpoint;
    replay.executor = options.executor;
    replay.device = options.device;
  }
  return replay;
}

std::string Steps(const Unit& unit) {
  return unit.kind == UnitKind::kInit ? "0"
                                      : fmt::format("{}-{}", unit.start_step, unit.until_step);
}

}  // namespace

std::vector<UnitOutcome> AuditKit(const KitAuditOptions& options) {
  const KitManifest manifest = ReadManifest(options.kit_dir);
  if (manifest.contract_version != build::kContractVersion) {
    Fail("{}: the kit was built under numerics contract v{}, this lockstep implements v{}: its "
         "hashes cannot be reproduced here",
         (options.kit_dir / kManifestName).string(), manifest.contract_version,
         build::kContractVersion);
  }
  const Trajectory trajectory = ReadTrajectory(options.kit_dir);
  if (trajectory.units.empty()) {
    Fail("{}: no units: the kit has nothing to audit", (options.kit_dir / kTrajectoryName).string());
  }
  std::vector<const Unit*> chosen;
  for (const std::string& name : options.units) {
    const auto it = std::find_if(trajectory.units.begin(), trajectory.units.end(),
                                 [&](const Unit& u) { return u.name == name; });
    if (it == trajectory.units.end()) {
      std::string known;
      for (const Unit& u : trajectory.units) known += (known.empty() ? "" : ", ") + u.name;
      Fail("--unit {}: {} has no such unit (units: {})", name,
           (options.kit_dir / kTrajectoryName).string(), known);
    }
    chosen.push_back(&*it);
  }
  if (options.units.empty()) {
    for (const Unit& u : trajectory.units) chosen.push_back(&u);
  }

  std::vector<UnitOutcome> outcomes;
  for (const Unit* unit : chosen) {
    std::fprintf(stderr, "audit: unit %s (%s, steps %s) at %d thread%s\n", unit->name.c_str(),
                 std::string(UnitKindName(unit->kind)).c_str(), Steps(*unit).c_str(),
                 options.threads, options.threads == 1 ? "" : "s");
    UnitOutcome outcome{*unit, std::nullopt, {}};
    const uint64_t read_before = ProcessReadBytes();
    try {
      if (unit->kind == UnitKind::kInterval) {
        // The unit must start where trajectory.json says, in the run it describes.
        const CheckpointIndex start = OpenCheckpoint(options.kit_dir / unit->start_checkpoint);
        if (start.state.step != unit->start_step) {
          Fail("{}: holds step {}, trajectory.json's start_step is {}", unit->start_checkpoint,
               start.state.step, unit->start_step);
        }
        if (start.state.descriptor != trajectory.descriptor) {
          Fail("{}: its run descriptor is not trajectory.json's descriptor",
               unit->start_checkpoint);
        }
      }
      outcome.result = audit::Replay(ReplayOptionsFor(*unit, options));
      std::fprintf(stderr, "%s\n", audit::VerdictLine(*outcome.result).c_str());
    } catch (const Error& e) {
      outcome.error = e.what();
      std::fprintf(stderr, "audit: unit %s: error: %s\n", unit->name.c_str(), e.what());
    }
    outcome.read_bytes = ProcessReadBytes() - read_before;
    outcomes.push_back(std::move(outcome));
  }
  return outcomes;
}

const kit::Unit& KitUnitOf(const kit::Trajectory& trajectory, std::string_view trajectory_path,
                           std::string_view name, std::string_view kind, uint64_t start_step,
                           uint64_t until_step, const Digest& expected, std::string_view what) {
  const auto unit = std::ranges::find(trajectory.units, name, &kit::Unit::name);
  if (unit == trajectory.units.end()) {
    Fail("{}: {} has no such unit ({}): this is not an audit of this kit", what, trajectory_path,
         ShownJson(nlohmann::json(name)));
  }
  if (kit::UnitKindName(unit->kind) != kind || unit->start_step != start_step ||
      unit->until_step != until_step || unit->expected_hash != expected) {
    Fail(
        "{}: {}'s unit {} is {} steps {}-{} expecting {}, not {} steps {}-{} expecting {}: this "
        "is not an audit of this kit",
        what, trajectory_path, unit->name, kit::UnitKindName(unit->kind), unit->start_step,
        unit->until_step, ToHex(unit->expected_hash), ShownJson(nlohmann::json(kind)), start_step,
        until_step, ToHex(expected));
  }
  return *unit;
}

void CheckVerdictAgreesWithHashes(std::string_view verdict, const Digest& expected,
                                  const std::optional<Digest>& replayed, bool has_error,
                                  std::string_view what) {
  const std::string shown = replayed ? ToHex(*replayed) : "(none)";
  if (has_error && verdict != "ERROR") {
    Fail("{}: verdict {} with an \"error\": only an ERROR has one", what,
         ShownJson(nlohmann::json(verdict)));
  }
  if (verdict == "MATCH") {
    if (replayed != expected) {
      Fail("{}: verdict MATCH, but the replayed hash {} is not the expected {}", what, shown,
           ToHex(expected));
    }
  } else if (verdict == "MISMATCH") {
    if (!replayed || *replayed == expected) {
      Fail("{}: verdict MISMATCH, but the replayed hash {} is not a different one", what, shown);
    }
  } else if (verdict == "ERROR") {
    if (replayed || !has_error) Fail("{}: verdict ERROR needs an \"error\" and no replay", what);
  } else {
    Fail("{}: verdict {} is not MATCH, MISMATCH or ERROR", what,
         ShownJson(nlohmann::json(verdict)));
  }
}

std::string KitAuditTable(const std::vector<UnitOutcome>& outcomes) {
  constexpr std::string_view kRow = "{:<24} {:<8} {:>11} {:<16} {:<16} {:<8} {:>9} {:>12}\n";
  std::string table = fmt::format(kRow, "unit", "mode", "steps", "expected", "got", "verdict",
                                  "wall s", "peak RSS");
  for (const UnitOutcome& o : outcomes) {
    const std::string expected = ToHex(o.unit.expected_hash).substr(0, 16);
    const std::string got = o.result ? ToHex(o.result->state_hash).substr(0, 16) : "-";
    const std::string wall = o.result ? fmt::format("{:.2f}", o.result->wall_seconds) : "-";
    const std::string rss = o.result ? MiB(o.result->peak_rss_bytes) : "-";
    table += fmt::format(kRow, o.unit.name, UnitKindName(o.unit.kind), Steps(o.unit), expected, got,
                         o.verdict(), wall, rss);
  }
  return table;
}

std::string KitAuditJson(const std::vector<UnitOutcome>& outcomes) {
  nlohmann::json report = nlohmann::json::array();
  for (const UnitOutcome& o : outcomes) {
    const Unit& u = o.unit;
    nlohmann::json j = {
        {"unit", u.name},
        {"kind", UnitKindName(u.kind)},
        {"start_step", u.start_step},
        {"until_step", u.until_step},
        {"expected", ToHex(u.expected_hash)},
        {"verdict", o.verdict()},
        {"publisher_wall_seconds",
         u.publisher_wall_seconds ? nlohmann::json(*u.publisher_wall_seconds) : nullptr},
        {"publisher_peak_rss_bytes",
         u.publisher_peak_rss_bytes ? nlohmann::json(*u.publisher_peak_rss_bytes) : nullptr},
        {"replay", o.result ? nlohmann::json::parse(audit::ResultJson(*o.result)) : nullptr},
        {"error", o.result ? nlohmann::json(nullptr) : nlohmann::json(o.error)},
    };
    report.push_back(std::move(j));
  }
  return report.dump(2) + "\n";
}

}  // namespace lockstep::audit
