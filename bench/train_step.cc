// bench_train_step: tokens/s of whole lockstep training steps at 1 and 2 threads, and the peak
// RSS of one step.
//
// A step is train::Trainer::Step(), the same function `lockstep train` runs: the microbatches'
// forward/backward, the global norm, clipping, AdamW over every tensor and the chained state
// hash. The Trainer reads its tokens from a dataset, so the benchmark writes a small synthetic
// corpus (data::WriteSynthCorpus) into a temporary directory first; the token values do not
// change the cost of a step. The state hash is part of what lockstep pays per step, so it stays
// in the timing; it is also timed alone and reported, since bench/torch_reference.py has no
// counterpart to it.
//
// Throughput mode (default): for each thread count, a fresh Trainer is initialised, makes one
// warm-up step and then N timed steps (best and median reported). Both runs make the same
// steps from the same state, so their final state hashes -- which cover every parameter,
// moment and gradient -- must be equal: that is the bitwise check across thread counts.
//
// MFU: the model FLOPs of a step (lockstep::ModelFlopsPerStep: the standard count) divided by
// the step time, as a fraction of lockstep's own GEMM rate measured in the same process at the
// same thread count on the step's largest linear-layer shape (tokens of a microbatch × the FFN's
// gate/up rows × d_model). It says how much of the step runs at GEMM speed.
//
// --profile mode: after a warm-up step, N steps at --threads with an OpObserver that times every
// kernel call of the step; prints seconds per step by op (GEMMs by form and shape, with their
// GFLOP/s), the share of the step, and the time outside any observed op.
//
// --flops mode: the step's model FLOPs and the GEMM rate only, without training.
//
// --peak-rss mode: one step of the config with microbatch 1 x seq 256 (one microbatch), then
// the process's peak resident set size (getrusage ru_maxrss). ru_maxrss is a high-water mark
// of the whole process, so each invocation is exactly one measurement and does nothing else.
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <sys/resource.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <string>
#include <tuple>
#include <vector>

#include "lockstep/core.h"
#include "lockstep/data.h"
#include "lockstep/kernels.h"
#include "lockstep/model.h"
#include "lockstep/state.h"
#include "lockstep/train.h"
#include "op_timer.h"

namespace {

namespace fs = std::filesystem;
using lockstep::Fail;
using lockstep::RunConfig;
namespace data = lockstep::data;
namespace train = lockstep::train;

// Enough text that a few steps do not wrap around an epoch; the stream wraps regardless, and
// the corpus stays a negligible part of the peak RSS.
constexpr uint64_t kCorpusTokens = 1 << 20;
constexpr uint64_t kCorpusSeed = 1;
constexpr int64_t kPeakRssSeq = 256;

// A directory under the system temp dir, removed with everything in it on scope exit.
class TempDir {
 public:
  TempDir() {
    std::string pattern = (fs::temp_directory_path() / "lockstep-bench-XXXXXX").string();
    if (mkdtemp(pattern.data()) == nullptr) Fail("bench_train_step: mkdtemp({}) failed", pattern);
    path_ = pattern;
  }
  ~TempDir() {
    std::error_code ignored;  // best effort: a leftover temp dir is not worth a crash
    fs::remove_all(path_, ignored);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const fs::path& path() const { return path_; }

 private:
  fs::path path_;
};

data::Dataset SynthDataset(const TempDir& tmp) {
  const fs::path dir = tmp.path() / "corpus";
  data::WriteSynthCorpus(dir, kCorpusSeed, kCorpusTokens);
  return data::OpenDataset(dir);
}

double Seconds(std::chrono::steady_clock::time_point since) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - since).count();
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 == 1 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// lockstep's GEMM rate (GFLOP/s) on the step's largest linear-layer shape, best of a few runs.
double GemmGflops(const RunConfig& config, int threads) {
  lockstep::SetThreads(threads);
  const int64_t m = config.train.microbatch * config.model.seq_len;
  const int64_t n = 2 * config.model.ffn_hidden, k = config.model.d_model;
  std::vector<float> x(static_cast<size_t>(m * k), 0.5f), w(static_cast<size_t>(n * k), 0.25f);
  std::vector<float> y(static_cast<size_t>(m * n));
  double best = 1e30;
  for (int rep = 0; rep < 5; ++rep) {
    const auto start = std::chrono::steady_clock::now();
    lockstep::rk::GemmXWt(x, w, y, m, n, k);
    best = std::min(best, Seconds(start));
  }
  return 2.0 * static_cast<double>(m) * static_cast<double>(n) * static_cast<double>(k) / best *
         1e-9;
}

struct Measurement {
  int threads = 0;
  int64_t tokens_per_step = 0;
  double gemm_gflops = 0;  // GemmGflops at this thread count
  double best_seconds = 0, median_seconds = 0;
  double hash_seconds = 0;  // one ComputeStateHash of the final state (a copy), alone
  lockstep::StateHash final_hash;
};

// A step whose update the spike protocol skipped does no AdamW work: timing it would flatter
// the result, so the benchmark refuses rather than report it.
void RequireUpdate(const train::StepReport& r, const RunConfig& config) {
  if (r.skipped) {
    Fail("bench_train_step: {} step {} skipped its update (loss {}, grad norm {}); the timing "
         "would not be of a full step",
         config.name, r.step, r.loss, r.grad_norm);
  }
}

Measurement Measure(const RunConfig& config, const data::Dataset& dataset, int threads,
                    int steps) {
  lockstep::SetThreads(threads);
  train::Trainer trainer(config, dataset, train::RunDescriptor(config, dataset));
  trainer.Initialize();
  RequireUpdate(trainer.Step(), config);  // warm-up: first touch of the arena, thread start-up

  std::vector<double> seconds;
  for (int s = 0; s < steps; ++s) {
    const auto start = std::chrono::steady_clock::now();
    const train::StepReport r = trainer.Step();
    seconds.push_back(Seconds(start));
    RequireUpdate(r, config);
  }
  Measurement m;
  m.threads = threads;
  m.tokens_per_step = trainer.tokens_per_step();
  m.gemm_gflops = GemmGflops(config, threads);
  m.best_seconds = *std::min_element(seconds.begin(), seconds.end());
  m.median_seconds = Median(seconds);
  // An independent recomputation: every array copied out of the trainer and hashed at once
  // (the hash alone is timed).
  std::vector<std::array<std::vector<float>, lockstep::kStateArrayCount>> arrays;
  std::vector<lockstep::TensorState> tensors;
  for (size_t i = 0; i < trainer.tensors().size(); ++i) {
    const lockstep::TensorShape& t = trainer.tensors()[i];
    int64_t numel = 1;
    for (const int64_t d : t.shape) numel *= d;
    auto& a = arrays.emplace_back();
    for (int k = 0; k < lockstep::kStateArrayCount; ++k) {
      a[k].resize(static_cast<size_t>(numel));
      trainer.ReadPiece(i, static_cast<lockstep::StateArray>(k), 0, a[k]);
    }
  }
  for (size_t i = 0; i < arrays.size(); ++i) {
    tensors.push_back({trainer.tensors()[i].name, trainer.tensors()[i].shape, arrays[i][0],
                       arrays[i][1], arrays[i][2], arrays[i][3], {}});
  }
  const auto start = std::chrono::steady_clock::now();
  m.final_hash = lockstep::ComputeStateHash(trainer.state(), tensors);
  m.hash_seconds = Seconds(start);
  if (m.final_hash.hash != trainer.hash()) {
    Fail("bench_train_step: recomputing the state hash gave {}, the trainer holds {}",
         lockstep::ToHex(m.final_hash.hash), lockstep::ToHex(trainer.hash()));
  }
  return m;
}

int RunThroughput(const RunConfig& config, int steps, bool json) {
  const TempDir tmp;
  const data::Dataset dataset = SynthDataset(tmp);
  const std::string isa = lockstep::rk::ActiveIsa().name;
  const double step_flops = lockstep::ModelFlopsPerStep(config);
  int64_t parameters = 0;
  for (const lockstep::ParamSpec& spec : lockstep::ParameterSpecs(config.model)) {
    parameters += spec.numel();
  }
  if (!json) {
    fmt::print("{}: {:.2f}M parameters, {} sequences x {} positions x {} microbatch(es) = {} "
               "tokens per step; lockstep variant {}\n"
               "one warm-up step, then best and median of {} steps (each includes the state "
               "hash; 'hash s' times it alone)\n",
               config.name, static_cast<double>(parameters) * 1e-6,
               config.train.microbatch, config.model.seq_len, config.train.microbatches,
               config.train.microbatch * config.model.seq_len * config.train.microbatches, isa,
               steps);
    fmt::print("model FLOPs per step: {:.2f} GFLOP\n", step_flops * 1e-9);
    fmt::print("{:>3} {:>12} {:>12} {:>10} {:>8} {:>9} {:>6}\n", "thr", "best s/step",
               "median s/st", "tokens/s", "hash s", "GEMM GF/s", "MFU");
    std::fflush(stdout);
  }
  std::vector<Measurement> results;
  for (int threads : {1, 2}) {
    results.push_back(Measure(config, dataset, threads, steps));
    const Measurement& m = results.back();
    if (!json) {
      fmt::print("{:>3} {:>12.3f} {:>12.3f} {:>10.0f} {:>8.3f} {:>9.1f} {:>6.3f}\n", m.threads,
                 m.best_seconds, m.median_seconds,
                 static_cast<double>(m.tokens_per_step) / m.best_seconds, m.hash_seconds,
                 m.gemm_gflops, step_flops / m.best_seconds * 1e-9 / m.gemm_gflops);
      std::fflush(stdout);
    }
  }
  const bool same = results[0].final_hash.hash == results[1].final_hash.hash;
  if (!same) {
    const auto differ = lockstep::DifferingComponents(results[0].final_hash, results[1].final_hash);
    fmt::print(stderr, "state hashes differ between 1 and 2 threads in: {}\n",
               fmt::join(differ, ", "));
  }
  if (json) {
    fmt::print("[\n");
    for (size_t i = 0; i < results.size(); ++i) {
      const Measurement& m = results[i];
      fmt::print("  {{\"config\": \"{}\", \"threads\": {}, \"tokens_per_step\": {}, "
                 "\"seconds_per_step\": {:.4f}, \"median_seconds_per_step\": {:.4f}, "
                 "\"tokens_per_second\": {:.1f}, \"state_hash_seconds\": {:.4f}, "
                 "\"model_gflop_per_step\": {:.3f}, \"model_gflops\": {:.2f}, "
                 "\"gemm_gflops\": {:.2f}, \"mfu_vs_gemm\": {:.4f}, "
                 "\"bitwise_same_across_threads\": {}, \"lockstep_variant\": \"{}\"}}{}\n",
                 config.name, m.threads, m.tokens_per_step, m.best_seconds, m.median_seconds,
                 static_cast<double>(m.tokens_per_step) / m.best_seconds, m.hash_seconds,
                 step_flops * 1e-9, step_flops / m.best_seconds * 1e-9,
                 m.gemm_gflops, step_flops / m.best_seconds * 1e-9 / m.gemm_gflops, same,
                 isa, i + 1 < results.size() ? "," : "");
    }
    fmt::print("]\n");
  } else {
    fmt::print("final state hash after {} steps, 1 vs 2 threads: {} ({})\n", steps + 1,
               same ? "bitwise identical" : "DIFFERENT", lockstep::ToHex(results[0].final_hash.hash));
  }
  return same ? 0 : 1;
}

using lockstep::bench::OpTimer;

int RunProfile(const RunConfig& config, int threads, int steps) {
  const TempDir tmp;
  const data::Dataset dataset = SynthDataset(tmp);
  lockstep::SetThreads(threads);
  train::Trainer trainer(config, dataset, train::RunDescriptor(config, dataset));
  trainer.Initialize();
  RequireUpdate(trainer.Step(), config);
  OpTimer timer;
  trainer.set_observer(&timer);
  const auto start = std::chrono::steady_clock::now();
  for (int s = 0; s < steps; ++s) RequireUpdate(trainer.Step(), config);
  const double step_seconds = Seconds(start) / steps;
  std::vector<std::pair<std::string, OpTimer::Total>> rows(timer.totals().begin(),
                                                           timer.totals().end());
  std::sort(rows.begin(), rows.end(),
            [](const auto& a, const auto& b) { return a.second.seconds > b.second.seconds; });
  fmt::print("{}: {} thread(s), variant {}, {:.3f} s per step (mean of {}, with the observer)\n",
             config.name, threads, lockstep::rk::ActiveIsa().name, step_seconds, steps);
  fmt::print("{:<34} {:>7} {:>10} {:>7} {:>8}\n", "op (gemm: m x n x k)", "calls", "s/step",
             "share", "GFLOP/s");
  double observed = 0;
  for (const auto& [key, t] : rows) {
    observed += t.seconds / steps;
    fmt::print("{:<34} {:>7} {:>10.4f} {:>6.1f}% {:>8}\n", key, t.calls / steps, t.seconds / steps,
               100 * t.seconds / steps / step_seconds,
               t.flops > 0 ? fmt::format("{:.1f}", t.flops / t.seconds * 1e-9) : "");
  }
  fmt::print("{:<34} {:>7} {:>10.4f} {:>6.1f}%\n", "(outside observed ops)", "",
             step_seconds - observed, 100 * (step_seconds - observed) / step_seconds);
  return 0;
}

int RunPeakRss(RunConfig config, int threads, bool json) {
  // Memory is dominated by the parameters, gradients and both moments, which do not depend on
  // the batch; one microbatch of one short sequence shows that floor and keeps the step quick.
  config.train.microbatch = 1;
  config.train.microbatches = 1;
  config.model.seq_len = std::min(config.model.seq_len, kPeakRssSeq);
  lockstep::SetThreads(threads);
  const TempDir tmp;
  const data::Dataset dataset = SynthDataset(tmp);
  int64_t parameters = 0;
  {
    train::Trainer trainer(config, dataset, train::RunDescriptor(config, dataset));
    trainer.Initialize();
    RequireUpdate(trainer.Step(), config);
    for (const lockstep::ParamSpec& spec : lockstep::ParameterSpecs(config.model)) {
      parameters += spec.numel();
    }
  }
  rusage usage{};
  if (getrusage(RUSAGE_SELF, &usage) != 0) Fail("bench_train_step: getrusage failed");
  const int64_t peak = static_cast<int64_t>(usage.ru_maxrss) * 1024;  // Linux: kilobytes
  if (json) {
    fmt::print("{{\"config\": \"{}\", \"microbatch\": {}, \"seq\": {}, \"threads\": {}, "
               "\"parameters\": {}, \"peak_rss_bytes\": {}}}\n",
               config.name, config.train.microbatch, config.model.seq_len, threads, parameters,
               peak);
  } else {
    // 4 fp32 copies of the parameters: values, gradients and the two AdamW moments.
    fmt::print("{}: one step, microbatch {} x seq {}, {} thread(s): peak RSS {:.1f} MiB "
               "({:.1f} MiB of it the 4 fp32 copies of {:.2f}M parameters)\n",
               config.name, config.train.microbatch, config.model.seq_len, threads,
               static_cast<double>(peak) / (1 << 20),
               static_cast<double>(parameters) * 16 / (1 << 20),
               static_cast<double>(parameters) * 1e-6);
  }
  return 0;
}

// --flops mode: the model FLOPs of one step and the GEMM rate at --threads, without training
// (for a config too large to hold: bench/replay_open1b.sh sets its step's compute limit by it).
int RunFlops(const RunConfig& config, int threads) {
  fmt::print("{{\"config\": \"{}\", \"threads\": {}, \"step_flops\": {:.6e}, \"gemm_gflops\": {:.1f}}}\n",
             config.name, threads, lockstep::ModelFlopsPerStep(config),
             GemmGflops(config, threads));
  return 0;
}

int Usage() {
  fmt::print(stderr,
             "usage: bench_train_step [--config NAME|PATH] [--steps N] [--json]\n"
             "       bench_train_step --profile [--config NAME|PATH] [--threads N] [--steps N]\n"
             "       bench_train_step --peak-rss [--config NAME|PATH] [--threads N] [--json]\n"
             "       bench_train_step --flops [--config NAME|PATH] [--threads N]\n"
             "  Times whole training steps (train::Trainer::Step) of a config (default\n"
             "  bench-8x512) at 1 and 2 threads: one warm-up step, then best and median of N\n"
             "  (default 3), and checks that the final state hashes are bitwise identical.\n"
             "  --profile times every kernel call of N steps at --threads (default 1) and prints\n"
             "  seconds per step by op (GEMMs by shape, with GFLOP/s) and the share of the step.\n"
             "  --peak-rss runs one step with microbatch 1 x seq 256 and reports the peak RSS;\n"
             "  it measures the whole process, so run one invocation per measurement.\n"
             "  --flops prints one JSON object, the model FLOPs of a step and the GEMM rate\n"
             "  (GFLOP/s) at --threads on the step's largest linear-layer shape; no training.\n");
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  std::string config_name = "bench-8x512";
  int steps = 3, threads = 1;
  bool json = false, peak_rss = false, profile = false, flops = false;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--json") {
      json = true;
    } else if (arg == "--peak-rss") {
      peak_rss = true;
    } else if (arg == "--profile") {
      profile = true;
    } else if (arg == "--flops") {
      flops = true;
    } else if (arg == "--config" && i + 1 < argc) {
      config_name = argv[++i];
    } else if (arg == "--steps" && i + 1 < argc) {
      steps = std::atoi(argv[++i]);
      if (steps < 1) return Usage();
    } else if (arg == "--threads" && i + 1 < argc) {
      threads = std::atoi(argv[++i]);
      if (threads < 1) return Usage();
    } else {
      return Usage();
    }
  }
  try {
    lockstep::RequireIeeeFloatingPoint();
    const RunConfig config = lockstep::LoadRunConfig(config_name);
    if (profile) return RunProfile(config, threads, steps);
    if (flops) return RunFlops(config, threads);
    return peak_rss ? RunPeakRss(config, threads, json) : RunThroughput(config, steps, json);
  } catch (const lockstep::Error& e) {
    fmt::print(stderr, "bench_train_step: {}\n", e.what());
    return 1;
  }
}
