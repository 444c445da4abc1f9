// Row reductions, AddInto, bf16 rounding, RMSNorm, RoPE: bitwise invariance, fp64 accuracy,
// finite-difference gradients, special values and argument errors.
#include <bit>
#include <cmath>
#include <cstring>
#include <limits>

#include "kernels/harness.h"
#include "lockstep/core.h"

namespace lockstep::test {
namespace {

const float kInf = std::numeric_limits<float>::infinity();
const float kNaN = std::numeric_limits<float>::quiet_NaN();

TEST(RowReductions, BitwiseInvariant) {
  for (int64_t cols : {1, 3, 15, 16, 17, 255, 257, 1000}) {
    ExpectBitwiseInvariant(fmt::format("row reductions cols={}", cols), [&] {
      const int64_t rows = 7;
      std::vector<float> x = RandomFloats(rows * cols, cols, -3, 3);
      x[rows * cols / 2] = -0.0f;
      std::vector<float> out(3 * rows);
      rk::RowSum(x, std::span(out).subspan(0, rows), rows, cols);
      rk::RowSumSquares(x, std::span(out).subspan(rows, rows), rows, cols);
      rk::RowMax(x, std::span(out).subspan(2 * rows, rows), rows, cols);
      return out;
    });
  }
}

TEST(RowReductions, LaneRuleIsTheContract) {
  // 32 elements: lane j sums x[j] + x[j+16]; folding 8-4-2-1. With one huge and one tiny value
  // in different lanes the order is visible; compute the contract by hand.
  std::vector<float> x(32, 0.0f);
  x[0] = 1.0f;
  x[16] = 0x1.0p-24f;  // same lane as x[0]: 1 + 2^-24 rounds to 1 (tie to even)
  x[1] = 0x1.0p-24f;   // lane 1
  // lanes: l0 = 1, l1 = 2^-24; fold: l0 += l8 (0) ... l0 += l1 -> 1 + 2^-24 -> 1.
  // A sequential sum gives the same here, so also check a case the fold makes different:
  x[9] = 0x1.0p-24f;   // lane 9 folds into lane 1 first: l1 = 2^-23, then 1 + 2^-23 is exact.
  float out = 0;
  for (const rk::Isa& isa : rk::UsableIsas()) {
    rk::SetIsa(isa);
    rk::RowSum(x, std::span(&out, 1), 1, 32);
    EXPECT_EQ(out, 1.0f + 0x1.0p-23f) << isa.name;
  }
}

TEST(RowReductions, SpecialValues) {
  std::vector<float> x = {1, kNaN, 2, -kInf, 5};
  float out;
  for (const rk::Isa& isa : rk::UsableIsas()) {
    rk::SetIsa(isa);
    rk::RowMax(x, std::span(&out, 1), 1, 5);
    EXPECT_TRUE(std::isnan(out)) << isa.name;
    rk::RowMax(std::span(x).subspan(2), std::span(&out, 1), 1, 3);
    EXPECT_EQ(out, 5.0f) << isa.name;
    std::vector<float> tiny = {std::numeric_limits<float>::denorm_min(), 0.0f};
    rk::RowSum(tiny, std::span(&out, 1), 1, 2);
    EXPECT_EQ(out, std::numeric_limits<float>::denorm_min()) << isa.name << ": FTZ";
    std::vector<float> zeros = {-0.0f, -0.0f};
    rk::RowSum(zeros, std::span(&out, 1), 1, 2);
    EXPECT_FALSE(std::signbit(out)) << isa.name << ": lanes start at +0";
    rk::RowSum(std::span<const float>(), std::span(&out, 1), 1, 0);
    EXPECT_EQ(out, 0.0f);
  }
}

// fp64 RMSNorm forward, and the gradient of L = sum(w * y) by central differences.
std::vector<double> RmsFp64(const std::vector<double>& x, const std::vector<double>& g, double eps,
                            int64_t rows, int64_t d) {
  std::vector<double> y(x.size());
  for (int64_t r = 0; r < rows; ++r) {
    double ss = 0;
    for (int64_t c = 0; c < d; ++c) ss += x[r * d + c] * x[r * d + c];
    const double s = 1.0 / std::sqrt(ss / d + eps);
    for (int64_t c = 0; c < d; ++c) y[r * d + c] = x[r * d + c] * s * (g.empty() ? 1.0 : g[c]);
  }
  return y;
}

TEST(RmsNorm, BitwiseInvariant) {
  for (int64_t d : {1, 3, 17, 255, 257}) {
    for (bool with_gain : {false, true}) {
      ExpectBitwiseInvariant(fmt::format("RmsNorm d={} gain={}", d, with_gain), [&] {
        const int64_t rows = 5;
        auto x = RandomFloats(rows * d, d), dy = RandomFloats(rows * d, d + 1);
        auto gain = with_gain ? RandomFloats(d, d + 2, 0.5f, 1.5f) : std::vector<float>();
        std::vector<float> y(rows * d), rstd(rows), dx(rows * d), dgain(gain.size());
        rk::RmsNormForward(x, gain, 1e-5f, y, rstd, rows, d);
        rk::RmsNormBackward(dy, x, gain, rstd, dx, dgain, rows, d);
        std::vector<float> out = y;
        out.insert(out.end(), rstd.begin(), rstd.end());
        out.insert(out.end(), dx.begin(), dx.end());
        out.insert(out.end(), dgain.begin(), dgain.end());
        return out;
      });
    }
  }
}

TEST(RmsNorm, ForwardMatchesFp64AndGradientMatchesFiniteDifferences) {
  const int64_t rows = 3, d = 37;
  const double eps = 1e-5;
  auto x = RandomFloats(rows * d, 1), gain = RandomFloats(d, 2, 0.5f, 1.5f);
  auto w = RandomFloats(rows * d, 3);
  std::vector<double> xd(x.begin(), x.end()), gd(gain.begin(), gain.end());
  std::vector<float> y(rows * d), rstd(rows), dx(rows * d), dgain(d);
  rk::RmsNormForward(x, gain, static_cast<float>(eps), y, rstd, rows, d);
  ExpectClose("RmsNormForward", y, RmsFp64(xd, gd, eps, rows, d), 1e-6, 1e-5);
  rk::RmsNormBackward(w, x, gain, rstd, dx, dgain, rows, d);
  auto loss = [&](const std::vector<double>& xv, const std::vector<double>& gv) {
    auto yv = RmsFp64(xv, gv, eps, rows, d);
    double l = 0;
    for (size_t i = 0; i < yv.size(); ++i) l += w[i] * yv[i];
    return l;
  };
  const double h = 1e-6;
  std::vector<double> fd_x(x.size()), fd_g(d);
  for (size_t i = 0; i < x.size(); ++i) {
    auto p = xd, m = xd;
    p[i] += h;
    m[i] -= h;
    fd_x[i] = (loss(p, gd) - loss(m, gd)) / (2 * h);
  }
  for (int64_t c = 0; c < d; ++c) {
    auto p = gd, m = gd;
    p[c] += h;
    m[c] -= h;
    fd_g[c] = (loss(xd, p) - loss(xd, m)) / (2 * h);
  }
  ExpectClose("RmsNormBackward dx", dx, fd_x, 1e-5, 1e-4);
  ExpectClose("RmsNormBackward dgain", dgain, fd_g, 1e-5, 1e-4);
}

TEST(RmsNorm, InPlaceEqualsOutOfPlaceAndNaNPropagates) {
  const int64_t rows = 2, d = 19;
  auto x = RandomFloats(rows * d, 9);
  std::vector<float> y(rows * d), rstd(rows), inplace = x;
  rk::RmsNormForward(x, {}, 1e-6f, y, rstd, rows, d);
  rk::RmsNormForward(inplace, {}, 1e-6f, inplace, rstd, rows, d);
  EXPECT_EQ(0, std::memcmp(y.data(), inplace.data(), y.size() * sizeof(float)));
  x[3] = kNaN;
  rk::RmsNormForward(x, {}, 1e-6f, y, rstd, rows, d);
  EXPECT_TRUE(std::isnan(y[0]));
  EXPECT_FALSE(std::isnan(y[d]));  // the other row is unaffected
}

TEST(RmsNorm, BadArguments) {
  std::vector<float> x(6), y(6), rstd(2), gain(2);
  EXPECT_THROW(rk::RmsNormForward(x, gain, 1e-5f, y, rstd, 2, 3), Error);  // gain size
  EXPECT_THROW(rk::RmsNormForward(x, {}, kNaN, y, rstd, 2, 3), Error);
  try {
    rk::RmsNormForward(x, {}, 1e-5f, std::span(x).subspan(1, 5), rstd, 2, 3);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("RmsNormForward: y has 5 elements"), std::string::npos);
  }
}

TEST(Rope, BitwiseInvariantAndInverse) {
  for (int64_t hd : {2, 6, 34, 128}) {
    const auto table = rk::MakeRopeTable(17, hd, 10000.0f);
    ExpectBitwiseInvariant(fmt::format("Rope head_dim={}", hd), [&] {
      const int64_t b = 2, t = 17, h = 3, n = b * t * h * hd;
      auto x = RandomFloats(n, hd);
      std::vector<float> y(n), back(n);
      rk::RopeForward(x, y, table, b, t, h, hd);
      rk::RopeBackward(y, back, table, b, t, h, hd);
      std::vector<float> out = y;
      out.insert(out.end(), back.begin(), back.end());
      out.insert(out.end(), table.cos.begin(), table.cos.end());
      out.insert(out.end(), table.sin.begin(), table.sin.end());
      return out;
    });
  }
}

// Rows of a sequence rotated from first_position on are the rows of the whole sequence's
// rotation at those positions (decoding with a KV cache), on every variant and thread count.
TEST(Rope, RowsFromAFirstPositionAreTheWholeSequencesRows) {
  const int64_t t = 37, h = 3, hd = 34, row = h * hd;
  const auto table = rk::MakeRopeTable(t, hd, 10000.0f);
  const auto x = RandomFloats(t * row, 9);
  std::vector<float> whole(x.size());
  rk::RopeForward(x, whole, table, 1, t, h, hd);
  for (const int64_t first : {int64_t{1}, int64_t{16}, t - 1}) {
    const std::vector<float> part(x.begin() + first * row, x.end());
    const std::vector<float> want(whole.begin() + first * row, whole.end());
    ExpectBitwiseInvariant(fmt::format("Rope from position {}", first), [&] {
      std::vector<float> y(part.size());
      rk::RopeForward(part, y, table, 1, t - first, h, hd, first);
      EXPECT_EQ(y, want) << "from position " << first;
      return y;
    });
  }
  std::vector<float> y(2 * row);
  EXPECT_THROW(rk::RopeForward(std::span(x).first(2 * row), y, table, 1, 2, h, hd, t - 1), Error);
  EXPECT_THROW(rk::RopeForward(std::span(x).first(2 * row), y, table, 1, 2, h, hd, -1), Error);
}

TEST(Rope, MatchesFp64RotationAndBackwardIsTranspose) {
  const int64_t t = 64, hd = 8, half = hd / 2;
  const float theta = 500000.0f;
  const auto table = rk::MakeRopeTable(t, hd, theta);
  auto x = RandomFloats(t * hd, 5), w = RandomFloats(t * hd, 6);
  std::vector<float> y(t * hd), dx(t * hd);
  rk::RopeForward(x, y, table, 1, t, 1, hd);
  rk::RopeBackward(w, dx, table, 1, t, 1, hd);
  std::vector<double> want(t * hd), want_dx(t * hd);
  for (int64_t p = 0; p < t; ++p) {
    for (int64_t i = 0; i < half; ++i) {
      const double a = p * std::pow(static_cast<double>(theta), -2.0 * i / hd);
      const double c = std::cos(a), s = std::sin(a);
      const double x1 = x[p * hd + i], x2 = x[p * hd + i + half];
      want[p * hd + i] = x1 * c - x2 * s;
      want[p * hd + i + half] = x2 * c + x1 * s;
      const double w1 = w[p * hd + i], w2 = w[p * hd + i + half];
      want_dx[p * hd + i] = w1 * c + w2 * s;  // d(sum w*y)/dx = Rᵀ w
      want_dx[p * hd + i + half] = w2 * c - w1 * s;
    }
  }
  // fp32 angles: t * inv_freq is rounded once (|err| <= 2^-24 * 64) before sin/cos.
  ExpectClose("RopeForward", y, want, 2e-5, 0);
  ExpectClose("RopeBackward", dx, want_dx, 2e-5, 0);
}

TEST(Rope, BadArguments) {
  const auto table = rk::MakeRopeTable(4, 4, 10000.0f);
  std::vector<float> x(2 * 8 * 4), y(x.size());
  EXPECT_THROW(rk::RopeForward(x, y, table, 1, 8, 2, 4), Error);  // seq beyond table
  EXPECT_THROW(rk::MakeRopeTable(4, 3, 10000.0f), Error);          // odd head_dim
  EXPECT_THROW(rk::MakeRopeTable(4, 4, kInf), Error);
}

TEST(AddInto, BitwiseAndSizes) {
  ExpectBitwiseInvariant("AddInto", [] {
    auto x = RandomFloats(1001, 1), y = RandomFloats(1001, 2);
    rk::AddInto(x, y);
    return y;
  });
  std::vector<float> x(3), y(4);
  EXPECT_THROW(rk::AddInto(x, y), Error);
}

// The binary32 value of a bfloat16's bits, by its fields in fp64: an all-ones exponent with a
// zero fraction stands for ±2^128, the value IEEE 754 rounds to infinity at.
double Bf16Value(uint32_t bits16) {
  const double sign = (bits16 & 0x8000u) != 0 ? -1.0 : 1.0;
  const int exponent = static_cast<int>((bits16 >> 7) & 0xffu);
  const double fraction = static_cast<double>(bits16 & 0x7fu);
  if (exponent == 0) return sign * std::ldexp(fraction, -133);  // subnormal: f · 2^-126 / 2^7
  return sign * std::ldexp(128.0 + fraction, exponent - 134);
}

// docs/numerics.md's rule, derived apart from the bit trick: of the two bfloat16 values around
// x, the nearer by exact fp64 distance, a tie to the one with an even last bit.
uint16_t NearestBf16(float x) {
  const uint32_t u = std::bit_cast<uint32_t>(x);
  if (std::isnan(x)) return 0x7fc0;
  if (std::isinf(x)) return static_cast<uint16_t>(u >> 16);
  const uint32_t low = u >> 16, high = low + 1;  // toward zero, and one step away from it
  const double v = x, dl = std::fabs(v - Bf16Value(low)), dh = std::fabs(Bf16Value(high) - v);
  if (dl != dh) return static_cast<uint16_t>(dl < dh ? low : high);
  return static_cast<uint16_t>((low & 1u) == 0 ? low : high);
}

TEST(Bf16, NarrowingIsRoundToNearestEvenByValue) {
  // Every exponent and sign, and in each the ties, the values beside them and random low bits.
  int64_t checked = 0;
  for (uint32_t high = 0; high < 0x10000u; ++high) {
    for (const uint32_t low :
         {0x0000u, 0x0001u, 0x7fffu, 0x8000u, 0x8001u, 0xffffu, (high * 2654435761u) & 0xffffu}) {
      const float x = std::bit_cast<float>(high << 16 | low);
      const BFloat16 got = NarrowToBf16(x);
      ASSERT_EQ(got.bits, NearestBf16(x)) << fmt::format("x bits {:#010x}", high << 16 | low);
      if ((got.bits & 0x7f80u) != 0x7f80u) {  // finite: widening is exact
        ASSERT_EQ(static_cast<double>(WidenBf16(got)), Bf16Value(got.bits));
      }
      ++checked;
    }
  }
  EXPECT_EQ(checked, 7 * 65536);
  EXPECT_EQ(NarrowToBf16(0x1.0p-149f).bits, 0x0000);  // below half the least subnormal: +0
  EXPECT_EQ(NarrowToBf16(0x1.0p-133f).bits, 0x0001);  // the least subnormal bfloat16, not flushed
  EXPECT_EQ(NarrowToBf16(3.40282347e38f).bits, 0x7f80);  // FLT_MAX rounds past the last: +inf
}

TEST(Bf16, RoundToBf16IsTheNarrowingOnEveryVariant) {
  std::vector<float> x = RandomFloats(70001, 61, -4, 4);
  for (size_t i = 0; i < x.size(); i += 97) x[i] = std::ldexp(x[i], -130);  // subnormals
  x[1] = kNaN;
  x[2] = -kInf;
  x[3] = -0.0f;
  x[4] = std::bit_cast<float>(0xff812345u);  // a NaN with a payload and a sign
  x[5] = std::bit_cast<float>(0x3f808000u);  // a tie, to even (down)
  x[6] = std::bit_cast<float>(0x3f818000u);  // a tie, to even (up)
  std::vector<float> want = x;
  for (float& v : want) v = WidenBf16(NarrowToBf16(v));
  std::vector<float> got = x;
  rk::RoundToBf16(got);
  EXPECT_EQ(std::memcmp(got.data(), want.data(), want.size() * sizeof(float)), 0);
  EXPECT_EQ(std::bit_cast<uint32_t>(got[4]), 0x7fc00000u);
  ExpectBitwiseInvariant("RoundToBf16", [&] {
    std::vector<float> y = x;
    rk::RoundToBf16(y);
    return y;
  });
}

}  // namespace
}  // namespace lockstep::test
