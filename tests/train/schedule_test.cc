// The learning-rate schedule and the spike protocol (src/train/schedule.h) against
// docs/training.md, "Step s": steps 1 and 5. Expected values are the doc's formulas written out
// here again, in double (within a tight tolerance) or, where the doc gives the float expression
// and it is short, in float and compared exactly; never by calling the code a second time.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <numbers>
#include <string>
#include <vector>

#include "lockstep/model.h"
#include "lockstep/state.h"
#include "lockstep/train.h"
#include "train/schedule.h"

namespace lockstep::train {
namespace {

TrainConfig Schedule(const std::string& kind, int64_t steps, int64_t warmup,
                     double fraction = 0.2) {
  TrainConfig c;
  c.schedule = kind;
  c.steps = steps;
  c.warmup_steps = warmup;
  c.lr = 1.0e-3;
  c.min_lr = 1.0e-4;
  c.wsd_decay_fraction = fraction;
  return c;
}

// The doc's peak and floor are train.lr and train.min_lr as binary32.
double Peak(const TrainConfig& c) { return static_cast<float>(c.lr); }
double Floor(const TrainConfig& c) { return static_cast<float>(c.min_lr); }

// The binary32 rounding of the doc's formulas leaves a few units in the last place of peak.
double Tolerance(const TrainConfig& c) { return 1e-6 * Peak(c); }

// docs/training.md: `s <= W`: peak * ((float)s / (float)W).
float WarmupFloat(const TrainConfig& c, int64_t s) {
  return static_cast<float>(c.lr) * (static_cast<float>(s) / static_cast<float>(c.warmup_steps));
}

// docs/training.md, cosine, in double: floor + (peak - floor) * 0.5 * (1 + cos(pi * p)),
// p = (s - W) / (S - W).
double CosineDouble(const TrainConfig& c, int64_t s) {
  const double p =
      static_cast<double>(s - c.warmup_steps) / static_cast<double>(c.steps - c.warmup_steps);
  return Floor(c) + (Peak(c) - Floor(c)) * 0.5 * (1.0 + std::cos(std::numbers::pi * p));
}

TEST(Schedule, WarmupRisesLinearlyFromZeroToPeakAtItsLastStep) {
  for (const std::string kind : {"cosine", "wsd"}) {
    SCOPED_TRACE(kind);
    const TrainConfig c = Schedule(kind, 100, 10);
    EXPECT_EQ(LearningRate(c, 0), 0.0f);  // step 0, the init, is at 0/W of the peak
    for (int64_t s = 1; s <= c.warmup_steps; ++s) {
      EXPECT_EQ(LearningRate(c, s), WarmupFloat(c, s)) << "step " << s;
      EXPECT_NEAR(LearningRate(c, s), Peak(c) * static_cast<double>(s) / 10.0, Tolerance(c))
          << "step " << s;
    }
    // The last step of warm-up is the peak itself: 10/10 is exactly 1.
    EXPECT_EQ(LearningRate(c, 10), static_cast<float>(c.lr));
    EXPECT_EQ(LearningRate(c, 1), static_cast<float>(c.lr) * 0.1f);
  }
}

TEST(Schedule, CosineAtItsBoundariesIsTheDocsFormula) {
  const TrainConfig c = Schedule("cosine", 100, 10);
  // The first step after warm-up: p = 1/90, just under the peak.
  EXPECT_NEAR(LearningRate(c, 11), CosineDouble(c, 11), Tolerance(c));
  EXPECT_LT(LearningRate(c, 11), static_cast<float>(c.lr));
  // Half way (p = 1/2): cos = 0, the mean of peak and floor.
  EXPECT_NEAR(LearningRate(c, 55), (Peak(c) + Floor(c)) / 2, Tolerance(c));
  // Every step of the decay, the last one (p = 1: the floor) included.
  for (int64_t s = 11; s <= 100; ++s) {
    EXPECT_NEAR(LearningRate(c, s), CosineDouble(c, s), Tolerance(c)) << "step " << s;
  }
  EXPECT_NEAR(LearningRate(c, 100), Floor(c), Tolerance(c));
  // Past S (a run resumed with --steps beyond train.steps): the floor, exactly.
  EXPECT_EQ(LearningRate(c, 101), static_cast<float>(c.min_lr));
  EXPECT_EQ(LearningRate(c, 1000), static_cast<float>(c.min_lr));

  // No warm-up (W = 0): step 1 is already the decay's first step, p = 1/S.
  const TrainConfig none = Schedule("cosine", 50, 0);
  EXPECT_NEAR(LearningRate(none, 1), CosineDouble(none, 1), Tolerance(none));
  EXPECT_NEAR(LearningRate(none, 50), Floor(none), Tolerance(none));
  // Warm-up as long as the run (S - W <= 0): warm-up to the peak at S, then the floor.
  const TrainConfig all = Schedule("cosine", 8, 8);
  EXPECT_EQ(LearningRate(all, 8), static_cast<float>(all.lr));
  EXPECT_EQ(LearningRate(all, 9), static_cast<float>(all.min_lr));
}

TEST(Schedule, WsdHoldsThePeakThenDecaysLinearlyOverItsLastDSteps) {
  // S = 10, W = 2, wsd_decay_fraction 0.25: D = llround(2.5) = 3 (llround rounds half away from
  // zero), so the peak holds to step S - D = 7 and steps 8, 9, 10 decay.
  const TrainConfig c = Schedule("wsd", 10, 2, 0.25);
  const float peak = static_cast<float>(c.lr), floor = static_cast<float>(c.min_lr);
  EXPECT_EQ(LearningRate(c, 2), peak);  // the last step of warm-up
  for (int64_t s = 3; s <= 7; ++s) EXPECT_EQ(LearningRate(c, s), peak) << "step " << s;
  // floor + (peak - floor) * ((float)(S - s) / (float)D), the doc's float expression.
  EXPECT_EQ(LearningRate(c, 8), floor + (peak - floor) * (2.0f / 3.0f));
  EXPECT_EQ(LearningRate(c, 9), floor + (peak - floor) * (1.0f / 3.0f));
  EXPECT_NEAR(LearningRate(c, 8), Floor(c) + (Peak(c) - Floor(c)) * 2 / 3, Tolerance(c));
  EXPECT_NEAR(LearningRate(c, 9), Floor(c) + (Peak(c) - Floor(c)) / 3, Tolerance(c));
  EXPECT_EQ(LearningRate(c, 10), floor);  // the last step: (S - S) / D = 0
  EXPECT_EQ(LearningRate(c, 11), floor);  // past S

  // A fraction that rounds to no step still decays over one: D = max(1, llround(0.1)) = 1.
  const TrainConfig one = Schedule("wsd", 10, 2, 0.01);
  EXPECT_EQ(LearningRate(one, 9), static_cast<float>(one.lr));
  EXPECT_EQ(LearningRate(one, 10), static_cast<float>(one.min_lr));
  // The whole run after warm-up decaying (fraction 1): D = S, so the decay starts at step 0,
  // and step W + 1 is already below the peak.
  const TrainConfig whole = Schedule("wsd", 10, 2, 1.0);
  EXPECT_EQ(LearningRate(whole, 3),
            static_cast<float>(whole.min_lr) +
                (static_cast<float>(whole.lr) - static_cast<float>(whole.min_lr)) * (7.0f / 10.0f));
}

// The schedule rises through warm-up and never rises after it; checked on every shipped config
// and on both schedules, at every step from 0 to past the end.
TEST(Schedule, RisesThroughWarmupAndNeverRisesAfterOnEveryShippedConfig) {
  std::vector<std::pair<std::string, TrainConfig>> configs;
  for (const std::string& name : EmbeddedConfigNames()) {
    const TrainConfig c = LoadRunConfig(name).train;
    configs.emplace_back(name, c);
    TrainConfig other = c;
    other.schedule = c.schedule == "cosine" ? "wsd" : "cosine";
    configs.emplace_back(name + " as " + other.schedule, other);
  }
  ASSERT_FALSE(configs.empty());
  for (const auto& [name, c] : configs) {
    SCOPED_TRACE(name);
    // (With no warm-up, step 0 is 0/0: the trainer never asks for it.)
    for (int64_t s = c.warmup_steps > 0 ? 1 : 2; s <= c.steps + 2; ++s) {
      const float before = LearningRate(c, s - 1), now = LearningRate(c, s);
      if (s <= c.warmup_steps) {
        ASSERT_GT(now, before) << "step " << s << " of warm-up";
      } else {
        ASSERT_LE(now, before) << "step " << s << " after warm-up";
      }
    }
    EXPECT_EQ(LearningRate(c, c.warmup_steps), static_cast<float>(c.lr));
    EXPECT_NEAR(LearningRate(c, c.steps), Floor(c), Tolerance(c));
  }
}

TrainConfig Spikes(double threshold, int64_t window, int64_t max_skips) {
  TrainConfig c;
  c.spike_threshold = threshold;
  c.spike_window = window;
  c.spike_max_skips = max_skips;
  return c;
}

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr float kInf = std::numeric_limits<float>::infinity();

TEST(Spike, ANonFiniteLossOrNormOrANormAboveTheThresholdSkips) {
  const TrainConfig c = Spikes(2.5, 10, 3);
  const SpikeState before{.total_skips = 4, .recent_skips = {3}};
  struct Case {
    const char* what;
    float loss, zloss, norm;
  };
  const float above = std::nextafter(2.5f, kInf);
  const float big = std::numeric_limits<float>::max();
  for (const Case& k : std::vector<Case>{{"NaN loss", kNaN, 0.0f, 1.0f},
                                         {"infinite loss", kInf, 0.0f, 1.0f},
                                         {"NaN z-loss", 1.0f, kNaN, 1.0f},
                                         {"loss + zloss overflows", big, big, 1.0f},
                                         {"NaN norm", 1.0f, 0.0f, kNaN},
                                         {"infinite norm", 1.0f, 0.0f, kInf},
                                         {"norm one ulp above the threshold", 1.0f, 0.0f, above}}) {
    SCOPED_TRACE(k.what);
    const SpikeOutcome out = SpikeRule(c, before, 5, k.loss, k.zloss, k.norm);
    EXPECT_TRUE(out.skipped);
    EXPECT_FALSE(out.halt);  // two recent skips of the three that halt
    EXPECT_EQ(out.state.total_skips, 5u);
    EXPECT_EQ(out.state.recent_skips, (std::vector<uint64_t>{3, 5}));
  }
  EXPECT_TRUE(NormSkips(kNaN, 2.5));
  EXPECT_TRUE(NormSkips(above, 2.5));
}

TEST(Spike, ANormExactlyAtTheThresholdDoesNotSkip) {
  const SpikeState before{.total_skips = 1, .recent_skips = {3}};
  const SpikeOutcome at = SpikeRule(Spikes(2.5, 10, 2), before, 5, 1.0f, 0.0f, 2.5f);
  EXPECT_FALSE(at.skipped);
  EXPECT_FALSE(at.halt);
  EXPECT_EQ(at.state.total_skips, 1u);
  EXPECT_EQ(at.state.recent_skips, (std::vector<uint64_t>{3}));
  // The comparison is in binary32: a threshold binary32 cannot hold (1.1) is first rounded to
  // it, and a norm equal to that rounding is at the threshold, not above it, though it is
  // above 1.1 as a binary64.
  const float rounded = static_cast<float>(1.1);
  ASSERT_GT(static_cast<double>(rounded), 1.1);
  EXPECT_FALSE(SpikeRule(Spikes(1.1, 10, 2), {}, 1, 1.0f, 0.0f, rounded).skipped);
  EXPECT_TRUE(
      SpikeRule(Spikes(1.1, 10, 2), {}, 1, 1.0f, 0.0f, std::nextafter(rounded, kInf)).skipped);
  EXPECT_FALSE(NormSkips(rounded, 1.1));
}

TEST(Spike, SkipsOlderThanTheWindowDropOut) {
  // window 3: at step s the skips at steps e with s - e >= 3 leave before s is counted.
  const TrainConfig c = Spikes(2.5, 3, 2);
  const SpikeState five{.total_skips = 1, .recent_skips = {5}};
  // Step 7: 7 - 5 = 2 < 3, step 5 is still in the window: two skips, the halt.
  const SpikeOutcome seven = SpikeRule(c, five, 7, kNaN, 0.0f, 1.0f);
  EXPECT_EQ(seven.state.recent_skips, (std::vector<uint64_t>{5, 7}));
  EXPECT_TRUE(seven.halt);
  // Step 8: 8 - 5 = 3, step 5 has left: one skip, no halt; total_skips still counts both.
  const SpikeOutcome eight = SpikeRule(c, five, 8, kNaN, 0.0f, 1.0f);
  EXPECT_EQ(eight.state.recent_skips, (std::vector<uint64_t>{8}));
  EXPECT_EQ(eight.state.total_skips, 2u);
  EXPECT_FALSE(eight.halt);
  // A step that is not skipped drops the old skips too, and keeps the total.
  const SpikeOutcome kept = SpikeRule(c, five, 8, 1.0f, 0.0f, 1.0f);
  EXPECT_FALSE(kept.skipped);
  EXPECT_TRUE(kept.state.recent_skips.empty());
  EXPECT_EQ(kept.state.total_skips, 1u);
  // window 1: only the step itself is ever recent.
  const SpikeOutcome narrow =
      SpikeRule(Spikes(2.5, 1, 1), {.total_skips = 1, .recent_skips = {4}}, 5, kNaN, 0.0f, 1.0f);
  EXPECT_EQ(narrow.state.recent_skips, (std::vector<uint64_t>{5}));
}

TEST(Spike, TheHaltComesExactlyAtSpikeMaxSkipsSkipsWithinTheWindow) {
  const TrainConfig c = Spikes(2.5, 10, 3);
  // Steps 1..6: skipped, not, skipped, not, not, skipped. The third skip (step 6) halts; the two
  // before it do not.
  const std::vector<bool> skips = {true, false, true, false, false, true};
  SpikeState state;
  for (size_t k = 0; k < skips.size(); ++k) {
    const uint64_t step = k + 1;
    const SpikeOutcome out = SpikeRule(c, state, step, 1.0f, 0.0f, skips[k] ? 3.0f : 2.0f);
    EXPECT_EQ(out.skipped, skips[k]) << "step " << step;
    EXPECT_EQ(out.halt, step == 6) << "step " << step;
    state = out.state;
  }
  EXPECT_EQ(state.total_skips, 3u);
  EXPECT_EQ(state.recent_skips, (std::vector<uint64_t>{1, 3, 6}));
  // A step that is not skipped never halts, however many skips are recent (a run resumed from
  // the checkpoint of its halt that then trains a good step).
  const SpikeOutcome good = SpikeRule(c, state, 7, 1.0f, 0.0f, 1.0f);
  EXPECT_FALSE(good.halt);
  EXPECT_EQ(good.state.recent_skips, (std::vector<uint64_t>{1, 3, 6}));
  // spike_max_skips 1: the first skip halts.
  EXPECT_TRUE(SpikeRule(Spikes(2.5, 1, 1), {}, 1, kNaN, 0.0f, 1.0f).halt);
}

}  // namespace
}  // namespace lockstep::train
