// The learning-rate schedule and the spike protocol: docs/training.md, "Step s", steps 1 and 5.
// Their float arithmetic is in the chain (the lr's bits are hashed): change nothing's order.
#include "train/schedule.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "lockstep/kernels.h"

namespace lockstep::train {

float LearningRate(const TrainConfig& c, int64_t step) {
  const float peak = static_cast<float>(c.lr), floor = static_cast<float>(c.min_lr);
  if (step <= c.warmup_steps) {
    return peak * (static_cast<float>(step) / static_cast<float>(c.warmup_steps));
  }
  const int64_t span = c.steps - c.warmup_steps;
  if (span <= 0 || step > c.steps) return floor;
  if (c.schedule == "cosine") {
    // floor + (peak - floor) * 0.5 * (1 + cos(pi * progress)), progress in (0, 1].
    const float progress = static_cast<float>(step - c.warmup_steps) / static_cast<float>(span);
    const float cosine = dmath::Cos(3.14159265f * progress);
    return floor + (peak - floor) * (0.5f * (1.0f + cosine));
  }
  // "wsd": warmup, stable at peak, then a linear decay to floor over the last
  // wsd_decay_fraction of the steps (at least one step).
  const int64_t decay_steps =
      std::max<int64_t>(1, static_cast<int64_t>(std::llround(c.wsd_decay_fraction * c.steps)));
  const int64_t decay_start = c.steps - decay_steps;
  if (step <= decay_start) return peak;
  const float remaining = static_cast<float>(c.steps - step) / static_cast<float>(decay_steps);
  return floor + (peak - floor) * remaining;
}

bool NormSkips(float grad_norm, double spike_threshold) {
  return !std::isfinite(grad_norm) || grad_norm > static_cast<float>(spike_threshold);
}

SpikeOutcome SpikeRule(const TrainConfig& config, const SpikeState& before, uint64_t step,
                       float loss, float zloss, float grad_norm) {
  SpikeOutcome out{
      .skipped = !std::isfinite(loss + zloss) || NormSkips(grad_norm, config.spike_threshold),
      .halt = false,
      .state = before};
  SpikeState& spike = out.state;
  std::erase_if(spike.recent_skips,
                [&](uint64_t s) { return step - s >= static_cast<uint64_t>(config.spike_window); });
  if (out.skipped) {
    spike.total_skips += 1;
    spike.recent_skips.push_back(step);
    out.halt = spike.recent_skips.size() >= static_cast<size_t>(config.spike_max_skips);
  }
  return out;
}

}  // namespace lockstep::train
