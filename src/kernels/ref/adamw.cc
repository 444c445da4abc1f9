// Scalar reference (normative) of AdamW with decoupled weight decay: docs/numerics.md (adamw).
#include <cmath>

#include "kernels/adamw_impl.h"

namespace lockstep::rk::ref {

AdamWScalars AdamWScalarsFor(const AdamWParams& p) {
  // The step enters Pow as the nearest float (exact up to 2^24 steps). dmath::Pow, not powf:
  // a libm powf here once split two machines at step 15.
  const auto step = static_cast<float>(p.step);
  const float bc1 = 1.0f - dmath::Pow(p.beta1, step);
  const float bc2 = 1.0f - dmath::Pow(p.beta2, step);
  return AdamWScalars{
      .decay = std::fma(-p.lr, p.weight_decay, 1.0f),
      .beta1 = p.beta1,
      .one_minus_beta1 = 1.0f - p.beta1,
      .beta2 = p.beta2,
      .one_minus_beta2 = 1.0f - p.beta2,
      .sqrt_bc2 = dmath::Sqrt(bc2),
      .eps = p.eps,
      .step_size = p.lr / bc1,
  };
}

void AdamW(const AdamWScalars& k, float* param, const float* grad, float* m, float* v,
           int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const float g = grad[i];
    const float mi = std::fma(k.beta1, m[i], k.one_minus_beta1 * g);
    const float vi = std::fma(k.beta2, v[i], (k.one_minus_beta2 * g) * g);
    const float denom = dmath::Sqrt(vi) / k.sqrt_bc2 + k.eps;
    param[i] = dmath::Canonical(std::fma(-k.step_size, mi / denom, param[i] * k.decay));
    m[i] = dmath::Canonical(mi);
    v[i] = dmath::Canonical(vi);
  }
}

}  // namespace lockstep::rk::ref
