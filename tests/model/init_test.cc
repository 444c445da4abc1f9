// Initialisation: thread-count independence, statistics, seeds, and known answers derived by an
// independent fp64 computation.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "lockstep/core.h"
#include "lockstep/kernels.h"
#include "lockstep/model.h"

namespace lockstep {
namespace {

std::vector<float> InitFlat(const ModelConfig& config, uint64_t seed) {
  ParamStore params(ParameterSpecs(config));
  InitParameters(config, seed, params);
  return {params.Flat().begin(), params.Flat().end()};
}

TEST(Init, BitsDoNotDependOnThreads) {
  const ModelConfig config = LoadRunConfig("tiny").model;
  const std::vector<float> one = InitFlat(config, 7);
  for (int threads : {2, 3}) {
    SetThreads(threads);
    const std::vector<float> other = InitFlat(config, 7);
    SetThreads(1);
    ASSERT_EQ(other.size(), one.size());
    EXPECT_EQ(std::memcmp(other.data(), one.data(), one.size() * sizeof(float)), 0) << threads;
  }
}

TEST(Init, StatisticsSeedsAndDrawCount) {
  const ModelConfig config = LoadRunConfig("tiny").model;
  ParamStore params(ParameterSpecs(config));
  const int64_t draws = InitParameters(config, 1234, params);
  int64_t matrix_elements = 0;
  double sum = 0, sum_sq = 0;
  const float bound = 2 * static_cast<float>(config.init_std);
  for (size_t i = 0; i < params.size(); ++i) {
    for (float x : params.Tensor(i)) {
      if (!params.Spec(i).is_matrix) {
        ASSERT_EQ(x, 1.0f) << params.Spec(i).name;
        continue;
      }
      ++matrix_elements;
      sum += x;
      sum_sq += double{x} * x;
      // ±2σ up to the rounding of the final product.
      ASSERT_LE(std::fabs(x), bound * (1 + 0x1.0p-21f)) << params.Spec(i).name;
    }
  }
  EXPECT_EQ(draws, matrix_elements);
  const double mean = sum / matrix_elements, std = std::sqrt(sum_sq / matrix_elements);
  // A normal truncated at ±2σ has standard deviation 0.8796σ.
  EXPECT_NEAR(mean, 0.0, 1e-4);
  EXPECT_NEAR(std / config.init_std, 0.8796, 0.003);
  EXPECT_NE(InitFlat(config, 1234), InitFlat(config, 1235));
}

// erfinv in fp64, independent of lockstep's: Newton on std::erf, which converges monotonically
// from 0 because erf is concave on the side of the root.
double ErfinvNewton(double z) {
  double y = 0;
  for (int i = 0; i < 200; ++i) {
    const double next = y - (std::erf(y) - z) / (2 / std::sqrt(M_PI) * std::exp(-y * y));
    if (next == y) break;
    y = next;
  }
  return y;
}

TEST(Init, KnownAnswersFromAnIndependentFp64Computation) {
  const ModelConfig config = LoadRunConfig("tiny").model;
  const uint64_t seed = 20240229;
  ParamStore params(ParameterSpecs(config));
  InitParameters(config, seed, params);
  // The draws are global over the matrices in ParameterSpecs order: collect their values.
  std::vector<float> drawn;
  for (size_t i = 0; i < params.size(); ++i) {
    if (params.Spec(i).is_matrix) drawn.insert(drawn.end(), params.Tensor(i).begin(), params.Tensor(i).end());
  }
  const PhiloxKey key = PhiloxKeyFromSeed(seed);
  double worst_ulps = 0;
  for (int64_t g : {0, 1, 2, 3, 4, 65535, 65536, 65537, 123457, 500001, 1000000}) {
    ASSERT_LT(g, static_cast<int64_t>(drawn.size()));
    const uint64_t c = static_cast<uint64_t>(g) / 4;
    const uint32_t word =
        Philox4x32({static_cast<uint32_t>(c), static_cast<uint32_t>(c >> 32), 0, 0}, key)[g % 4];
    const double t = (2.0 * (word >> 8) + 1 - 16777216.0) / 16777216.0;
    const double expected = config.init_std * std::sqrt(2.0) * ErfinvNewton(t * std::erf(std::sqrt(2.0)));
    const float got = drawn[static_cast<size_t>(g)];
    const double ulp = std::ldexp(1.0, std::ilogb(got) - 23);
    worst_ulps = std::max(worst_ulps, std::fabs(got - expected) / ulp);
    EXPECT_LE(std::fabs(got - expected), 2 * ulp) << "draw " << g << ": " << got << " vs " << expected;
  }
  std::printf("init known answers: worst error %.2f ulp\n", worst_ulps);
}

}  // namespace
}  // namespace lockstep
