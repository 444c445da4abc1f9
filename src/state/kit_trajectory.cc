// trajectory.json: the units of a kit, each with what its replay needs and the hash it must reach.
#include <algorithm>

#include "lockstep/state.h"
#include "state/internal.h"

namespace lockstep::kit {
namespace {
using state_internal::Json;

constexpr std::string_view kTrajectoryFormat = "lockstep-trajectory";

// Optional measurements are written as null, never left out, so a reader sees they are unknown.
template <typename T>
Json OrNull(const std::optional<T>& value) {
  return value ? Json(*value) : Json(nullptr);
}

}  // namespace

std::string_view UnitKindName(UnitKind kind) {
  return kind == UnitKind::kInit ? "init" : "interval";
}

std::string TrajectoryJson(const Trajectory& trajectory) {
  Json units = Json::array();
  for (const Unit& u : trajectory.units) {
    Json j = {{"name", u.name},
              {"kind", UnitKindName(u.kind)},
              {"config", u.config},
              {"data", u.data},
              {"until_step", u.until_step},
              {"expected_hash", ToHex(u.expected_hash)},
              {"publisher_wall_seconds", OrNull(u.publisher_wall_seconds)},
              {"publisher_peak_rss_bytes", OrNull(u.publisher_peak_rss_bytes)}};
    if (u.kind == UnitKind::kInit) {
      j["seed"] = u.seed;
    } else {
      j["start_step"] = u.start_step;
      j["start_checkpoint"] = u.start_checkpoint;
      j["target_checkpoint"] = u.target_checkpoint;
    }
    units.push_back(std::move(j));
  }
  const Json j = {{"format", kTrajectoryFormat},
                  {"format_version", kTrajectoryFormatVersion},
                  {"descriptor", trajectory.descriptor},
                  {"units", units}};
  return j.dump(2) + "\n";
}

Trajectory ParseTrajectory(std::string_view text, std::string_view what) {
  using namespace state_internal;
  const Json j = ParseJsonStrict(text, what);
  RequireKeys(j, {"descriptor", "format", "format_version", "units"}, what);
  RequireFormat(j, kTrajectoryFormat, kTrajectoryFormatVersion, what);
  Trajectory trajectory;
  trajectory.descriptor = StringField(j, "descriptor", what);
  if (!j["units"].is_array()) Fail("{}: field \"units\" is not an array", what);
  for (size_t i = 0; i < j["units"].size(); ++i) {
    const Json& u = j["units"][i];
    std::string unit_what = fmt::format("{}: units[{}]", what, i);
    if (!u.is_object() || !u.contains("kind")) Fail("{}: missing field \"kind\"", unit_what);
    const std::string kind = StringField(u, "kind", unit_what);
    Unit unit;
    if (kind == "init") {
      unit.kind = UnitKind::kInit;
      RequireKeys(u,
                  {"config", "data", "expected_hash", "kind", "name", "publisher_peak_rss_bytes",
                   "publisher_wall_seconds", "seed", "until_step"},
                  unit_what);
      unit.seed = U64Field(u, "seed", unit_what);
    } else if (kind == "interval") {
      unit.kind = UnitKind::kInterval;
      RequireKeys(u,
                  {"config", "data", "expected_hash", "kind", "name", "publisher_peak_rss_bytes",
                   "publisher_wall_seconds", "start_checkpoint", "start_step",
                   "target_checkpoint", "until_step"},
                  unit_what);
      unit.start_step = U64Field(u, "start_step", unit_what);
      unit.start_checkpoint = StringField(u, "start_checkpoint", unit_what);
      unit.target_checkpoint = StringField(u, "target_checkpoint", unit_what);
      ValidateKitPath(unit.start_checkpoint, unit_what + ": start_checkpoint");
      ValidateKitPath(unit.target_checkpoint, unit_what + ": target_checkpoint");
    } else {
      Fail("{}: field \"kind\" is {}, expected \"init\" or \"interval\"", unit_what,
           ShownJson(u["kind"]));
    }
    unit.name = StringField(u, "name", unit_what);
    unit.config = StringField(u, "config", unit_what);
    unit.data = StringField(u, "data", unit_what);
    ValidateKitPath(unit.config, unit_what + ": config");
    ValidateKitPath(unit.data, unit_what + ": data");
    unit.until_step = U64Field(u, "until_step", unit_what);
    unit.expected_hash = DigestField(u, "expected_hash", unit_what);
    if (unit.kind == UnitKind::kInit && unit.until_step != 0) {
      Fail("{}: an init unit has until_step 0, not {}", unit_what, unit.until_step);
    }
    if (unit.kind == UnitKind::kInterval && unit.until_step <= unit.start_step) {
      Fail("{}: until_step {} is not after start_step {}", unit_what, unit.until_step,
           unit.start_step);
    }
    const Json& wall = u["publisher_wall_seconds"];
    if (!wall.is_null() && !wall.is_number()) {
      Fail("{}: field \"publisher_wall_seconds\" is {}, expected a number or null", unit_what,
           ShownJson(wall));
    }
    if (!wall.is_null()) unit.publisher_wall_seconds = wall.get<double>();
    if (!u["publisher_peak_rss_bytes"].is_null()) {
      unit.publisher_peak_rss_bytes = U64Field(u, "publisher_peak_rss_bytes", unit_what);
    }
    for (const Unit& other : trajectory.units) {
      if (other.name == unit.name) Fail("{}: unit name \"{}\" repeats", unit_what, unit.name);
    }
    trajectory.units.push_back(std::move(unit));
  }
  return trajectory;
}

Trajectory ReadTrajectory(const std::filesystem::path& kit_dir) {
  const std::filesystem::path path = kit_dir / kTrajectoryName;
  return ParseTrajectory(ReadFileText(path), path.string());
}

std::vector<std::string> VerifyKitChain(const std::filesystem::path& kit_dir) {
  Trajectory trajectory;
  try {
    trajectory = ReadTrajectory(kit_dir);
  } catch (const Error& e) {
    return {e.what()};  // the kit's own file: a problem found, as in VerifyKitSignatures
  }
  std::vector<std::string> problems;
  const auto inits = std::ranges::count(trajectory.units, UnitKind::kInit, &Unit::kind);
  if (inits != 1) {
    problems.push_back(fmt::format("{}: {} init units (a kit has one: the chain starts there)",
                                   (kit_dir / kTrajectoryName).string(), inits));
  }
  for (const Unit& unit : trajectory.units) {
    if (unit.kind != UnitKind::kInterval) continue;
    const std::filesystem::path start = kit_dir / unit.start_checkpoint;
    CheckpointIndex index;
    try {
      index = OpenCheckpoint(start);
    } catch (const Error& e) {
      problems.push_back(fmt::format("unit {}: {}", unit.name, e.what()));
      continue;
    }
    if (index.state.step != unit.start_step) {
      problems.push_back(fmt::format("unit {}: start_step {}, but {} is the checkpoint of step {}",
                                     unit.name, unit.start_step, start.string(), index.state.step));
      continue;
    }
    for (const Unit& before : trajectory.units) {
      if (&before == &unit || before.until_step != unit.start_step) continue;
      if (before.expected_hash != index.state_hash) {
        problems.push_back(fmt::format(
            "unit {}: starts from {}, whose state hash {} is not the hash {} that unit {} ends "
            "at (step {}): the interval does not continue the chain",
            unit.name, start.string(), ToHex(index.state_hash), ToHex(before.expected_hash),
            before.name, unit.start_step));
      }
    }
  }
  return problems;
}

std::vector<std::string> VerifyKitSignatures(const std::filesystem::path& kit_dir,
                                             const Ed25519PublicKey& trusted,
                                             std::span<const std::filesystem::path> known_histories) {
  const std::filesystem::path path = kit_dir / kSignaturesName;
  if (!std::filesystem::exists(path)) {
    return {fmt::format("{}: missing: the kit is not signed", path.string())};
  }
  // The kit's file is what is being judged: one that does not parse is a problem found, like
  // one that does not verify (a --known-history file that does not parse is bad input).
  SignedChain chain;
  try {
    chain = ReadSignedChain(path);
  } catch (const Error& e) {
    return {e.what()};
  }
  std::vector<std::string> problems;
  for (const std::string& p : VerifySignedChain(chain, &trusted)) {
    problems.push_back(fmt::format("{}: {}", path.string(), p));
  }
  for (const Unit& unit : ReadTrajectory(kit_dir).units) {
    // An interval's start is signed too: its checkpoint's state hash, at start_step.
    if (unit.kind == UnitKind::kInterval) {
      Digest start{};
      try {
        start = OpenCheckpoint(kit_dir / unit.start_checkpoint).state_hash;
      } catch (const Error& e) {
        problems.push_back(fmt::format("unit {}: {}", unit.name, e.what()));
        continue;
      }
      if (unit.start_step >= chain.lines.size() || chain.lines[unit.start_step].hash != start) {
        problems.push_back(fmt::format(
            "unit {}: its start checkpoint's state hash {} is not the signed hash of step {}",
            unit.name, ToHex(start), unit.start_step));
      }
    }
    if (unit.until_step >= chain.lines.size()) {
      problems.push_back(fmt::format("unit {}: no signed chain line for step {}", unit.name,
                                     unit.until_step));
    } else if (chain.lines[unit.until_step].hash != unit.expected_hash) {
      problems.push_back(fmt::format(
          "unit {}: expected_hash {} is not the signed hash {} of step {}", unit.name,
          ToHex(unit.expected_hash), ToHex(chain.lines[unit.until_step].hash), unit.until_step));
    }
  }
  for (const std::filesystem::path& known : known_histories) {
    const SignedChain other = ReadSignedChain(known);
    if (const auto bad = VerifySignedChain(other, &trusted); !bad.empty()) {
      problems.push_back(fmt::format("{}: not a valid history under the trusted key: {}",
                                     known.string(), bad.front()));
      continue;
    }
    if (const auto equivocation = FindEquivocation(other, chain)) {
      problems.push_back(fmt::format("{} against {}: {}", path.string(), known.string(),
                                     *equivocation));
    }
  }
  return problems;
}

}  // namespace lockstep::kit
