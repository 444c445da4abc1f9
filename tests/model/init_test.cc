// Initialisation: thread-count independence, statistics, seeds, known answers derived by an
// independent fp64 computation, and the erfinv table of large matrices against the documented
// formula for every draw.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
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

// A checkpoint's scales are a function of its weights (docs/model.md, "Linears"): the init's
// pass; a scale one ulp off, or a weight changed under its scale, is refused naming the tensor
// and row; a row with a NaN has the canonical NaN scale, and passes.
TEST(Init, WeightScalesAreCheckedAgainstTheirWeights) {
  const ModelConfig config = LoadRunConfig("tiny-int8").model;
  ParamStore params(ParameterSpecs(config));
  InitParameters(config, 3, params);
  CheckWeightScales(config, params, "ckpt");
  const ParamIndex P(config);
  const size_t scale = P.Scale(1, LayerTensor::kWv), weight = P.WeightOfScale(scale);
  const int64_t cols = params.Spec(weight).shape[1];
  std::span<float> s = params.Tensor(scale), w = params.Tensor(weight);

  s[5] = std::nextafter(s[5], 1.0f);
  try {
    CheckWeightScales(config, params, "ckpt");
    ADD_FAILURE() << "a scale one ulp off was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("ckpt: 'layers.1.attn.wv.scale' row 5"), std::string::npos)
        << e.what();
  }
  s[5] = std::nextafter(s[5], 0.0f);
  CheckWeightScales(config, params, "ckpt");

  w[7 * cols + 3] = 1.0f;  // above the row's largest magnitude (about 2 · init_std)
  EXPECT_THROW(CheckWeightScales(config, params, "ckpt"), Error);
  w[7 * cols + 3] = std::numeric_limits<float>::quiet_NaN();
  s[7] = std::bit_cast<float>(0x7FC00000u);
  CheckWeightScales(config, params, "ckpt");

  EXPECT_NO_THROW(CheckWeightScales(LoadRunConfig("tiny").model, params, "ckpt"));  // no int8
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

// docs/model.md's erfinv argument of a draw, computed here from the formula.
float DocumentedArgument(uint32_t word) {
  const auto k = static_cast<int32_t>(word >> 8);
  return static_cast<float>(2 * k + 1 - (1 << 24)) * 0x1.0p-24f * dmath::Erf(0x1.6a09e6p+0f);
}

// The table of large matrices gives dmath::Erfinv's bits for every one of the 2^24 draws k
// (each with other low bits in its word), times a scale rounded once, on every usable ISA: both
// halves, the ends and the middle.
TEST(Init, ErfinvTableGivesErfinvOfEveryDraw) {
  constexpr uint32_t kBlock = 1 << 20;
  constexpr float kScale = 0.0283f;
  const rk::Isa saved = rk::ActiveIsa();
  rk::InitErfinvTable();
  std::vector<uint32_t> words(kBlock);
  std::vector<float> got(kBlock), want(kBlock);
  for (uint32_t first = 0; first < (1u << 24); first += kBlock) {
    for (uint32_t j = 0; j < kBlock; ++j) words[j] = ((first + j) << 8) | ((j * 37u) & 255u);
    for (uint32_t j = 0; j < kBlock; ++j) want[j] = DocumentedArgument(words[j]);
    rk::ErfinvInPlace(want);  // dmath::Erfinv's bits on every ISA (tests/kernels/dmath_test.cc)
    for (uint32_t j = 0; j < kBlock; j += 4099) {
      ASSERT_EQ(want[j], dmath::Erfinv(DocumentedArgument(words[j])));
    }
    for (float& y : want) y = kScale * y;
    for (const rk::Isa& isa : rk::UsableIsas()) {
      rk::SetIsa(isa);
      rk::InitErfinvByTable(words, kScale, got);
      ASSERT_EQ(std::memcmp(got.data(), want.data(), kBlock * sizeof(float)), 0)
          << isa.name << ": a draw of k in [" << first << ", " << first + kBlock << ") differs";
    }
    rk::SetIsa(saved);
  }
}

// A matrix large enough to take the table: its elements are docs/model.md's formula, computed
// here from the Philox words with the scalar dmath::Erfinv, and the same at 1, 2, 3, 4 and 7
// threads.
TEST(Init, LargeMatricesFollowTheFormulaAtEveryThreadCount) {
  const ModelConfig config = LoadRunConfig("tiny").model;
  const ParamSpec spec{"w", {2, kInitTableDraws}, true, true};
  const uint64_t seed = 31;
  const int64_t first_draw = 1000, begin = kInitTableDraws - 20000, count = 70001;
  std::vector<uint32_t> words(static_cast<size_t>(count));
  rk::PhiloxWords(PhiloxKeyFromSeed(seed), static_cast<uint64_t>(first_draw + begin), words);
  const float scale = static_cast<float>(config.init_std) * 0x1.6a09e6p+0f;
  std::vector<float> want(words.size());
  for (size_t e = 0; e < words.size(); ++e) {
    want[e] = scale * dmath::Erfinv(DocumentedArgument(words[e]));
  }
  for (int threads : {1, 2, 3, 4, 7}) {
    SetThreads(threads);
    std::vector<float> got(static_cast<size_t>(count));
    InitTensorRange(config, seed, spec, first_draw, begin, got);
    EXPECT_EQ(std::memcmp(got.data(), want.data(), got.size() * sizeof(float)), 0) << threads;
  }
  SetThreads(1);
}

}  // namespace
}  // namespace lockstep
