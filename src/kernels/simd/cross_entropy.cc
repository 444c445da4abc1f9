// SIMD cross-entropy element kernels. The 16 logical lanes of the online log-sum-exp live in
// 16/N vectors of N floats (N = 8 on AVX2, 16 on AVX-512), so each lane merges the reference's
// logits in the reference's order; the vector merge is ce::Merge written with masks. The last
// partial group of 16 goes to the reference kernel.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels/simd/cross_entropy.cc"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>

#include "kernels/cross_entropy_impl.h"
#include "kernels/simd/dmath-inl.h"

HWY_BEFORE_NAMESPACE();
namespace lockstep::rk::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

void LseAccumulate(const float* z, int64_t n, float* m, float* s) {
  const hn::CappedTag<float, kReductionLanes> d;
  constexpr size_t kN = hn::MaxLanes(d);
  constexpr size_t kVectors = kReductionLanes / kN;
  static_assert(kReductionLanes % kN == 0, "whole vectors hold the logical lanes");
  const auto one = hn::Set(d, 1.0f);
  hn::Vec<decltype(d)> mv[kVectors], sv[kVectors];
  for (size_t j = 0; j < kVectors; ++j) {
    mv[j] = hn::LoadU(d, m + j * kN);
    sv[j] = hn::LoadU(d, s + j * kN);
  }
  int64_t c = 0;
  for (; c + kReductionLanes <= n; c += kReductionLanes) {
    for (size_t j = 0; j < kVectors; ++j) {
      const auto zv = hn::LoadU(d, z + c + j * kN);
      // ce::Merge(m, s, z, 1); exp of inf - inf in a lane where z == m is computed and dropped.
      const auto e = hn::IfThenElse(hn::Eq(zv, mv[j]), one,
                                    VExp(d, hn::Neg(hn::Abs(hn::Sub(zv, mv[j])))));
      const auto greater = hn::Gt(zv, mv[j]);
      sv[j] = hn::IfThenElse(greater, hn::MulAdd(sv[j], e, one), hn::MulAdd(one, e, sv[j]));
      mv[j] = hn::IfThenElse(greater, zv, mv[j]);
    }
  }
  for (size_t j = 0; j < kVectors; ++j) {
    hn::StoreU(mv[j], d, m + j * kN);
    hn::StoreU(sv[j], d, s + j * kN);
  }
  ref::LseAccumulate(z + c, n - c, m, s);
}

void LogitGrad(float* z, int64_t n, float lse, float coef, float grad_scale) {
  const hn::ScalableTag<float> d;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(d));
  const auto lse_v = hn::Set(d, lse), coef_v = hn::Set(d, coef), scale_v = hn::Set(d, grad_scale);
  int64_t c = 0;
  for (; c + lanes <= n; c += lanes) {
    const auto p = VExp(d, hn::Sub(hn::LoadU(d, z + c), lse_v));
    hn::StoreU(hn::Mul(scale_v, hn::Mul(coef_v, p)), d, z + c);
  }
  ref::LogitGrad(z + c, n - c, lse, coef, grad_scale);
}

}  // namespace lockstep::rk::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace lockstep::rk::simd {
HWY_EXPORT(LseAccumulate);
HWY_EXPORT(LogitGrad);

void LseAccumulate(const float* z, int64_t n, float* m, float* s) {
  HWY_DYNAMIC_DISPATCH(LseAccumulate)(z, n, m, s);
}
void LogitGrad(float* z, int64_t n, float lse, float coef, float grad_scale) {
  HWY_DYNAMIC_DISPATCH(LogitGrad)(z, n, lse, coef, grad_scale);
}
}  // namespace lockstep::rk::simd
#endif
