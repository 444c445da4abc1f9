// Private to src/kernels: dmath::Erfinv over an array (the truncated-normal init's hot loop).
// ref:: is normative (the scalar function per element); simd:: runs the active Highway target
// and must match it bit for bit.
#pragma once

#include <cstdint>

namespace lockstep::rk {

// The init's erfinv table (rk::InitErfinvTable): the entry of draw k (one of 2^24) is entry
// k - 2^23 for k >= 2^23 and that of 2^24 - 1 - k below, four bits at bit 4 (a mod 8) of word a
// / 8.
inline constexpr uint32_t kInitTableHalf = uint32_t{1} << 23;
inline uint32_t InitTableIndex(uint32_t k) {
  return (k >= kInitTableHalf ? k : ~k) & (kInitTableHalf - 1);
}
inline int32_t InitTableCorrection(const uint32_t* table, uint32_t a) {
  return static_cast<int32_t>((table[a / 8] >> (4 * (a % 8))) & 15) - 8;
}
// (float)(2k + 1 - 2^24) * 2^-24: an odd multiple of 2^-24 in (-1, 1), exact.
inline float InitUniform(uint32_t word) {
  const auto k = static_cast<int32_t>(word >> 8);
  return static_cast<float>(2 * k + 1 - (1 << 24)) * 0x1.0p-24f;
}

#define LOCKSTEP_RK_ERFINV_KERNELS                                                                 \
  /* x[i] = dmath::Erfinv(x[i]) */                                                                 \
  void ErfinvInPlace(float* x, int64_t n);                                                         \
  /* x[i] = dmath::ErfinvFirstApproximation(x[i]) */                                               \
  void ErfinvFirstApproximationInPlace(float* x, int64_t n);                                       \
  /* out[i] = scale * Erfinv(x) for x = (float)(2k + 1 - 2^24) * 2^-24 * bound, k = words[i] >> 8, \
   */                                                                                              \
  /* from the first approximation and the table (rk::InitErfinvTable) */                           \
  void InitErfinvByTable(const uint32_t* words, const uint32_t* table, float bound, float scale,   \
                         float* out, int64_t n);

namespace ref {
LOCKSTEP_RK_ERFINV_KERNELS
}
namespace simd {
LOCKSTEP_RK_ERFINV_KERNELS
}
#undef LOCKSTEP_RK_ERFINV_KERNELS

}  // namespace lockstep::rk
