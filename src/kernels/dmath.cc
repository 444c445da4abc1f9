// Deterministic scalar math. SLEEF's "cinz" functions (consistent, no FMA) give the same bits
// on every ISA of that family: the portable C scalar (purec) runs on any CPU, and the AVX /
// AVX-512 members (simd/dmath-inl.h) match it bit for bit. The "finz" (FMA) family would be
// faster but its scalar member needs FMA hardware, which the reference must not assume.
// std:: math is never used: its bits depend on the libc version.
#include <sleef.h>

#include "lockstep/kernels.h"

namespace lockstep::dmath {

// Every result passes through Canonical: SLEEF returns NaN bits as the hardware makes them
// (the AVX-512 member gives log(-inf) = -NaN where the portable C member gives +NaN), and IEEE
// sqrt of a negative number is -NaN on x86 and +NaN on Arm.
float Exp(float x) { return Canonical(Sleef_cinz_expf1_u10purec(x)); }
float Log(float x) { return Canonical(Sleef_cinz_logf1_u10purec(x)); }
// sqrt and division are correctly rounded by IEEE 754, so any conforming unit gives these bits.
float Sqrt(float x) { return Canonical(__builtin_sqrtf(x)); }
float Rsqrt(float x) { return Canonical(1.0f / __builtin_sqrtf(x)); }
float Sin(float x) { return Canonical(Sleef_cinz_sinf1_u10purec(x)); }
float Cos(float x) { return Canonical(Sleef_cinz_cosf1_u10purec(x)); }
float Pow(float x, float y) { return Canonical(Sleef_cinz_powf1_u10purec(x, y)); }
float Erf(float x) { return Canonical(Sleef_cinz_erff1_u10purec(x)); }

}  // namespace lockstep::dmath
