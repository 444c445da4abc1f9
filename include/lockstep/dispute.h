// lockstep disputes (audit layer): per-op traces of a step committed by a Merkle root, finding
// the first divergent step of two chains and the first divergent op of two traces, and a referee
// that recomputes one op with the reference kernels. docs/disputes.md defines the protocol and
// the formats.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <string_view>
#include <tuple>
#include <vector>

#include "lockstep/core.h"
#include "lockstep/train.h"

namespace lockstep::dispute {

// (The Merkle tree over the records is core's: MerkleRoot, InclusionProof, VerifyInclusion.)

// ---- traces ----------------------------------------------------------------------------------
// One tensor of an op in a trace record: its role in the op (docs/disputes.md), element type and
// count, and the BLAKE2b of its bytes. (The state hash's per-tensor digests are TensorDigest.)
struct OpTensorDigest {
  std::string role;
  Dtype dtype = Dtype::kF32;  // as the trace names it (DtypeName)
  int64_t elements = 0;
  Digest blake2b{};
};

struct TraceRecord {
  int64_t index = 0;       // position in the step, from 0
  uint64_t step = 0;
  int64_t microbatch = 0;  // -1: the optimizer's part of the step
  std::string op;
  int64_t layer = -1;
  std::vector<std::pair<std::string, double>> args;  // in the op's order
  std::vector<OpTensorDigest> inputs, outputs;
  std::string line;  // the record exactly as written (its leaf hashes these bytes)

  double Arg(std::string_view name) const;  // fails naming the record when absent
};

struct TraceHeader {
  uint64_t step = 0;              // the traced step
  uint64_t checkpoint_step = 0;   // the checkpoint the replay started from
  Digest checkpoint_hash{};       // its state hash
  Digest state_hash{};            // the state hash after the traced step
  int64_t records = 0;
  Digest merkle_root{};
};

struct Trace {
  std::filesystem::path dir;
  TraceHeader header;
  std::vector<TraceRecord> records;
};

struct TraceOptions {
  std::filesystem::path checkpoint, data_dir, out;
  uint64_t step = 0;
  std::set<int64_t> dump_ops;  // also write these ops' inputs and outputs (op_K.safetensors)
  int threads = 1;
  bool progress = true;
  train::TestFaults faults;  // test-only
  OpExecutor* executor = nullptr;  // runs the ops it runs (an OpenCL device); null: the CPU
};

// Replays from the checkpoint to step - 1, then step `step` with every op recorded; writes
// out/records.jsonl, out/trace.json (and out/op_K.safetensors for each of dump_ops). Refuses an existing
// out, a step at or before the checkpoint's, and a state on disk.
Trace WriteTrace(const TraceOptions& options);
// Reads a trace directory: every record parsed and checked, the Merkle root recomputed and
// compared with trace.json's.
Trace ReadTrace(const std::filesystem::path& dir);

// ---- finding the divergence ------------------------------------------------------------------
// The state-hash lines of a party: a run directory, a kit (both hold state_hashes.jsonl) or the
// file itself. Steps may be sparse (a party that commits every k-th step).
std::map<uint64_t, Digest> ReadChain(const std::filesystem::path& path);

struct StepsVerdict {
  bool diverged = false;
  bool agreed = false;              // some common step agrees (last_agreed is meaningful)
  uint64_t last_agreed = 0;         // the last step both agree on
  uint64_t first_differing = 0;     // the first step both committed where they differ
  uint64_t first_divergent = 0;     // the first step whose hashes differ (after bisection)
  bool located = false;             // first_divergent is exact (else: the parties could not say)
  int queries = 0;                  // hashes asked of the parties during bisection
  std::string Json() const;
};
// `ask(party, step)` returns party 0's (A) or 1's (B) hash at a step it did not commit
// (std::nullopt: cannot tell); without it, or when a party committed every step, only the
// committed lines are compared. Fails when a chain is empty or the two share no step.
using AskHash = std::function<std::optional<Digest>(int party, uint64_t step)>;
StepsVerdict DisputeSteps(const std::map<uint64_t, Digest>& a, const std::map<uint64_t, Digest>& b,
                          const AskHash& ask = {});

struct OpsVerdict {
  enum class Kind {
    kIdentical,
    kOutputs,
    kInputs,
    kDifferentComputations,
    kHeaders
  } kind = Kind::kIdentical;
  int64_t index = -1;
  std::string what;  // the record: op, layer, microbatch, step
  // The differing digests: (role, a, b).
  std::vector<std::tuple<std::string, std::string, std::string>> differing;
  std::string Json() const;
};
// The first record where the two traces differ: its outputs while its inputs agree (kOutputs: a
// computation to referee), its inputs (kInputs: e.g. different data or state before the step),
// or the records themselves (a different op, layer or arguments).
OpsVerdict DisputeOps(const Trace& a, const Trace& b);

// ---- the referee -----------------------------------------------------------------------------
struct RefereeOptions {
  std::filesystem::path trace_a, trace_b, dump_a, dump_b;
  int64_t op = 0;
};
struct RefereeVerdict {
  std::string winner;  // "a", "b", "neither" or "both"
  std::string json;
  int ExitCode() const;  // 0 a, 1 b, 3 neither, 4 both
};
// Checks that both parties' record `op` agree on the op and its inputs, that the revealed inputs
// (either dump) hash to those digests and each party's revealed outputs to its record's, then
// recomputes the op with the reference kernels at one thread and names the party (or parties)
// whose committed outputs equal the recomputation.
RefereeVerdict Referee(const RefereeOptions& options);

}  // namespace lockstep::dispute
