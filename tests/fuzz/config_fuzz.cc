#include "fuzz/fuzz_target.h"
#include "lockstep/model.h"
#include "lockstep/train.h"

// A config that parses must also describe itself and size its state and activations without
// overflow (the bounds exist for that).
LOCKSTEP_FUZZ_TARGET({
  const lockstep::RunConfig config = lockstep::ParseRunConfig(text, "fuzz.yaml");
  (void)lockstep::DescriptorJson(config);
  (void)lockstep::ParameterSpecs(config.model);
  (void)lockstep::train::StateBytes(config.model);
  (void)lockstep::Model::AllocatedBytes(config.model, config.train.vocab_chunk,
                                        config.train.microbatch, config.model.seq_len);
})
