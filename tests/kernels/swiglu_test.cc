// SwiGLU: bitwise invariance, fp64 accuracy, finite-difference gradients, special values and
// argument errors (docs/numerics.md (swiglu)).
#include <cmath>
#include <functional>
#include <limits>
#include <string>

#include "kernels/harness.h"
#include "lockstep/core.h"

namespace lockstep::test {
namespace {

const float kInf = std::numeric_limits<float>::infinity();
const float kNaN = std::numeric_limits<float>::quiet_NaN();

double SiluUp(double g, double u) { return g / (1.0 + std::exp(-g)) * u; }

TEST(Swiglu, BitwiseInvariant) {
  for (int64_t rows : {1, 3}) {
    for (int64_t f : kAwkwardSizes) {
      ExpectBitwiseInvariant(fmt::format("swiglu rows={} f={}", rows, f), [&] {
        const std::vector<float> h = RandomFloats(rows * 2 * f, f, -12, 12);
        const std::vector<float> dout = RandomFloats(rows * f, f + 1);
        std::vector<float> out(rows * f), dh(rows * 2 * f);
        rk::SwigluForward(h, out, rows, f);
        rk::SwigluBackward(h, dout, dh, rows, f);
        out.insert(out.end(), dh.begin(), dh.end());
        return out;
      });
    }
  }
}

TEST(Swiglu, MatchesFp64) {
  const int64_t rows = 5, f = 257;
  const std::vector<float> h = RandomFloats(rows * 2 * f, 7, -20, 20);
  std::vector<float> out(rows * f);
  rk::SwigluForward(h, out, rows, f);
  std::vector<double> want(out.size());
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t j = 0; j < f; ++j) want[r * f + j] = SiluUp(h[r * 2 * f + j], h[r * 2 * f + f + j]);
  }
  // exp (1 ulp), add, divide, two multiplies: a few ulp relative.
  ExpectClose("swiglu forward", out, want, 1e-30, 4e-7);
}

// dL/dh for L = sum(dout * out), by central differences of the fp64 forward.
TEST(Swiglu, BackwardMatchesFiniteDifferences) {
  const int64_t rows = 3, f = 17;
  const std::vector<float> h = RandomFloats(rows * 2 * f, 11, -6, 6);
  const std::vector<float> dout = RandomFloats(rows * f, 12);
  std::vector<float> dh(rows * 2 * f);
  rk::SwigluBackward(h, dout, dh, rows, f);
  std::vector<double> want(dh.size());
  const double step = 1e-5;
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t j = 0; j < f; ++j) {
      const double g = h[r * 2 * f + j], u = h[r * 2 * f + f + j], dy = dout[r * f + j];
      want[r * 2 * f + j] = dy * (SiluUp(g + step, u) - SiluUp(g - step, u)) / (2 * step);
      want[r * 2 * f + f + j] = dy * (SiluUp(g, u + step) - SiluUp(g, u - step)) / (2 * step);
    }
  }
  ExpectClose("swiglu backward", dh, want, 1e-6, 1e-5);
}

TEST(Swiglu, SpecialValues) {
  const float tiny = 1e-40f;  // subnormal
  // gate values, each with up = 1 and dout = 1.
  const std::vector<float> gate = {-0.0f, 0.0f, tiny, -100.0f, kInf, -kInf, kNaN, 100.0f};
  const int64_t f = static_cast<int64_t>(gate.size());
  std::vector<float> h(gate);
  h.resize(2 * f, 1.0f);
  const std::vector<float> dout(f, 1.0f);
  std::vector<float> out(f), dh(2 * f);
  for (const rk::Isa& isa : rk::UsableIsas()) {
    rk::SetIsa(isa);
    rk::SwigluForward(h, out, 1, f);
    rk::SwigluBackward(h, dout, dh, 1, f);
    EXPECT_TRUE(out[0] == 0 && std::signbit(out[0])) << isa.name << ": silu(-0) = -0";
    EXPECT_TRUE(out[1] == 0 && !std::signbit(out[1])) << isa.name;
    EXPECT_EQ(out[2], tiny * 0.5f) << isa.name << ": subnormal kept, not flushed";
    EXPECT_NE(out[2], 0.0f) << isa.name;
    EXPECT_EQ(out[3], 0.0f) << isa.name << ": exp(100) overflows to inf, s = 0, no NaN";
    EXPECT_EQ(dh[3], 0.0f) << isa.name;
    EXPECT_EQ(out[4], kInf) << isa.name;
    EXPECT_TRUE(std::isnan(out[5])) << isa.name << ": silu(-inf) = -inf * 0 is NaN by contract";
    EXPECT_TRUE(std::isnan(out[6]) && std::isnan(dh[6]) && std::isnan(dh[f + 6])) << isa.name;
    EXPECT_EQ(out[7], 100.0f) << isa.name;
    EXPECT_EQ(dh[0], 0.5f) << isa.name << ": d silu / dg at 0 is 1/2";
  }
  rk::SetIsa(rk::IsaByName("best"));
}

TEST(Swiglu, RejectsBadArguments) {
  std::vector<float> h(12), out(6), dh(12);
  ExpectError([&] { rk::SwigluForward(h, std::span(out).first(5), 2, 3); },
              {"SwigluForward", "out has 5", "rows*f = 6"});
  ExpectError([&] { rk::SwigluForward(h, out, 0, 3); }, {"SwigluForward", "rows = 0"});
  ExpectError([&] { rk::SwigluForward(h, std::span(h).first(6), 2, 3); },
              {"SwigluForward", "out", "overlaps", "h"});
  ExpectError([&] { rk::SwigluBackward(h, out, std::span(dh).subspan(2), 2, 3); },
              {"SwigluBackward", "dh has 10"});
  ExpectError([&] { rk::SwigluBackward(h, std::span(dh).first(6), dh, 2, 3); },
              {"SwigluBackward", "dh", "overlaps", "dout"});
}

}  // namespace
}  // namespace lockstep::test
