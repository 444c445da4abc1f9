// Private to src/kernels: dmath::Erfinv over an array (the truncated-normal init's hot loop).
// ref:: is normative (the scalar function per element); simd:: runs the active Highway target
// and must match it bit for bit.
#pragma once

#include <cstdint>

namespace lockstep::rk {

#define LOCKSTEP_RK_ERFINV_KERNELS \
  /* x[i] = dmath::Erfinv(x[i]) */ \
  void ErfinvInPlace(float* x, int64_t n); \
  /* x[i] = dmath::ErfinvFirstApproximation(x[i]) */ \
  void ErfinvFirstApproximationInPlace(float* x, int64_t n);

namespace ref {
LOCKSTEP_RK_ERFINV_KERNELS
}
namespace simd {
LOCKSTEP_RK_ERFINV_KERNELS
}
#undef LOCKSTEP_RK_ERFINV_KERNELS

}  // namespace lockstep::rk
