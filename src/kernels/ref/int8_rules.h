// Private to src/kernels: the scalar rules of the int8 quantizer (docs/numerics.md, "Int8"),
// shared by the reference and the SIMD variants' row tails.
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
// x quantized with the row's scale s (s > 0 and finite): round-half-even (the binary runs in
// round-to-nearest, RequireIeeeFloatingPoint), then clamped.
inline int8_t Quantize(float x, float s) {
  return static_cast<int8_t>(std::clamp(std::nearbyint(x / s), -127.0f, 127.0f));
}
// Whether a row with scale s has its elements quantized (else q = 0).
inline bool QuantizesElements(float s) { return s > 0.0f; }

}  // namespace lockstep::rk::int8
