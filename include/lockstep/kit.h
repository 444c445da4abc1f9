// lockstep kits: everything an auditor needs to replay a published run, in one directory with a
// manifest of sha256 digests (docs/kits.md). The formats (kit.json, trajectory.json) and the
// file check are in the state layer (state.h, namespace lockstep::kit), which needs no compute;
// building, fetching and auditing a kit are the audit layer's, here. A kit holds the dataset, the
// run's config, the complete checkpoints the units start from (and end at), trajectory.json (the
// units with their expected hashes) and kit.json (every other file with its size and sha256).
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "lockstep/audit.h"
#include "lockstep/core.h"
#include "lockstep/json.h"
#include "lockstep/state.h"  // the kit.json and trajectory.json formats (namespace kit)

namespace lockstep::audit {

// ---- kit build -------------------------------------------------------------------------------
struct KitBuildOptions {
  std::filesystem::path run_dir;   // a `lockstep train` run directory
  std::filesystem::path data_dir;  // the dataset it trained on
  std::filesystem::path out_dir;   // must not exist
};

// Builds the kit in a temporary sibling of out_dir and renames it into place. Checks that every
// complete checkpoint's meta.json agrees with state_hashes.jsonl, that all record the same run
// descriptor, that the dataset's manifest is the one the descriptor names, and that the config
// written into the kit reproduces the descriptor byte for byte. Units: the init, and one interval
// per pair of consecutive complete checkpoints. Returns the trajectory written.
kit::Trajectory BuildKit(const KitBuildOptions& options);

// ---- kit fetch -------------------------------------------------------------------------------
struct KitFetchOptions {
  std::string url;            // the kit's base: file://..., http://..., https://...
  std::filesystem::path dest;  // created if missing
  bool progress = true;       // progress bars on stderr (when it is a terminal)
  // A server that does not connect within stall_seconds, or sends under min_rate bytes per
  // second for that long, fails the transfer, and so does a transfer of N bytes that takes more
  // than stall_seconds + N / min_rate seconds in all (a non-empty .part is kept for a resume).
  long stall_seconds = 60;
  long min_rate = 1024;
};

struct KitFetchReport {
  std::vector<std::string> fetched;  // downloaded (from scratch or resumed) and verified
  std::vector<std::string> resumed;  // of those, the ones continued from a partial .part
  std::vector<std::string> present;  // already in DEST with the right size and sha256
  std::vector<std::string> failed;   // one message per file that failed (deleted), naming it
  Digest manifest_sha256{};          // of the kit.json fetched: compare with the published one
};

// Fetches URL/kit.json (written to DEST/kit.json; a different kit.json already there is an
// error), then each listed file into DEST/<path>.part, resuming a partial .part with a range
// request (or downloading it whole from a server that cannot resume it); verifies size and
// sha256 and renames it to DEST/<path>. A file that fails
// verification is deleted and reported in `failed`. Throws Error on an unusable URL, an
// unreadable kit.json, or a transfer error.
KitFetchReport FetchKit(const KitFetchOptions& options);

// ---- audit -----------------------------------------------------------------------------------
struct KitAuditOptions {
  std::filesystem::path kit_dir;
  std::vector<std::string> units;  // names to replay, in this order; empty: every unit
  int threads = 1;
  bool force = false;  // passed to the replay (memory plan, start-checkpoint digests)
  // The interval units' ops that it runs run there (ReplayOptions::executor, device).
  OpExecutor* executor = nullptr;
  std::string device;
};

struct UnitOutcome {
  kit::Unit unit;
  std::optional<ReplayResult> result;  // absent when the replay failed with an error
  std::string error;
  uint64_t read_bytes = 0;  // what the replay read (read(2) and the like: /proc/self/io rchar)
  bool match() const { return result && result->match.value_or(false); }
  std::string_view verdict() const { return !result ? "ERROR" : match() ? "MATCH" : "MISMATCH"; }
};

// Checks that this lockstep implements the kit's numerics contract, then replays each
// chosen unit with audit::Replay against its expected hash (interval units compare with their
// target checkpoint, so a mismatch is localised). A replay that fails with an error is recorded
// in its outcome and the audit goes on. Fails (Error) on an unknown unit name or unreadable kit.
// Does not verify the kit's files: callers run VerifyKit first.
std::vector<UnitOutcome> AuditKit(const KitAuditOptions& options);
// Fails (naming `what`) unless `verdict` is MATCH with replayed == expected, MISMATCH with a
// different replayed hash, or ERROR with an error and no replayed hash: the one reading of a
// verdict written in an audit report or receipt.
void CheckVerdictAgreesWithHashes(std::string_view verdict, const Digest& expected,
                                  const std::optional<Digest>& replayed, bool has_error,
                                  std::string_view what);
// The unit of `trajectory` (read from `trajectory_path`) that a row of an audit report or
// receipt names, which must have the row's kind, steps and expected hash; fails naming `what`
// otherwise: the one reading of "this row is of this kit".
const kit::Unit& KitUnitOf(const kit::Trajectory& trajectory, std::string_view trajectory_path,
                           std::string_view name, std::string_view kind, uint64_t start_step,
                           uint64_t until_step, const Digest& expected, std::string_view what);
// A fixed-width table: unit, mode, steps, expected, got, MATCH/MISMATCH/ERROR, wall s, peak RSS.
std::string KitAuditTable(const std::vector<UnitOutcome>& outcomes);
// A JSON array with one object per unit (the unit, the verdict, the publisher's measurements and
// the replay's result object, or the error).
std::string KitAuditJson(const std::vector<UnitOutcome>& outcomes);

// ---- audit receipts (docs/formats/receipt.md, kind "audit") -------------------------------
// The kit as the audit read it at its start, before anything was replayed: what its receipt and
// report bind, whatever happens to the kit's files meanwhile.
struct AuditedKit {
  Digest kit_json_sha256{};     // of kit.json's bytes
  kit::KitManifest manifest;    // parsed from those bytes
  Digest descriptor_blake2b{};  // of the trajectory's run descriptor
  bool verified = false;        // every file matched kit.json (false: replayed under --force)
};
// Reads `kit_dir`'s kit.json once (its sha256 and manifest from the same bytes) and the
// trajectory's descriptor. `verified` says whether the kit verified.
AuditedKit ReadAuditedKit(const std::filesystem::path& kit_dir, bool verified);
struct AuditReceiptContext {
  std::string command;  // the command line as given
  std::string device;   // "cpu" or the --device the interval units ran on
  int threads = 1;
  std::string started;  // when the audit started (UtcNow())
  AuditedKit kit;
};
// What a replay computed in one step that no kit holds: its loss, and its backward digest
// (train::StepReport::backward_digest), which only a backward through every layer yields.
struct ReplayedStep {
  float loss = 0;
  Digest backward{};
};
// The proof of replay of an interval unit: BLAKE2b-256 of "lockstep/replay-proof/v2" \0, the
// signer's public key (32 zero bytes unsigned), the kit.json's sha256, the unit's name and \0,
// start and until step (u64 little-endian), then for every replayed step in step order its loss
// (binary32 little-endian) and its backward digest (32 bytes). Neither is in any kit: only a
// replay (or the publisher's metrics.jsonl) has them.
Digest ReplayProof(const Ed25519PublicKey& signer, const Digest& kit_sha256, const kit::Unit& unit,
                   std::span<const ReplayedStep> steps);
// Audit receipts are of format version 2: version 1's proofs of replay bound the losses alone,
// which the forward of a unit's first step gives without a backward.
inline constexpr uint64_t kAuditReceiptFormatVersion = 2;
// The receipt file's text for `outcomes` of context.kit, signed with `key` if given.
std::string AuditReceipt(const std::vector<UnitOutcome>& outcomes,
                         const AuditReceiptContext& context, const Ed25519Seed* key);
// The same facts as a human report (Markdown): kit, toolchain, command, checksums, result,
// resources and what the audit does not show. `receipt_text` is AuditReceipt's output for `kit`.
std::string AuditReportMarkdown(const AuditedKit& kit, const std::string& receipt_text);

// ---- coverage (docs/audit.md, "Many auditors") -----------------------------------------------
struct CoverageOptions {
  std::filesystem::path kit_dir;
  std::vector<std::filesystem::path> receipts;
  // When set, only receipts signed by one of these keys count.
  std::optional<std::vector<Ed25519PublicKey>> trusted_keys;
  int threshold = 1;  // a unit is confirmed by at least this many distinct keys' MATCHes
  // The publisher's metrics.jsonl of the run: with it, every MATCH's proof of replay is checked.
  std::optional<std::filesystem::path> metrics;
};
// Reads every receipt (one that does not verify, is of another kit or unit, or whose proof does
// not check is listed as refused and never counted) and returns the coverage document
// (docs/audit.md, "coverage --json").
nlohmann::json Coverage(const CoverageOptions& options);
// The coverage table (HTML, for `lockstep coverage` and `lockstep report --receipt`).
std::string CoverageHtmlSection(const nlohmann::json& coverage);
// A self-contained page holding the coverage.
std::string CoveragePage(const nlohmann::json& coverage);

}  // namespace lockstep::audit
