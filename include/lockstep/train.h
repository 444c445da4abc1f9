// lockstep train: the training loop. A step is M microbatches in a canonical order, AdamW with
// parameter groups, a warmup + cosine (or WSD) schedule, stateless global-norm clipping, the
// spike protocol, and the chained state hash after every step (docs/training.md).
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "lockstep/data.h"
#include "lockstep/model.h"
#include "lockstep/state.h"

namespace lockstep::train {

// The learning rate of step `step` (1-based) under config.train (docs/training.md).
float LearningRate(const TrainConfig& config, int64_t step);

// What one step did, for metrics and the progress line.
struct StepReport {
  uint64_t step = 0;
  float loss = 0, zloss = 0, grad_norm = 0, clip_factor = 1, lr = 0;
  bool skipped = false;
  bool halt = false;  // the spike protocol saw spike_max_skips skips within spike_window steps
  int64_t tokens = 0;  // tokens this step consumed
  double seconds = 0;
};

// The whole training state of a run and the step function. Owns the parameters, both AdamW
// moments and the gradients of the last step.
class Trainer {
 public:
  // descriptor: the canonical run descriptor (RunDescriptor()).
  Trainer(const RunConfig& config, const data::Dataset& dataset, std::string descriptor);

  // Step 0: initialised parameters, zero moments and gradients, and its state hash.
  void Initialize();
  // Restores a checkpoint (verified by the caller) written by a run with the same descriptor.
  void Restore(const Checkpoint& checkpoint);
  // Makes step state().step + 1 and hashes the result.
  StepReport Step();

  const StepState& state() const { return state_; }
  const Digest& hash() const { return hash_.hash; }
  const StateHash& state_hash() const { return hash_; }
  const ParamStore& params() const { return params_; }
  std::vector<TensorState> Tensors() const;
  int64_t tokens_per_step() const;

 private:
  void Rehash();

  RunConfig config_;
  data::TokenStream stream_;
  Model model_;
  ParamStore params_, grads_, m_, v_;
  StepState state_;
  StateHash hash_;
  std::vector<uint32_t> tokens_;  // one microbatch: [microbatch, seq_len + 1]
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
};

// `lockstep train`: trains into run_dir (metrics.jsonl, state_hashes.jsonl, checkpoints/).
// Returns the process exit code: 0 done, 1 halted by the spike protocol.
int RunTraining(const TrainOptions& options);

}  // namespace lockstep::train
