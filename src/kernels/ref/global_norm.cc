// Scalar reference (normative) of the global-norm lanes: docs/numerics.md (global_norm).
#include <cmath>

#include "kernels/global_norm_impl.h"

namespace lockstep::rk::ref {

// fp64 makes every square exact (24-bit significands, exponents far inside fp64's range), so a
// subnormal float's square is a normal double and is never flushed or lost.
void AccumulateSquares(const float* x, int64_t n, double* lanes) {
  for (int64_t c = 0; c < n; ++c) {
    const double xd = x[c];
    lanes[c % kReductionLanes] = std::fma(xd, xd, lanes[c % kReductionLanes]);
  }
}

}  // namespace lockstep::rk::ref
