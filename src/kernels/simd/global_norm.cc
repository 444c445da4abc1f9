// SIMD global-norm lanes: the 16 logical fp64 lanes live in 16/N vectors of N doubles (N = 4 on
// AVX2, 8 on AVX-512), so each lane sees the reference's terms in the reference's order. The
// last partial group of 16 goes to the reference kernel.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels/simd/global_norm.cc"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>

#include "kernels/global_norm_impl.h"

HWY_BEFORE_NAMESPACE();
namespace lockstep::rk::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

void AccumulateSquares(const float* x, int64_t n, double* lanes) {
  const hn::CappedTag<double, kReductionLanes> dd;
  const hn::Rebind<float, decltype(dd)> df;
  constexpr size_t kN = hn::MaxLanes(dd);
  constexpr size_t kVectors = kReductionLanes / kN;
  static_assert(kReductionLanes % kN == 0, "whole vectors hold the logical lanes");
  hn::Vec<decltype(dd)> acc[kVectors];
  for (size_t j = 0; j < kVectors; ++j) acc[j] = hn::LoadU(dd, lanes + j * kN);
  int64_t c = 0;
  for (; c + kReductionLanes <= n; c += kReductionLanes) {
    for (size_t j = 0; j < kVectors; ++j) {
      const auto xd = hn::PromoteTo(dd, hn::LoadU(df, x + c + j * kN));
      acc[j] = hn::MulAdd(xd, xd, acc[j]);
    }
  }
  for (size_t j = 0; j < kVectors; ++j) hn::StoreU(acc[j], dd, lanes + j * kN);
  ref::AccumulateSquares(x + c, n - c, lanes);
}

}  // namespace lockstep::rk::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace lockstep::rk::simd {
HWY_EXPORT(AccumulateSquares);

void AccumulateSquares(const float* x, int64_t n, double* lanes) {
  HWY_DYNAMIC_DISPATCH(AccumulateSquares)(x, n, lanes);
}
}  // namespace lockstep::rk::simd
#endif
