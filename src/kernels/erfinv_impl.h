// Private to src/kernels: dmath::Erfinv over an array (the truncated-normal init's hot loop).
// ref:: is normative (the scalar function per element); simd:: runs the active Highway target
// and must match it bit for bit.
#pragma once

#include <bit>
#include <cmath>
#include <cstdint>

#include "kernels/init_erfinv_coefficients.h"

namespace lockstep::rk {

// The init's erfinv table (rk::InitErfinvTable): draw k (one of 2^24) takes entry a = k - 2^23
// for k >= 2^23 and that of 2^24 - 1 - k below; entry a is four bits at bit 4 (a mod 8) of word
// a / 8.
inline constexpr uint32_t kInitTableHalf = uint32_t{1} << 23;
inline uint32_t InitTableIndex(uint32_t k) {
  return (k >= kInitTableHalf ? k : ~k) & (kInitTableHalf - 1);
}
inline int32_t InitTableCorrection(const uint32_t* table, uint32_t a) {
  return static_cast<int32_t>((table[a / 8] >> (4 * (a % 8))) & 15) - 8;
}
// The init's first approximation of erfinv, for 0 < |x| <= 0.9545 (the init's arguments): on the
// segment j of |x| that u = 1 - |x| gives (its exponent and first mantissa bit), |x| * q_j(|x| -
// c_j) with q_j a polynomial (scripts/gen-init-erfinv.py), by Horner's rule with fused
// multiply-adds, and x's sign: within 2 ulp of erfinv, odd bit for bit. It needs no log (Giles'
// does) and is not part of the contract: the init corrects it exactly by its table. Outside the
// domain the segment is clamped to the zero padding (a defined result, no read out of bounds).
// The segment is bits(u) >> 22 (exponent and first mantissa bit) less kInitErfinvSegmentBias,
// u = 1 - |x| in [2^-5, 1); the last of the 16 table entries is zero padding.
inline constexpr uint32_t kInitErfinvSegmentBias = 244, kInitErfinvOutside = 15;
static_assert(kInitErfinvSegments <= static_cast<int>(kInitErfinvOutside));
inline uint32_t InitErfinvSegment(float magnitude) {
  const uint32_t j = (std::bit_cast<uint32_t>(1.0f - magnitude) >> 22) - kInitErfinvSegmentBias;
  return j < kInitErfinvOutside ? j : kInitErfinvOutside;
}
inline float InitErfinvFirstApproximation(float x) {
  const float magnitude = std::fabs(x);
  const uint32_t j = InitErfinvSegment(magnitude);
  const float s = magnitude - kInitErfinvCenter[j];
  float p = kInitErfinvCoefficient[kInitErfinvDegree][j];
  for (int k = kInitErfinvDegree - 1; k >= 0; --k) p = std::fma(p, s, kInitErfinvCoefficient[k][j]);
  return std::copysign(magnitude * p, x);
}
// (float)(2k + 1 - 2^24) * 2^-24: an odd multiple of 2^-24 in (-1, 1), exact.
inline float InitUniform(uint32_t word) {
  const auto k = static_cast<int32_t>(word >> 8);
  return static_cast<float>(2 * k + 1 - (1 << 24)) * 0x1.0p-24f;
}

#define LOCKSTEP_RK_ERFINV_KERNELS                                                               \
  /* x[i] = dmath::Erfinv(x[i]) */                                                               \
  void ErfinvInPlace(float* x, int64_t n);                                                       \
  /* x[i] = InitErfinvFirstApproximation(x[i]), for 0 < |x[i]| <= 0.9545 */                      \
  void InitErfinvFirstApproximationInPlace(float* x, int64_t n);                                 \
  /* out[i] = scale * Erfinv(InitUniform(words[i]) * bound), from the first */                   \
  /* approximation and the table (rk::InitErfinvTable) */                                        \
  void InitErfinvByTable(const uint32_t* words, const uint32_t* table, float bound, float scale, \
                         float* out, int64_t n);

namespace ref {
LOCKSTEP_RK_ERFINV_KERNELS
}
namespace simd {
LOCKSTEP_RK_ERFINV_KERNELS
}
#undef LOCKSTEP_RK_ERFINV_KERNELS

}  // namespace lockstep::rk
