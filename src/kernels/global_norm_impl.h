// Private to src/kernels: the global-norm block kernel (docs/numerics.md (global_norm)). A block
// (at most kNormBlock elements) is summed in kReductionLanes fp64 lanes; the kernel only
// accumulates into the lanes, and the public entry folds them and adds the block sums in order.
// ref:: is normative; simd:: runs the active Highway target and must match it bit for bit.
#pragma once

#include <cstdint>

#include "lockstep/kernels.h"

namespace lockstep::rk {

// lanes[c % 16] = fma(x[c], x[c], lanes[c % 16]) in fp64 for c = 0, 1, ..., n-1 in order
// (x widened exactly). Callers pass slices that start at a multiple of 16 within the block.
#define LOCKSTEP_RK_NORM_KERNELS \
  void AccumulateSquares(const float* x, int64_t n, double* lanes);

namespace ref {
LOCKSTEP_RK_NORM_KERNELS
}
namespace simd {
LOCKSTEP_RK_NORM_KERNELS
}
#undef LOCKSTEP_RK_NORM_KERNELS

}  // namespace lockstep::rk
