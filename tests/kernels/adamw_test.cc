// AdamW: bitwise invariance over 25 steps, fp64 accuracy, special values and argument errors
// (docs/numerics.md (adamw)).
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

const rk::AdamWParams kParams{.lr = 1e-2f, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f,
                              .weight_decay = 0.1f, .step = 1};
constexpr int kSteps = 25;  // a libm powf in the bias correction once diverged only at step 15

// param, m, v after kSteps updates with fresh gradients each step.
std::vector<float> Train(int64_t n, uint64_t seed) {
  std::vector<float> param = RandomFloats(n, seed), m(n, 0.0f), v(n, 0.0f);
  for (int step = 1; step <= kSteps; ++step) {
    rk::AdamWParams p = kParams;
    p.step = step;
    rk::AdamWUpdate(p, param, RandomFloats(n, seed + step, -3, 3), m, v);
  }
  param.insert(param.end(), m.begin(), m.end());
  param.insert(param.end(), v.begin(), v.end());
  return param;
}

TEST(AdamW, BitwiseInvariant) {
  for (int64_t n : {int64_t{1}, int64_t{3}, int64_t{17}, int64_t{255}, int64_t{257},
                    int64_t{100003}}) {
    ExpectBitwiseInvariant(fmt::format("adamw n={} over {} steps", n, kSteps),
                           [&] { return Train(n, n); });
  }
}

TEST(AdamW, MatchesFp64) {
  const int64_t n = 1001;
  const std::vector<float> got = Train(n, 3);
  const std::vector<float> param0 = RandomFloats(n, 3);
  std::vector<double> param(param0.begin(), param0.end());
  std::vector<double> m(n, 0.0), v(n, 0.0);
  const double lr = kParams.lr, b1 = kParams.beta1, b2 = kParams.beta2, eps = kParams.eps;
  for (int step = 1; step <= kSteps; ++step) {
    const std::vector<float> g = RandomFloats(n, 3 + step, -3, 3);
    const double bc1 = 1 - std::pow(b1, step), bc2 = 1 - std::pow(b2, step);
    for (int64_t i = 0; i < n; ++i) {
      param[i] *= 1 - lr * kParams.weight_decay;
      m[i] = b1 * m[i] + (1 - b1) * g[i];
      v[i] = b2 * v[i] + (1 - b2) * g[i] * g[i];
      param[i] -= lr / bc1 * m[i] / (std::sqrt(v[i]) / std::sqrt(bc2) + eps);
    }
  }
  auto slice = [&](int k) { return std::vector<float>(got.begin() + k * n, got.begin() + (k + 1) * n); };
  ExpectClose("param", slice(0), param, 1e-5, 1e-5);
  ExpectClose("m", slice(1), m, 1e-6, 1e-5);
  ExpectClose("v", slice(2), v, 1e-6, 1e-5);
}

TEST(AdamW, SpecialValues) {
  const float tiny = 1e-40f;  // subnormal
  const std::vector<float> grad = {kNaN, kInf, 0.0f, -0.0f, tiny, 2.0f};
  for (const rk::Isa& isa : rk::UsableIsas()) {
    rk::SetIsa(isa);
    std::vector<float> param = {1, 1, -0.0f, 0.5f, 1, 1}, m(6, 0.0f), v(6, 0.0f);
    rk::AdamWParams p = kParams;
    p.weight_decay = 0;
    rk::AdamWUpdate(p, param, grad, m, v);
    // NaN results are the canonical NaN on every variant (they are hashed).
    for (float nan : {param[0], m[0], v[0], param[1]}) {
      EXPECT_EQ(std::bit_cast<uint32_t>(nan), dmath::kCanonicalNaNBits) << isa.name;
    }
    EXPECT_TRUE(param[2] == 0 && std::signbit(param[2])) << isa.name << ": zero gradient, -0 kept";
    EXPECT_EQ(param[3], 0.5f) << isa.name << ": a zero gradient moves nothing";
    EXPECT_EQ(m[4], 0.1f * tiny) << isa.name << ": subnormal moment kept";
    EXPECT_NE(m[4], 0.0f) << isa.name;
    EXPECT_NEAR(param[5], 1.0f - p.lr, 1e-7) << isa.name << ": the first step moves lr * sign(g)";
  }
  rk::SetIsa(rk::IsaByName("best"));
}

TEST(AdamW, RejectsBadArguments) {
  std::vector<float> param(4), grad(4), m(4), v(4);
  auto update = [&](rk::AdamWParams p) {
    return [&, p] { rk::AdamWUpdate(p, param, grad, m, v); };
  };
  rk::AdamWParams p = kParams;
  p.beta1 = 1.0f;
  ExpectError(update(p), {"AdamWUpdate", "beta1 = 1", "[0, 1)"});
  p = kParams;
  p.beta2 = -0.5f;
  ExpectError(update(p), {"AdamWUpdate", "beta2 = -0.5"});
  p = kParams;
  p.lr = kNaN;
  ExpectError(update(p), {"AdamWUpdate", "lr = nan"});
  p = kParams;
  p.eps = 0;
  ExpectError(update(p), {"AdamWUpdate", "eps = 0"});
  p = kParams;
  p.weight_decay = kInf;
  ExpectError(update(p), {"AdamWUpdate", "weight_decay = inf"});
  p = kParams;
  p.step = 0;
  ExpectError(update(p), {"AdamWUpdate", "step = 0"});
  ExpectError([&] { rk::AdamWUpdate(kParams, param, std::span(grad).first(3), m, v); },
              {"AdamWUpdate", "grad has 3", "param.size() = 4"});
  ExpectError([&] { rk::AdamWUpdate(kParams, param, grad, param, v); },
              {"AdamWUpdate", "param", "overlaps", "m"});
}

}  // namespace
}  // namespace lockstep::test
