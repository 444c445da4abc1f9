// lockstep kits: everything an auditor needs to replay a published run, in one directory with a
// manifest of sha256 digests (docs/kits.md). A kit holds the dataset, the run's config, the
// complete checkpoints the units start from (and end at), trajectory.json (the units with their
// expected hashes) and kit.json (every other file with its size and sha256).
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "lockstep/audit.h"
#include "lockstep/core.h"

namespace lockstep::kit {

inline constexpr int kKitFormatVersion = 1;
inline constexpr int kTrajectoryFormatVersion = 1;
inline constexpr std::string_view kManifestName = "kit.json";
inline constexpr std::string_view kTrajectoryName = "trajectory.json";

// ---- kit.json ----------------------------------------------------------------------------------
struct KitFile {
  std::string path;  // relative to the kit, '/'-separated (see ValidateKitPath)
  uint64_t size = 0;
  Digest sha256{};
};

struct KitManifest {
  std::string lockstep_version, git_commit;  // of the lockstep that built the kit
  int contract_version = 0;                  // numerics contract the kit's hashes were made under
  std::vector<KitFile> files;                // sorted by path, every file but kit.json itself
};

// Fails unless `path` is a safe relative kit path: non-empty '/'-separated segments of
// [A-Za-z0-9._-], none "." or "..", not kit.json. (Fetch writes DEST/<path>: nothing may escape
// DEST, and the path goes into a URL unescaped.) `what` names the source in errors.
void ValidateKitPath(std::string_view path, std::string_view what);

// The exact bytes of kit.json for `manifest` (sorted keys, 2-space indent, final newline).
std::string ManifestJson(const KitManifest& manifest);
// Parses and validates kit.json text (fields, versions, paths, sorted and unique); `what` names
// the source in errors.
KitManifest ParseManifest(std::string_view text, std::string_view what);
KitManifest ReadManifest(const std::filesystem::path& kit_dir);

// The size and sha256 of a file, hashed through a read-only mapping so that even a file of many
// GiB needs no buffer of its size.
KitFile DescribeFile(const std::filesystem::path& file, std::string relative_path);

// Checks a kit directory against its kit.json: the exact file set (a file kit.json does not list,
// or a listed file that is missing, is an error; so is anything that is not a regular file), and
// every file's size and sha256. Returns one message per problem, each naming the file; empty
// when the kit verifies. Throws Error when kit.json itself cannot be read or parsed.
std::vector<std::string> VerifyKit(const std::filesystem::path& kit_dir);

// ---- trajectory.json -------------------------------------------------------------------------
enum class UnitKind { kInit, kInterval };
std::string_view UnitKindName(UnitKind kind);  // "init" | "interval"

struct Unit {
  std::string name;  // "init", or "interval_<start>_<until>"
  UnitKind kind = UnitKind::kInit;
  std::string config;  // kit path of the run config (YAML)
  std::string data;    // kit path of the dataset directory
  uint64_t seed = 0;   // init: the config's train.seed
  uint64_t start_step = 0, until_step = 0;  // init: both 0
  // interval: the checkpoint the replay starts from, and the publisher's checkpoint at
  // until_step (for localising a mismatch); kit paths of checkpoint directories.
  std::string start_checkpoint, target_checkpoint;
  Digest expected_hash{};  // state_hashes.jsonl at until_step
  // What the publisher measured: the sum of metrics.jsonl's step_seconds over the interval;
  // nullopt where the run did not measure it (the init's time, and peak RSS, which lockstep
  // train does not record).
  std::optional<double> publisher_wall_seconds;
  std::optional<uint64_t> publisher_peak_rss_bytes;
};

struct Trajectory {
  std::string descriptor;  // the run descriptor every checkpoint's meta.json records
  std::vector<Unit> units;  // init first, then intervals by start step
};

std::string TrajectoryJson(const Trajectory& trajectory);
Trajectory ParseTrajectory(std::string_view text, std::string_view what);
Trajectory ReadTrajectory(const std::filesystem::path& kit_dir);

// ---- kit build -------------------------------------------------------------------------------
struct BuildOptions {
  std::filesystem::path run_dir;   // a `lockstep train` run directory
  std::filesystem::path data_dir;  // the dataset it trained on
  std::filesystem::path out_dir;   // must not exist
};

// Builds the kit in a temporary sibling of out_dir and renames it into place. Checks that every
// complete checkpoint's meta.json agrees with state_hashes.jsonl, that all record the same run
// descriptor, that the dataset's manifest is the one the descriptor names, and that the config
// written into the kit reproduces the descriptor byte for byte. Units: the init, and one interval
// per pair of consecutive complete checkpoints. Returns the trajectory written.
Trajectory BuildKit(const BuildOptions& options);

// ---- kit fetch -------------------------------------------------------------------------------
struct FetchOptions {
  std::string url;            // the kit's base: file://..., http://..., https://...
  std::filesystem::path dest;  // created if missing
  bool progress = true;       // progress bars on stderr (when it is a terminal)
};

struct FetchReport {
  std::vector<std::string> fetched;  // downloaded (from scratch or resumed) and verified
  std::vector<std::string> resumed;  // of those, the ones continued from a partial .part
  std::vector<std::string> present;  // already in DEST with the right size and sha256
  std::vector<std::string> failed;   // one message per file that failed (deleted), naming it
  Digest manifest_sha256{};          // of the kit.json fetched: compare with the published one
};

// Fetches URL/kit.json (written to DEST/kit.json; a different kit.json already there is an
// error), then each listed file into DEST/<path>.part, resuming a partial .part with a range
// request; verifies size and sha256 and renames it to DEST/<path>. A file that fails
// verification is deleted and reported in `failed`. Throws Error on an unusable URL, an
// unreadable kit.json, or a transfer error.
FetchReport Fetch(const FetchOptions& options);

// ---- audit -----------------------------------------------------------------------------------
struct AuditOptions {
  std::filesystem::path kit_dir;
  std::vector<std::string> units;  // names to replay, in this order; empty: every unit
  int threads = 1;
  bool force = false;  // passed to the replay (memory plan, start-checkpoint digests)
};

struct UnitOutcome {
  Unit unit;
  std::optional<audit::ReplayResult> result;  // absent when the replay failed with an error
  std::string error;
  bool match() const { return result && result->match.value_or(false); }
};

// Checks that this lockstep implements the kit's numerics contract, then replays each
// chosen unit with audit::Replay against its expected hash (interval units compare with their
// target checkpoint, so a mismatch is localised). A replay that fails with an error is recorded
// in its outcome and the audit goes on. Fails (Error) on an unknown unit name or unreadable kit.
// Does not verify the kit's files: callers run VerifyKit first.
std::vector<UnitOutcome> AuditKit(const AuditOptions& options);
// A fixed-width table: unit, mode, steps, expected, got, MATCH/MISMATCH/ERROR, wall s, peak RSS.
std::string AuditTable(const std::vector<UnitOutcome>& outcomes);
// A JSON array with one object per unit (the unit, the verdict, the publisher's measurements and
// the replay's result object, or the error).
std::string AuditJson(const std::vector<UnitOutcome>& outcomes);

}  // namespace lockstep::kit
