// SIMD AdamW: the reference's operations on whole vectors of independent elements (Sqrt and Div
// are IEEE correctly rounded, MulAdd is fused; NaN results canonical), the remainder handed to
// the reference kernel.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels/simd/adamw.cc"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>

#include "kernels/adamw_impl.h"

HWY_BEFORE_NAMESPACE();
namespace lockstep::rk::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

void AdamW(const AdamWScalars& k, float* param, const float* grad, float* m, float* v,
           int64_t n) {
  const hn::ScalableTag<float> d;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(d));
  const auto decay = hn::Set(d, k.decay), neg_step_size = hn::Set(d, -k.step_size);
  const auto beta1 = hn::Set(d, k.beta1), one_minus_beta1 = hn::Set(d, k.one_minus_beta1);
  const auto beta2 = hn::Set(d, k.beta2), one_minus_beta2 = hn::Set(d, k.one_minus_beta2);
  const auto sqrt_bc2 = hn::Set(d, k.sqrt_bc2), eps = hn::Set(d, k.eps);
  const auto nan = hn::BitCast(d, hn::Set(hn::RebindToUnsigned<decltype(d)>(),
                                          dmath::kCanonicalNaNBits));
  const auto canonical = [&](auto x) { return hn::IfThenElse(hn::IsNaN(x), nan, x); };
  int64_t i = 0;
  for (; i + lanes <= n; i += lanes) {
    const auto g = hn::LoadU(d, grad + i);
    const auto mi = hn::MulAdd(beta1, hn::LoadU(d, m + i), hn::Mul(one_minus_beta1, g));
    const auto vi = hn::MulAdd(beta2, hn::LoadU(d, v + i), hn::Mul(hn::Mul(one_minus_beta2, g), g));
    const auto denom = hn::Add(hn::Div(hn::Sqrt(vi), sqrt_bc2), eps);
    const auto p = hn::Mul(hn::LoadU(d, param + i), decay);
    hn::StoreU(canonical(hn::MulAdd(neg_step_size, hn::Div(mi, denom), p)), d, param + i);
    hn::StoreU(canonical(mi), d, m + i);
    hn::StoreU(canonical(vi), d, v + i);
  }
  ref::AdamW(k, param + i, grad + i, m + i, v + i, n - i);
}

}  // namespace lockstep::rk::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace lockstep::rk::simd {
HWY_EXPORT(AdamW);

void AdamW(const AdamWScalars& k, float* param, const float* grad, float* m, float* v,
           int64_t n) {
  HWY_DYNAMIC_DISPATCH(AdamW)(k, param, grad, m, v, n);
}
}  // namespace lockstep::rk::simd
#endif
