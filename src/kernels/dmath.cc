// Deterministic scalar math. SLEEF's "cinz" functions (consistent, no FMA) give the same bits
// on every ISA of that family: the portable C scalar (purec) runs on any CPU, and the AVX /
// AVX-512 members (simd/dmath-inl.h) match it bit for bit. The "finz" (FMA) family would be
// faster but its scalar member needs FMA hardware, which the reference must not assume.
// std:: math is never used: its bits depend on the libc version.
#include <sleef.h>

#include "lockstep/kernels.h"

namespace lockstep::dmath {

float Exp(float x) { return Sleef_cinz_expf1_u10purec(x); }
float Log(float x) { return Sleef_cinz_logf1_u10purec(x); }
// sqrt and division are correctly rounded by IEEE 754, so any conforming unit gives these bits.
float Sqrt(float x) { return __builtin_sqrtf(x); }
float Rsqrt(float x) { return 1.0f / __builtin_sqrtf(x); }
float Sin(float x) { return Sleef_cinz_sinf1_u10purec(x); }
float Cos(float x) { return Sleef_cinz_cosf1_u10purec(x); }
float Pow(float x, float y) { return Sleef_cinz_powf1_u10purec(x, y); }
float Erf(float x) { return Sleef_cinz_erff1_u10purec(x); }

}  // namespace lockstep::dmath
