// Private to src/kernels: the per-element kernels of the fused output head + cross-entropy
// (docs/numerics.md (cross_entropy)). The public entry (cross_entropy.cc) produces the logits a
// vocab chunk at a time with the GEMM, splits rows across threads, and calls these kernels on
// one row's slice of a chunk. ref:: is normative; simd:: runs the active Highway target and
// must match it bit for bit.
#pragma once

#include <cmath>
#include <cstdint>

#include "lockstep/kernels.h"

namespace lockstep::rk {
namespace ce {

// Merges the running log-sum-exp (m_b, s_b) into (m, s), where a state (m, s) stands for
// s * exp(m): m' = max(m, m_b) and the other side's sum is scaled by e = exp(-|m - m_b|),
// taken as exactly 1 when m == m_b (so equal infinities, such as two empty lanes at -inf, never
// form inf - inf). Feeding one logit z is the merge with (z, 1). A NaN m_b fails both
// comparisons and makes s NaN; m itself never becomes NaN.
inline void Merge(float& m, float& s, float m_b, float s_b) {
  const float e = m_b == m ? 1.0f : dmath::Exp(-std::fabs(m_b - m));
  if (m_b > m) {
    s = std::fma(s, e, s_b);
    m = m_b;
  } else {
    s = std::fma(s_b, e, s);
  }
}

// d(loss + zloss)/dz at the target column, times grad_scale: the softmax term and the -1 are
// fused so that p ~ 1 keeps its low bits. coef = 1 + 2*z_loss*lse (see CrossEntropyBackward).
inline float TargetLogitGrad(float z, float lse, float coef, float grad_scale) {
  return grad_scale * std::fma(coef, dmath::Exp(z - lse), -1.0f);
}

}  // namespace ce

#define LOCKSTEP_RK_CE_KERNELS                                                              \
  /* Feeds logits z[0, n) into lane states m[16], s[16]: z[c] goes to lane c % 16, in       \
     increasing c, by ce::Merge(m[lane], s[lane], z[c], 1). The slice must start at a vocab \
     index that is a multiple of 16. */                                                     \
  void LseAccumulate(const float* z, int64_t n, float* m, float* s);                        \
  /* In place: z[c] = grad_scale * (coef * exp(z[c] - lse)), the non-target logit gradient. */ \
  void LogitGrad(float* z, int64_t n, float lse, float coef, float grad_scale);

namespace ref {
LOCKSTEP_RK_CE_KERNELS
}
namespace simd {
LOCKSTEP_RK_CE_KERNELS
}
#undef LOCKSTEP_RK_CE_KERNELS

}  // namespace lockstep::rk
