// lockstep::dmath::Erfinv, the inverse error function (used by the truncated-normal init).
//
// Hand-written because no library available on Debian provides a deterministic erfinv: SLEEF
// has none, and libm/Boost/std implementations are neither fixed in operation order nor the
// same across versions. Every operation below is an IEEE basic operation (correctly rounded,
// so the same bits on every conforming unit), std::fma (correctly rounded by C99/C++, whether
// done in hardware or in software), or a SLEEF function of the deterministic "finz" family.
// The file is compiled with -ffp-contract=off, so no multiply-add is fused behind our back,
// and fp64 arithmetic on every supported platform (x86-64 SSE2, AArch64) is true binary64.
//
// Method (docs/numerics.md (dmath) gives the same steps as a specification):
//  1. A first approximation y0 in fp32 from M. Giles, "Approximating the erfinv function",
//     GPU Computing Gems Jade Edition (2011): with w = -log((1 - x)(1 + x)), erfinv(x) = x p(w)
//     where p is a degree-8 polynomial in w - 2.5 (w < 5) or in sqrt(w) - 3 (w >= 5). Alone
//     it is within 3.1 ulp of erfinv(x) (docs/numerics.md (dmath)).
//  2. One Newton step on erf(y) = x in fp64 with SLEEF's fp64 erf and exp. Newton converges
//     quadratically (the new error is about y0 * e0^2 for an absolute error e0), so the step
//     leaves an error near 1e-12 relative, and the final rounding to fp32 dominates: the
//     result is within 0.5 ulp plus a negligible fraction (tests/kernels/dmath_test.cc).
//     The step is done in fp64 because fp32 cannot do it: near |x| = 1 the residual
//     erf(y0) - x would be swamped by the 1 ulp error of an fp32 erf (erfinv's condition
//     number there is in the thousands).
#include <sleef.h>

#include <bit>
#include <cmath>
#include <limits>

#include "kernels/erfinv_impl.h"
#include "kernels/philox_impl.h"
#include "kernels/internal.h"
#include "lockstep/kernels.h"

namespace lockstep::dmath {
namespace {

// sqrt(pi) / 2 = 1 / erf'(0), rounded to fp64.
constexpr double kHalfSqrtPi = 0.88622692545275801365;

// Giles' single-precision approximation, for 0 < |x| < 1. Horner's rule from the highest
// coefficient, each step one fused multiply-add: p = fma(p, t, c).
float GilesErfinv(float x) {
  const float w = -Log((1.0f - x) * (1.0f + x));
  float p;
  if (w < 5.0f) {
    const float t = w - 2.5f;
    p = 2.81022636e-08f;
    p = std::fma(p, t, 3.43273939e-07f);
    p = std::fma(p, t, -3.5233877e-06f);
    p = std::fma(p, t, -4.39150654e-06f);
    p = std::fma(p, t, 0.00021858087f);
    p = std::fma(p, t, -0.00125372503f);
    p = std::fma(p, t, -0.00417768164f);
    p = std::fma(p, t, 0.246640727f);
    p = std::fma(p, t, 1.50140941f);
  } else {
    const float t = Sqrt(w) - 3.0f;
    p = -0.000200214257f;
    p = std::fma(p, t, 0.000100950558f);
    p = std::fma(p, t, 0.00134934322f);
    p = std::fma(p, t, -0.00367342844f);
    p = std::fma(p, t, 0.00573950773f);
    p = std::fma(p, t, -0.0076224613f);
    p = std::fma(p, t, 0.00943887047f);
    p = std::fma(p, t, 1.00167406f);
    p = std::fma(p, t, 2.83297682f);
  }
  return p * x;
}

}  // namespace

float ErfinvFirstApproximation(float x) {
  if (!(std::fabs(x) < 1.0f) || x == 0.0f) return std::bit_cast<float>(kCanonicalNaNBits);
  return GilesErfinv(x);
}

float Erfinv(float x) {
  if (!(std::fabs(x) < 1.0f)) {  // |x| >= 1 or NaN
    if (std::fabs(x) == 1.0f) return std::copysign(std::numeric_limits<float>::infinity(), x);
    return std::numeric_limits<float>::quiet_NaN();
  }
  if (x == 0.0f) return x;  // +0 -> +0, -0 -> -0

  // Newton step y1 = y0 - (erf(y0) - x) / erf'(y0), erf'(y) = exp(-y^2) / (sqrt(pi)/2),
  // written as y1 = y0 - ((erf(y0) - x) * (sqrt(pi)/2)) * exp(y0 * y0), in this order.
  // y0 is below 4 in magnitude (|x| <= 1 - 2^-24), so exp(y0 * y0) < e^16 cannot overflow;
  // for subnormal x, fp64 holds y0 and the residual without underflow.
  const double y0 = static_cast<double>(GilesErfinv(x));
  const double residual = Sleef_cinz_erfd1_u10purec(y0) - static_cast<double>(x);
  const double step = (residual * kHalfSqrtPi) * Sleef_cinz_expd1_u10purec(y0 * y0);
  return static_cast<float>(y0 - step);
}

}  // namespace lockstep::dmath

namespace lockstep::rk {

void PhiloxWords(PhiloxKey key, uint64_t first, std::span<uint32_t> out) {
  const auto kernel = detail::UsingReference() ? &ref::PhiloxWords : &simd::PhiloxWords;
  kernel(key[0], key[1], first, out.data(), static_cast<int64_t>(out.size()));
}

void ErfinvInPlace(std::span<float> x) {
  const auto kernel = detail::UsingReference() ? &ref::ErfinvInPlace : &simd::ErfinvInPlace;
  kernel(x.data(), static_cast<int64_t>(x.size()));
}

void ErfinvFirstApproximationInPlace(std::span<float> x) {
  const auto kernel = detail::UsingReference() ? &ref::ErfinvFirstApproximationInPlace
                                               : &simd::ErfinvFirstApproximationInPlace;
  kernel(x.data(), static_cast<int64_t>(x.size()));
}

}  // namespace lockstep::rk
