// SIMD variants of the exact int8 ops. The quantizer's division, rounding and clamp are
// element-wise (IEEE division, round-half-even), and its row maximum is exact in any order; the
// GEMM's int32 sums are exact in any order (k <= kInt8MaxK), so these give the reference's bits
// by construction. The products are widened to int16 and summed in pairs into int32
// (ReorderWidenMulAccumulate: vpmaddwd on x86), never a saturating form.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels/simd/int8.cc"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>

#include <algorithm>
#include <cmath>

#include "kernels/impl.h"
#include "kernels/ref/int8_rules.h"
#include "lockstep/core.h"

HWY_BEFORE_NAMESPACE();
namespace lockstep::rk::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

void QuantizeRows(const float* x, int8_t* q, float* scale, int64_t rows, int64_t cols) {
  const hn::ScalableTag<float> d;
  const hn::RebindToSigned<decltype(d)> di;
  const auto n = static_cast<int64_t>(hn::Lanes(d));
  ParallelFor(rows, [&](int64_t r) {
    const float* row = x + r * cols;
    int8_t* out = q + r * cols;
    auto vmax = hn::Zero(d);
    auto bad = hn::FirstN(d, 0);  // no lane
    int64_t i = 0;
    for (; i + n <= cols; i += n) {
      const auto v = hn::LoadU(d, row + i);
      bad = hn::Or(bad, hn::Not(hn::IsFinite(v)));
      vmax = hn::Max(vmax, hn::Abs(v));
    }
    float amax = hn::GetLane(hn::MaxOfLanes(d, vmax));
    bool finite = hn::AllFalse(d, bad);
    for (int64_t t = i; t < cols; ++t) {
      finite = finite && std::isfinite(row[t]);
      amax = std::max(amax, std::fabs(row[t]));
    }
    const float s = scale[r] = int8::RowScale(amax, finite);
    if (!int8::QuantizesElements(s)) {
      std::fill(out, out + cols, int8_t{0});
      return;
    }
    const auto vs = hn::Set(d, s), lo = hn::Set(d, -127.0f), hi = hn::Set(d, 127.0f);
    HWY_ALIGN int32_t ints[hn::MaxLanes(di)];
    for (i = 0; i + n <= cols; i += n) {
      const auto v = hn::Min(hn::Max(hn::Round(hn::Div(hn::LoadU(d, row + i), vs)), lo), hi);
      hn::Store(hn::ConvertTo(di, v), di, ints);
      for (int64_t t = 0; t < n; ++t) out[i + t] = static_cast<int8_t>(ints[t]);
    }
    for (; i < cols; ++i) out[i] = int8::Quantize(row[i], s);
  });
}

// Σ_r a[r]·b[r] over k int8 pairs, exact.
HWY_INLINE int32_t DotI8(const int8_t* a, const int8_t* b, int64_t k) {
  const hn::ScalableTag<int16_t> d16;
  const hn::Rebind<int8_t, decltype(d16)> d8;
  const hn::RepartitionToWide<decltype(d16)> d32;
  const auto n = static_cast<int64_t>(hn::Lanes(d16));
  auto sum0 = hn::Zero(d32), sum1 = hn::Zero(d32);
  int64_t r = 0;
  for (; r + n <= k; r += n) {
    const auto va = hn::PromoteTo(d16, hn::LoadU(d8, a + r));
    const auto vb = hn::PromoteTo(d16, hn::LoadU(d8, b + r));
    sum0 = hn::ReorderWidenMulAccumulate(d32, va, vb, sum0, sum1);
  }
  int32_t total = hn::GetLane(hn::SumOfLanes(d32, hn::Add(sum0, sum1)));
  for (; r < k; ++r) total += int32_t{a[r]} * int32_t{b[r]};
  return total;
}

void GemmI8XWt(const int8_t* qx, const float* sx, const int8_t* qw, const float* sw, float* y,
               int64_t m, int64_t n, int64_t k) {
  ParallelFor(m, [&](int64_t i) {
    for (int64_t j = 0; j < n; ++j) {
      const int32_t acc = DotI8(qx + i * k, qw + j * k, k);
      y[i * n + j] = static_cast<float>(acc) * (sx[i] * sw[j]);
    }
  });
}

void DequantizeRows(const int8_t* q, const float* scale, float* y, int64_t rows, int64_t cols) {
  const hn::ScalableTag<float> d;
  const hn::RebindToSigned<decltype(d)> d32;
  const hn::Rebind<int8_t, decltype(d)> d8;
  const auto n = static_cast<int64_t>(hn::Lanes(d));
  ParallelFor(rows, [&](int64_t r) {
    const int8_t* in = q + r * cols;
    float* out = y + r * cols;
    const auto vs = hn::Set(d, scale[r]);
    int64_t i = 0;
    for (; i + n <= cols; i += n) {
      const auto v = hn::ConvertTo(d, hn::PromoteTo(d32, hn::LoadU(d8, in + i)));
      hn::StoreU(hn::Mul(v, vs), d, out + i);
    }
    for (; i < cols; ++i) out[i] = static_cast<float>(in[i]) * scale[r];
  });
}

}  // namespace lockstep::rk::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace lockstep::rk::simd {
HWY_EXPORT(QuantizeRows);
HWY_EXPORT(GemmI8XWt);
HWY_EXPORT(DequantizeRows);

void QuantizeRows(const float* x, int8_t* q, float* scale, int64_t rows, int64_t cols) {
  HWY_DYNAMIC_DISPATCH(QuantizeRows)(x, q, scale, rows, cols);
}
void GemmI8XWt(const int8_t* qx, const float* sx, const int8_t* qw, const float* sw, float* y,
               int64_t m, int64_t n, int64_t k) {
  HWY_DYNAMIC_DISPATCH(GemmI8XWt)(qx, sx, qw, sw, y, m, n, k);
}
void DequantizeRows(const int8_t* q, const float* scale, float* y, int64_t rows, int64_t cols) {
  HWY_DYNAMIC_DISPATCH(DequantizeRows)(q, scale, y, rows, cols);
}
}  // namespace lockstep::rk::simd
#endif
