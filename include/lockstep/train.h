// lockstep train: the training loop. A step is M microbatches in a canonical order, AdamW with
// parameter groups, a warmup + cosine (or WSD) schedule, stateless global-norm clipping, the
// spike protocol, and the chained state hash after every step (docs/training.md).
#pragma once

#include <array>
#include <cstdint>
#include <filesystem>
#include <initializer_list>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "lockstep/data.h"
#include "lockstep/kernels.h"
#include "lockstep/model.h"
#include "lockstep/state.h"

namespace lockstep::train {

// The learning rate of step `step` (1-based) under config.train (docs/training.md).
float LearningRate(const TrainConfig& config, int64_t step);

// Where a part of a step (or of a replay) went: its wall time, and the state store's disk
// traffic during it (zero with the state in RAM): the bytes read back and verified against their
// chunk digests, and the seconds spent waiting for them; the bytes digested and written, and the
// seconds spent on them; and every byte the part hashed (those two plus any state it digested).
struct PhaseReport {
  std::string name;
  double seconds = 0;
  uint64_t read_bytes = 0, written_bytes = 0, hashed_bytes = 0;
  double read_seconds = 0, write_seconds = 0;
};

// What one step did, for metrics and the progress line.
struct StepReport {
  uint64_t step = 0;
  float loss = 0, zloss = 0, grad_norm = 0, clip_factor = 1, lr = 0;
  bool skipped = false;
  bool halt = false;  // the spike protocol saw spike_max_skips skips within spike_window steps
  int64_t tokens = 0;  // tokens this step consumed
  // BLAKE2b-256 of the backward digests (Model::Backward) of the step's microbatches, 32 bytes
  // each, in microbatch order over every rank (docs/training.md, "The backward digest").
  Digest backward_digest{};
  double seconds = 0;
  // Distributed runs, during the step: the seconds this rank's exchanges ran, the part of them
  // that ran while it computed (the rest it waited for), and the bytes it sent.
  double comm_seconds = 0, comm_hidden_seconds = 0;
  uint64_t comm_bytes = 0;
  // "forward and backward" (the microbatch groups and their gradient sums), "global norm",
  // "update and hash", in that order; then "verify checkpoint" in the first step after
  // RestoreInPlace. read_seconds include checking what was read against its digests.
  std::vector<PhaseReport> phases;
};

// One line of a run's metrics.jsonl (docs/training.md, "The run directory"), the one typed reader
// of that file. A non-finite loss, z-loss or norm is written as null and read as NaN.
struct MetricsLine {
  uint64_t step = 0;
  double loss = 0, zloss = 0, grad_norm = 0, clip_factor = 1, lr = 0;
  bool skipped = false;
  uint64_t tokens = 0;  // cumulative
  Digest tokens_blake2b{};
  std::optional<Digest> backward_blake2b;  // absent from an earlier lockstep's lines
  double step_seconds = 0, tokens_per_second = 0, comm_seconds = 0, comm_hidden_seconds = 0;
  uint64_t comm_bytes = 0;
};
// The one writer of a step's JSON line (no newline): metrics.jsonl's 15 fields of `r` and
// `state` (the step just done), "tokens" counting every step up to r.step; with `state_hash`,
// also "state_hash" (replay's --loss-log). Keys sorted, compact, non-finite floats null.
std::string MetricsLineJson(const StepReport& r, const StepState& state,
                            const Digest* state_hash = nullptr);
// Every line, strictly: exactly the documented fields with their types, steps increasing. A last
// line without its newline (a crash mid-append) is an error, or with TornLine::kDrop dropped.
// Errors name the file, the line and the field.
std::vector<MetricsLine> ReadMetrics(const std::filesystem::path& path,
                                     TornLine torn = TornLine::kRefuse);

class StateStore;
class Comm;
class Exchange;

// Test-only faults (docs/disputes.md, "Faults to test with"; docs/distributed.md). The caller
// installs them (the CLI from its --test-fault-* flags); nothing is read from the environment, so
// no variable can change the bits of a run.
struct StepAndIndex {
  uint64_t step = 0;
  int64_t index = 0;
};
struct TestFaults {
  // Element 0 of the first output of op `index` (0-based, in trace order) of step `step` moved
  // one ulp toward +inf. Single-process runs.
  std::optional<StepAndIndex> op;
  // The lowest bit of token `index` of step `step` flipped (the step's tokens in microbatch order).
  std::optional<StepAndIndex> token;
  // Rank `rank` changes one element of the first parameter tensor it receives at step `step`, as
  // a faulty node would.
  struct Replica {
    int rank = 0;
    uint64_t step = 0;
  };
  std::optional<Replica> replica;
};

// The bytes of a run's state: the four fp32 arrays (parameter, m, v, gradient) of every tensor.
uint64_t StateBytes(const ModelConfig& model);

// Where a Trainer keeps its tensors (src/train/state_store.h): in RAM, or -- for a model larger
// than memory -- in digested chunk files under spill_dir, with only what a pass needs resident
// (one layer's parameters, a gradient, the activations); and whether the model keeps every
// layer's activations or recomputes them in the backward. The bits are the same every way.
struct Storage {
  std::optional<std::filesystem::path> spill_dir;
  Model::Activations activations = Model::Activations::kKept;
};
// Full sharding (docs/distributed.md, "Full sharding"): with N > 1 processes, one microbatch per
// gradient group (train.microbatches == train.grad_groups) and the state in RAM, each rank holds
// only its range of the parameters too, gathers each layer's parameters from their owners when
// it computes the layer, and sends each gradient to its owners as soon as it is final: no group
// buffer, and no whole copy of the parameters. Other runs keep every parameter on every rank.
bool FullySharded(const RunConfig& config, int processes, const Storage& storage);
// The bytes of the gradient buffer a microbatch group is computed in, besides the state: one
// fp32 array per tensor when train.grad_groups > 1 or the run has more than one process, unless
// fully sharded; else 0.
uint64_t GroupBufferBytes(const RunConfig& config, int processes, const Storage& storage = {});
// The store's own memory plan for one process (docs/audit.md, "The memory plan"): what it holds
// resident while a step runs, part by part as (what, bytes) -- in RAM the four arrays and a
// microbatch group's gradients; on disk the most a step holds open or reads ahead at once.
std::vector<std::pair<std::string, uint64_t>> StorePlan(const RunConfig& config,
                                                        const Storage& storage);

// Checks that what a run keeps where `executor` runs its ops fits there (OpExecutor::Plan; an
// OpenCL device refuses a run that does not, naming both sizes): rank `rank` of `ranks`
// processes keeps its state in RAM (the parameters whole, the moments and the gradient of its
// range; nothing with a spill_dir), the group gradients, the activations and one op's
// temporaries (docs/devices.md, "Memory"). Call it before building the Trainer.
void PlanDeviceMemory(const RunConfig& config, const Storage& storage, int ranks, int rank,
                      OpExecutor& executor);

// Elements [begin, end) of a tensor.
struct ElementRange {
  int64_t begin = 0, end = 0;
  int64_t size() const { return end - begin; }
};

// Who holds what in a run of `ranks` processes (docs/distributed.md, "What each rank holds"): the
// units of `unit` elements (the hash chunk, kHashChunkFloats; with --spill-dir the spill chunk,
// kSpillChunkFloats) of every tensor in parameter order, each given to the rank whose equal share
// of all elements holds the unit's midpoint, floor(N * (2 * before + size) / (2 * total)).
// Returns per tensor N + 1 element offsets: rank r holds the moments and gradient of elements
// [bounds[r], bounds[r + 1]) and updates them. Which rank holds what changes no bit.
std::vector<std::vector<int64_t>> OwnershipBounds(const std::vector<ParamSpec>& specs, int ranks,
                                                  int64_t unit = kHashChunkFloats);
// The ownership unit of a run kept in `storage`.
int64_t OwnershipUnit(const Storage& storage);

// The whole training state of a run and the step function: the parameters, both AdamW moments
// and the gradients of the last step, in a StateStore.
class Trainer {
 public:
  // descriptor: the canonical run descriptor (RunDescriptor()). With `comm` of N > 1 ranks
  // (src/train/comm.h) every rank constructs a Trainer and calls the same methods in the same
  // order: each computes its microbatch groups and owns a range of each tensor's moments,
  // gradients and update (docs/distributed.md); the bits are those of one process. N must divide
  // train.grad_groups. Without `comm`: one process.
  Trainer(const RunConfig& config, const data::Dataset& dataset, std::string descriptor,
          const Storage& storage = {}, Comm* comm = nullptr);
  ~Trainer();

  // Step 0: initialised parameters, zero moments and gradients, and its state hash.
  void Initialize();
  // Loads a checkpoint written by a run with the same descriptor, reading each file once. Fails
  // when a file's digest differs from COMPLETE or the state hash recomputed from the data differs
  // from meta.json's -- unless digests == FileDigests::kIgnore (forensics, `replay --force`): then
  // the state is taken as the files hold it, and its recomputed hash is returned for the caller
  // to report.
  StateHash Restore(const CheckpointIndex& checkpoint,
                    FileDigests digests = FileDigests::kEnforce);
  // Restore for an audit, reading each checkpoint byte once: with the state on disk nothing is
  // read now. Each chunk stays where it lies in the checkpoint's files, and the next Step reads
  // it there when it first needs it, digesting it then (every later read is checked against that
  // digest); that Step ends by reading what it did not need and checking the files' digests and
  // the state hash from those digests, failing as Restore does. Until then the state is
  // meta.json's word: reads and checkpoints are refused. Returns false where the state is in
  // RAM: there this is Restore. One process only.
  bool RestoreInPlace(const CheckpointIndex& checkpoint);
  // Makes step state().step + 1 and hashes the result.
  StepReport Step();
  // The next Step() computes its state hash but need not keep the new state: a spilled store
  // skips writing the updated arrays back (half of the update pass's disk traffic). For a
  // replay's last step when nothing reads the state after it; the trainer then refuses further
  // steps, reads and checkpoints.
  void DiscardNextState() { discard_next_ = true; }
  // Writes the current state as run_dir/checkpoints/step_N (WriteCheckpointStreamed), keeping
  // the gradients as their digests (from the state hash: they are not read) or, with
  // Gradients::kFull, whole -- which needs them held: not after restoring a checkpoint without
  // them, before the next step. In a distributed run rank 0 writes, asking each range's owner for
  // its pieces, while every other rank calls it too and answers (it returns an empty path there).
  std::filesystem::path WriteCheckpoint(const std::filesystem::path& run_dir,
                                        Gradients gradients = Gradients::kDigests);
  // Copies elements [begin, begin + out.size()) of array `array` of tensor i (a PieceSource).
  // Distributed: rank 0 only, during WriteCheckpoint, or any rank for what it holds. Fails for a
  // gradient the trainer does not hold (restored from a checkpoint that keeps its digest only).
  void ReadPiece(size_t i, StateArray array, int64_t begin, std::span<float> out);

  const StepState& state() const { return state_; }
  const Digest& hash() const { return hash_.hash; }
  // Whether each rank holds only its range of the parameters too (FullySharded).
  bool fully_sharded() const { return sharded_; }
  const StateHash& state_hash() const { return hash_; }
  const std::vector<TensorShape>& tensors() const { return shapes_; }
  int64_t tokens_per_step() const;
  // Bytes the spill files hold on disk now (0 in RAM).
  uint64_t SpillBytes() const;
  // Progress lines on stderr (ProgressLine) for the long phases: initialising, loading and
  // writing checkpoints, and a spilled step's update pass. Off by default.
  void set_progress(bool on) { progress_ = on; }
  // Every op of the following steps -- the model's kernel calls and the step's gradient sums,
  // norm, clip and update -- is reported to `observer` (null: none), in trace order
  // (docs/disputes.md). Needs the state in RAM and one process. The test-only op fault, when
  // installed, sits in front of it.
  void set_observer(OpObserver* observer);
  // Installs test-only faults for the following steps (none by default).
  void set_faults(const TestFaults& faults);
  // Runs the ops of the following steps that `executor` runs there (an OpenCL device; null: every
  // op on the CPU), which keeps the state in RAM and the activations (OpExecutor::Keep; plan its
  // memory first: PlanDeviceMemory). The bits are the same wherever they run.
  void set_executor(OpExecutor* executor);

 private:
  // Digests the chunks of every array this rank holds (and, when `update`, applies the step's
  // clip and AdamW update piece by piece first); shares the chunk digests and the updated
  // parameters with the other ranks, checking each received chunk against its owner's digest;
  // then hashes the state.
  // Returns the bytes it digested.
  uint64_t UpdateAndHash(bool update, const rk::AdamWParams& adam_template, float clip_factor);
  // With int8 linears: each rank's row maxima of the weights (per scale tensor; empty for the
  // others) folded into every rank's (rk::FoldMaxima), so that each holds the whole rows'.
  void ShareRowMaxima(std::vector<std::vector<float>>& maxima) const;
  // UpdateAndHash's end: every rank's chunk digests from this rank's (per tensor, per array),
  // the next step's parameter copies checked or shared, and the state hash.
  void ShareAndHash(
      const std::vector<std::array<std::vector<Digest>, kStateArrayCount>>& held_chunks,
      bool update);
  // body(i, begin, count) on every store piece of the elements this rank holds, tensor by
  // tensor, with each piece's `arrays` prefetched (StateStore::Prefetch) ahead: the next piece,
  // and more while they hold at most one full piece. On disk, the next pieces are read while
  // the body computes on this one. With
  // `tensors` (increasing), only theirs.
  template <typename Body>
  void ForEachHeldPiece(std::initializer_list<StateArray> arrays, Body&& body,
                        std::optional<std::span<const size_t>> tensors = std::nullopt);
  // Microbatch group g (its microbatches' windows from `cursor`) forward and backward into
  // `access`; returns each microbatch's (loss, zloss) sums and appends its tokens to `tokens`
  // and its backward digest to `backward`. Each microbatch done is added to `progress`.
  std::vector<float> RunGroup(int64_t g, uint64_t cursor, TensorAccess& access,
                              std::vector<uint32_t>& tokens, std::vector<Digest>& backward,
                              ProgressLine& progress);
  // Adds the gradients of round j's groups (in the group buffer of each rank) into the owners'
  // gradients, in group order (nothing to add where the route put them there: one process's
  // first round, full sharding).
  void FoldRound(int64_t round);
  // The step's microbatch groups, round by round, each over its route to the state
  // (src/train/routes.h), their gradients folded into the owners' in group order.
  struct GroupsDone {
    float loss = 0, zloss = 0;  // the step's mean losses over its tokens
    Digest tokens_digest{};     // of every token consumed, in microbatch order
    Digest backward_digest{};   // of every microbatch's backward digest, in microbatch order
    // Per tensor, its gradient's block squares where the route summed them (else empty).
    std::vector<std::vector<double>> squares;
  };
  GroupsDone RunGroups(uint64_t step);
  // The global norm of the step's gradients (docs/training.md), from the block squares given and
  // those of every other gradient this rank holds, which it reads (making a NaN canonical).
  float GlobalNorm(uint64_t step, std::vector<std::vector<double>> squares);
  // The host memory the executor may keep copies of: the state in RAM and the group buffer.
  std::vector<std::span<const float>> KeptRegions() const;
  // Every kept region brought back from the executor; with host_writes, its copies dropped too
  // (before the host writes the state).
  void StateOnHost(bool host_writes);
  // The elements of tensor i whose moments and gradient this rank holds, and the whole tensor.
  ElementRange Held(size_t i) const;
  ElementRange Whole(size_t i) const { return {0, specs_[i].numel()}; }
  // Fails naming `what` once a step's state was discarded.
  void RefuseDiscarded(std::string_view what) const;
  // RefuseDiscarded, and fails while a checkpoint restored in place is not verified yet.
  void RefuseUnsettled(std::string_view what) const;
  // Restore's checks of a checkpoint against this run: descriptor, tensor names and shapes.
  void CheckRestorable(const CheckpointIndex& checkpoint) const;
  // The tensor data bytes of a checkpoint of this model keeping `gradients`.
  uint64_t CheckpointBytes(Gradients gradients) const;

  RunConfig config_;
  std::unique_ptr<Comm> solo_;  // when no Comm was given
  Comm& comm_;
  // Who holds what, and every transfer between the ranks (src/train/exchange.h).
  std::unique_ptr<Exchange> exchange_;
  int rank_ = 0, ranks_ = 1;  // exchange_'s
  bool sharded_ = false;      // FullySharded
  // Full sharding: per tensor, the owners' parameter chunk digests of the last step this process
  // trained or initialised (empty after a restore), which the next step's gathers must match.
  std::vector<std::vector<Digest>> param_chunks_;
  std::unique_ptr<ParamStore> group_;  // a microbatch group's gradients (N > 1 or K > 1)
  data::TokenStream stream_;
  Model model_;
  std::vector<ParamSpec> specs_;
  // With int8 linears: per tensor, the index of its scale tensor (kNoScale: none); else empty.
  static constexpr size_t kNoScale = SIZE_MAX;
  std::vector<size_t> scale_of_;
  std::vector<TensorShape> shapes_;
  std::unique_ptr<StateStore> store_;
  StepState state_;
  StateHash hash_;
  std::vector<uint32_t> tokens_;  // one microbatch: [microbatch, seq_len + 1]
  bool progress_ = false;
  bool discard_next_ = false, discarded_ = false;  // DiscardNextState
  std::optional<CheckpointIndex> attached_;  // restored in place, not verified yet
  // The store holds the gradients of state_ (false after restoring a checkpoint that keeps only
  // their digests, until the next step computes new ones).
  bool gradients_held_ = true;
  OpObserver* caller_observer_ = nullptr;  // set_observer's
  // The op fault (if any) in front of the caller's observer, and the executor.
  OpHooks hooks_;
  std::unique_ptr<OpObserver> op_fault_;
  TestFaults faults_;
};

// The run descriptor hashed into every step: the model layer's DescriptorJson plus the data
// manifest's digest, as compact JSON with sorted keys.
std::string RunDescriptor(const RunConfig& config, const data::Dataset& dataset);

struct TrainOptions {
  std::string config;  // embedded name or YAML path
  std::filesystem::path data_dir, run_dir;
  std::optional<int64_t> steps;  // stop after this many steps (default: config.train.steps)
  int threads = 1;
  bool resume = false;
  bool progress = true;  // a progress line on stderr
  std::optional<std::filesystem::path> spill_dir;  // Storage::spill_dir
  Model::Activations activations = Model::Activations::kKept;  // Storage::activations
  // Distributed runs: a collective that waits longer than this for the other ranks stops the
  // run (a rank died or hangs).
  double comm_timeout_seconds = 600;
  TestFaults faults;  // test-only
  // Runs the step's ops that it runs (an OpenCL device; null: all on the CPU). Not part of the
  // run: the bits are the same.
  OpExecutor* executor = nullptr;
  std::string device = "cpu";  // the --device flag as given: every rank must give the same
  // Signs every chain line and, after every checkpoint, a root over the chain so far, into
  // run_dir/signatures.jsonl (docs/formats/signatures.md).
  std::optional<std::filesystem::path> sign_key;
  // What each checkpoint keeps of the gradients (docs/formats/checkpoint.md): their digests, or
  // with kFull the gradients too, for localising a later disagreement to gradient elements.
  Gradients checkpoint_gradients = Gradients::kDigests;
};

// `lockstep train`: trains into run_dir (metrics.jsonl, state_hashes.jsonl, checkpoints/).
// Returns the process exit code: 0 done, 1 halted by the spike protocol.
int RunTraining(const TrainOptions& options);

}  // namespace lockstep::train
