// Private to src/kernels: the SwiGLU kernels behind SwigluForward / SwigluBackward
// (docs/numerics.md (swiglu)). Each kernel handles n consecutive elements of one row and never
// looks at the thread count: the public entry splits rows across threads. ref:: is normative;
// simd:: runs the active Highway target and must match it bit for bit.
#pragma once

#include <cstdint>

namespace lockstep::rk {

#define LOCKSTEP_RK_SWIGLU_KERNELS                                                       \
  /* out[i] = silu(gate[i]) * up[i] */                                                   \
  void SwigluForward(const float* gate, const float* up, float* out, int64_t n);         \
  /* dgate[i], dup[i] from dout[i] */                                                    \
  void SwigluBackward(const float* gate, const float* up, const float* dout, float* dgate, \
                      float* dup, int64_t n);

namespace ref {
LOCKSTEP_RK_SWIGLU_KERNELS
}
namespace simd {
LOCKSTEP_RK_SWIGLU_KERNELS
}
#undef LOCKSTEP_RK_SWIGLU_KERNELS

}  // namespace lockstep::rk
