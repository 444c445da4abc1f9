// The vector forms of lockstep::dmath (src/kernels/simd/dmath-inl.h) must give, lane by lane,
// exactly the bits of the scalar functions, on every target lockstep dispatches to and for
// both the full-width tag and the 8-lane tag the kernels use (on AVX-512 the latter takes the
// per-lane fallback).
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels/dmath_vector_test.cc"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>

#include <cstdint>
#include <cstring>
#include <ios>
#include <limits>
#include <vector>

// src/ is not on kernel_tests' include path; this resolves through tests/.
#include "kernels/simd/dmath-inl.h"

HWY_BEFORE_NAMESPACE();
namespace lockstep::rk::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

template <class D>
void ApplyWithTag(D d, const float* x, size_t n, float* out) {
  const size_t lanes = hn::Lanes(d);
  for (size_t i = 0; i < n; i += lanes) {
    const auto v = hn::LoadU(d, x + i);
    hn::StoreU(VExp(d, v), d, out + 0 * n + i);
    hn::StoreU(VLog(d, v), d, out + 1 * n + i);
    hn::StoreU(VSin(d, v), d, out + 2 * n + i);
    hn::StoreU(VCos(d, v), d, out + 3 * n + i);
    hn::StoreU(VErf(d, v), d, out + 4 * n + i);
  }
}

// out[f * n + i] = function f (Exp, Log, Sin, Cos, Erf) of x[i]; `eight_lanes` selects
// CappedTag<float, 8> over the widest tag. n must be a multiple of every vector width.
void ApplyVectorForms(const float* x, size_t n, bool eight_lanes, float* out) {
  if (eight_lanes) {
    ApplyWithTag(hn::CappedTag<float, 8>(), x, n, out);
  } else {
    ApplyWithTag(hn::ScalableTag<float>(), x, n, out);
  }
}

}  // namespace lockstep::rk::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
#include <gtest/gtest.h>

#include "kernels/harness.h"
#include "lockstep/kernels.h"

namespace lockstep::rk {
HWY_EXPORT(ApplyVectorForms);
namespace {

constexpr int kFunctions = 5;  // the blocks of ApplyVectorForms' output

TEST(DmathVector, BitIdenticalToScalarOnEveryTarget) {
  constexpr size_t kN = size_t{1} << 17;
  // Half uniform in [-100, 100] (the working ranges, log's NaNs included), half random bit
  // patterns (every binade, subnormals, infinities, NaNs), then the special values.
  std::vector<float> x = test::RandomFloats(kN / 2, 1, -100.0f, 100.0f);
  const std::vector<float> bits = test::RandomFloats(kN / 2, 2, 0.0f, 1.0f);
  for (float u : bits) {
    const auto pattern = static_cast<uint32_t>(static_cast<double>(u) * 4294967296.0);
    float f;
    std::memcpy(&f, &pattern, sizeof f);
    x.push_back(f);
  }
  const float specials[] = {0.0f, -0.0f, std::numeric_limits<float>::infinity(),
                            -std::numeric_limits<float>::infinity(),
                            std::numeric_limits<float>::quiet_NaN(),
                            std::numeric_limits<float>::denorm_min(),
                            -std::numeric_limits<float>::min()};
  std::copy(std::begin(specials), std::end(specials), x.begin());

  float (*const scalar[kFunctions])(float) = {dmath::Exp, dmath::Log, dmath::Sin, dmath::Cos,
                                              dmath::Erf};
  const char* const names[kFunctions] = {"Exp", "Log", "Sin", "Cos", "Erf"};
  std::vector<float> want(kFunctions * kN);
  for (int f = 0; f < kFunctions; ++f) {
    for (size_t i = 0; i < kN; ++i) want[f * kN + i] = scalar[f](x[i]);
  }

  const Isa saved = ActiveIsa();
  std::vector<float> got(kFunctions * kN);
  for (const Isa& isa : UsableIsas()) {
    if (isa.hwy_target == 0) continue;  // the reference is the scalar code itself
    hwy::SetSupportedTargetsForTest(isa.hwy_target);
    for (bool eight_lanes : {false, true}) {
      HWY_DYNAMIC_DISPATCH(ApplyVectorForms)(x.data(), kN, eight_lanes, got.data());
      for (int f = 0; f < kFunctions; ++f) {
        const float* g = got.data() + f * kN;
        const float* w = want.data() + f * kN;
        if (std::memcmp(g, w, kN * sizeof(float)) == 0) continue;
        size_t i = 0;
        while (std::memcmp(g + i, w + i, sizeof(float)) == 0) ++i;
        ADD_FAILURE() << "V" << names[f] << " on " << isa.name
                      << (eight_lanes ? " (8 lanes)" : " (full width)") << std::hexfloat
                      << " at x = " << x[i]
                      << ": " << g[i] << ", scalar " << w[i];
      }
    }
  }
  hwy::SetSupportedTargetsForTest(0);
  SetIsa(saved);
}

}  // namespace
}  // namespace lockstep::rk
#endif  // HWY_ONCE
