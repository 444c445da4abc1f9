// SIMD variants of the int8 ops. The quantizer's division, rounding and clamp are element-wise
// (IEEE division, round-half-even), and its row maximum is exact in any order; the GEMM's int32
// sums are exact in any order (k <= kInt8MaxK); the rotation's butterflies are the reference's
// additions on the same values; so these give the reference's bits by construction. No saturating
// form is used (scripts/saturation-check.sh).
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels/simd/int8.cc"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "kernels/impl.h"
#include "kernels/ref/int8_rules.h"
#include "lockstep/core.h"

HWY_BEFORE_NAMESPACE();
namespace lockstep::rk::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// One row quantized with scale s (int8::Quantize, lane by lane).
void QuantizeRow(const float* row, float s, int8_t* out, int64_t cols) {
  const hn::ScalableTag<float> d;
  const hn::RebindToSigned<decltype(d)> di;
  const auto n = static_cast<int64_t>(hn::Lanes(d));
  if (!(s > 0.0f)) {
    std::fill(out, out + cols, int8_t{0});
    return;
  }
  const auto vs = hn::Set(d, s), lo = hn::Set(d, -127.0f), hi = hn::Set(d, 127.0f);
  HWY_ALIGN int32_t ints[hn::MaxLanes(di)];
  int64_t i = 0;
  for (; i + n <= cols; i += n) {
    const auto y = hn::Div(hn::LoadU(d, row + i), vs);
    // NaN lanes to 0 before the rounding, the clamp and the conversion.
    const auto v = hn::Min(hn::Max(hn::Round(hn::IfThenZeroElse(hn::IsNaN(y), y)), lo), hi);
    hn::Store(hn::ConvertTo(di, v), di, ints);
    for (int64_t t = 0; t < n; ++t) out[i + t] = static_cast<int8_t>(ints[t]);
  }
  for (; i < cols; ++i) out[i] = int8::Quantize(row[i], s);
}

void QuantizeRows(const float* x, int8_t* q, float* scale, int64_t rows, int64_t cols) {
  const hn::ScalableTag<float> d;
  const auto n = static_cast<int64_t>(hn::Lanes(d));
  ParallelFor(rows, [&](int64_t r) {
    const float* row = x + r * cols;
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
    scale[r] = int8::RowScale(amax, finite);
    QuantizeRow(row, scale[r], q + r * cols, cols);
  });
}

void QuantizeRowsByScale(const float* x, const float* scale, int8_t* q, int64_t rows,
                         int64_t cols) {
  ParallelFor(rows, [&](int64_t r) { QuantizeRow(x + r * cols, scale[r], q + r * cols, cols); });
}

#if HWY_TARGET == HWY_AVX2 || HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX3_DL
// x86: a register-blocked kernel over packed operands. Lane j of an int32 accumulator is output
// column j of its block; each step adds one group of G consecutive products along k to it:
//   AVX3_DL (AVX-512 VNNI), G = 4: vpdpbusd on u8 = w + 128 and s8 = x, which adds
//     Σ (w + 128)·x = Σ w·x + 128·Σ x; the row's 128·Σ_r x[i, r] is subtracted at the end. The
//     adds wrap modulo 2^32 (vpdpbusd, never the saturating vpdpbusds), and the exact result
//     fits in int32 (k <= kInt8MaxK), so the wrapped sum minus the correction is that result.
//   AVX2, AVX3, G = 2: vpmaddwd on int8 values widened to int16, a pair per lane.
// The sums are exact, so neither the blocking nor the threads change a bit; the epilogue is the
// reference's float(acc) · (sx[i] · sw[j]).
#if HWY_TARGET == HWY_AVX3_DL
constexpr int64_t kGroup = 4;
using PackedW = uint8_t;  // w + 128
using PackedX = int8_t;
// Highway 1.0.3 compiles AVX3_DL without AVX512-VNNI (its target string names "avxvnni", the VEX
// form), though it dispatches there only on CPUs that have it: the kernel adds it.
#define LOCKSTEP_INT8_TILE __attribute__((target(HWY_TARGET_STR ",avx512vnni")))
#else
constexpr int64_t kGroup = 2;
using PackedW = int16_t;
using PackedX = int16_t;
#endif
#ifndef LOCKSTEP_INT8_TILE
#define LOCKSTEP_INT8_TILE
#endif
static_assert(kGroup * sizeof(PackedW) == 4 && kGroup * sizeof(PackedX) == 4);
// Six rows by two vectors of sums: 12 registers, which AVX2 has beside the operands (more sums,
// on AVX-512, made GCC 12 keep them in memory).
constexpr int64_t kMr = 6, kNr = 2;
constexpr int64_t kRowsPerTask = 8 * kMr;
constexpr int64_t kKcGroups = 64;  // k in blocks of 64 groups: 8 KiB of an AVX-512 panel

using D32 = hn::ScalableTag<int32_t>;
using V32 = hn::Vec<D32>;

// acc + the products of one group: lane j of w holds column j's group, every lane of x the row's.
LOCKSTEP_INT8_TILE HWY_INLINE V32 GroupStep(V32 acc, V32 w, V32 x) {
#if HWY_TARGET == HWY_AVX3_DL
  return V32{_mm512_dpbusd_epi32(acc.raw, w.raw, x.raw)};
#elif HWY_TARGET == HWY_AVX3
  return hn::Add(acc, V32{_mm512_madd_epi16(w.raw, x.raw)});
#else
  return hn::Add(acc, V32{_mm256_madd_epi16(w.raw, x.raw)});
#endif
}

// One group of row x starting at element r: its 4 bytes as one int32.
HWY_INLINE int32_t GroupOf(const PackedX* x) {
  int32_t v;
  std::memcpy(&v, x, sizeof(v));
  return v;
}

// sums[kMr rows][kNr vectors] (row stride kNr vectors) += rows x[0..kMr) against `groups`
// groups of a packed panel. The accumulators are named variables: an array of vectors would be
// kept in memory through the loop.
LOCKSTEP_INT8_TILE HWY_INLINE void Accumulate(const PackedX* const* x, const PackedW* w,
                                              int64_t groups, int32_t* sums) {
  static_assert(kMr == 6 && kNr == 2, "Accumulate is written for six rows of two vectors");
  const D32 d;
  const auto lanes = static_cast<int64_t>(hn::Lanes(d));
  const int64_t stride = kNr * lanes;
#define LOCKSTEP_ACC_ROW(i)                     \
  V32 a##i##0 = hn::Load(d, sums + i * stride); \
  V32 a##i##1 = hn::Load(d, sums + i * stride + lanes);
  LOCKSTEP_ACC_ROW(0)
  LOCKSTEP_ACC_ROW(1)
  LOCKSTEP_ACC_ROW(2)
  LOCKSTEP_ACC_ROW(3)
  LOCKSTEP_ACC_ROW(4)
  LOCKSTEP_ACC_ROW(5)
#undef LOCKSTEP_ACC_ROW
  const PackedX *x0 = x[0], *x1 = x[1], *x2 = x[2], *x3 = x[3], *x4 = x[4], *x5 = x[5];
  const hn::ScalableTag<PackedW> dw;
#pragma GCC unroll 4
  for (int64_t g = 0; g < groups; ++g, w += stride * kGroup) {
    const V32 w0 = hn::BitCast(d, hn::Load(dw, w));
    const V32 w1 = hn::BitCast(d, hn::Load(dw, w + lanes * kGroup));
#define LOCKSTEP_ACC_STEP(i)                               \
  {                                                        \
    const V32 xv = hn::Set(d, GroupOf(x##i + g * kGroup)); \
    a##i##0 = GroupStep(a##i##0, w0, xv);                  \
    a##i##1 = GroupStep(a##i##1, w1, xv);                  \
  }
    LOCKSTEP_ACC_STEP(0)
    LOCKSTEP_ACC_STEP(1)
    LOCKSTEP_ACC_STEP(2)
    LOCKSTEP_ACC_STEP(3)
    LOCKSTEP_ACC_STEP(4)
    LOCKSTEP_ACC_STEP(5)
#undef LOCKSTEP_ACC_STEP
  }
#define LOCKSTEP_ACC_STORE(i)               \
  hn::Store(a##i##0, d, sums + i * stride); \
  hn::Store(a##i##1, d, sums + i * stride + lanes);
  LOCKSTEP_ACC_STORE(0)
  LOCKSTEP_ACC_STORE(1)
  LOCKSTEP_ACC_STORE(2)
  LOCKSTEP_ACC_STORE(3)
  LOCKSTEP_ACC_STORE(4)
  LOCKSTEP_ACC_STORE(5)
#undef LOCKSTEP_ACC_STORE
}

// Rows [i_begin, i_end) (at most kRowsPerTask) against panel p of packed W, into y. k runs in
// blocks of kKcGroups groups so that the panel's block and the rows' stay in L1 while every
// row block uses them.
LOCKSTEP_INT8_TILE void Task(const PackedX* xp, int64_t kp, const int32_t* row_fix, const float* sx,
                             const PackedW* panel, const float* sw, float* y, int64_t i_begin,
                             int64_t i_end, int64_t j0, int64_t n) {
  const D32 d;
  const hn::RebindToFloat<D32> df;
  const auto lanes = static_cast<int64_t>(hn::Lanes(d));
  const int64_t stride = kNr * lanes, groups = kp / kGroup;
  HWY_ALIGN int32_t sums[(kRowsPerTask + kMr) * kNr * hn::MaxLanes(d)];
  std::fill(std::begin(sums), std::end(sums), 0);
  for (int64_t g0 = 0; g0 < groups; g0 += kKcGroups) {
    const int64_t count = std::min(kKcGroups, groups - g0);
    for (int64_t i0 = i_begin; i0 < i_end; i0 += kMr) {
      const PackedX* x[kMr];
      for (int64_t ii = 0; ii < kMr; ++ii) {
        x[ii] = xp + std::min(i0 + ii, i_end - 1) * kp + g0 * kGroup;  // past the end: repeated
      }
      Accumulate(x, panel + g0 * stride * kGroup, count, sums + (i0 - i_begin) * stride);
    }
  }
  // y = float(acc - fix) · (sx[i] · sw[j]): the scale product rounded once, then one multiply.
  HWY_ALIGN float part[hn::MaxLanes(df)];
  for (int64_t jj = 0; jj < kNr && j0 + jj * lanes < n; ++jj) {
    const int64_t j = j0 + jj * lanes, count = std::min(lanes, n - j);
    std::fill(part, part + lanes, 0.0f);
    std::copy(sw + j, sw + j + count, part);
    const auto swv = hn::Load(df, part);
    for (int64_t i = i_begin; i < i_end; ++i) {
      const V32 acc = hn::Load(d, sums + (i - i_begin) * stride + jj * lanes);
      const auto v = hn::Mul(hn::ConvertTo(df, hn::Sub(acc, hn::Set(d, row_fix[i]))),
                             hn::Mul(hn::Set(df, sx[i]), swv));
      if (count == lanes) {
        hn::StoreU(v, df, y + i * n + j);
      } else {
        hn::Store(v, df, part);
        std::copy(part, part + count, y + i * n + j);
      }
    }
  }
}

void GemmI8XWt(const int8_t* qx, const float* sx, const int8_t* qw, const float* sw, float* y,
               int64_t m, int64_t n, int64_t k) {
  const D32 d;
  const auto lanes = static_cast<int64_t>(hn::Lanes(d));
  const int64_t kp = (k + kGroup - 1) / kGroup * kGroup, groups = kp / kGroup;
  const int64_t panel_cols = kNr * lanes, panels = (n + panel_cols - 1) / panel_cols;
  const int64_t panel_elems = groups * panel_cols * kGroup;
  // Scratch on the calling thread: packed W, packed X and the rows' corrections.
  auto* wp = reinterpret_cast<PackedW*>(ScratchFloats(
      Scratch::kGemmB,
      static_cast<size_t>((panels * panel_elems * int64_t{sizeof(PackedW)} + 3) / 4)));
  const int64_t x_bytes = m * kp * int64_t{sizeof(PackedX)};
  float* a = ScratchFloats(Scratch::kGemmA, static_cast<size_t>((x_bytes + 3) / 4 + m));
  auto* xp = reinterpret_cast<PackedX*>(a);
  auto* row_fix = reinterpret_cast<int32_t*>(a + (x_bytes + 3) / 4);
  // W, column by column into its panel's [group][vector jj][lane][kGroup] layout; columns past n
  // and k's padding are 0 (with VNNI stored as 0 + 128).
  ParallelFor(panels * panel_cols, [&](int64_t j) {
    PackedW* out = wp + j / panel_cols * panel_elems + j % panel_cols * kGroup;
    const int8_t* row = qw + std::min(j, n - 1) * k;  // (a column past n reads nothing)
    int64_t g = 0;
    for (; j < n && (g + 1) * kGroup <= k; ++g, out += panel_cols * kGroup) {  // whole groups
#if HWY_TARGET == HWY_AVX3_DL
      uint32_t v;  // four int8 values; w + 128 as u8 is w with its top bit flipped
      std::memcpy(&v, row + g * kGroup, sizeof(v));
      v ^= 0x80808080u;
#else
      const uint32_t v = static_cast<uint16_t>(int16_t{row[g * kGroup]}) |
                         static_cast<uint32_t>(static_cast<uint16_t>(int16_t{row[g * kGroup + 1]}))
                             << 16;
#endif
      std::memcpy(out, &v, sizeof(v));
    }
    for (; g < groups; ++g, out += panel_cols * kGroup) {  // k's last group, columns past n
      for (int64_t t = 0; t < kGroup; ++t) {
        const int64_t r = g * kGroup + t;
        const int32_t v = j < n && r < k ? int32_t{row[r]} : 0;
        out[t] = static_cast<PackedW>(HWY_TARGET == HWY_AVX3_DL ? v + 128 : v);
      }
    }
  });
  // X, row by row, padded with zeros to kp (with VNNI and k a multiple of 4, qx as it is); with
  // VNNI, each row's 128·Σ x (wrapping like the sums).
  const PackedX* x_rows = xp;
#if HWY_TARGET == HWY_AVX3_DL
  if (kp == k) x_rows = qx;
#endif
  ParallelFor(m, [&](int64_t i) {
    const int8_t* row = qx + i * k;
    uint32_t sum = 0;
    for (int64_t r = 0; r < k; ++r) sum += static_cast<uint32_t>(int32_t{row[r]});
    row_fix[i] = HWY_TARGET == HWY_AVX3_DL ? static_cast<int32_t>(sum * 128u) : 0;
    if (x_rows == xp) {
      PackedX* out = xp + i * kp;
      for (int64_t r = 0; r < k; ++r) out[r] = static_cast<PackedX>(row[r]);
      std::fill(out + k, out + kp, PackedX{0});
    }
  });
  const int64_t row_tasks = (m + kRowsPerTask - 1) / kRowsPerTask;
  ParallelFor(row_tasks * panels, [&](int64_t task) {
    const int64_t p = task % panels, i_begin = task / panels * kRowsPerTask;
    const int64_t i_end = std::min(m, i_begin + kRowsPerTask);
    Task(x_rows, kp, row_fix, sx, wp + p * panel_elems, sw, y, i_begin, i_end, p * panel_cols, n);
  });
}
#undef LOCKSTEP_INT8_TILE
#else
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
#endif

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

// HadamardRows in the reference's stage order (strides 1, 2, ..., block / 2), each stage's
// butterflies the reference's additions on the same values, so the same bits.
//
// Rows of x (not transposed): in place in y, whole vectors at a time. Strides below the vector's
// n lanes pair lane l with lane l ^ h of one vector (a permutation; the lower lane gets a + b,
// the upper a - b), strides from n up pair whole vectors.
void RotateRows(const float* x, float* y, int64_t rows, int64_t cols) {
  const hn::CappedTag<float, 16> d;
  const hn::RebindToSigned<decltype(d)> di;
  const auto n = static_cast<int64_t>(hn::Lanes(d));
  const int64_t block = HadamardBlock(cols);
  const int64_t chunk = std::max(block, n), whole = cols / chunk * chunk;
  const int64_t inner = std::min(block, n);  // the strides within a vector: 1 .. inner / 2
  const auto factor = hn::Set(d, int8::HadamardFactor(block));
  const auto lane = hn::Iota(di, 0);
  ParallelFor(rows, [&](int64_t r) {
    float* v = y + r * cols;
    if (v != x + r * cols) std::copy_n(x + r * cols, cols, v);
    for (int64_t s = 0; s < whole; s += chunk) {
      float* c = v + s;
      for (int64_t j = 0; j < chunk; j += n) {
        auto a = hn::LoadU(d, c + j);
        for (int64_t h = 1; h < inner; h *= 2) {
          const auto other = hn::TableLookupLanes(
              a, hn::IndicesFromVec(d, hn::Xor(lane, hn::Set(di, static_cast<int32_t>(h)))));
          const auto upper = hn::RebindMask(
              d, hn::Ne(hn::And(lane, hn::Set(di, static_cast<int32_t>(h))), hn::Zero(di)));
          a = hn::IfThenElse(upper, hn::Sub(other, a), hn::Add(a, other));
        }
        hn::StoreU(a, d, c + j);
      }
      for (int64_t h = n; h < block; h *= 2) {
        for (int64_t i = 0; i < chunk; i += 2 * h) {
          for (int64_t j = i; j < i + h; j += n) {
            const auto a = hn::LoadU(d, c + j), b = hn::LoadU(d, c + j + h);
            hn::StoreU(hn::Add(a, b), d, c + j);
            hn::StoreU(hn::Sub(a, b), d, c + j + h);
          }
        }
      }
      for (int64_t j = 0; j < chunk; j += n)
        hn::StoreU(hn::Mul(hn::LoadU(d, c + j), factor), d, c + j);
    }
    // Blocks smaller than a vector past the last whole vector.
    for (int64_t s = whole; s < cols; s += block) int8::RotateBlock(v + s, block);
  });
}

// Rows of xᵀ: kLines of them at a time as the columns of a tile whose row j holds element j of
// each (x's rows, read a cache line at a time), so that every butterfly is whole vectors.
void RotateColumns(const float* x, float* y, int64_t rows, int64_t cols) {
  constexpr int64_t kLines = 16, kMaxBlock = 64;
  const hn::CappedTag<float, kLines> d;
  const auto n = static_cast<int64_t>(hn::Lanes(d));
  const int64_t block = HadamardBlock(rows);
  const auto factor = hn::Set(d, int8::HadamardFactor(block));
  ParallelFor((cols + kLines - 1) / kLines, [&](int64_t t) {
    HWY_ALIGN float tile[kMaxBlock * kLines] = {};
    const int64_t first = t * kLines, count = std::min(kLines, cols - first);
    for (int64_t s = 0; s < rows; s += block) {
      for (int64_t j = 0; j < block; ++j) {
        std::copy_n(x + (s + j) * cols + first, count, tile + j * kLines);
      }
      for (int64_t h = 1; h < block; h *= 2) {
        for (int64_t i = 0; i < block; i += 2 * h) {
          for (int64_t j = i; j < i + h; ++j) {
            for (int64_t l = 0; l < kLines; l += n) {
              float* p = tile + j * kLines + l;
              float* q = tile + (j + h) * kLines + l;
              const auto a = hn::Load(d, p), b = hn::Load(d, q);
              hn::Store(hn::Add(a, b), d, p);
              hn::Store(hn::Sub(a, b), d, q);
            }
          }
        }
      }
      for (int64_t j = 0; j < block; ++j) {
        for (int64_t l = 0; l < kLines; l += n) {
          hn::Store(hn::Mul(hn::Load(d, tile + j * kLines + l), factor), d, tile + j * kLines + l);
        }
      }
      for (int64_t l = 0; l < count; ++l) {
        float* out = y + (first + l) * rows + s;
        for (int64_t j = 0; j < block; ++j) out[j] = tile[j * kLines + l];
      }
    }
  });
}

void HadamardRows(const float* x, float* y, int64_t rows, int64_t cols, bool transpose) {
  if (transpose) {
    RotateColumns(x, y, rows, cols);
  } else {
    RotateRows(x, y, rows, cols);
  }
}

}  // namespace lockstep::rk::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace lockstep::rk::simd {
HWY_EXPORT(QuantizeRows);
HWY_EXPORT(QuantizeRowsByScale);
HWY_EXPORT(GemmI8XWt);
HWY_EXPORT(DequantizeRows);
HWY_EXPORT(HadamardRows);

void QuantizeRows(const float* x, int8_t* q, float* scale, int64_t rows, int64_t cols) {
  HWY_DYNAMIC_DISPATCH(QuantizeRows)(x, q, scale, rows, cols);
}
void QuantizeRowsByScale(const float* x, const float* scale, int8_t* q, int64_t rows,
                         int64_t cols) {
  HWY_DYNAMIC_DISPATCH(QuantizeRowsByScale)(x, scale, q, rows, cols);
}
void GemmI8XWt(const int8_t* qx, const float* sx, const int8_t* qw, const float* sw, float* y,
               int64_t m, int64_t n, int64_t k) {
  HWY_DYNAMIC_DISPATCH(GemmI8XWt)(qx, sx, qw, sw, y, m, n, k);
}
void DequantizeRows(const int8_t* q, const float* scale, float* y, int64_t rows, int64_t cols) {
  HWY_DYNAMIC_DISPATCH(DequantizeRows)(q, scale, y, rows, cols);
}
void HadamardRows(const float* x, float* y, int64_t rows, int64_t cols, bool transpose) {
  HWY_DYNAMIC_DISPATCH(HadamardRows)(x, y, rows, cols, transpose);
}
}  // namespace lockstep::rk::simd
#endif
