// Reference erfinv (and its first step) over an array: the scalar function, element by element.
#include "kernels/erfinv_impl.h"
#include "lockstep/kernels.h"

namespace lockstep::rk::ref {

void ErfinvInPlace(float* x, int64_t n) {
  for (int64_t i = 0; i < n; ++i) x[i] = dmath::Erfinv(x[i]);
}

void ErfinvFirstApproximationInPlace(float* x, int64_t n) {
  for (int64_t i = 0; i < n; ++i) x[i] = dmath::ErfinvFirstApproximation(x[i]);
}

}  // namespace lockstep::rk::ref
