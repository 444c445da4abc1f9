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
#include <vector>

#include "kernels/impl.h"
#include "kernels/internal.h"
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
  const hn::Rebind<int8_t, decltype(di)> d8;
  const auto vs = hn::Set(d, s), lo = hn::Set(d, -127.0f), hi = hn::Set(d, 127.0f);
  int64_t i = 0;
  for (; i + n <= cols; i += n) {
    const auto y = hn::Div(hn::LoadU(d, row + i), vs);
    // NaN lanes to 0 before the rounding, the clamp and the conversion; the narrowing to int8
    // is exact (the values are in [-127, 127] already).
    const auto v = hn::Min(hn::Max(hn::Round(hn::IfThenZeroElse(hn::IsNaN(y), y)), lo), hi);
    hn::StoreU(hn::DemoteTo(d8, hn::ConvertTo(di, v)), d8, out + i);
  }
  for (; i < cols; ++i) out[i] = int8::Quantize(row[i], s);
}

// One row quantized with its own scale (QuantizeRows' row): *scale and out[0, cols).
void QuantizeRowOwnScale(const float* row, int8_t* out, float* scale, int64_t cols) {
  const hn::ScalableTag<float> d;
  const auto n = static_cast<int64_t>(hn::Lanes(d));
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
  *scale = int8::RowScale(amax, finite);
  QuantizeRow(row, *scale, out, cols);
}

void QuantizeRows(const float* x, int8_t* q, float* scale, int64_t rows, int64_t cols) {
  ParallelFor(rows,
              [&](int64_t r) { QuantizeRowOwnScale(x + r * cols, q + r * cols, scale + r, cols); });
}

void QuantizeRowsByScale(const float* x, const float* scale, int8_t* q, int64_t rows,
                         int64_t cols) {
  ParallelFor(rows, [&](int64_t r) { QuantizeRow(x + r * cols, scale[r], q + r * cols, cols); });
}

// Four vectors of four 32-bit values r0..r3 (rows) transposed: put(c, v) receives column c
// (r0[c], r1[c], r2[c], r3[c]). Moves only, by two rounds of interleaving.
template <class D, class Put>
HWY_INLINE void Transpose4x4(D d, hn::Vec<D> r0, hn::Vec<D> r1, hn::Vec<D> r2, hn::Vec<D> r3,
                             const Put& put) {
  static_assert(sizeof(hn::TFromD<D>) == 4 && hn::MaxLanes(D()) == 4);
  const hn::Repartition<uint64_t, D> d64;
  const auto lo01 = hn::BitCast(d64, hn::InterleaveLower(d, r0, r1));  // r0[0] r1[0] r0[1] r1[1]
  const auto lo23 = hn::BitCast(d64, hn::InterleaveLower(d, r2, r3));
  const auto hi01 = hn::BitCast(d64, hn::InterleaveUpper(d, r0, r1));  // r0[2] r1[2] r0[3] r1[3]
  const auto hi23 = hn::BitCast(d64, hn::InterleaveUpper(d, r2, r3));
  put(0, hn::BitCast(d, hn::InterleaveLower(d64, lo01, lo23)));
  put(1, hn::BitCast(d, hn::InterleaveUpper(d64, lo01, lo23)));
  put(2, hn::BitCast(d, hn::InterleaveLower(d64, hi01, hi23)));
  put(3, hn::BitCast(d, hn::InterleaveUpper(d64, hi01, hi23)));
}

#if HWY_TARGET == HWY_AVX2 || HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX3_DL
// x86: the register-blocked kernel of int8_tile-inl.h, in the dot form where the target has an
// int8 dot product (AVX3_DL; AVX2 with AVX-VNNI, the variant AVX2_VNNI), else the widened form.
#if HWY_TARGET == HWY_AVX3_DL || HWY_TARGET == HWY_AVX2
namespace dot {
#define LOCKSTEP_I8_DOT 1
// Highway 1.0.3 compiles AVX3_DL without AVX512-VNNI (its target string names "avxvnni", the VEX
// form), though it dispatches there only on CPUs that have it: the kernel adds it. AVX2's dot
// form runs only as the variant AVX2_VNNI, on CPUs with AVX-VNNI.
#if HWY_TARGET == HWY_AVX3_DL
#define LOCKSTEP_INT8_TILE __attribute__((target(HWY_TARGET_STR ",avx512vnni")))
#else
#define LOCKSTEP_INT8_TILE __attribute__((target(HWY_TARGET_STR ",avxvnni")))
#endif
#include "kernels/simd/int8_tile-inl.h"
}  // namespace dot
#endif
#if HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX2
namespace widened {
#define LOCKSTEP_I8_DOT 0
#define LOCKSTEP_INT8_TILE
#include "kernels/simd/int8_tile-inl.h"
}  // namespace widened
#endif

// f(form) for the form of the active variant (int8_tile-inl.h's Form: dot or widened).
template <class F>
decltype(auto) WithForm(F&& f) {
#if HWY_TARGET == HWY_AVX3_DL
  return f(dot::Form());
#elif HWY_TARGET == HWY_AVX3
  return f(widened::Form());
#else
  return rk::detail::Int8DotActive() ? f(dot::Form()) : f(widened::Form());
#endif
}

void GemmI8XWt(const int8_t* qx, const float* sx, const int8_t* qw, const float* sw, float* y,
               int64_t m, int64_t n, int64_t k) {
  WithForm([&](auto form) { form.Gemm(qx, sx, qw, sw, y, m, n, k); });
}

// A weight packed once (rk::PackI8ForGemm) in the layout of the active form: the form's id
// (what a packing must match to be read), its bytes, the packing, the product.
int64_t I8PackingForm() {
  return WithForm([](auto form) { return decltype(form)::kId; });
}
int64_t PackedI8Bytes(int64_t n, int64_t k) {
  return WithForm([&](auto form) { return form.PackedBytes(n, k); });
}
void PackI8(const int8_t* qw, int64_t n, int64_t k, uint8_t* out) {
  WithForm([&](auto form) { form.Pack(qw, n, k, out); });
}
void GemmI8XWtPacked(const int8_t* qx, const float* sx, const uint8_t* packed, const float* sw,
                     float* y, int64_t m, int64_t n, int64_t k) {
  WithForm([&](auto form) { form.GemmPacked(qx, sx, packed, sw, y, m, n, k); });
}
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

#if HWY_TARGET == HWY_NEON
// The variant NEON_DOTPROD (CPUs with the dot-product extension): sdot adds four int8 products
// into each int32 lane, wrapping (there is no saturating form). out[c] = Σ_r a[r]·w[c][r] for
// four columns c, exact.
__attribute__((target("arch=armv8.2-a+dotprod"))) void DotI8Sdot4(const int8_t* a,
                                                                  const int8_t* const* w, int64_t k,
                                                                  int32_t* out) {
  int32x4_t s0 = vdupq_n_s32(0), s1 = s0, s2 = s0, s3 = s0;
  int64_t r = 0;
  for (; r + 16 <= k; r += 16) {
    const int8x16_t va = vld1q_s8(a + r);
    s0 = vdotq_s32(s0, va, vld1q_s8(w[0] + r));
    s1 = vdotq_s32(s1, va, vld1q_s8(w[1] + r));
    s2 = vdotq_s32(s2, va, vld1q_s8(w[2] + r));
    s3 = vdotq_s32(s3, va, vld1q_s8(w[3] + r));
  }
  out[0] = vaddvq_s32(s0);
  out[1] = vaddvq_s32(s1);
  out[2] = vaddvq_s32(s2);
  out[3] = vaddvq_s32(s3);
  for (; r < k; ++r) {
    for (int c = 0; c < 4; ++c) out[c] += int32_t{a[r]} * int32_t{w[c][r]};
  }
}
#endif

void GemmI8XWt(const int8_t* qx, const float* sx, const int8_t* qw, const float* sw, float* y,
               int64_t m, int64_t n, int64_t k) {
#if HWY_TARGET == HWY_NEON
  if (rk::detail::Int8DotActive()) {
    ParallelFor(m, [&](int64_t i) {
      for (int64_t j0 = 0; j0 < n; j0 += 4) {
        const int8_t* w[4];
        for (int64_t c = 0; c < 4; ++c) w[c] = qw + std::min(j0 + c, n - 1) * k;  // past n: n - 1
        int32_t acc[4];
        DotI8Sdot4(qx + i * k, w, k, acc);
        for (int64_t j = j0; j < std::min(n, j0 + 4); ++j) {
          y[i * n + j] = static_cast<float>(acc[j - j0]) * (sx[i] * sw[j]);
        }
      }
    });
    return;
  }
#endif
  ParallelFor(m, [&](int64_t i) {
    for (int64_t j = 0; j < n; ++j) {
      const int32_t acc = DotI8(qx + i * k, qw + j * k, k);
      y[i * n + j] = static_cast<float>(acc) * (sx[i] * sw[j]);
    }
  });
}
#endif

#if !(HWY_TARGET == HWY_AVX2 || HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX3_DL)
// Elsewhere the product reads qw itself: no packing (form 0), never asked to pack or read one.
int64_t I8PackingForm() { return 0; }
int64_t PackedI8Bytes(int64_t, int64_t) { return 0; }
void PackI8(const int8_t*, int64_t, int64_t, uint8_t*) {}
void GemmI8XWtPacked(const int8_t*, const float*, const uint8_t*, const float*, float*, int64_t,
                     int64_t, int64_t) {}
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

// The lanes l of a vector with l & h set (the upper lanes of the butterflies of stride h).
template <class D>
HWY_INLINE hn::Mask<D> UpperLanes(D d, int64_t h) {
  const hn::RebindToSigned<D> di;
  return hn::RebindMask(
      d, hn::Ne(hn::And(hn::Iota(di, 0), hn::Set(di, static_cast<int32_t>(h))), hn::Zero(di)));
}

// Lane l ^ h of v in lane l, for a stride h below v's 4, 8 or 16 lanes: moves only (within
// 128-bit blocks for h = 1, 2; the blocks swapped pairwise for h = 4, the halves for h = 8).
template <class D>
HWY_INLINE hn::Vec<D> PartnerLanes(D d, hn::Vec<D> v, int64_t h) {
  if (h == 1) return hn::Shuffle2301(v);
  if (h == 2) return hn::Shuffle1032(v);
  if constexpr (hn::MaxLanes(D()) >= 8) {
    if (h == 4) return hn::SwapAdjacentBlocks(v);
  }
  return hn::ConcatLowerUpper(d, v, v);  // h = 8 of 16 lanes: the halves swapped
}

// The butterflies of strides 1, 2, ..., kCount / 2 among kCount whole vectors, in that order:
// (v[i], v[i + h]) = (v[i] + v[i + h], v[i] - v[i + h]) for every i with i & h = 0.
template <int64_t kCount, class V>
HWY_INLINE void Butterflies(V* v) {
  for (int64_t h = 1; h < kCount; h *= 2) {
    for (int64_t i = 0; i < kCount; ++i) {
      if ((i & h) != 0) continue;
      const V a = v[i], b = v[i + h];
      v[i] = hn::Add(a, b);
      v[i + h] = hn::Sub(a, b);
    }
  }
}

// One block of 64 elements from `in`, rotated in registers (64 / n vectors) into `out` (which may
// be `in`). Within a vector the butterfly of stride h takes the lower lane's a + b and the upper
// lane's a - b from the same two operations as the reference, in its operand order (so that even
// a NaN's bits are the reference's; a + (-b) would flip a NaN operand's sign), blended by the
// mask of upper lanes. Strides from n up pair whole vectors.
template <class D>
HWY_INLINE void RotateBlock64(D d, const float* in, float* out, const hn::Mask<D>* upper,
                              hn::Vec<D> factor) {
  constexpr int64_t n = hn::MaxLanes(D()), kVecs = 64 / n;
  hn::Vec<D> v[kVecs];
  for (int64_t i = 0; i < kVecs; ++i) v[i] = hn::LoadU(d, in + i * n);
  for (int64_t h = 1, stage = 0; h < n; h *= 2, ++stage) {
    for (int64_t i = 0; i < kVecs; ++i) {
      const auto partner = PartnerLanes(d, v[i], h);
      v[i] = hn::IfThenElse(upper[stage], hn::Sub(partner, v[i]), hn::Add(v[i], partner));
    }
  }
  Butterflies<kVecs>(v);
  for (int64_t i = 0; i < kVecs; ++i) hn::StoreU(hn::Mul(v[i], factor), d, out + i * n);
}

// A row of x (not transposed) from `in` into v[0, cols) (`in` may be v). Blocks of 64 rotate in
// registers (RotateBlock64; with the general loop below, a table permutation per stride within
// a vector and a pass over memory per stride across vectors, hadamard_quantize_rows of 2048 ×
// 2816 took 8.3 ms at one thread on a Zen 3, 4.2 ms with it). Other blocks whole vectors at a
// time: strides below the vector's n lanes pair lane l with lane l ^ h of one vector (a
// permutation; the lower lane gets a + b, the upper a - b), strides from n up pair whole vectors.
void RotateRow(const float* in, float* v, int64_t cols) {
  const hn::CappedTag<float, 16> d;
  const hn::RebindToSigned<decltype(d)> di;
  const auto n = static_cast<int64_t>(hn::Lanes(d));
  const int64_t block = HadamardBlock(cols);
  const auto factor = hn::Set(d, int8::HadamardFactor(block));
  if (block == 64 && n == static_cast<int64_t>(hn::MaxLanes(d)) && n >= 4) {
    hn::Mask<decltype(d)> upper[4];  // h = 1, 2, 4, 8
    for (int64_t h = 1, stage = 0; h < n; h *= 2, ++stage) upper[stage] = UpperLanes(d, h);
    for (int64_t s = 0; s < cols; s += 64) RotateBlock64(d, in + s, v + s, upper, factor);
    return;
  }
  if (v != in) std::copy_n(in, cols, v);
  const auto lane = hn::Iota(di, 0);
  const int64_t chunk = std::max(block, n), whole = cols / chunk * chunk;
  const int64_t inner = std::min(block, n);  // the strides within a vector: 1 .. inner / 2
  for (int64_t s = 0; s < whole; s += chunk) {
    float* c = v + s;
    for (int64_t j = 0; j < chunk; j += n) {
      auto a = hn::LoadU(d, c + j);
      for (int64_t h = 1; h < inner; h *= 2) {
        const auto other = hn::TableLookupLanes(
            a, hn::IndicesFromVec(d, hn::Xor(lane, hn::Set(di, static_cast<int32_t>(h)))));
        a = hn::IfThenElse(UpperLanes(d, h), hn::Sub(other, a), hn::Add(a, other));
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
}

// Rows of xᵀ are kColumnTile columns of x at a time.
constexpr int64_t kColumnTile = 64;

// out[l · stride + j] = tile[j · kColumnTile + l] for l < count, j < block: 4 × 4 blocks by
// interleaving where both are whole (the element-by-element copy took two thirds of
// RotateColumnTile's time), the rest one by one.
void TransposeTile(const float* tile, int64_t count, int64_t block, float* out, int64_t stride) {
  const hn::Full128<float> d;
  const int64_t count4 = block % 4 == 0 ? count / 4 * 4 : 0;
  for (int64_t l = 0; l < count4; l += 4) {
    for (int64_t j = 0; j < block; j += 4) {
      const float* t = tile + j * kColumnTile + l;
      float* o = out + l * stride + j;
      Transpose4x4(d, hn::LoadU(d, t), hn::LoadU(d, t + kColumnTile),
                   hn::LoadU(d, t + 2 * kColumnTile), hn::LoadU(d, t + 3 * kColumnTile),
                   [&](int64_t c, hn::Vec<decltype(d)> v) { hn::StoreU(v, d, o + c * stride); });
    }
  }
  for (int64_t l = count4; l < count; ++l) {
    for (int64_t j = 0; j < block; ++j) out[l * stride + j] = tile[j * kColumnTile + l];
  }
}

// A block of 64 rows of x from `x` (rows `cols` apart) by kColumnTile columns, rotated along the
// rows into `tile` (row j at tile + j · kColumnTile) and scaled by `factor`, in two passes over
// vectors of 8 rows held in registers: strides 1, 2, 4 among rows 8g .. 8g + 7 (read from x), then
// strides 8, 16, 32 among rows r, r + 8, ..., r + 56. With the stages one at a time over the tile
// in memory (RotateColumnTile's other path: a copy, six passes and the scaling) the transposed
// hadamard_quantize_rows of 2048 × 2816 took 8.0-10.4 ms at one thread on a Zen 3, 6.9-7.6 ms
// with this (alternating runs).
template <class D>
HWY_INLINE void RotateWholeTile64(D d, const float* x, int64_t cols, float* tile,
                                  hn::Vec<D> factor) {
  const auto n = static_cast<int64_t>(hn::Lanes(d));
  hn::Vec<D> v[8];
  for (int64_t g = 0; g < 8; ++g) {
    for (int64_t l = 0; l < kColumnTile; l += n) {
      for (int64_t i = 0; i < 8; ++i) v[i] = hn::LoadU(d, x + (8 * g + i) * cols + l);
      Butterflies<8>(v);
      for (int64_t i = 0; i < 8; ++i) hn::Store(v[i], d, tile + (8 * g + i) * kColumnTile + l);
    }
  }
  for (int64_t r = 0; r < 8; ++r) {
    for (int64_t l = 0; l < kColumnTile; l += n) {
      for (int64_t i = 0; i < 8; ++i) v[i] = hn::Load(d, tile + (r + 8 * i) * kColumnTile + l);
      Butterflies<8>(v);
      for (int64_t i = 0; i < 8; ++i) {
        hn::Store(hn::Mul(v[i], factor), d, tile + (r + 8 * i) * kColumnTile + l);
      }
    }
  }
}

// The rows first .. first + kColumnTile - 1 of xᵀ (fewer at the end), rotated into out[l * rows +
// j] (row first + l, element j): the columns of a tile whose row j holds element j of each (x's
// rows read four cache lines at a time: one line at a time ran at a third of the speed on the
// wide shapes), so that every butterfly is whole vectors.
void RotateColumnTile(const float* x, float* out, int64_t rows, int64_t cols, int64_t first) {
  constexpr int64_t kMaxBlock = 64;
  const hn::CappedTag<float, kColumnTile> d;
  const auto n = static_cast<int64_t>(hn::Lanes(d));
  const int64_t block = HadamardBlock(rows);
  const auto factor = hn::Set(d, int8::HadamardFactor(block));
  HWY_ALIGN float tile[kMaxBlock * kColumnTile] = {};
  const int64_t count = std::min(kColumnTile, cols - first);
  for (int64_t s = 0; s < rows; s += block) {
    if (block == 64 && count == kColumnTile) {
      RotateWholeTile64(d, x + s * cols + first, cols, tile, factor);
      TransposeTile(tile, count, block, out + s, rows);
      continue;
    }
    for (int64_t j = 0; j < block; ++j) {
      std::copy_n(x + (s + j) * cols + first, count, tile + j * kColumnTile);
    }
    for (int64_t h = 1; h < block; h *= 2) {
      for (int64_t i = 0; i < block; i += 2 * h) {
        for (int64_t j = i; j < i + h; ++j) {
          for (int64_t l = 0; l < kColumnTile; l += n) {
            float* p = tile + j * kColumnTile + l;
            float* q = tile + (j + h) * kColumnTile + l;
            const auto a = hn::Load(d, p), b = hn::Load(d, q);
            hn::Store(hn::Add(a, b), d, p);
            hn::Store(hn::Sub(a, b), d, q);
          }
        }
      }
    }
    for (int64_t j = 0; j < block; ++j) {
      for (int64_t l = 0; l < kColumnTile; l += n) {
        float* p = tile + j * kColumnTile + l;
        hn::Store(hn::Mul(hn::Load(d, p), factor), d, p);
      }
    }
    TransposeTile(tile, count, block, out + s, rows);
  }
}

int64_t ColumnTiles(int64_t cols) { return (cols + kColumnTile - 1) / kColumnTile; }

void HadamardRows(const float* x, float* y, int64_t rows, int64_t cols, bool transpose) {
  if (transpose) {
    ParallelFor(ColumnTiles(cols), [&](int64_t t) {
      RotateColumnTile(x, y + t * kColumnTile * rows, rows, cols, t * kColumnTile);
    });
  } else {
    ParallelFor(rows, [&](int64_t r) { RotateRow(x + r * cols, y + r * cols, cols); });
  }
}

// The rotated rows (one row, or one tile of xᵀ's) in a buffer of the worker's that stays in its
// caches, each quantized from there: the rotated matrix never goes to memory.
void HadamardQuantizeRows(const float* x, int8_t* q, float* scale, int64_t rows, int64_t cols,
                          bool transpose) {
  static thread_local std::vector<float> rotated;
  if (transpose) {
    ParallelFor(ColumnTiles(cols), [&](int64_t t) {
      const int64_t first = t * kColumnTile, count = std::min(kColumnTile, cols - first);
      rotated.resize(static_cast<size_t>(count * rows));
      RotateColumnTile(x, rotated.data(), rows, cols, first);
      for (int64_t l = 0; l < count; ++l) {
        QuantizeRowOwnScale(rotated.data() + l * rows, q + (first + l) * rows, scale + first + l,
                            rows);
      }
    });
  } else {
    ParallelFor(rows, [&](int64_t r) {
      rotated.resize(static_cast<size_t>(cols));
      RotateRow(x + r * cols, rotated.data(), cols);
      QuantizeRowOwnScale(rotated.data(), q + r * cols, scale + r, cols);
    });
  }
}

}  // namespace lockstep::rk::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace lockstep::rk::simd {
HWY_EXPORT(QuantizeRows);
HWY_EXPORT(QuantizeRowsByScale);
HWY_EXPORT(GemmI8XWt);
HWY_EXPORT(I8PackingForm);
HWY_EXPORT(PackedI8Bytes);
HWY_EXPORT(PackI8);
HWY_EXPORT(GemmI8XWtPacked);
HWY_EXPORT(DequantizeRows);
HWY_EXPORT(HadamardRows);
HWY_EXPORT(HadamardQuantizeRows);

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
int64_t I8PackingForm() { return HWY_DYNAMIC_DISPATCH(I8PackingForm)(); }
int64_t PackedI8Bytes(int64_t n, int64_t k) { return HWY_DYNAMIC_DISPATCH(PackedI8Bytes)(n, k); }
void PackI8(const int8_t* qw, int64_t n, int64_t k, uint8_t* out) {
  HWY_DYNAMIC_DISPATCH(PackI8)(qw, n, k, out);
}
void GemmI8XWtPacked(const int8_t* qx, const float* sx, const uint8_t* packed, const float* sw,
                     float* y, int64_t m, int64_t n, int64_t k) {
  HWY_DYNAMIC_DISPATCH(GemmI8XWtPacked)(qx, sx, packed, sw, y, m, n, k);
}
void DequantizeRows(const int8_t* q, const float* scale, float* y, int64_t rows, int64_t cols) {
  HWY_DYNAMIC_DISPATCH(DequantizeRows)(q, scale, y, rows, cols);
}
void HadamardRows(const float* x, float* y, int64_t rows, int64_t cols, bool transpose) {
  HWY_DYNAMIC_DISPATCH(HadamardRows)(x, y, rows, cols, transpose);
}
void HadamardQuantizeRows(const float* x, int8_t* q, float* scale, int64_t rows, int64_t cols,
                          bool transpose) {
  HWY_DYNAMIC_DISPATCH(HadamardQuantizeRows)(x, q, scale, rows, cols, transpose);
}
}  // namespace lockstep::rk::simd
#endif
