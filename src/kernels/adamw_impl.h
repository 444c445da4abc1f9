// Private to src/kernels: the AdamW kernels (docs/numerics.md (adamw)). The per-step scalars are
// computed once by ref::AdamWScalarsFor; the element kernels update n consecutive elements and
// never look at the thread count (the public entry splits the tensor into blocks). ref:: is
// normative; simd:: runs the active Highway target and must match it bit for bit.
#pragma once

#include <cstdint>

#include "lockstep/kernels.h"

namespace lockstep::rk {

namespace ref {
AdamWScalars AdamWScalarsFor(const AdamWParams& p);
}

#define LOCKSTEP_RK_ADAMW_KERNELS \
  void AdamW(const AdamWScalars& k, float* param, const float* grad, float* m, float* v, int64_t n);

namespace ref {
LOCKSTEP_RK_ADAMW_KERNELS
}
namespace simd {
LOCKSTEP_RK_ADAMW_KERNELS
}
#undef LOCKSTEP_RK_ADAMW_KERNELS

}  // namespace lockstep::rk
