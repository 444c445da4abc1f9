// Replaying a unit of a run: the init unit is regenerated and hashed tensor by tensor; an
// interval unit restores a verified checkpoint and runs the training step until the target step.
// docs/audit.md gives the commands, the output contract and the memory plan.
#include <linux/magic.h>
#include <sys/statfs.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <map>
#include <nlohmann/json.hpp>

#include "lockstep/audit.h"
#include "lockstep/kernels.h"
#include "lockstep/train.h"

namespace lockstep::audit {
namespace {
namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

// Each replayed step's backward digest, as hex.
std::vector<std::string> BackwardHex(std::span<const Digest> digests) {
  std::vector<std::string> hex;
  for (const Digest& d : digests) hex.push_back(ToHex(d));
  return hex;
}

void Note(const std::string& line) { std::fprintf(stderr, "replay: %s\n", line.c_str()); }

uint64_t TensorBytes(const ParamSpec& spec) {
  return static_cast<uint64_t>(spec.numel()) * sizeof(float);
}

uint64_t LargestTensorBytes(const ModelConfig& model) {
  uint64_t bytes = 0;
  for (const ParamSpec& spec : ParameterSpecs(model)) bytes = std::max(bytes, TensorBytes(spec));
  return bytes;
}

// What a training step allocates beside the Model: the token stream's cached epochs (document
// order and packed starts), one microbatch of tokens, and the fused cross-entropy's logit
// chunk with its per-row lane states.
uint64_t StepScratchBytes(const RunConfig& config, const data::Dataset& dataset) {
  const uint64_t rows = static_cast<uint64_t>(config.train.microbatch * config.model.seq_len);
  // The head's logit chunk, unless the model keeps all the logits in its arena.
  const uint64_t chunk =
      KeepsLogits(static_cast<int64_t>(rows), config.model.vocab)
          ? 0
          : static_cast<uint64_t>(std::min(config.train.vocab_chunk, config.model.vocab));
  return data::TokenStream::kCachedEpochs * dataset.num_documents() *
             (sizeof(uint32_t) + sizeof(uint64_t)) +
         static_cast<uint64_t>(config.train.microbatch * (config.model.seq_len + 1)) *
             sizeof(uint32_t) +
         rows * (chunk + 2 * rk::kReductionLanes) * sizeof(float);
}

// Prints the plan and refuses (unless forced) one the machine cannot hold now.
void CheckMemoryPlan(const MemoryPlan& plan, bool force) {
  Note("memory plan: " + plan.Describe());
  const uint64_t available = MemAvailableBytes();
  const uint64_t needed = plan.total() - plan.resident_at_planning;
  if (needed <= available) return;
  const std::string problem = fmt::format(
      "memory plan: the replay needs {} bytes beyond what is resident now (planned peak RSS {} "
      "bytes), but /proc/meminfo has MemAvailable {} bytes",
      needed, plan.total(), available);
  if (!force) Fail("{}; pass --force to replay anyway", problem);
  Note("WARNING: " + problem + "; replaying anyway (--force)");
}

ReplayResult ReplayInit(const ReplayOptions& o) {
  RunConfig config = LoadRunConfig(o.config);
  if (o.seed) config.train.seed = *o.seed;
  const data::Dataset dataset = data::OpenDataset(o.data_dir);
  const std::vector<ParamSpec> specs = ParameterSpecs(config.model);
  const bool by_table = std::ranges::any_of(specs, InitByTable);  // the init's erfinv table
  const uint64_t init_bytes =
      static_cast<uint64_t>(InitInPiecesFloats(config.model, kInitPieceFloats)) * sizeof(float);
  const MemoryPlan plan{.parts = {{"init piece and scale maxima", init_bytes},
                                  {"chunk of zeros", 4 << 18},
                                  {"erfinv table", by_table ? kInitTableBytes : 0}},
                        .resident_at_planning = CurrentRssBytes()};
  CheckMemoryPlan(plan, o.force);

  // Parameters are made piece by piece and hashed; m, v and the gradient are zeros, whose digest
  // depends on the element count only (ZeroArrayDigest).
  std::vector<ArrayHasher> params(specs.size());
  InitInPieces(config.model, config.train.seed, kInitPieceFloats,
               [&](size_t i, int64_t, std::span<const float> piece) { params[i].Update(piece); });
  const std::vector<int64_t> first_draws = FirstDraws(specs);
  std::vector<TensorDigest> digests;
  for (size_t i = 0; i < specs.size(); ++i) {
    const Digest zeros = ZeroArrayDigest(static_cast<uint64_t>(specs[i].numel()));
    digests.push_back({specs[i].name, specs[i].shape, params[i].Final(), zeros, zeros, zeros});
  }
  // The state of step 0 as Trainer::Initialize makes it (docs/training.md, "Step 0").
  StepState state;
  state.descriptor = train::RunDescriptor(config, dataset);
  state.rng_seed = config.train.seed;
  state.rng_counter = static_cast<uint64_t>(first_draws.back());
  ReplayResult result;
  result.mode = "init";
  result.state_hash = StateHashFromDigests(state, digests).hash;
  result.expected = o.expect_hash;
  if (o.expect_hash) result.match = result.state_hash == *o.expect_hash;
  result.planned_peak_rss_bytes = plan.total();
  return result;
}

// RUN/state_hashes.jsonl for a checkpoint at RUN/checkpoints/step_*, when there is one.
std::optional<fs::path> ChainOfCheckpoint(const fs::path& checkpoint) {
  fs::path dir = fs::absolute(checkpoint).lexically_normal();
  if (dir.filename().empty()) dir = dir.parent_path();  // "…/step_000000010/"
  if (dir.parent_path().filename() != RunLayout{}.checkpoints()) return std::nullopt;
  const fs::path chain = RunLayout{dir.parent_path().parent_path()}.hashes();
  if (!fs::is_regular_file(chain)) return std::nullopt;
  return chain;
}

// The hash the run's chain records for `until_step`, after checking that the chain's line for
// the checkpoint's step is the checkpoint's (recorded) hash.
std::optional<Digest> ChainTarget(const fs::path& chain, const CheckpointIndex& start,
                                  uint64_t until_step) {
  std::optional<Digest> target;
  bool start_found = false;
  for (const StateHashLine& line : ReadStateHashLines(chain)) {
    if (line.step == start.state.step) {
      start_found = true;
      if (line.hash != start.state_hash) {
        Fail("{}: the line for step {} holds {}, but {} records {}: the checkpoint is not from "
             "this run",
             chain.string(), line.step, ToHex(line.hash), start.dir.string(),
             ToHex(start.state_hash));
      }
    }
    if (line.step == until_step) target = line.hash;
  }
  if (!start_found) {
    Fail("{}: no line for the checkpoint's step {}: the checkpoint is not from this run",
         chain.string(), start.state.step);
  }
  if (target) {
    Note(fmt::format("target: {} line for step {}", chain.string(), until_step));
  } else {
    Note(fmt::format("no target: {} has no line for step {}", chain.string(), until_step));
  }
  return target;
}

// The spill files hold at most every chunk of the four arrays once (a rewrite reuses its slot;
// a chunk never written takes no space). Refuses, unless forced, when the file system holding
// `dir` has less free space, rather than fail with ENOSPC minutes into the replay.
void CheckSpillDisk(const fs::path& dir, uint64_t needed, bool chosen_by_user, bool force) {
  fs::path probe = fs::absolute(dir);
  while (!fs::exists(probe) && probe.has_parent_path() && probe != probe.parent_path()) {
    probe = probe.parent_path();
  }
  // A temp directory in RAM (tmpfs) would put the spilled state back in memory.
  struct statfs fs_info {};
  if (!chosen_by_user && ::statfs(probe.c_str(), &fs_info) == 0 &&
      fs_info.f_type == TMPFS_MAGIC) {
    Fail("the replay does not fit in RAM, and {} is a tmpfs (held in RAM): give --spill-dir on a "
         "disk",
         probe.string());
  }
  std::error_code error;
  const fs::space_info space = fs::space(probe, error);
  if (error) Fail("{}: cannot read the free disk space: {}", probe.string(), error.message());
  const double gb = 1e9;
  Note(fmt::format("spill: up to {:.2f} GB on disk; {} has {:.2f} GB available",
                   static_cast<double>(needed) / gb, probe.string(),
                   static_cast<double>(space.available) / gb));
  if (space.available >= needed) return;
  const std::string problem =
      fmt::format("spill: the replay may write {} bytes under {}, but its file system has {} "
                  "bytes available",
                  needed, dir.string(), space.available);
  if (!force) Fail("{}; free space, give another --spill-dir, or pass --force", problem);
  Note("WARNING: " + problem + "; replaying anyway (--force)");
}

// Replays in RAM when the machine holds it (or --spill-dir is given), else in a SpillStore.
struct ReplayStorage {
  MemoryPlan plan;
  train::Storage storage;
};

ReplayStorage PlanInterval(const ReplayOptions& o, const RunConfig& config,
                           const data::Dataset& dataset) {
  const uint64_t resident = CurrentRssBytes();
  const uint64_t activations =
      static_cast<uint64_t>(Model::AllocatedBytes(config.model, config.train.vocab_chunk,
                                                  config.train.microbatch, config.model.seq_len,
                                                  o.activations)) +
      StepScratchBytes(config, dataset);
  // --compare-checkpoint: one array of each side at a time.
  const uint64_t compare = o.compare_checkpoint ? 2 * LargestTensorBytes(config.model) : 0;
  MemoryPlan in_ram{.parts = train::StorePlan(config, {}), .resident_at_planning = resident};
  in_ram.parts.emplace_back("activations and step scratch", activations);
  in_ram.parts.emplace_back("localisation arrays", compare);
  if (!o.spill_dir && in_ram.total() - resident <= MemAvailableBytes()) {
    return {in_ram, {.spill_dir = std::nullopt, .activations = o.activations}};
  }
  const fs::path dir =
      o.spill_dir ? *o.spill_dir
                  : fs::temp_directory_path() / fmt::format("lockstep-spill-{}", ::getpid());
  Note(fmt::format("{}: parameters, moments and gradients are kept on disk in {}",
                   o.spill_dir ? "--spill-dir" : "the replay does not fit in RAM",
                   dir.string()));
  const train::Storage storage{dir, o.activations};
  MemoryPlan spilled{.parts = train::StorePlan(config, storage), .resident_at_planning = resident};
  spilled.parts.emplace_back("activations and step scratch", activations);
  // The step's open tensors are released before the localisation reads its arrays.
  const uint64_t open = spilled.total() - resident - activations;
  spilled.parts.emplace_back("localisation arrays beyond the released open tensors",
                             compare - std::min(compare, open));
  return {spilled, storage};
}

ReplayResult ReplayInterval(const ReplayOptions& o) {
  const CheckpointIndex start = OpenCheckpoint(o.checkpoint);
  if (o.until_step <= start.state.step) {
    Fail("--until-step {} is at or before the step of --checkpoint {} (step {}): a replay must run "
         "at least one step",
         o.until_step, o.checkpoint.string(), start.state.step);
  }
  const RunConfig config = ConfigOfCheckpoint(start);
  std::optional<CheckpointIndex> reference;
  if (o.compare_checkpoint) {
    reference = OpenCheckpoint(*o.compare_checkpoint);
    if (reference->state.step != o.until_step) {
      Fail("--compare-checkpoint {} holds step {}, not --until-step {}",
           o.compare_checkpoint->string(), reference->state.step, o.until_step);
    }
  }
  std::optional<File> loss_log;
  if (o.loss_log) loss_log.emplace(File::Create(*o.loss_log));

  const data::Dataset dataset = data::OpenDataset(o.data_dir);
  const ReplayStorage storage = PlanInterval(o, config, dataset);
  CheckMemoryPlan(storage.plan, o.force);
  if (storage.storage.spill_dir) {
    CheckSpillDisk(*storage.storage.spill_dir, train::StateBytes(config.model),
                   o.spill_dir.has_value(), o.force);
  }

  std::optional<Digest> target = o.expect_hash;
  if (!target) {
    if (const std::optional<fs::path> chain = ChainOfCheckpoint(o.checkpoint)) {
      target = ChainTarget(*chain, start, o.until_step);
    } else {
      Note("no target: no --expect-hash, and the checkpoint is not in a run directory "
           "(RUN/checkpoints/step_*) with a state_hashes.jsonl");
    }
  }
  if (o.executor != nullptr) train::PlanDeviceMemory(config, storage.storage, 1, 0, *o.executor);
  train::Trainer trainer(config, dataset, train::RunDescriptor(config, dataset), storage.storage);
  trainer.set_progress(true);
  trainer.set_faults(o.faults);
  trainer.set_executor(o.executor);
  const auto load_start = Clock::now();
  // On disk the checkpoint is read in place by the first step, which verifies it (each byte read
  // once, hashed once); in RAM, or with --force (which must know the files' hash before it
  // trains on them), it is read and verified first.
  bool in_place = false;
  if (o.force) {
    const StateHash loaded = trainer.Restore(start, FileDigests::kIgnore);
    if (loaded.hash != start.state_hash) {
      Note(fmt::format("WARNING: --force: {} hashes to {} but meta.json records {}: replaying "
                       "from the state the files hold, which is NOT the published one",
                       o.checkpoint.string(), ToHex(loaded.hash), ToHex(start.state_hash)));
    }
  } else {
    in_place = trainer.RestoreInPlace(start);
  }
  ReplayResult result;
  {
    train::PhaseReport& load = result.phases.emplace_back();
    load.name = "load checkpoint";
    load.seconds = std::chrono::duration<double>(Clock::now() - load_start).count();
    if (in_place) {
      Note(fmt::format("checkpoint step {}: read in place by step {}, which verifies it",
                       start.state.step, start.state.step + 1));
    } else {
      load.read_seconds = load.seconds;
      for (const CheckpointIndex::File& file : start.files) {
        if (!file.path.empty()) load.read_bytes += file.size;
      }
      load.hashed_bytes = load.read_bytes;
      Note(fmt::format("checkpoint step {} loaded and verified in {:.1f} s ({:.2f} GB/s)",
                       start.state.step, load.seconds,
                       static_cast<double>(load.read_bytes) / load.seconds * 1e-9));
    }
  }
  result.mode = "interval";
  result.expected = target;
  result.planned_peak_rss_bytes = storage.plan.total();
  // Nothing reads the last step's state unless it is compared or handed off: a spilled replay
  // then need not write it back.
  const bool state_needed = reference.has_value() || o.save_checkpoint_dir.has_value();
  while (trainer.state().step < o.until_step) {
    if (trainer.state().step + 1 == o.until_step && !state_needed) trainer.DiscardNextState();
    const train::StepReport r = trainer.Step();
    result.losses.push_back(r.loss);
    result.backward_digests.push_back(r.backward_digest);
    for (train::PhaseReport phase : r.phases) {
      phase.name = fmt::format("step {}: {}", r.step, phase.name);
      if (phase.read_bytes + phase.written_bytes > 0) {
        Note(fmt::format("{}: {:.2f} s; read {:.2f} GB waiting {:.2f} s, wrote {:.2f} GB in "
                         "{:.2f} s, hashed {:.2f} GB",
                         phase.name, phase.seconds, static_cast<double>(phase.read_bytes) * 1e-9,
                         phase.read_seconds, static_cast<double>(phase.written_bytes) * 1e-9,
                         phase.write_seconds, static_cast<double>(phase.hashed_bytes) * 1e-9));
      }
      result.phases.push_back(std::move(phase));
    }
    Note(fmt::format("step {}/{}  loss {:.6f}  grad_norm {:.6f}  {:.2f} s{}", r.step, o.until_step,
                     r.loss, r.grad_norm, r.seconds, r.skipped ? "  SKIPPED (spike)" : ""));
    if (loss_log) loss_log->Write(train::MetricsLineJson(r, trainer.state(), &trainer.hash()) + "\n");
    if (r.halt && r.step < o.until_step) {
      Fail("the spike protocol halts the run at step {} ({} skips within {} steps), before "
           "--until-step {}: the published run cannot have continued past it",
           r.step, trainer.state().spike.recent_skips.size(), config.train.spike_window,
           o.until_step);
    }
  }
  result.state_hash = trainer.hash();
  if (target) result.match = result.state_hash == *target;
  result.spill_bytes = trainer.SpillBytes();

  if (reference) {
    const StateHash reference_hash =
        VerifyStreamedHash(*reference, StreamCheckpoint(*reference, kCheckpointPieceFloats, {}));
    result.localisation = LocaliseMismatch(
        trainer.state(), trainer.state_hash(), trainer.tensors(),
        [&](size_t i, StateArray a, int64_t begin, std::span<float> out) {
          trainer.ReadPiece(i, a, begin, out);
        },
        *reference, reference_hash);
    if (result.localisation.empty()) {
      Note(fmt::format("the replayed state equals {}", o.compare_checkpoint->string()));
    }
    for (const std::string& line : result.localisation) Note("localisation: " + line);
  }

  if (o.save_checkpoint_dir) {
    if (result.match == true || o.force) {
      const fs::path written = trainer.WriteCheckpoint(*o.save_checkpoint_dir);
      Note(fmt::format("hand-off checkpoint written: {}{}", written.string(),
                       result.match == true ? "" : " (WITHOUT a match: --force)"));
    } else {
      Note(fmt::format("hand-off checkpoint NOT written to {}: {}",
                       o.save_checkpoint_dir->string(),
                       result.match ? "the replay does not match its target"
                                    : "there is no target to match (give --expect-hash)"));
    }
  }
  result.step = trainer.state().step;
  result.consumed_tokens =
      trainer.state().data_cursor * static_cast<uint64_t>(config.model.seq_len);
  return result;
}

// Options that belong to the other unit are refused rather than ignored.
void CheckOptions(const ReplayOptions& o) {
  auto refuse = [&](bool given, const char* option) {
    if (given) {
      Fail("{} does not apply to {} replays", option, o.from_init ? "--from-init" : "--checkpoint");
    }
  };
  if (o.data_dir.empty()) Fail("--data is required: every hash covers the dataset's manifest");
  if (o.from_init) {
    if (o.config.empty()) Fail("--from-init needs --config");
    refuse(!o.checkpoint.empty(), "--checkpoint");
    refuse(o.until_step != 0, "--until-step");
    refuse(o.save_checkpoint_dir.has_value(), "--save-checkpoint-dir");
    refuse(o.loss_log.has_value(), "--loss-log");
    refuse(o.compare_checkpoint.has_value(), "--compare-checkpoint");
    refuse(o.spill_dir.has_value(), "--spill-dir (the init unit holds one piece in RAM)");
    refuse(o.faults.op || o.faults.token, "--test-fault-op and --test-fault-token");
    refuse(o.executor != nullptr, "--device (the init unit runs no op of the op table)");
  } else {
    if (o.checkpoint.empty()) Fail("an interval replay needs --checkpoint (or give --from-init)");
    refuse(!o.config.empty(), "--config (the checkpoint records its config)");
    refuse(o.seed.has_value(), "--seed (the checkpoint records its seed)");
  }
}

}  // namespace

ReplayResult Replay(const ReplayOptions& options) {
  const auto start = Clock::now();
  // This unit's own peak, even after others in the same process (lockstep audit).
  const bool own_peak = ResetPeakRss();
  CheckOptions(options);
  {
    const auto given = [](const std::optional<fs::path>& p) { return p.value_or(fs::path()); };
    std::vector<NamedPath> inputs = {{"--checkpoint", options.checkpoint},
                                     {"--data", options.data_dir},
                                     {"--compare-checkpoint", given(options.compare_checkpoint)}};
    if (!options.checkpoint.empty()) {
      inputs.push_back({"the run's chain", given(ChainOfCheckpoint(options.checkpoint))});
    }
    if (!options.config.empty() && fs::exists(options.config)) {
      inputs.push_back({"--config", options.config});
    }
    RefuseOutputsOntoInputs({{"--loss-log", given(options.loss_log)},
                             {"--save-checkpoint-dir", given(options.save_checkpoint_dir)},
                             {"--spill-dir", given(options.spill_dir)}},
                            inputs);
  }
  if (!own_peak) {
    Note("WARNING: /proc/self/clear_refs is not writable: peak_rss_bytes is the process's peak "
         "since it started");
  }
  SetThreads(options.threads);
  ReplayResult result = options.from_init ? ReplayInit(options) : ReplayInterval(options);
  result.device = "cpu:" + rk::ActiveIsa().name;
  if (options.executor != nullptr) result.device = options.device + " with " + result.device;
  result.threads = options.threads;
  result.wall_seconds = std::chrono::duration<double>(Clock::now() - start).count();
  result.peak_rss_bytes = PeakRssBytes();
  return result;
}

std::string ResultJson(const ReplayResult& r) {
  nlohmann::ordered_json j = {
      {"step", r.step},
      {"consumed_tokens", r.consumed_tokens},
      {"state_hash", ToHex(r.state_hash)},
      {"mode", r.mode},
      {"device", r.device},
      {"threads", r.threads},
      {"expected", r.expected ? nlohmann::ordered_json(ToHex(*r.expected)) : nullptr},
      {"match", r.match ? nlohmann::ordered_json(*r.match) : nullptr},
      {"losses", r.losses},
      {"backward_blake2b", BackwardHex(r.backward_digests)},
      {"wall_seconds", r.wall_seconds},
      {"peak_rss_bytes", r.peak_rss_bytes},
      {"planned_peak_rss_bytes", r.planned_peak_rss_bytes},
      {"spill_disk_bytes", r.spill_bytes},
      {"localisation", r.localisation},
      {"phases", nlohmann::ordered_json::array()},
  };
  for (const train::PhaseReport& p : r.phases) {
    j["phases"].push_back({{"name", p.name},
                           {"seconds", p.seconds},
                           {"read_bytes", p.read_bytes},
                           {"read_seconds", p.read_seconds},
                           {"written_bytes", p.written_bytes},
                           {"write_seconds", p.write_seconds},
                           {"hashed_bytes", p.hashed_bytes}});
  }
  return j.dump(2) + "\n";
}

std::string VerdictLine(const ReplayResult& r) {
  return fmt::format("replay: state_hash={} expected={} MATCH={}", ToHex(r.state_hash),
                     r.expected ? ToHex(*r.expected) : "none",
                     !r.match ? "None" : *r.match ? "True" : "False");
}

int ExitCode(const ReplayResult& r) { return r.match == false ? 1 : 0; }

}  // namespace lockstep::audit
