// Reference erfinv, and the init's erfinv by table, over an array: element by element.
#include <bit>

#include "kernels/erfinv_impl.h"
#include "lockstep/kernels.h"

namespace lockstep::rk::ref {

void ErfinvInPlace(float* x, int64_t n) {
  for (int64_t i = 0; i < n; ++i) x[i] = dmath::Erfinv(x[i]);
}

void InitErfinvFirstApproximationInPlace(float* x, int64_t n) {
  for (int64_t i = 0; i < n; ++i) x[i] = InitErfinvFirstApproximation(x[i]);
}

void InitErfinvByTable(const uint32_t* words, const uint32_t* table, float bound, float scale,
                       float* out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const float y0 = InitErfinvFirstApproximation(InitUniform(words[i]) * bound);
    const auto d = static_cast<uint32_t>(InitTableCorrection(table, InitTableIndex(words[i] >> 8)));
    out[i] = scale * std::bit_cast<float>(std::bit_cast<uint32_t>(y0) + d);
  }
}

}  // namespace lockstep::rk::ref
