// Scalar reference (normative) of the cross-entropy element kernels:
// docs/numerics.md (cross_entropy).
#include "kernels/cross_entropy_impl.h"

namespace lockstep::rk::ref {

void LseAccumulate(const float* z, int64_t n, float* m, float* s) {
  for (int64_t c = 0; c < n; ++c) {
    const int64_t lane = c % kReductionLanes;
    ce::Merge(m[lane], s[lane], z[c], 1.0f);
  }
}

void LogitGrad(float* z, int64_t n, float lse, float coef, float grad_scale) {
  for (int64_t c = 0; c < n; ++c) z[c] = grad_scale * (coef * dmath::Exp(z[c] - lse));
}

}  // namespace lockstep::rk::ref
