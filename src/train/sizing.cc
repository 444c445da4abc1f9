// The run's sizing: what the state, the group buffers and a device's working set take, and the
// unit of who holds which elements. Below the stores and the trainer, which both ask it, and
// calling neither (docs/training.md, "Storage: in RAM or on disk").
#include <fmt/format.h>

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "lockstep/train.h"
#include "train/state_store.h"

namespace lockstep::train {

uint64_t StateBytes(const ModelConfig& model) {
  uint64_t floats = 0;
  for (const ParamSpec& spec : ParameterSpecs(model)) floats += static_cast<uint64_t>(spec.numel());
  return floats * sizeof(float) * kStateArrayCount;
}

int64_t OwnershipUnit(const Storage& storage) {
  // A spilled rank's pieces are whole spill chunks (SpillStore), so its range is too.
  return storage.spill_dir ? kSpillChunkFloats : kHashChunkFloats;
}

void PlanDeviceMemory(const RunConfig& config, const Storage& storage, int ranks, int rank,
                      OpExecutor& executor) {
  const ModelConfig& m = config.model;
  const std::vector<ParamSpec> specs = ParameterSpecs(m);
  const int64_t rows = config.train.microbatch * m.seq_len;
  int64_t largest = std::max({rows * m.vocab, rows * 2 * m.ffn_hidden,
                              rows * std::max(m.d_model, m.n_heads * m.head_dim)});
  uint64_t state = 0;
  const bool sharded = FullySharded(config, ranks, storage);
  const std::vector<std::vector<int64_t>> bounds =
      OwnershipBounds(specs, ranks, OwnershipUnit(storage));
  for (size_t i = 0; i < specs.size(); ++i) {
    largest = std::max(largest, specs[i].numel());
    const auto r = static_cast<size_t>(rank);
    // The parameters whole (fully sharded: the range this rank holds); the moments and the
    // gradient of that range.
    const int64_t held = bounds[i][r + 1] - bounds[i][r];
    const int64_t params = sharded ? held : specs[i].numel();
    if (!storage.spill_dir) state += sizeof(float) * static_cast<uint64_t>(params + 3 * held);
  }
  const uint64_t group = GroupBufferBytes(config, ranks, storage);
  const auto activations = static_cast<uint64_t>(Model::AllocatedBytes(
      m, config.train.vocab_chunk, config.train.microbatch, m.seq_len, storage.activations));
  // One op's temporaries: the head's logits, and for a state on disk one update's pieces.
  const auto floats = [](int64_t n) { return sizeof(float) * static_cast<uint64_t>(n); };
  const uint64_t pieces =
      storage.spill_dir ? kStateArrayCount * floats(std::min(largest, kSpillPieceFloats)) : 0;
  // Sharded, the gathered parameters and the open gradient are copied in with each op.
  const uint64_t gathered = sharded ? 2 * floats(largest) : 0;
  const uint64_t scratch = floats(rows * m.vocab) + pieces + gathered;
  const auto size = [](uint64_t b) {
    return b >= (uint64_t{1} << 30) ? fmt::format("{:.2f} GiB", static_cast<double>(b) / (1 << 30))
                                    : fmt::format("{:.1f} MiB", static_cast<double>(b) / (1 << 20));
  };
  executor.Plan(state + group + activations + scratch, floats(largest),
                fmt::format("state {}, group gradients {}, activations {}, one op's temporaries {}",
                            size(state), size(group), size(activations), size(scratch)));
}

bool FullySharded(const RunConfig& config, int processes, const Storage& storage) {
  return processes > 1 && config.train.microbatches == config.train.grad_groups &&
         !storage.spill_dir;
}

uint64_t GroupBufferBytes(const RunConfig& config, int processes, const Storage& storage) {
  const bool needed =
      (config.train.grad_groups > 1 || processes > 1) && !FullySharded(config, processes, storage);
  return needed ? StateBytes(config.model) / kStateArrayCount : 0;
}

}  // namespace lockstep::train
