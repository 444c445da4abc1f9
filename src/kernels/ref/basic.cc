// Scalar reference (normative) of the row reductions, AddInto, RoundToBf16, RMSNorm and RoPE.
#include <cmath>

#include "kernels/impl.h"
#include "kernels/ref/lanes.h"
#include "lockstep/core.h"

namespace lockstep::rk::ref {

void RowSum(const float* x, float* out, int64_t rows, int64_t cols) {
  ParallelFor(rows, [&](int64_t r) { out[r] = lanes::Sum(x + r * cols, cols); });
}

void RowSumSquares(const float* x, float* out, int64_t rows, int64_t cols) {
  ParallelFor(rows, [&](int64_t r) { out[r] = lanes::Dot(x + r * cols, x + r * cols, cols); });
}

void RowMax(const float* x, float* out, int64_t rows, int64_t cols) {
  ParallelFor(rows, [&](int64_t r) { out[r] = lanes::Max(x + r * cols, cols); });
}

void AddInto(const float* x, float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = y[i] + x[i];
}

void RoundToBf16(const float* x, float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = WidenBf16(NarrowToBf16(x[i]));
}

void RmsNormForward(const float* x, const float* gain, float eps, float* y, float* rstd,
                    int64_t rows, int64_t d) {
  const float inv_d = 1.0f / static_cast<float>(d);
  ParallelFor(rows, [&](int64_t r) {
    const float* xr = x + r * d;
    float* yr = y + r * d;
    const float s = 1.0f / std::sqrt(lanes::Dot(xr, xr, d) * inv_d + eps);
    for (int64_t c = 0; c < d; ++c) yr[c] = gain ? (xr[c] * s) * gain[c] : xr[c] * s;
    rstd[r] = s;
  });
}

void RmsNormBackward(const float* dy, const float* x, const float* gain, const float* rstd,
                     float* dx, float* dgain, int64_t rows, int64_t d) {
  const float inv_d = 1.0f / static_cast<float>(d);
  if (dgain != nullptr) {  // before dx: dx may alias dy
    ParallelFor(d, [&](int64_t c) {
      float acc = 0.0f;
      for (int64_t r = 0; r < rows; ++r) acc = std::fma(dy[r * d + c], x[r * d + c] * rstd[r], acc);
      dgain[c] = acc;
    });
  }
  ParallelFor(rows, [&](int64_t r) {
    const float* xr = x + r * d;
    float* dxr = dx + r * d;
    for (int64_t c = 0; c < d; ++c) dxr[c] = gain ? dy[r * d + c] * gain[c] : dy[r * d + c];
    const float s = rstd[r];
    const float coef = ((lanes::Dot(dxr, xr, d) * inv_d) * s) * s;
    for (int64_t c = 0; c < d; ++c) dxr[c] = s * std::fma(-xr[c], coef, dxr[c]);
  });
}

void Rope(const float* x, float* y, const float* cos, const float* sin, int64_t batch,
          int64_t seq, int64_t heads, int64_t head_dim, bool inverse) {
  const int64_t half = head_dim / 2;
  ParallelFor(batch * seq, [&](int64_t bt) {
    const int64_t t = bt % seq;
    const float* ct = cos + t * half;
    const float* st = sin + t * half;
    for (int64_t h = 0; h < heads; ++h) {
      const float* xh = x + (bt * heads + h) * head_dim;
      float* yh = y + (bt * heads + h) * head_dim;
      for (int64_t i = 0; i < half; ++i) {
        const float x1 = xh[i], x2 = xh[i + half];
        if (!inverse) {  // rotate by +angle
          yh[i] = std::fma(x1, ct[i], -(x2 * st[i]));
          yh[i + half] = std::fma(x2, ct[i], x1 * st[i]);
        } else {  // the transpose: rotate by -angle
          yh[i] = std::fma(x1, ct[i], x2 * st[i]);
          yh[i + half] = std::fma(x2, ct[i], -(x1 * st[i]));
        }
      }
    }
  });
}

}  // namespace lockstep::rk::ref
