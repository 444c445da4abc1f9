// lockstep infer: the trained model used outside training. The verified parameter load
// (checkpoint -> config -> parameters, every file's digest and the state hash checked before
// anything is used), a forward that needs no targets with a KV cache for decoding, generation with
// receipts, and export to other runtimes' formats. Layered above model, data and state, beside
// train (docs/architecture.md).
#pragma once

#include <cstdint>
#include <filesystem>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "lockstep/model.h"
#include "lockstep/state.h"

namespace lockstep::infer {

// ---- the verified load ------------------------------------------------------------------------
// The run config a checkpoint was trained with: its descriptor through ConfigOfDescriptor.
RunConfig ConfigOfCheckpoint(const Checkpoint& checkpoint);
RunConfig ConfigOfCheckpoint(const CheckpointIndex& checkpoint);

// A checkpoint's parameters, loaded and verified.
struct VerifiedModel {
  std::filesystem::path dir;
  RunConfig config;
  std::string descriptor;  // the run descriptor the checkpoint records
  Digest state_hash{};     // meta.json's, equal to the one recomputed from the files
  uint64_t step = 0;
  ParamStore params;
};
// Streams `dir` (a complete checkpoint, RUN/checkpoints/step_*) in pieces: RAM ~ the parameters,
// not the moments. Checks every file's digest, the state hash, and that the tensors are the ones
// the recorded config makes, by name, shape and order; fails naming the directory, the tensor and
// both values. Nothing is returned before every check has passed.
VerifiedModel LoadVerified(const std::filesystem::path& dir);

}  // namespace lockstep::infer
