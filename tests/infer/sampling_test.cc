// Sampling (docs/numerics.md, "Sampling"): greedy ties, the cuts, the draw's key, and that the
// draws follow the softmax.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "common/expect_error.h"
#include "lockstep/infer.h"

namespace lockstep {
namespace {

using infer::SampleToken;
using infer::SamplingParams;

TEST(Sampling, GreedyTakesTheLowestIdOfTheLargestLogit) {
  const std::vector<float> logits = {0.5f, 2.0f, -1.0f, 2.0f, 1.0f};
  EXPECT_EQ(SampleToken(logits, {}, 0, 0), 1u);
  EXPECT_EQ(SampleToken(std::vector<float>{-INFINITY, -INFINITY}, {}, 0, 0), 0u);
}

TEST(Sampling, OneCandidateLeftIsTheGreedyChoiceWhateverTheDraw) {
  const std::vector<float> logits = {0.5f, 2.0f, -1.0f, 2.0f, 1.0f};
  for (uint64_t seed = 0; seed < 50; ++seed) {
    SamplingParams top_k{64, 1.5f, 1, 1.0f, seed};
    EXPECT_EQ(SampleToken(logits, top_k, seed, 7), 1u);
    SamplingParams top_p{64, 1.5f, 0, 1e-6f, seed};
    EXPECT_EQ(SampleToken(logits, top_p, seed, 7), 1u);
  }
}

TEST(Sampling, TheDrawIsKeyedBySeedRequestAndPositionOnly) {
  std::vector<float> logits(512);
  for (size_t i = 0; i < logits.size(); ++i) logits[i] = std::sin(float(i)) * 2.0f;
  const SamplingParams p{64, 1.0f, 0, 1.0f, 42};
  int differ_by_request = 0, differ_by_position = 0;
  for (int64_t t = 0; t < 64; ++t) {
    const uint32_t a = SampleToken(logits, p, 3, t);
    EXPECT_EQ(SampleToken(logits, p, 3, t), a);
    differ_by_request += SampleToken(logits, p, 4, t) != a;
    differ_by_position += SampleToken(logits, p, 3, t + 1) != a;
  }
  EXPECT_GT(differ_by_request, 32);
  EXPECT_GT(differ_by_position, 32);
}

// Over many (request, position) draws the frequencies follow softmax(logits / T) with top-k and
// top-p applied: a chi-square bound far above its 99.9% point for these degrees of freedom.
TEST(Sampling, TheFrequenciesFollowTheCutSoftmax) {
  const std::vector<float> logits = {1.0f, 0.0f, 2.0f, -1.0f, 0.5f, -3.0f};
  for (const auto& [temperature, top_k, top_p] :
       {std::tuple{1.0f, 0, 1.0f}, {0.5f, 0, 1.0f}, {2.0f, 3, 1.0f}, {1.0f, 0, 0.8f}}) {
    std::vector<double> p(logits.size());
    std::vector<size_t> order = {2, 0, 4, 1, 3, 5};  // by logit, largest first
    const size_t k = top_k > 0 ? size_t(top_k) : order.size();
    double total = 0;
    for (size_t j = 0; j < k; ++j)
      total += p[order[j]] = std::exp((logits[order[j]] - 2.0) / temperature);
    if (top_p < 1) {
      double running = 0;
      for (size_t j = 0; j < k; ++j) {
        if (running >= top_p * total) p[order[j]] = 0;
        running += p[order[j]];
      }
    }
    double kept = 0;
    for (const double x : p) kept += x;
    std::vector<int> count(logits.size());
    const int n = 20000;
    const SamplingParams params{64, temperature, top_k, top_p, 9};
    for (int i = 0; i < n; ++i) ++count[SampleToken(logits, params, i % 100, i / 100)];
    double chi2 = 0;
    for (size_t i = 0; i < p.size(); ++i) {
      if (p[i] == 0) {
        EXPECT_EQ(count[i], 0) << "id " << i << " is cut, yet drawn";
        continue;
      }
      const double want = n * p[i] / kept;
      chi2 += (count[i] - want) * (count[i] - want) / want;
    }
    EXPECT_LT(chi2, 30.0) << "temperature " << temperature << " top_k " << top_k << " top_p "
                          << top_p;
  }
}

// Logits divided by a tiny temperature overflow to +inf (inf - inf would make every weight NaN
// and the walk end on the last candidate, the least likely token): the first candidate's scaled
// logit not being finite gives the greedy token, the limit as T goes to 0.
TEST(Sampling, ATemperatureSoSmallThatTheLogitsOverflowIsGreedy) {
  const std::vector<float> logits = {5.0f, 20.0f, -10.0f, 19.0f, 10.0f, -30.0f};
  for (const float t : {1e-30f, 1e-35f, 1e-38f, 1e-40f, 1e-45f}) {
    for (uint64_t seed = 0; seed < 20; ++seed) {
      EXPECT_EQ(SampleToken(logits, {64, t, 0, 1.0f, seed}, seed, 3), 1u) << t;
      EXPECT_EQ(SampleToken(logits, {64, t, 3, 0.9f, seed}, seed, 3), 1u) << t;
    }
  }
  // Two largest logits equal, both overflowing: the lower id, as greedy takes it.
  const std::vector<float> tied = {5.0f, 20.0f, -10.0f, 20.0f};
  for (uint64_t seed = 0; seed < 20; ++seed) {
    EXPECT_EQ(SampleToken(tied, {64, 1e-38f, 0, 1.0f, seed}, seed, 3), 1u);
  }
  // A +inf logit, and logits all -inf, at any temperature: greedy too.
  const std::vector<float> with_inf = {0.5f, INFINITY, 2.0f, INFINITY};
  EXPECT_EQ(SampleToken(with_inf, {64, 1.0f, 0, 1.0f, 9}, 0, 0), 1u);
  EXPECT_EQ(SampleToken(std::vector<float>{-INFINITY, -INFINITY, -INFINITY}, {64, 0.7f, 0, 1.0f, 9},
                        0, 0),
            0u);
}

TEST(Sampling, ANanLogitIsRefused) {
  const std::vector<float> logits = {0.0f, std::numeric_limits<float>::quiet_NaN()};
  test::ExpectError([&] { SampleToken(logits, {}, 2, 5); }, {"request 2, position 5", "NaN"});
}

}  // namespace
}  // namespace lockstep
