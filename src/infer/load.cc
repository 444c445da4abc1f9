// The verified parameter load: checkpoint -> config -> parameters.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>

#include "lockstep/infer.h"

namespace lockstep::infer {

RunConfig ConfigOfCheckpoint(const Checkpoint& checkpoint) {
  return ConfigOfDescriptor(checkpoint.state.descriptor,
                            (checkpoint.dir / RunLayout::kMeta).string() + " descriptor");
}

RunConfig ConfigOfCheckpoint(const CheckpointIndex& checkpoint) {
  return ConfigOfDescriptor(checkpoint.state.descriptor,
                            (checkpoint.dir / RunLayout::kMeta).string() + " descriptor");
}

VerifiedModel LoadVerified(const std::filesystem::path& dir) {
  const CheckpointIndex ckpt = OpenCheckpoint(dir);
  RunConfig config = ConfigOfCheckpoint(ckpt);
  // The tensors must be those the recorded config makes, in its order: a descriptor that does
  // not match them names the checkpoint, not a model of another shape.
  std::vector<ParamSpec> specs = ParameterSpecs(config.model);
  if (ckpt.tensors.size() != specs.size()) {
    Fail("{}: holds {} tensors; its descriptor's model has {}", dir.string(), ckpt.tensors.size(),
         specs.size());
  }
  for (size_t i = 0; i < specs.size(); ++i) {
    const TensorShape& t = ckpt.tensors[i];
    if (t.name != specs[i].name || t.shape != specs[i].shape) {
      Fail("{}: tensor {} is '{}' [{}]; its descriptor's model has '{}' [{}]", dir.string(), i,
           t.name, fmt::join(t.shape, ", "), specs[i].name, fmt::join(specs[i].shape, ", "));
    }
  }
  ParamStore params(std::move(specs));
  VerifyStreamedHash(ckpt,
                     StreamCheckpoint(ckpt, kCheckpointPieceFloats,
                                      [&](size_t i, StateArray a, int64_t begin,
                                          std::span<const float> piece, std::span<const Digest>) {
                                        if (a != StateArray::kParam) return;
                                        std::ranges::copy(piece, params.Tensor(i).begin() + begin);
                                      }));
  return {dir, std::move(config), ckpt.state.descriptor, ckpt.state_hash, ckpt.state.step,
          std::move(params)};
}

}  // namespace lockstep::infer
