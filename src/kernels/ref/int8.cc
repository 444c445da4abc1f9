// Scalar reference of the exact int8 ops (normative): docs/numerics.md, "Int8".
#include <algorithm>
#include <cmath>
#include <vector>

#include "kernels/impl.h"
#include "kernels/ref/int8_rules.h"
#include "lockstep/core.h"

namespace lockstep::rk::ref {

void QuantizeRows(const float* x, int8_t* q, float* scale, int64_t rows, int64_t cols) {
  ParallelFor(rows, [&](int64_t r) {
    const float* row = x + r * cols;
    int8_t* out = q + r * cols;
    float amax = 0.0f;
    bool finite = true;
    for (int64_t i = 0; i < cols; ++i) {
      finite = finite && std::isfinite(row[i]);
      amax = std::max(amax, std::fabs(row[i]));
    }
    const float s = scale[r] = int8::RowScale(amax, finite);
    for (int64_t i = 0; i < cols; ++i) out[i] = int8::Quantize(row[i], s);
  });
}

void QuantizeRowsByScale(const float* x, const float* scale, int8_t* q, int64_t rows,
                         int64_t cols) {
  ParallelFor(rows, [&](int64_t r) {
    for (int64_t i = 0; i < cols; ++i) q[r * cols + i] = int8::Quantize(x[r * cols + i], scale[r]);
  });
}

void GemmI8XWt(const int8_t* qx, const float* sx, const int8_t* qw, const float* sw, float* y,
               int64_t m, int64_t n, int64_t k) {
  ParallelFor(m, [&](int64_t i) {
    for (int64_t j = 0; j < n; ++j) {
      int32_t acc = 0;
      for (int64_t r = 0; r < k; ++r) {
        acc += int32_t{qx[i * k + r]} * int32_t{qw[j * k + r]};
      }
      y[i * n + j] = static_cast<float>(acc) * (sx[i] * sw[j]);
    }
  });
}

void DequantizeRows(const int8_t* q, const float* scale, float* y, int64_t rows, int64_t cols) {
  ParallelFor(rows, [&](int64_t r) {
    for (int64_t i = 0; i < cols; ++i)
      y[r * cols + i] = static_cast<float>(q[r * cols + i]) * scale[r];
  });
}

void HadamardRows(const float* x, float* y, int64_t rows, int64_t cols, bool transpose) {
  const int64_t lines = transpose ? cols : rows, len = transpose ? rows : cols;
  const int64_t block = HadamardBlock(len);
  ParallelFor(lines, [&](int64_t i) {
    float* out = y + i * len;
    for (int64_t e = 0; e < len; ++e) out[e] = transpose ? x[e * cols + i] : x[i * cols + e];
    for (int64_t s = 0; s < len; s += block) int8::RotateBlock(out + s, block);
  });
}

void HadamardQuantizeRows(const float* x, int8_t* q, float* scale, int64_t rows, int64_t cols,
                          bool transpose) {
  std::vector<float> rotated(static_cast<size_t>(rows * cols));
  HadamardRows(x, rotated.data(), rows, cols, transpose);
  QuantizeRows(rotated.data(), q, scale, transpose ? cols : rows, transpose ? rows : cols);
}

}  // namespace lockstep::rk::ref
