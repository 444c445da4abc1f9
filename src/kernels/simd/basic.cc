// SIMD row reductions, AddInto, RoundToBf16, RMSNorm and RoPE. Reductions keep the canonical 16
// logical lanes as two 8-float vectors (lanes 0-7, 8-15) so the order is the reference's on every
// target; element-wise work is vectorised across independent outputs.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels/simd/basic.cc"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "kernels/impl.h"
#include "kernels/ref/lanes.h"
#include "lockstep/core.h"

HWY_BEFORE_NAMESPACE();
namespace lockstep::rk::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

using D8 = hn::CappedTag<float, 8>;
static_assert(kReductionLanes == 16, "two 8-lane vectors hold the logical lanes");
// Targets narrower than 8 floats are compiled (EMU128) but never dispatched: they use the
// reference loops so the code stays correct there too.
constexpr bool kEightLanes = hn::MaxLanes(D8()) == 8;

// Runs step(acc_lo, acc_hi, v_lo, v_hi) over x (and y) in blocks of 16, the last block padded
// with `pad`, then stores the lanes for the scalar fold.
template <class Step>
HWY_INLINE void LaneLoop(const float* x, const float* y, int64_t n, float pad, float init,
                         float* lanes_out, Step step) {
  const D8 d;
  auto lo = hn::Set(d, init), hi = hn::Set(d, init);
  int64_t c = 0;
  for (; c + kReductionLanes <= n; c += kReductionLanes) {
    step(lo, hi, hn::LoadU(d, x + c), hn::LoadU(d, x + c + 8),
         y ? hn::LoadU(d, y + c) : hn::Zero(d), y ? hn::LoadU(d, y + c + 8) : hn::Zero(d));
  }
  if (c < n) {
    HWY_ALIGN float xb[kReductionLanes], yb[kReductionLanes];
    std::fill(xb, xb + kReductionLanes, pad);
    std::fill(yb, yb + kReductionLanes, pad);
    std::copy(x + c, x + n, xb);
    if (y) std::copy(y + c, y + n, yb);
    step(lo, hi, hn::Load(d, xb), hn::Load(d, xb + 8), hn::Load(d, yb), hn::Load(d, yb + 8));
  }
  hn::StoreU(lo, d, lanes_out);
  hn::StoreU(hi, d, lanes_out + 8);
}

// Padding with +0 is exact: a lane started at +0 is never -0, and x + (+0) == x otherwise.
HWY_INLINE float LaneSum(const float* x, int64_t n) {
  if constexpr (!kEightLanes) return lanes::Sum(x, n);
  HWY_ALIGN float l[kReductionLanes];
  LaneLoop(x, nullptr, n, 0.0f, 0.0f, l, [](auto& lo, auto& hi, auto x0, auto x1, auto, auto) {
    lo = hn::Add(lo, x0);
    hi = hn::Add(hi, x1);
  });
  return lanes::FoldSum(l);
}

// fma(0, 0, lane) == lane, so zero padding is exact here too.
HWY_INLINE float LaneDot(const float* a, const float* b, int64_t n) {
  if constexpr (!kEightLanes) return lanes::Dot(a, b, n);
  HWY_ALIGN float l[kReductionLanes];
  LaneLoop(a, b, n, 0.0f, 0.0f, l, [](auto& lo, auto& hi, auto a0, auto a1, auto b0, auto b1) {
    lo = hn::MulAdd(a0, b0, lo);
    hi = hn::MulAdd(a1, b1, hi);
  });
  return lanes::FoldSum(l);
}

HWY_INLINE float LaneMax(const float* x, int64_t n) {
  if constexpr (!kEightLanes) return lanes::Max(x, n);
  const D8 d;
  const float neg_inf = -std::numeric_limits<float>::infinity();
  HWY_ALIGN float l[kReductionLanes];
  auto nan = hn::Zero(d);  // lanes become all-ones where a NaN was seen
  LaneLoop(x, nullptr, n, neg_inf, neg_inf, l,
           [&](auto& lo, auto& hi, auto x0, auto x1, auto, auto) {
             nan = hn::Or(nan, hn::VecFromMask(d, hn::Or(hn::IsNaN(x0), hn::IsNaN(x1))));
             lo = hn::IfThenElse(hn::Gt(x0, lo), x0, lo);
             hi = hn::IfThenElse(hn::Gt(x1, hi), x1, hi);
           });
  if (!hn::AllTrue(d, hn::Eq(nan, hn::Zero(d)))) return std::numeric_limits<float>::quiet_NaN();
  return lanes::FoldMax(l);
}

void RowSum(const float* x, float* out, int64_t rows, int64_t cols) {
  ParallelFor(rows, [&](int64_t r) { out[r] = LaneSum(x + r * cols, cols); });
}

void RowSumSquares(const float* x, float* out, int64_t rows, int64_t cols) {
  ParallelFor(rows, [&](int64_t r) { out[r] = LaneDot(x + r * cols, x + r * cols, cols); });
}

void RowMax(const float* x, float* out, int64_t rows, int64_t cols) {
  ParallelFor(rows, [&](int64_t r) { out[r] = LaneMax(x + r * cols, cols); });
}

// Applies f to vectors of [0, n) and, for the tail, to scalars through the same lambda.
template <class F>
HWY_INLINE void ForEachVector(int64_t n, F f) {
  const hn::ScalableTag<float> d;
  const int64_t L = static_cast<int64_t>(hn::Lanes(d));
  int64_t i = 0;
  for (; i + L <= n; i += L) f(d, i);
  if (i < n) {
    const hn::CappedTag<float, 1> d1;
    for (; i < n; ++i) f(d1, i);
  }
}

void AddInto(const float* x, float* y, int64_t n) {
  constexpr int64_t kBlock = int64_t{1} << 14;  // 64 KiB of each operand per task
  ParallelFor((n + kBlock - 1) / kBlock, [&](int64_t block) {
    const int64_t begin = block * kBlock;
    const float* xb = x + begin;
    float* yb = y + begin;
    ForEachVector(std::min(kBlock, n - begin), [&](auto d, int64_t i) {
      hn::StoreU(hn::Add(hn::LoadU(d, yb + i), hn::LoadU(d, xb + i)), d, yb + i);
    });
  });
}

// NarrowToBf16's rule on the bits of each lane (lockstep/tensor.h), widened back.
void RoundToBf16(const float* x, float* y, int64_t n) {
  constexpr int64_t kBlock = int64_t{1} << 14;
  ParallelFor((n + kBlock - 1) / kBlock, [&](int64_t block) {
    const float* xb = x + block * kBlock;
    float* yb = y + block * kBlock;
    ForEachVector(std::min(kBlock, n - block * kBlock), [&](auto d, int64_t i) {
      const hn::RebindToUnsigned<decltype(d)> du;
      const auto v = hn::LoadU(d, xb + i);
      const auto u = hn::BitCast(du, v);
      const auto odd = hn::And(hn::ShiftRight<16>(u), hn::Set(du, 1u));
      const auto rounded =
          hn::And(hn::Add(u, hn::Add(odd, hn::Set(du, 0x7FFFu))), hn::Set(du, 0xFFFF0000u));
      const auto nan = hn::BitCast(d, hn::Set(du, 0x7FC00000u));
      hn::StoreU(hn::IfThenElse(hn::IsNaN(v), nan, hn::BitCast(d, rounded)), d, yb + i);
    });
  });
}

void RmsNormForward(const float* x, const float* gain, float eps, float* y, float* rstd,
                    int64_t rows, int64_t d) {
  const float inv_d = 1.0f / static_cast<float>(d);
  ParallelFor(rows, [&](int64_t r) {
    const float* xr = x + r * d;
    float* yr = y + r * d;
    const float s = 1.0f / std::sqrt(LaneDot(xr, xr, d) * inv_d + eps);
    ForEachVector(d, [&](auto dv, int64_t c) {
      auto v = hn::Mul(hn::LoadU(dv, xr + c), hn::Set(dv, s));
      if (gain) v = hn::Mul(v, hn::LoadU(dv, gain + c));
      hn::StoreU(v, dv, yr + c);
    });
    rstd[r] = s;
  });
}

void RmsNormBackward(const float* dy, const float* x, const float* gain, const float* rstd,
                     float* dx, float* dgain, int64_t rows, int64_t d) {
  const float inv_d = 1.0f / static_cast<float>(d);
  if (dgain != nullptr) {  // before dx: dx may alias dy. Columns in parallel, rows in order.
    constexpr int64_t kColumns = 256;
    ParallelFor((d + kColumns - 1) / kColumns, [&](int64_t block) {
      const int64_t c0 = block * kColumns, c1 = std::min(d, c0 + kColumns);
      std::fill(dgain + c0, dgain + c1, 0.0f);
      for (int64_t r = 0; r < rows; ++r) {
        const float* dyr = dy + r * d;
        const float* xr = x + r * d;
        ForEachVector(c1 - c0, [&](auto dv, int64_t i) {
          const int64_t c = c0 + i;
          const auto xhat = hn::Mul(hn::LoadU(dv, xr + c), hn::Set(dv, rstd[r]));
          hn::StoreU(hn::MulAdd(hn::LoadU(dv, dyr + c), xhat, hn::LoadU(dv, dgain + c)), dv,
                     dgain + c);
        });
      }
    });
  }
  ParallelFor(rows, [&](int64_t r) {
    const float* xr = x + r * d;
    const float* dyr = dy + r * d;
    float* dxr = dx + r * d;
    if (gain) {
      ForEachVector(d, [&](auto dv, int64_t c) {
        hn::StoreU(hn::Mul(hn::LoadU(dv, dyr + c), hn::LoadU(dv, gain + c)), dv, dxr + c);
      });
    } else if (dxr != dyr) {
      std::copy(dyr, dyr + d, dxr);
    }
    const float s = rstd[r];
    const float coef = ((LaneDot(dxr, xr, d) * inv_d) * s) * s;
    ForEachVector(d, [&](auto dv, int64_t c) {
      const auto t = hn::NegMulAdd(hn::LoadU(dv, xr + c), hn::Set(dv, coef), hn::LoadU(dv, dxr + c));
      hn::StoreU(hn::Mul(hn::Set(dv, s), t), dv, dxr + c);
    });
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
      ForEachVector(half, [&](auto dv, int64_t i) {
        const auto x1 = hn::LoadU(dv, xh + i), x2 = hn::LoadU(dv, xh + i + half);
        const auto c = hn::LoadU(dv, ct + i), s = hn::LoadU(dv, st + i);
        if (!inverse) {
          hn::StoreU(hn::MulAdd(x1, c, hn::Neg(hn::Mul(x2, s))), dv, yh + i);
          hn::StoreU(hn::MulAdd(x2, c, hn::Mul(x1, s)), dv, yh + i + half);
        } else {
          hn::StoreU(hn::MulAdd(x1, c, hn::Mul(x2, s)), dv, yh + i);
          hn::StoreU(hn::MulAdd(x2, c, hn::Neg(hn::Mul(x1, s))), dv, yh + i + half);
        }
      });
    }
  });
}

}  // namespace lockstep::rk::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace lockstep::rk::simd {
HWY_EXPORT(RowSum);
HWY_EXPORT(RowSumSquares);
HWY_EXPORT(RowMax);
HWY_EXPORT(AddInto);
HWY_EXPORT(RoundToBf16);
HWY_EXPORT(RmsNormForward);
HWY_EXPORT(RmsNormBackward);
HWY_EXPORT(Rope);

void RowSum(const float* x, float* out, int64_t rows, int64_t cols) {
  HWY_DYNAMIC_DISPATCH(RowSum)(x, out, rows, cols);
}
void RowSumSquares(const float* x, float* out, int64_t rows, int64_t cols) {
  HWY_DYNAMIC_DISPATCH(RowSumSquares)(x, out, rows, cols);
}
void RowMax(const float* x, float* out, int64_t rows, int64_t cols) {
  HWY_DYNAMIC_DISPATCH(RowMax)(x, out, rows, cols);
}
void AddInto(const float* x, float* y, int64_t n) { HWY_DYNAMIC_DISPATCH(AddInto)(x, y, n); }
void RoundToBf16(const float* x, float* y, int64_t n) {
  HWY_DYNAMIC_DISPATCH(RoundToBf16)(x, y, n);
}
void RmsNormForward(const float* x, const float* gain, float eps, float* y, float* rstd,
                    int64_t rows, int64_t d) {
  HWY_DYNAMIC_DISPATCH(RmsNormForward)(x, gain, eps, y, rstd, rows, d);
}
void RmsNormBackward(const float* dy, const float* x, const float* gain, const float* rstd,
                     float* dx, float* dgain, int64_t rows, int64_t d) {
  HWY_DYNAMIC_DISPATCH(RmsNormBackward)(dy, x, gain, rstd, dx, dgain, rows, d);
}
void Rope(const float* x, float* y, const float* cos, const float* sin, int64_t batch,
          int64_t seq, int64_t heads, int64_t head_dim, bool inverse) {
  HWY_DYNAMIC_DISPATCH(Rope)(x, y, cos, sin, batch, seq, heads, head_dim, inverse);
}
}  // namespace lockstep::rk::simd
#endif
