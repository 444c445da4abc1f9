// The rules a step follows around its update (docs/training.md, "Step s"): the learning-rate
// schedule (step 1; `LearningRate`, declared in lockstep/train.h, is defined in schedule.cc)
// and the spike protocol (step 5). Pure functions of the config and their arguments: the bits
// they give are part of every run's chain.
#pragma once

#include <cstdint>

#include "lockstep/model.h"
#include "lockstep/state.h"
#include "lockstep/train.h"

namespace lockstep::train {

// Whether a global norm alone skips a step: not finite, or above train.spike_threshold (compared
// as binary32: a norm equal to the threshold rounded to binary32 does not skip).
bool NormSkips(float grad_norm, double spike_threshold);

// What the spike protocol makes of step `step` (1-based).
struct SpikeOutcome {
  bool skipped = false;  // no update: loss + zloss or the norm not finite, or NormSkips
  bool halt = false;     // skipped, and `state` now holds train.spike_max_skips recent skips
  SpikeState state;      // the spike state after the step
};
// Step 5 of docs/training.md, from the spike state `before` the step: first the skips at steps
// `e` with `step - e >= train.spike_window` leave recent_skips; a skipped step then counts in
// total_skips and is appended to recent_skips, and halts the run when recent_skips then holds
// train.spike_max_skips steps. A step that is not skipped never halts.
SpikeOutcome SpikeRule(const TrainConfig& config, const SpikeState& before, uint64_t step,
                       float loss, float zloss, float grad_norm);

}  // namespace lockstep::train
