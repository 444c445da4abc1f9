// lockstep audit: replaying a unit of a run (its seeded init, or an interval of steps from a
// published checkpoint) and checking the result against a target hash, planning the memory a
// replay needs, localising a mismatch, and verifying a hand-off checkpoint from its files alone.
// docs/audit.md describes the commands built on this and their output contract.
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "lockstep/infer.h"
#include "lockstep/json.h"
#include "lockstep/model.h"
#include "lockstep/state.h"
#include "lockstep/train.h"

namespace lockstep::audit {

using infer::ConfigOfCheckpoint;

// ---- memory ------------------------------------------------------------------------------------
// The estimated peak resident set of a replay: what is resident when planning (program,
// libraries, the dataset) plus each allocation the replay will make.
struct MemoryPlan {
  std::vector<std::pair<std::string, uint64_t>> parts;  // (what, bytes)
  uint64_t resident_at_planning = 0;
  uint64_t total() const;
  // "planned peak RSS 41.2 MiB = resident now 6.1 MiB + parameters, gradients, AdamW m and v
  // 16.4 MiB + ..."
  std::string Describe() const;
};


// ---- replay ------------------------------------------------------------------------------------
struct ReplayOptions {
  bool from_init = false;  // the init unit; otherwise an interval unit
  // Init unit: the config (embedded name or YAML path) and an optional seed overriding
  // train.seed.
  std::string config;
  std::optional<uint64_t> seed;
  // Interval unit: the checkpoint to start from and the step to replay to. Both units need the
  // dataset: the run descriptor every hash covers includes its manifest digest.
  std::filesystem::path checkpoint, data_dir;
  uint64_t until_step = 0;
  std::optional<Digest> expect_hash;
  int threads = 1;
  std::optional<std::filesystem::path> save_checkpoint_dir, loss_log, compare_checkpoint;
  // Replays even when the memory plan exceeds MemAvailable, when the start checkpoint's file
  // digests or state hash do not verify (with a warning naming the problem), and writes the
  // hand-off checkpoint without a match.
  bool force = false;
  // Interval unit: keep the state on disk here (train::Storage). Without it the replay runs in
  // RAM when the memory plan fits MemAvailable, else spills under the system's temp directory.
  std::optional<std::filesystem::path> spill_dir;
  // Interval unit: keep each layer's input only and recompute its activations in the backward
  // (train::Storage::activations). Same bits.
  Model::Activations activations = Model::Activations::kKept;
  train::TestFaults faults;  // interval unit, test-only
  // Interval unit: runs the step's ops that it runs (an OpenCL device named `device`, e.g.
  // "opencl:0:0"; null: all on the CPU).
  OpExecutor* executor = nullptr;
  std::string device;
};

struct ReplayResult {
  uint64_t step = 0, consumed_tokens = 0;
  Digest state_hash{};
  std::string mode;    // "init" | "interval"
  std::string device;  // "cpu:<active SIMD variant>", e.g. "cpu:AVX2"
  int threads = 1;
  std::optional<Digest> expected;
  std::optional<bool> match;  // nullopt: no target
  std::vector<float> losses;  // one per replayed step; empty for init
  std::vector<Digest> backward_digests;  // each replayed step's (StepReport::backward_digest)
  double wall_seconds = 0;
  uint64_t peak_rss_bytes = 0, planned_peak_rss_bytes = 0;
  uint64_t spill_bytes = 0;  // what the spill files held on disk at the end (0 in RAM)
  std::vector<std::string> localisation;  // with a compare checkpoint that differs
  // An interval unit's parts, in order: "load checkpoint", then each step's (StepReport::phases,
  // their names prefixed "step N: "); empty for init.
  std::vector<train::PhaseReport> phases;
};

// Runs one unit. Notes (the memory plan, warnings, the localisation) go to stderr as they
// happen. Fails (Error) on bad input: unreadable or inconsistent files, --until-step at or
// before the checkpoint's step, a plan the machine cannot hold (without force).
ReplayResult Replay(const ReplayOptions& options);
// The stdout contract: a JSON object with step, consumed_tokens, state_hash, mode, device,
// threads, expected, match, losses, wall_seconds, peak_rss_bytes, planned_peak_rss_bytes and
// localisation.
std::string ResultJson(const ReplayResult& result);
// "replay: state_hash=<64 hex> expected=<64 hex|none> MATCH=<True|False|None>"
std::string VerdictLine(const ReplayResult& result);
// 0 on a match or with no target, 1 on a mismatch.
int ExitCode(const ReplayResult& result);

// ---- localisation ------------------------------------------------------------------------------
// The distance between two floats in units in the last place: the difference of their bit
// patterns mapped to a monotonic integer order (sign-magnitude: -x maps to -bits(x)), so
// neighbouring floats are 1 apart and +0 and -0 are 0 apart.
uint64_t UlpDistance(float a, float b);

// One line per hash component in which `replayed` differs from the reference checkpoint, in hash
// order: for a tensor array, the number of differing elements, the first one and the one with
// the largest absolute difference (flat and multi-index, both values and their bits, the ulp
// distance); for the scalar record, each differing field. Then, when arrays differ, a last line
// naming the array and element with the largest absolute difference of all (where a single
// corrupted value shows, however far the divergence has spread). Empty when the hashes are equal.
// The replayed side is read through `replayed` (a whole array at a time), the reference from
// its files; RAM ~ two arrays.
std::vector<std::string> LocaliseMismatch(const StepState& replayed_state,
                                          const StateHash& replayed_hash,
                                          std::span<const TensorShape> replayed_tensors,
                                          const PieceSource& replayed,
                                          const CheckpointIndex& reference,
                                          const StateHash& reference_hash);

// ---- hand-off verification ---------------------------------------------------------------------
struct HandoffVerdict {
  std::filesystem::path checkpoint;
  uint64_t step = 0;
  Digest recomputed{};  // the state hash of the checkpoint's files
  Digest recorded{};    // meta.json's state_hash
  Digest expected{};    // what the caller expects (the published hash of this step)
  Digest prev_hash{};   // meta.json's prev_hash
  Digest expected_prev{};
  bool hash_ok() const { return recomputed == expected && recorded == expected; }
  bool prev_ok() const { return prev_hash == expected_prev; }
  bool accepted() const { return hash_ok() && prev_ok(); }
  // A human-readable report ending in "verdict: ACCEPTED" or "verdict: REJECTED (...)".
  std::string Report() const;
};

// Reads the checkpoint (every file checked against COMPLETE), recomputes its state hash from the
// files (no forward or backward) and compares it, and meta.json's prev_hash, with the
// expectations. Fails (Error) only when the checkpoint cannot be read.
HandoffVerdict VerifyHandoff(const std::filesystem::path& checkpoint, const Digest& expect_hash,
                             const Digest& expect_prev_hash);

// ---- lockstep report ------------------------------------------------------------------------
struct ReportOptions {
  std::filesystem::path source;  // a run directory (state_hashes.jsonl) or a kit (kit.json)
  std::optional<std::filesystem::path> audit;  // `lockstep audit --json-out` of it
  std::optional<nlohmann::json> coverage;      // of the kit's receipts (kit.h, Coverage)
  // Another run whose curves are drawn, dashed, on SOURCE's plots, with a table of both runs'
  // mean loss over their last 50 steps.
  std::optional<std::filesystem::path> compare;
  std::filesystem::path out;                   // the HTML page
};
// Writes one self-contained HTML page (no script, no external resource): the chain's head and
// checkpoints; for a run, loss (and z-loss), gradient norm with the clip threshold and the
// skipped and clipped steps marked, learning rate and tokens/s against the step, checkpoints
// marked on each plot; the audit table (unit, steps, expected and replayed hash, verdict, wall
// time against the publisher's, peak RSS against plan); the configuration; for a kit, what it
// holds; with `compare`, that run's curves on the same plots and both runs' mean loss over their
// last 50 steps. Written to a temporary file and renamed. Errors name the file and field.
void WriteReport(const ReportOptions& options);

}  // namespace lockstep::audit
