// `lockstep train`: the run directory, resume, metrics, checkpoints and the progress line.
#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <chrono>
#include <cstdio>
#include <limits>
#include <set>
#include <thread>
#include <nlohmann/json.hpp>

#include "lockstep/json.h"
#include "lockstep/train.h"
#include "train/comm.h"
#include "train/metrics_log.h"

namespace lockstep::train {
namespace {
namespace fs = std::filesystem;

// A number field that may be null (a non-finite value, which JSON cannot hold): NaN then.
double NumberOrNull(const nlohmann::json& j, const char* key, const std::string& what) {
  const nlohmann::json& v = j.at(key);
  if (v.is_null()) return std::numeric_limits<double>::quiet_NaN();
  if (!v.is_number()) Fail("{}: field \"{}\" is {}, expected a number or null", what, key, v.dump());
  return v.get<double>();
}

uint64_t UnsignedField(const nlohmann::json& j, const char* key, const std::string& what) {
  const nlohmann::json& v = j.at(key);
  if (!v.is_number_unsigned()) {
    Fail("{}: field \"{}\" is {}, expected an unsigned integer", what, key, v.dump());
  }
  return v.get<uint64_t>();
}

std::string Duration(double seconds) {
  const int s = static_cast<int>(std::lround(seconds));
  return s >= 3600 ? fmt::format("{}h{:02}m", s / 3600, s / 60 % 60)
                   : fmt::format("{}m{:02}s", s / 60, s % 60);
}

// A summary of metrics.jsonl on stdout: the mean loss over each tenth of the run.
void PrintLossCurve(const fs::path& metrics_path, double unigram_entropy) {
  if (!fs::exists(metrics_path)) return;  // --steps 0: no step, no curve
  std::vector<std::pair<uint64_t, double>> losses;
  for (const MetricsLine& m : ReadMetrics(metrics_path)) {
    // A diverged step's loss is written as null: it has no place on the curve.
    if (std::isfinite(m.loss)) losses.emplace_back(m.step, m.loss);
  }
  if (losses.empty()) return;
  fmt::print("loss curve ({} steps; unigram entropy of the corpus: {:.4f} nats/token)\n",
             losses.size(), unigram_entropy);
  const size_t parts = std::min<size_t>(10, losses.size());
  for (size_t p = 0; p < parts; ++p) {
    const size_t begin = losses.size() * p / parts, end = losses.size() * (p + 1) / parts;
    double sum = 0;
    for (size_t i = begin; i < end; ++i) sum += losses[i].second;
    fmt::print("  steps {:>6} - {:<6} mean loss {:.4f}\n", losses[begin].first,
               losses[end - 1].first, sum / static_cast<double>(end - begin));
  }
}

}  // namespace

std::string MetricsLineJson(const StepReport& r, const StepState& state, const Digest* state_hash) {
  nlohmann::json j = {{"step", r.step},
                      {"loss", r.loss},
                      {"zloss", r.zloss},
                      {"grad_norm", r.grad_norm},
                      {"clip_factor", r.clip_factor},
                      {"lr", r.lr},
                      {"skipped", r.skipped},
                      {"tokens", r.step * static_cast<uint64_t>(r.tokens)},
                      {"tokens_blake2b", ToHex(state.tokens_digest)},
                      {"backward_blake2b", ToHex(r.backward_digest)},
                      {"step_seconds", r.seconds},
                      {"tokens_per_second", static_cast<double>(r.tokens) / r.seconds},
                      {"comm_seconds", r.comm_seconds},
                      {"comm_hidden_seconds", r.comm_hidden_seconds},
                      {"comm_bytes", r.comm_bytes}};
  if (state_hash != nullptr) j["state_hash"] = ToHex(*state_hash);
  return j.dump();
}

std::vector<MetricsLine> ReadMetrics(const fs::path& path, TornLine torn) {
  const std::vector<std::string> lines = LogLines(path, torn == TornLine::kDrop);
  std::vector<MetricsLine> metrics;
  for (size_t n = 0; n < lines.size(); ++n) {
    const std::string what = fmt::format("{}: line {}", path.string(), n + 1);
    const nlohmann::json j = ParseJsonStrict(lines[n], what);
    static const std::set<std::string> kFields = {"step",           "loss",
                                                  "zloss",          "grad_norm",
                                                  "clip_factor",    "lr",
                                                  "skipped",        "tokens",
                                                  "tokens_blake2b", "backward_blake2b",
                                                  "step_seconds",   "tokens_per_second",
                                                  "comm_seconds",   "comm_hidden_seconds",
                                                  "comm_bytes"};
    // Lines of an earlier lockstep's lack these: comm_hidden_seconds reads as 0,
    // backward_blake2b as absent.
    static const std::set<std::string> kLater = {"comm_hidden_seconds", "backward_blake2b"};
    if (!j.is_object()) Fail("{}: not a JSON object", what);
    for (const auto& [key, value] : j.items()) {
      if (!kFields.contains(key)) Fail("{}: unknown field \"{}\"", what, key);
    }
    for (const std::string& key : kFields) {
      if (!j.contains(key) && !kLater.contains(key)) {
        Fail("{}: missing field \"{}\"", what, key);
      }
    }
    MetricsLine m;
    m.step = UnsignedField(j, "step", what);
    if (!metrics.empty() && m.step <= metrics.back().step) {
      Fail("{}: step {} does not follow step {}", what, m.step, metrics.back().step);
    }
    m.loss = NumberOrNull(j, "loss", what);
    m.zloss = NumberOrNull(j, "zloss", what);
    m.grad_norm = NumberOrNull(j, "grad_norm", what);
    m.clip_factor = NumberOrNull(j, "clip_factor", what);
    m.lr = NumberOrNull(j, "lr", what);
    if (!j["skipped"].is_boolean()) Fail("{}: field \"skipped\" is not true or false", what);
    m.skipped = j["skipped"].get<bool>();
    m.tokens = UnsignedField(j, "tokens", what);
    if (!j["tokens_blake2b"].is_string()) Fail("{}: field \"tokens_blake2b\" is not a string", what);
    m.tokens_blake2b = DigestFromHex(j["tokens_blake2b"].get<std::string>(),
                                     what + ": field \"tokens_blake2b\"");
    m.step_seconds = NumberOrNull(j, "step_seconds", what);
    // A measured duration: what a kit sums into a unit's publisher_wall_seconds.
    if (!(m.step_seconds >= 0 && std::isfinite(m.step_seconds))) {
      Fail("{}: field \"step_seconds\" is {}, expected a finite number >= 0 (a step's duration)",
           what, j.at("step_seconds").dump());
    }
    m.tokens_per_second = NumberOrNull(j, "tokens_per_second", what);
    m.comm_seconds = NumberOrNull(j, "comm_seconds", what);
    if (j.contains("comm_hidden_seconds")) {
      m.comm_hidden_seconds = NumberOrNull(j, "comm_hidden_seconds", what);
    }
    if (j.contains("backward_blake2b")) {
      if (!j["backward_blake2b"].is_string()) {
        Fail("{}: field \"backward_blake2b\" is not a string", what);
      }
      m.backward_blake2b = DigestFromHex(j["backward_blake2b"].get<std::string>(),
                                         what + ": field \"backward_blake2b\"");
    }
    m.comm_bytes = UnsignedField(j, "comm_bytes", what);
    metrics.push_back(m);
  }
  return metrics;
}

void MetricsLog::TruncateAfter(uint64_t last_step) const {
  if (!fs::exists(path_)) return;
  const std::string text = ReadFileText(path_);
  const std::vector<MetricsLine> lines = ReadMetrics(path_, TornLine::kDrop);
  // ReadMetrics insists that steps increase: the lines kept are the first ones, each ending
  // with its '\n' (a torn line is the last and has none).
  size_t end = 0;
  for (const MetricsLine& m : lines) {
    if (m.step > last_step) break;
    end = text.find('\n', end) + 1;
  }
  fs::path temp = path_;
  temp += ".tmp";
  WriteFileSynced(temp, std::string_view(text).substr(0, end));
  std::error_code ec;
  fs::rename(temp, path_, ec);
  if (ec) Fail("{}: cannot rename to {}: {}", temp.string(), path_.string(), ec.message());
  const fs::path parent = path_.parent_path();
  SyncDirectory(parent.empty() ? "." : parent);
}

void MetricsLog::Append(const StepReport& r, const StepState& state) const {
  AppendFileSynced(path_, MetricsLineJson(r, state) + "\n");
}

namespace {

// --sign-key: every chain line is signed as it is appended, and after every checkpoint a root
// over the chain so far (docs/formats/signatures.md). Ed25519 signatures are deterministic, so
// re-signing a line gives the same bytes: a resume rebuilds the file from the chain it keeps.
class ChainSigner {
 public:
  ChainSigner(const fs::path& path, const fs::path& key_path)
      : path_(path), seed_(ReadSigningKey(key_path)), key_(PublicKeyOf(seed_)) {}

  void Start() { StartSignedChain(path_, key_); }

  void Line(uint64_t step, const Digest& hash) {
    const SignedLine line{step, hash, SignMessage(seed_, ChainLineMessage(step, hash))};
    lines_.push_back(line);
    AppendSignedLine(path_, line);
  }

  void Root() {
    const Digest root = ChainRoot(lines_);
    const uint64_t steps = lines_.size();
    AppendSignedRoot(path_, {steps, root, SignMessage(seed_, ChainRootMessage(steps, root))});
  }

  // After a resume truncated the chain: the key line, every kept line, and a root after each
  // complete checkpoint among them. A file signed with another key is refused; a torn last line
  // (a crash during an append) is dropped like the chain's, since the file is rebuilt anyway.
  void Rebuild(std::span<const StateHashLine> chain, std::span<const uint64_t> checkpoints) {
    if (fs::exists(path_) && ReadSignedChain(path_, TornLine::kDrop).key != key_) {
      Fail("{}: the run was signed with another key than --sign-key's ({})", path_.string(),
           ToHex(key_));
    }
    const fs::path temp = path_.string() + ".tmp";
    const fs::path final_path = path_;
    path_ = temp;
    fs::remove(temp);
    Start();
    for (const StateHashLine& line : chain) {
      Line(line.step, line.hash);
      if (std::ranges::binary_search(checkpoints, line.step)) Root();
    }
    fs::rename(temp, final_path);
    path_ = final_path;
  }

 private:
  fs::path path_;
  Ed25519Seed seed_;
  Ed25519PublicKey key_;
  std::vector<SignedLine> lines_;
};

// The chain kept on a signed run's resume must be the one signed: the signatures verify and
// every kept line is signed with its hash (the checkpoint at the last kept step was written after
// that line was signed, so a line without a signature is not the run's).
void CheckSignedLines(const fs::path& signatures_path, const fs::path& hashes_path,
                      std::span<const StateHashLine> lines) {
  const SignedChain signed_chain = ReadSignedChain(signatures_path, TornLine::kDrop);
  if (const auto problems = VerifySignedChain(signed_chain, nullptr); !problems.empty()) {
    Fail("{}: {}", signatures_path.string(), problems.front());
  }
  for (const StateHashLine& line : lines) {
    if (line.step >= signed_chain.lines.size()) {
      Fail(
          "{}: step {} holds {}, but {} signs no line for it: the chain was edited, or is not "
          "this run's",
          hashes_path.string(), line.step, ToHex(line.hash), signatures_path.string());
    }
    const SignedLine& s = signed_chain.lines[line.step];
    if (s.hash != line.hash) {
      Fail(
          "{}: step {} holds {}, but {} signs {} for it: the chain was edited, or is not this "
          "run's",
          hashes_path.string(), line.step, ToHex(line.hash), signatures_path.string(),
          ToHex(s.hash));
    }
  }
}

// The test faults as one line, for the ranks' agreement.
std::string FaultsText(const TestFaults& f) {
  std::string text;
  if (f.op) text += fmt::format("op {}:{} ", f.op->step, f.op->index);
  if (f.token) text += fmt::format("token {}:{} ", f.token->step, f.token->index);
  if (f.replica) text += fmt::format("replica {}:{}", f.replica->rank, f.replica->step);
  return text.empty() ? "none" : text;
}

// The job every rank must agree on: its config, its data and how many steps it runs.
struct Job {
  RunConfig config;
  data::Dataset dataset;
  uint64_t target = 0;  // the step to stop at
};

// Loads the config and the data, and checks that every rank runs the same job: the same
// descriptor and every flag that changes what the run commits. Every check that may refuse is
// made under AgreeOrFail: one rank's refusal (rank 0's of the run directory, another rank's of
// its own --data) stops every rank at once.
Job LoadJob(const TrainOptions& options, Comm& comm) {
  std::optional<Job> job;
  AgreeOrFail(comm, [&] {
    RunConfig config = LoadRunConfig(options.config);
    data::Dataset dataset = data::OpenDataset(options.data_dir);
    if (options.steps && *options.steps < 0) Fail("--steps = {} (must be >= 0)", *options.steps);
    if (fs::exists(options.run_dir) && !fs::is_directory(options.run_dir)) {
      Fail("--out {}: exists and is not a directory", options.run_dir.string());
    }
    const auto target = static_cast<uint64_t>(options.steps.value_or(config.train.steps));
    job.emplace(Job{std::move(config), std::move(dataset), target});
  });
  RequireSameOnEveryRank(
      comm,
      {{"run descriptor (config and data manifest)", RunDescriptor(job->config, job->dataset)},
       {"--steps", std::to_string(job->target)},
       {"--resume", options.resume ? "given" : "not given"},
       {"--full-gradients",
        options.checkpoint_gradients == Gradients::kFull ? "given" : "not given"},
       // Who holds what follows from it (OwnershipUnit); each rank's path is its own.
       {"--spill-dir", options.spill_dir ? "given" : "not given"},
       // Where the ops run: the bits are the same on every device, but the ranks plan and
       // exchange their memory alike only when they run alike.
       {"--device", options.device},
       // The writer signs; a rank that would sign when rank 0 does not is another job.
       {"--sign-key", options.sign_key ? "given" : "not given"},
       {"--test-fault-* flags", FaultsText(options.faults)}});
  return std::move(*job);
}

// Refuses, before anything is allocated, a run whose state does not fit: on the device
// (PlanDeviceMemory), or one process's in RAM (rather than be killed).
void CheckMemory(const TrainOptions& options, const RunConfig& config, const Storage& storage,
                 Comm& comm) {
  if (options.executor != nullptr) {
    AgreeOrFail(comm, [&] {
      PlanDeviceMemory(config, storage, comm.size(), comm.rank(), *options.executor);
    });
  }
  if (options.spill_dir || comm.size() > 1) return;
  uint64_t needed = static_cast<uint64_t>(
      Model::AllocatedBytes(config.model, config.train.vocab_chunk, config.train.microbatch,
                            config.model.seq_len, options.activations));
  for (const auto& [what, bytes] : StorePlan(config, {})) needed += bytes;
  if (needed <= MemAvailableBytes()) return;
  const bool grouped = config.train.grad_groups > 1;
  Fail(
      "{}: parameters, AdamW moments, gradients{} and activations need {:.2f} GiB of RAM but "
      "MemAvailable is {:.2f} GiB: {}",
      options.config, grouped ? " and a microbatch group's gradients" : "",
      static_cast<double>(needed) / (1 << 30), static_cast<double>(MemAvailableBytes()) / (1 << 30),
      grouped ? "train it with more processes (mpirun; docs/distributed.md), which share the "
                "moments and gradients"
              : "give --spill-dir DIR to keep them on disk");
}

// What rank 0 (the writer) keeps in the run directory beside the checkpoints: the chain, the
// metrics and, with --sign-key, the signatures. Every other rank holds one that writes nothing.
struct RunLogs {
  RunLogs(const TrainOptions& options, Comm& comm)
      : writer(comm.rank() == 0), layout{options.run_dir}, metrics(layout.metrics()) {
    AgreeOrFail(comm, [&] {
      if (options.sign_key && writer) signer.emplace(layout.signatures(), *options.sign_key);
    });
  }
  // Step `step`'s chain line, signed, and its metrics line.
  void Step(const StepReport& r, const Trainer& trainer) {
    if (!writer) return;
    AppendStateHashLine(layout.hashes(), {r.step, trainer.hash()});
    if (signer) signer->Line(r.step, trainer.hash());
    metrics.Append(r, trainer.state());
  }
  // After a checkpoint: a signed root over the chain so far.
  void Checkpointed() {
    if (signer) signer->Root();
  }

  const bool writer;
  const RunLayout layout;
  MetricsLog metrics;
  std::optional<ChainSigner> signer;  // the writer's, with --sign-key
};

// A new run: the directory made (refusing one that holds a run), step 0 initialised, its chain
// line and its checkpoint (the start of the first interval an auditor can replay).
void StartRun(const TrainOptions& options, Comm& comm, Trainer& trainer, RunLogs& logs) {
  AgreeOrFail(comm, [&] {
    if (!logs.writer) return;
    if (fs::exists(logs.layout.hashes()) || fs::exists(logs.layout.checkpoints())) {
      Fail("{} already holds a run (state_hashes.jsonl or checkpoints/): {}",
           options.run_dir.string(),
           LatestCompleteCheckpoint(options.run_dir)
               ? "use --resume to continue it, or choose another --out"
               : "it has no complete checkpoint (it was stopped before step 0 was saved), so "
                 "it cannot be resumed: delete it, or choose another --out");
    }
    // Nor anything, of anyone's, where the run's logs go (a link not followed): a new run's
    // logs are its own from their first line.
    for (const fs::path& log :
         {logs.layout.hashes(), logs.layout.metrics(), logs.layout.signatures()}) {
      if (fs::symlink_status(log).type() != fs::file_type::not_found) {
        Fail(
            "{}: exists, and a new run's logs start empty (it is never appended to, written "
            "through nor replaced): remove it, or choose another --out",
            log.string());
      }
    }
    fs::create_directories(options.run_dir);
  });
  trainer.Initialize();
  if (logs.writer) AppendStateHashLine(logs.layout.hashes(), {0, trainer.hash()});
  if (logs.signer) {
    logs.signer->Start();
    logs.signer->Line(0, trainer.hash());
  }
  trainer.WriteCheckpoint(options.run_dir, options.checkpoint_gradients);
  logs.Checkpointed();
}

// --resume: the latest complete checkpoint restored on every rank; the logs cut back to it.
void ResumeRun(const TrainOptions& options, Comm& comm, Trainer& trainer, RunLogs& logs) {
  std::optional<fs::path> latest;
  std::vector<StateHashLine> lines;  // rank 0's: the chain up to the checkpoint
  const fs::path hashes_path = logs.layout.hashes(), signatures_path = logs.layout.signatures();
  AgreeOrFail(comm, [&] {
    latest = LatestCompleteCheckpoint(options.run_dir);
    if (!latest) {
      Fail(
          "--resume: {} has no complete checkpoint (checkpoints/step_*/COMPLETE): the run was "
          "stopped before its step-0 checkpoint was saved, so there is nothing to resume; "
          "delete the directory and start the run again",
          options.run_dir.string());
    }
    trainer.Restore(OpenCheckpoint(*latest));
    if (!logs.writer) return;  // the logs are rank 0's
    // The logs may run past the checkpoint (a crash after it): keep what the checkpoint covers,
    // and insist that the chain kept is the one the checkpoints (this one and every earlier
    // one) record: an edited or deleted line is not carried forward.
    lines = ReadStateHashLines(hashes_path, TornLine::kDrop);
    std::erase_if(lines, [&](const StateHashLine& l) { return l.step > trainer.state().step; });
    if (!logs.signer && fs::exists(signatures_path)) {
      Fail("{}: this run's chain is signed: resume it with --sign-key", signatures_path.string());
    }
    // In a signed run every kept line must be the one signed (before Rebuild signs the kept
    // lines anew, which would launder an edited one): checked first, as it names the step.
    if (logs.signer && fs::exists(signatures_path)) {
      CheckSignedLines(signatures_path, hashes_path, lines);
    }
    // Signed or not, each checkpoint's chain pins every line up to it.
    CheckChainAncestry(hashes_path, lines,
                       CheckpointAnchors(options.run_dir, trainer.state().step));
    // Signs the chain up to the checkpoint again (it may refuse the signatures file).
    if (logs.signer) logs.signer->Rebuild(lines, CompleteCheckpointSteps(options.run_dir));
  });
  RequireSameOnEveryRank(comm,
                         {{"checkpoint to resume from (its state hash)", ToHex(trainer.hash())}});
  if (!logs.writer) return;
  WriteStateHashLines(hashes_path, lines);
  logs.metrics.TruncateAfter(trainer.state().step);
  std::fprintf(stderr, "resumed from %s (step %llu, hash %s)\n", latest->c_str(),
               static_cast<unsigned long long>(trainer.state().step),
               ToHex(trainer.hash()).c_str());
}

// The progress line of step r, of a run that started this process at step `first`.
std::string StepLine(const StepReport& r, uint64_t first, uint64_t target, double elapsed) {
  const double eta =
      elapsed / static_cast<double>(r.step - first) * static_cast<double>(target - r.step);
  return fmt::format(
      "step {}/{}  loss {:.4f}  gnorm {:.3f}  lr {:.2e}  {:.0f} tok/s  elapsed {}  eta {}{}",
      r.step, target, r.loss, r.grad_norm, r.lr, r.tokens / r.seconds, Duration(elapsed),
      Duration(eta), r.skipped ? "  SKIPPED (spike)" : "");
}

// Steps until `target` or the spike protocol's halt, each logged, with a checkpoint every
// train.ckpt_every steps and at the last. Returns the exit code: 0 done, 1 halted.
int StepUntil(const TrainOptions& options, const RunConfig& config, uint64_t target,
              Trainer& trainer, RunLogs& logs) {
  const bool tty = options.progress && isatty(STDERR_FILENO);
  const bool show = options.progress && logs.writer;
  const auto start = std::chrono::steady_clock::now();
  const uint64_t first = trainer.state().step;
  int exit_code = 0;
  while (trainer.state().step < target) {
    const StepReport r = trainer.Step();
    logs.Step(r, trainer);
    const bool last = r.step == target || r.halt;
    if (last || (config.train.ckpt_every > 0 && r.step % config.train.ckpt_every == 0)) {
      trainer.WriteCheckpoint(options.run_dir, options.checkpoint_gradients);
      logs.Checkpointed();
    }
    if (show) {
      const double elapsed =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      std::fprintf(stderr, tty ? "\r%s\033[K" : "%s\n",
                   StepLine(r, first, target, elapsed).c_str());
    }
    if (r.halt) {
      if (logs.writer) {
        std::fprintf(stderr,
                     "\nhalted by the spike protocol: %zu skipped steps within %lld steps "
                     "(train.spike_max_skips = %lld); state saved at step %llu\n",
                     trainer.state().spike.recent_skips.size(),
                     static_cast<long long>(config.train.spike_window),
                     static_cast<long long>(config.train.spike_max_skips),
                     static_cast<unsigned long long>(r.step));
      }
      exit_code = 1;
      break;
    }
  }
  if (tty && logs.writer) std::fprintf(stderr, "\n");
  return exit_code;
}

// Each process's peak RSS (the moments' share falls as 1/N: docs/distributed.md) and, on a
// device, what keeping the state there cost per step since step `first` (the copies for the
// hash and checkpoints), on rank 0's stderr.
void PrintCosts(const TrainOptions& options, Comm& comm, const Trainer& trainer, uint64_t first,
                const OpExecutor::Traffic& device_before) {
  const uint64_t peak = PeakRssBytes();
  std::vector<uint64_t> peaks(static_cast<size_t>(comm.size()));
  comm.Allgather(std::as_bytes(std::span(&peak, 1)), std::as_writable_bytes(std::span(peaks)));
  if (comm.rank() != 0) return;
  std::string line;
  for (size_t r = 0; r < peaks.size(); ++r) {
    line +=
        fmt::format("{}{:.1f} MiB", r == 0 ? "" : ", ", static_cast<double>(peaks[r]) / (1 << 20));
  }
  std::fprintf(stderr, "peak RSS %s: %s\n", comm.size() == 1 ? "of the process" : "per rank",
               line.c_str());
  if (options.executor == nullptr || trainer.state().step == first) return;
  const OpExecutor::Traffic t = options.executor->traffic();
  const auto steps = static_cast<double>(trainer.state().step - first);
  std::fprintf(stderr,
               "device copies per step: %.2f MiB to the device, %.2f MiB back (%.2f MiB kept "
               "there)\n",
               static_cast<double>(t.to_device - device_before.to_device) / steps / (1 << 20),
               static_cast<double>(t.to_host - device_before.to_host) / steps / (1 << 20),
               static_cast<double>(t.kept) / (1 << 20));
}

// The distribution of a run with more than one process, on rank 0's stderr.
void PrintDistribution(Comm& comm, const RunConfig& config, const Trainer& trainer) {
  if (comm.rank() != 0 || comm.size() == 1) return;
  std::fprintf(stderr, "training with %d processes (train.grad_groups = %lld): %s\n", comm.size(),
               static_cast<long long>(config.train.grad_groups),
               trainer.fully_sharded()
                   ? "fully sharded, each rank holding its range of the parameters, gradients "
                     "and moments (docs/distributed.md)"
                   : "every rank holding every parameter and a group buffer, its range of the "
                     "gradients and moments (docs/distributed.md)");
}

int Train(const TrainOptions& options, Comm& comm) {
  SetThreads(options.threads);
  const Job job = LoadJob(options, comm);
  const Storage storage{options.spill_dir, options.activations};
  CheckMemory(options, job.config, storage, comm);
  std::optional<Trainer> built;
  AgreeOrFail(comm, [&] {
    built.emplace(job.config, job.dataset, RunDescriptor(job.config, job.dataset), storage, &comm);
    built->set_faults(options.faults);
  });
  Trainer& trainer = *built;
  trainer.set_progress(options.progress && comm.rank() == 0);
  trainer.set_executor(options.executor);
  PrintDistribution(comm, job.config, trainer);
  RunLogs logs(options, comm);
  if (options.resume) {
    ResumeRun(options, comm, trainer, logs);
  } else {
    StartRun(options, comm, trainer, logs);
  }
  const uint64_t first = trainer.state().step;
  const OpExecutor::Traffic device_before =
      options.executor != nullptr ? options.executor->traffic() : OpExecutor::Traffic{};
  const int exit_code = StepUntil(options, job.config, job.target, trainer, logs);
  PrintCosts(options, comm, trainer, first, device_before);
  if (logs.writer) PrintLossCurve(logs.layout.metrics(), job.dataset.unigram_entropy_nats());
  return exit_code;
}

}  // namespace

int RunTraining(const TrainOptions& options) {
  const std::unique_ptr<Comm> comm = MakeWorldComm(options.comm_timeout_seconds);
  try {
    return Train(options, *comm);
  } catch (const Error& e) {
    if (comm->size() == 1) throw;
    // Every rank's error reaches the terminal, with its rank. mpirun stops the whole job as soon
    // as one rank exits non-zero, so a rank that fails lingers a moment after reporting: ranks
    // that fail together (a verdict every rank reached) all get their message out.
    const bool internal = dynamic_cast<const InternalError*>(&e) != nullptr;
    std::fprintf(stderr, "lockstep: %s: rank %d of %d: %s\n", internal ? "internal error" : "error",
                 comm->rank(), comm->size(), e.what());
    std::fflush(stderr);
    std::this_thread::sleep_for(std::chrono::seconds(1));
    if (internal) return kInternalErrorExit;
    return dynamic_cast<const CommFailure*>(&e) != nullptr ? kCommFailureExit : 2;
  }
}

}  // namespace lockstep::train
