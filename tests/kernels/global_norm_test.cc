// Global norm, clip factor and Scale: bitwise invariance, fp64 accuracy, exact cases, special
// values and argument errors (docs/numerics.md (global_norm)).
#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <string>

#include "kernels/harness.h"
#include "lockstep/core.h"

namespace lockstep::test {
namespace {

const float kInf = std::numeric_limits<float>::infinity();
const float kNaN = std::numeric_limits<float>::quiet_NaN();

float Norm(const std::vector<std::vector<float>>& tensors) {
  std::vector<std::span<const float>> views(tensors.begin(), tensors.end());
  return rk::GlobalNorm(views);
}

// Tensors of awkward sizes, several spanning more than one kNormBlock.
std::vector<std::vector<float>> AwkwardTensors() {
  std::vector<std::vector<float>> t;
  uint64_t seed = 1;
  for (int64_t n : {int64_t{0}, int64_t{1}, int64_t{3}, int64_t{17}, int64_t{255}, int64_t{257},
                    rk::kNormBlock + 17, 3 * rk::kNormBlock + 5}) {
    t.push_back(RandomFloats(n, seed++, -1e3f, 1e3f));
  }
  return t;
}

TEST(GlobalNorm, BitwiseInvariant) {
  const std::vector<std::vector<float>> tensors = AwkwardTensors();
  ExpectBitwiseInvariant("global norm + scale", [&] {
    std::vector<float> out = {Norm(tensors)};
    for (const auto& t : tensors) {  // each tensor on its own: the one-tensor paths
      out.push_back(Norm({t}));
    }
    std::vector<float> scaled = tensors.back();
    rk::Scale(scaled, rk::ClipFactor(out[0], 1.0f));
    out.insert(out.end(), scaled.begin(), scaled.end());
    return out;
  });
}

// The streamed form (pieces of whole blocks, as a spilled gradient is read back) gives the
// bits of the one-call form, whatever the piece length, on every variant and thread count.
TEST(GlobalNorm, PiecesEqualWhole) {
  const std::vector<std::vector<float>> tensors = AwkwardTensors();
  for (const int64_t blocks_per_piece : {1, 2, 3}) {
    ExpectBitwiseInvariant("global norm in pieces", [&] {
      std::vector<double> sums;
      for (const auto& t : tensors) {
        double running = 0.0;
        const std::span<const float> all(t);
        for (size_t b = 0; b < t.size(); b += blocks_per_piece * rk::kNormBlock) {
          running = rk::AddTensorSquares(
              running, all.subspan(b, std::min(t.size() - b,
                                               size_t(blocks_per_piece * rk::kNormBlock))));
        }
        sums.push_back(running);
      }
      const float pieces = rk::NormOfTensorSums(sums);
      const float whole = Norm(tensors);
      EXPECT_EQ(std::bit_cast<uint32_t>(pieces), std::bit_cast<uint32_t>(whole));
      return std::vector<float>{pieces};
    });
  }
}

TEST(GlobalNorm, MatchesFp64) {
  const std::vector<std::vector<float>> tensors = AwkwardTensors();
  long double sum = 0;
  for (const auto& t : tensors) {
    for (float x : t) sum += static_cast<long double>(x) * x;
  }
  // An fp64 sum of 2.6e5 squares is good to ~1e-11 relative; the fp32 rounding dominates.
  ExpectClose("norm", {Norm(tensors)}, {static_cast<double>(std::sqrt(sum))}, 0, 0x1.0p-23);
}

TEST(GlobalNorm, ExactCases) {
  EXPECT_EQ(Norm({{3.0f}, {}, {4.0f}}), 5.0f);
  EXPECT_EQ(Norm({}), 0.0f);
  // One element: its square is exact in fp64 and sqrt of an exact square is exact.
  for (float x : {1e-40f, -std::numeric_limits<float>::denorm_min(), 3e38f, -0.0f}) {
    EXPECT_EQ(Norm({{x}}), std::fabs(x)) << x;
  }
  // Squares that underflow fp32 (1e-60) are kept in fp64: a million of them give 1e-27.
  const float norm = Norm({std::vector<float>(1000000, 1e-30f)});
  EXPECT_NEAR(norm, 1e-27f, 1e-33f);
}

TEST(GlobalNorm, SpecialValues) {
  std::vector<float> big = RandomFloats(2 * rk::kNormBlock, 7);
  for (const rk::Isa& isa : rk::UsableIsas()) {
    rk::SetIsa(isa);
    big[rk::kNormBlock + 100] = -kNaN;  // x86 propagates this sign; the norm is canonical
    EXPECT_EQ(std::bit_cast<uint32_t>(Norm({{1.0f}, big})), dmath::kCanonicalNaNBits) << isa.name;
    big[rk::kNormBlock + 100] = -kInf;
    EXPECT_EQ(Norm({{1.0f}, big}), kInf) << isa.name;
    big[rk::kNormBlock + 100] = 0.0f;
  }
  rk::SetIsa(rk::IsaByName("best"));
}

TEST(CanonicalizeNaNs, ReplacesEveryNaNAndNothingElse) {
  std::vector<float> x = {1.0f, -kNaN, kInf, std::bit_cast<float>(0x7f800001u), -0.0f,
                          std::bit_cast<float>(0xffc00000u), 1e-45f};
  const std::vector<float> before = x;
  EXPECT_EQ(rk::CanonicalizeNaNs(x), 3);
  for (size_t i = 0; i < x.size(); ++i) {
    const uint32_t want = std::isnan(before[i]) ? dmath::kCanonicalNaNBits
                                                : std::bit_cast<uint32_t>(before[i]);
    EXPECT_EQ(std::bit_cast<uint32_t>(x[i]), want) << i;
  }
}

TEST(ClipFactor, Rule) {
  EXPECT_EQ(rk::ClipFactor(0.5f, 1.0f), 1.0f);
  EXPECT_EQ(rk::ClipFactor(4.0f, 1.0f), 1.0f / (4.0f + 1e-6f));
  EXPECT_EQ(rk::ClipFactor(4.0f, 0.0f), 1.0f) << "clipping off";
  EXPECT_EQ(rk::ClipFactor(4.0f, -1.0f), 1.0f) << "clipping off";
  EXPECT_EQ(rk::ClipFactor(kInf, 1.0f), 0.0f);
  EXPECT_EQ(rk::ClipFactor(0.0f, kInf), 1.0f);
  EXPECT_TRUE(std::isnan(rk::ClipFactor(kNaN, 1.0f))) << "a NaN norm must reach the caller";
  EXPECT_TRUE(std::isnan(rk::ClipFactor(kNaN, 0.0f))) << "even with clipping off";
  ExpectError([] { rk::ClipFactor(-1.0f, 1.0f); }, {"ClipFactor", "norm = -1"});
  ExpectError([] { rk::ClipFactor(1.0f, kNaN); }, {"ClipFactor", "max_norm = nan"});
}

TEST(Scale, ExactAndChecked) {
  std::vector<float> x = {1.0f, -0.0f, 1e-40f, kInf, 3.0f};
  rk::Scale(x, 0.5f);
  EXPECT_EQ(x[0], 0.5f);
  EXPECT_TRUE(x[1] == 0 && std::signbit(x[1]));
  EXPECT_EQ(x[2], 1e-40f * 0.5f);
  EXPECT_EQ(x[3], kInf);
  EXPECT_EQ(x[4], 1.5f);
  ExpectError([&] { rk::Scale(x, kNaN); }, {"Scale", "factor = nan"});
}

}  // namespace
}  // namespace lockstep::test
