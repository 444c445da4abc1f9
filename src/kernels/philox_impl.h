// Private to src/kernels: the Philox4x32-10 word stream (lockstep::Philox4x32, src/core). ref:: is
// normative (one counter at a time); simd:: runs the active Highway target and must match it.
#pragma once

#include <cstdint>

namespace lockstep::rk {

#define LOCKSTEP_RK_PHILOX_KERNELS                                                   \
  /* out[i] = word (first + i) % 4 of Philox4x32({(first + i) / 4 as two 32-bit */   \
  /* halves, 0, 0}, {k0, k1}) for i < n */                                            \
  void PhiloxWords(uint32_t k0, uint32_t k1, uint64_t first, uint32_t* out, int64_t n);

namespace ref {
LOCKSTEP_RK_PHILOX_KERNELS
}
namespace simd {
LOCKSTEP_RK_PHILOX_KERNELS
}
#undef LOCKSTEP_RK_PHILOX_KERNELS

}  // namespace lockstep::rk
