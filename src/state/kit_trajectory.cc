// trajectory.json: the units of a kit, each with what its replay needs and the hash it must reach.
#include <algorithm>
#include <map>
#include <optional>

#include "lockstep/state.h"
#include "state/internal.h"

namespace lockstep::kit {
namespace {
using state_internal::Json;

constexpr std::string_view kTrajectoryFormat = "lockstep-trajectory";
// The kit paths of the run config and the dataset every unit names (docs/kits.md, Layout).
constexpr std::string_view kKitConfigName = "config.yaml";
constexpr std::string_view kKitDataName = "data";
// The largest step a unit may name: the replay's --until-step range (tools/lockstep/commands.h).
constexpr uint64_t kMaxKitStep = uint64_t{1} << 40;

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
  return ParseTrajectory(ReadFileText(path, kMaxJsonBytes, "a trajectory.json"), path.string());
}

namespace {
// A signed kit holds every chain line: each checkpoint's state hash, prev_hash and chain_blake2b
// must be theirs (docs/kits.md, "What a kit proves"). The first that is not, if any.
std::optional<std::string> SignedLinesProblem(const std::filesystem::path& kit_dir) {
  const std::filesystem::path signatures = kit_dir / kSignaturesName;
  if (!std::filesystem::exists(signatures)) return std::nullopt;
  try {
    std::vector<StateHashLine> lines;
    for (const SignedLine& line : ReadSignedChain(signatures).lines) {
      lines.push_back({line.step, line.hash});
    }
    CheckChainAncestry(signatures, lines, CheckpointAnchors(kit_dir, UINT64_MAX));
  } catch (const Error& e) {
    return e.what();
  }
  return std::nullopt;
}
}  // namespace

std::vector<std::string> VerifyKitChain(const std::filesystem::path& kit_dir) {
  Trajectory trajectory;
  try {
    trajectory = ReadTrajectory(kit_dir);
  } catch (const Error& e) {
    return {e.what()};  // the kit's own file: a problem found, as in VerifyKitSignatures
  }
  const std::string where = (kit_dir / kTrajectoryName).string();
  std::vector<std::string> problems;
  const auto inits = std::ranges::count(trajectory.units, UnitKind::kInit, &Unit::kind);
  if (inits != 1) {
    problems.push_back(
        fmt::format("{}: {} init units (a kit has one: the chain starts there)", where, inits));
    return problems;  // nothing below can say where the chain starts
  }
  if (trajectory.units.front().kind != UnitKind::kInit) {
    problems.push_back(
        fmt::format("{}: units[0] is {}, not the init unit (the units are the init, "
                    "then the intervals in step order)",
                    where, trajectory.units.front().name));
  }

  // The kit's checkpoints, by step, each opened once (meta.json's step, hash and descriptor).
  struct Held {
    std::string path;  // kit path
    std::optional<CheckpointIndex> index;
    std::string error;
  };
  std::map<uint64_t, Held> held;
  for (const uint64_t step : CompleteCheckpointSteps(kit_dir)) {
    Held h{RunLayout{}.checkpoint(step).generic_string(), std::nullopt, {}};
    try {
      h.index = OpenCheckpoint(kit_dir / h.path);
      if (h.index->state.step != step) {
        problems.push_back(fmt::format("{}: meta.json's step is {}, but the directory is step {}",
                                       (kit_dir / h.path).string(), h.index->state.step, step));
      } else if (h.index->state.descriptor != trajectory.descriptor) {
        problems.push_back(
            fmt::format("{}: its run descriptor is not {}'s \"descriptor\" (a kit "
                        "holds one run)",
                        (kit_dir / h.path).string(), where));
      }
    } catch (const Error& e) {
      h.error = e.what();
      problems.push_back(e.what());
    }
    held.emplace(step, std::move(h));
  }
  if (held.empty()) {
    problems.push_back(
        fmt::format("{}: no complete checkpoint (checkpoints/step_*/COMPLETE): "
                    "nothing anchors the units' hashes",
                    kit_dir.string()));
    return problems;
  }
  const auto shown = [&](const std::string& kit_path) { return (kit_dir / kit_path).string(); };
  // The checkpoint the kit holds at `step` under the kit path `path` (the format's
  // checkpoints/step_%09d), or a problem naming the unit, the field and the value.
  const auto checkpoint_at = [&](const Unit& unit, const char* field, const std::string& path,
                                 uint64_t step) -> const CheckpointIndex* {
    const std::string wanted = RunLayout{}.checkpoint(step).generic_string();
    if (path != wanted) {
      problems.push_back(
          fmt::format("unit {}: field \"{}\" is \"{}\", but the checkpoint of step "
                      "{} is \"{}\"",
                      unit.name, field, path, step, wanted));
      return nullptr;
    }
    const auto it = held.find(step);
    if (it == held.end()) {
      problems.push_back(
          fmt::format("unit {}: field \"{}\" is \"{}\", a checkpoint the kit does "
                      "not hold (no {}/COMPLETE)",
                      unit.name, field, path, shown(path)));
      return nullptr;
    }
    if (!it->second.index) return nullptr;  // reported above
    return &*it->second.index;
  };
  const auto fields_common = [&](const Unit& unit) {
    if (unit.config != kKitConfigName) {
      problems.push_back(fmt::format("unit {}: field \"config\" is \"{}\", expected \"{}\"",
                                     unit.name, unit.config, kKitConfigName));
    }
    if (unit.data != kKitDataName) {
      problems.push_back(fmt::format("unit {}: field \"data\" is \"{}\", expected \"{}\"",
                                     unit.name, unit.data, kKitDataName));
    }
    if (unit.publisher_peak_rss_bytes) {
      problems.push_back(
          fmt::format("unit {}: field \"publisher_peak_rss_bytes\" is {}, expected "
                      "null (lockstep train does not measure it)",
                      unit.name, *unit.publisher_peak_rss_bytes));
    }
  };

  // The init: named "init", seeded with the descriptor's train.seed (the config's: kit build
  // checks that config.yaml reproduces the descriptor), ending at the step-0 checkpoint's hash.
  const Unit& init = *std::ranges::find(trajectory.units, UnitKind::kInit, &Unit::kind);
  fields_common(init);
  if (init.name != "init") {
    problems.push_back(
        fmt::format("unit {}: field \"name\" is \"{}\", expected \"init\"", init.name, init.name));
  }
  if (init.publisher_wall_seconds) {
    problems.push_back(
        fmt::format("unit {}: field \"publisher_wall_seconds\" is {}, expected null "
                    "(the init is not measured)",
                    init.name, *init.publisher_wall_seconds));
  }
  std::optional<uint64_t> descriptor_seed;
  try {
    const Json d = ParseJsonStrict(trajectory.descriptor, where + ": field \"descriptor\"");
    if (d.is_object() && d.contains("train") && d["train"].is_object() &&
        d["train"].contains("seed") && d["train"]["seed"].is_number_unsigned()) {
      descriptor_seed = d["train"]["seed"].get<uint64_t>();
    } else {
      problems.push_back(fmt::format("{}: field \"descriptor\" has no unsigned train.seed", where));
    }
  } catch (const Error& e) {
    problems.push_back(e.what());
  }
  if (descriptor_seed && init.seed != *descriptor_seed) {
    problems.push_back(fmt::format("unit {}: field \"seed\" is {}, but the run's train.seed is {}",
                                   init.name, init.seed, *descriptor_seed));
  }
  if (const auto zero = held.find(0); zero == held.end()) {
    problems.push_back(
        fmt::format("unit {}: the kit holds no checkpoint of step 0 ({}): nothing "
                    "links the init to the first interval",
                    init.name, shown(RunLayout{}.checkpoint(0).generic_string())));
  } else if (zero->second.index && zero->second.index->state_hash != init.expected_hash) {
    problems.push_back(
        fmt::format("unit {}: field \"expected_hash\" is {}, but {} has state hash "
                    "{}",
                    init.name, ToHex(init.expected_hash), shown(zero->second.path),
                    ToHex(zero->second.index->state_hash)));
  }

  // The intervals, in order: each starts where the unit before it ends, from the checkpoint of
  // that step, whose state hash is the hash the unit before it must reach; each ends at the
  // checkpoint of its until_step, whose state hash is its expected_hash; the last ends at the
  // kit's last checkpoint. Together they cover every step from the init to that checkpoint.
  const Unit* before = &init;
  std::vector<const Unit*> intervals;
  for (const Unit& u : trajectory.units) {
    if (u.kind == UnitKind::kInterval) intervals.push_back(&u);
  }
  for (size_t i = 0; i < intervals.size(); ++i) {
    const Unit& unit = *intervals[i];
    fields_common(unit);
    const std::string name = fmt::format("interval_{}_{}", unit.start_step, unit.until_step);
    if (unit.name != name) {
      problems.push_back(
          fmt::format("unit {}: field \"name\" is \"{}\", but its steps make it "
                      "\"{}\"",
                      unit.name, unit.name, name));
    }
    if (unit.until_step > kMaxKitStep) {
      problems.push_back(
          fmt::format("unit {}: field \"until_step\" is {}, out of range (at most "
                      "{})",
                      unit.name, unit.until_step, kMaxKitStep));
    }
    if (!unit.publisher_wall_seconds || !(*unit.publisher_wall_seconds >= 0)) {
      problems.push_back(fmt::format(
          "unit {}: field \"publisher_wall_seconds\" is {}, expected a number >= 0", unit.name,
          unit.publisher_wall_seconds ? fmt::format("{}", *unit.publisher_wall_seconds) : "null"));
    }
    if (unit.start_step != before->until_step) {
      problems.push_back(fmt::format(
          "unit {}: field \"start_step\" is {}, but the unit before it, {}, ends at step {}: {}",
          unit.name, unit.start_step, before->name, before->until_step,
          unit.start_step > before->until_step
              ? fmt::format("steps {} to {} are in no unit (a gap in the chain)",
                            before->until_step + 1, unit.start_step)
              : std::string("the units overlap or are out of order")));
    }
    if (const CheckpointIndex* start =
            checkpoint_at(unit, "start_checkpoint", unit.start_checkpoint, unit.start_step)) {
      if (unit.start_step == before->until_step && start->state_hash != before->expected_hash) {
        problems.push_back(fmt::format(
            "unit {}: starts from {}, whose state hash {} is not the hash {} that unit {} ends "
            "at (step {}): the interval does not continue the chain",
            unit.name, shown(unit.start_checkpoint), ToHex(start->state_hash),
            ToHex(before->expected_hash), before->name, unit.start_step));
      }
    }
    if (const CheckpointIndex* target =
            checkpoint_at(unit, "target_checkpoint", unit.target_checkpoint, unit.until_step)) {
      // When the next interval starts from this target, the link check above reports a hash
      // that differs, once, as the interval that does not continue the chain.
      const bool next_links = i + 1 < intervals.size() &&
                              intervals[i + 1]->start_step == unit.until_step &&
                              intervals[i + 1]->start_checkpoint == unit.target_checkpoint;
      if (target->state_hash != unit.expected_hash && !next_links) {
        problems.push_back(fmt::format(
            "unit {}: field \"expected_hash\" is {}, but its target_checkpoint {} has state hash "
            "{}",
            unit.name, ToHex(unit.expected_hash), shown(unit.target_checkpoint),
            ToHex(target->state_hash)));
      }
    }
    before = &unit;
  }
  const uint64_t last = held.rbegin()->first;
  if (before->until_step != last) {
    problems.push_back(fmt::format(
        "{}: the units end at step {} (unit {}), but the kit's last checkpoint is step {}: steps "
        "{} to {} are in no unit (a gap in the chain)",
        where, before->until_step, before->name, last, std::min(before->until_step, last) + 1,
        std::max(before->until_step, last)));
  }
  if (std::optional<std::string> p = SignedLinesProblem(kit_dir)) problems.push_back(*p);
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
