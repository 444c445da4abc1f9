// Private to src/kernels: the scalar rules of the int8 quantizer and rotation (docs/numerics.md,
// "Int8"), shared by the reference and the SIMD variants.
#pragma once

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>

#include "lockstep/kernels.h"

namespace lockstep::rk::int8 {

// The scale of a row whose elements are all finite (`finite`) with largest magnitude amax.
inline float RowScale(float amax, bool finite) {
  return finite ? amax / 127.0f : std::bit_cast<float>(dmath::kCanonicalNaNBits);
}
// x quantized with its row's scale s: x / s rounded half to even (the binary runs in
// round-to-nearest, RequireIeeeFloatingPoint), then clamped; 0 where s is not above zero or
// x / s is NaN.
inline int8_t Quantize(float x, float s) {
  const float y = x / s;
  if (!(s > 0.0f) || std::isnan(y)) return 0;
  return static_cast<int8_t>(std::clamp(std::nearbyint(y), -127.0f, 127.0f));
}
// HadamardRows' last factor for a block of 64, 16, 4 or 1 elements: 1/√block, a power of two.
inline float HadamardFactor(int64_t block) {
  return block == 64 ? 0.125f : block == 16 ? 0.25f : block == 4 ? 0.5f : 1.0f;
}
// v[0, block) rotated: the fast Walsh-Hadamard butterflies (a, b) -> (a + b, a - b) at strides
// 1, 2, 4, ..., block / 2 in that order, then every element times HadamardFactor(block).
inline void RotateBlock(float* v, int64_t block) {
  for (int64_t h = 1; h < block; h *= 2) {
    for (int64_t i = 0; i < block; i += 2 * h) {
      for (int64_t j = i; j < i + h; ++j) {
        const float a = v[j], b = v[j + h];
        v[j] = a + b;
        v[j + h] = a - b;
      }
    }
  }
  const float factor = HadamardFactor(block);
  for (int64_t j = 0; j < block; ++j) v[j] *= factor;
}

}  // namespace lockstep::rk::int8
