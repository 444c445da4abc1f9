// SIMD erfinv: dmath::Erfinv's operations (src/kernels/erfinv.cc) on whole vectors. Giles' fp32
// first approximation uses VLog (lane-by-lane dmath::Log), IEEE sqrt and fused multiply-adds
// (std::fma in the scalar code); the fp64 Newton step calls the vector members of the same
// deterministic SLEEF "cinz" family as the scalar code (erf and exp, AVX with 4 doubles and
// AVX-512F with 8), with IEEE multiplies and subtractions in the same order; widening to fp64 is
// exact and the final narrowing is one round to nearest, as static_cast<float> does. Targets
// without those SLEEF members run the reference.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels/simd/erfinv.cc"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>

#include <limits>

#include "kernels/erfinv_impl.h"
#include "kernels/simd/dmath-inl.h"
#include "lockstep/kernels.h"

#if HWY_ARCH_X86 && !defined(LOCKSTEP_SLEEF_X86_ERFINV_DECLARED)
#define LOCKSTEP_SLEEF_X86_ERFINV_DECLARED
#include <immintrin.h>
// Declared here for the reason dmath-inl.h gives (signatures as in sleef.h 3.5).
extern "C" {
__attribute__((target("avx"))) __m256d Sleef_cinz_erfd4_u10avx(__m256d);
__attribute__((target("avx"))) __m256d Sleef_cinz_expd4_u10avx(__m256d);
__attribute__((target("avx512f"))) __m512d Sleef_cinz_erfd8_u10avx512fnofma(__m512d);
__attribute__((target("avx512f"))) __m512d Sleef_cinz_expd8_u10avx512fnofma(__m512d);
}
#endif

HWY_BEFORE_NAMESPACE();
namespace lockstep::rk::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

#if HWY_TARGET == HWY_AVX2 || HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX3_DL || \
    HWY_TARGET == HWY_AVX3_ZEN4
#define LOCKSTEP_ERFINV_VECTOR 1

// SLEEF's fp64 erf and exp on a full vector of doubles of this target.
template <class V>
static HWY_INLINE V ErfD(V v) {
#if HWY_TARGET == HWY_AVX2
  return V{Sleef_cinz_erfd4_u10avx(v.raw)};
#else
  return V{Sleef_cinz_erfd8_u10avx512fnofma(v.raw)};
#endif
}
template <class V>
static HWY_INLINE V ExpD(V v) {
#if HWY_TARGET == HWY_AVX2
  return V{Sleef_cinz_expd4_u10avx(v.raw)};
#else
  return V{Sleef_cinz_expd8_u10avx512fnofma(v.raw)};
#endif
}

// Giles' approximation times x (GilesErfinv in src/kernels/erfinv.cc): the branch each lane's w
// selects; the second (w >= 5, |x| > 0.9966) only when a lane needs it.
template <class D, class V = hn::Vec<D>>
static HWY_INLINE V Giles(D d, V x) {
  const V one = hn::Set(d, 1.0f);
  const V w = hn::Neg(VLog(d, hn::Mul(hn::Sub(one, x), hn::Add(one, x))));
  const V t1 = hn::Sub(w, hn::Set(d, 2.5f));
  V p1 = hn::Set(d, 2.81022636e-08f);
  p1 = hn::MulAdd(p1, t1, hn::Set(d, 3.43273939e-07f));
  p1 = hn::MulAdd(p1, t1, hn::Set(d, -3.5233877e-06f));
  p1 = hn::MulAdd(p1, t1, hn::Set(d, -4.39150654e-06f));
  p1 = hn::MulAdd(p1, t1, hn::Set(d, 0.00021858087f));
  p1 = hn::MulAdd(p1, t1, hn::Set(d, -0.00125372503f));
  p1 = hn::MulAdd(p1, t1, hn::Set(d, -0.00417768164f));
  p1 = hn::MulAdd(p1, t1, hn::Set(d, 0.246640727f));
  p1 = hn::MulAdd(p1, t1, hn::Set(d, 1.50140941f));
  const auto first = hn::Lt(w, hn::Set(d, 5.0f));
  if (hn::AllTrue(d, first)) return hn::Mul(p1, x);
  const V t2 = hn::Sub(hn::Sqrt(w), hn::Set(d, 3.0f));
  V p2 = hn::Set(d, -0.000200214257f);
  p2 = hn::MulAdd(p2, t2, hn::Set(d, 0.000100950558f));
  p2 = hn::MulAdd(p2, t2, hn::Set(d, 0.00134934322f));
  p2 = hn::MulAdd(p2, t2, hn::Set(d, -0.00367342844f));
  p2 = hn::MulAdd(p2, t2, hn::Set(d, 0.00573950773f));
  p2 = hn::MulAdd(p2, t2, hn::Set(d, -0.0076224613f));
  p2 = hn::MulAdd(p2, t2, hn::Set(d, 0.00943887047f));
  p2 = hn::MulAdd(p2, t2, hn::Set(d, 1.00167406f));
  p2 = hn::MulAdd(p2, t2, hn::Set(d, 2.83297682f));
  return hn::Mul(hn::IfThenElse(first, p1, p2), x);
}
#endif

void ErfinvInPlace(float* x, int64_t n) {
  int64_t i = 0;
#ifdef LOCKSTEP_ERFINV_VECTOR
  const hn::ScalableTag<float> df;
  const hn::ScalableTag<double> dd;          // half as many lanes
  const hn::Rebind<float, decltype(dd)> dh;  // floats of one double vector
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(df));
  const int64_t half = static_cast<int64_t>(hn::Lanes(dd));
  const auto half_sqrt_pi = hn::Set(dd, 0.88622692545275801365);
  const auto infinity = hn::Set(df, std::numeric_limits<float>::infinity());
  const auto nan = hn::Set(df, std::numeric_limits<float>::quiet_NaN());
  HWY_ALIGN float y0[hn::MaxLanes(df)];
  for (; i + lanes <= n; i += lanes) {
    const auto v = hn::LoadU(df, x + i);
    hn::Store(Giles(df, v), df, y0);
    // One Newton step in fp64, half a vector at a time:
    // y1 = y0 - ((erf(y0) - x) * (sqrt(pi)/2)) * exp(y0 * y0).
    for (int64_t h = 0; h < lanes; h += half) {
      const auto y = hn::PromoteTo(dd, hn::Load(dh, y0 + h));
      const auto xd = hn::PromoteTo(dd, hn::LoadU(dh, x + i + h));
      const auto step = hn::Mul(hn::Mul(hn::Sub(ErfD(y), xd), half_sqrt_pi), ExpD(hn::Mul(y, y)));
      hn::Store(hn::DemoteTo(dh, hn::Sub(y, step)), dh, y0 + h);
    }
    // |x| >= 1 or NaN: +-inf at +-1, NaN beyond; +-0 stays itself.
    const auto magnitude = hn::Abs(v);
    auto y = hn::IfThenElse(hn::Eq(v, hn::Zero(df)), v, hn::Load(df, y0));
    const auto edge = hn::IfThenElse(hn::Eq(magnitude, hn::Set(df, 1.0f)),
                                     hn::CopySign(infinity, v), nan);
    y = hn::IfThenElse(hn::Lt(magnitude, hn::Set(df, 1.0f)), y, edge);
    hn::StoreU(y, df, x + i);
  }
#endif
  ref::ErfinvInPlace(x + i, n - i);
}

// Entry j of a table of 16 floats in every lane (j < 16).
template <class D, class V = hn::Vec<D>, class VU = hn::Vec<hn::RebindToUnsigned<D>>>
static HWY_INLINE V Lookup16(D d, const float* table, VU j) {
  const hn::RebindToSigned<D> di;
  if constexpr (hn::MaxLanes(D()) >= 16) {
    return hn::TableLookupLanes(hn::Load(d, table), hn::IndicesFromVec(d, hn::BitCast(di, j)));
  } else {
    static_assert(hn::MaxLanes(D()) == 8);
    const auto low = hn::BitCast(di, hn::And(j, hn::Set(hn::RebindToUnsigned<D>(), 7)));
    const auto indices = hn::IndicesFromVec(d, low);
    return hn::IfThenElse(hn::RebindMask(d, hn::Lt(hn::BitCast(di, j), hn::Set(di, 8))),
                          hn::TableLookupLanes(hn::Load(d, table), indices),
                          hn::TableLookupLanes(hn::Load(d, table + 8), indices));
  }
}

// InitErfinvFirstApproximation (src/kernels/erfinv_impl.h) on a vector.
template <class D, class V = hn::Vec<D>>
static HWY_INLINE V InitFirst(D d, V x) {
  const hn::RebindToUnsigned<D> du;
  const V magnitude = hn::Abs(x);
  const auto bits = hn::ShiftRight<22>(hn::BitCast(du, hn::Sub(hn::Set(d, 1.0f), magnitude)));
  const auto j =
      hn::Min(hn::Sub(bits, hn::Set(du, kInitErfinvSegmentBias)), hn::Set(du, kInitErfinvOutside));
  const V s = hn::Sub(magnitude, Lookup16(d, kInitErfinvCenter, j));
  V p = Lookup16(d, kInitErfinvCoefficient[kInitErfinvDegree], j);
  for (int k = kInitErfinvDegree - 1; k >= 0; --k) {
    p = hn::MulAdd(p, s, Lookup16(d, kInitErfinvCoefficient[k], j));
  }
  return hn::CopySign(hn::Mul(magnitude, p), x);
}

void InitErfinvFirstApproximationInPlace(float* x, int64_t n) {
  int64_t i = 0;
#ifdef LOCKSTEP_ERFINV_VECTOR
  const hn::ScalableTag<float> df;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(df));
  for (; i + lanes <= n; i += lanes) hn::StoreU(InitFirst(df, hn::LoadU(df, x + i)), df, x + i);
#endif
  ref::InitErfinvFirstApproximationInPlace(x + i, n - i);
}

void InitErfinvByTable(const uint32_t* words, const uint32_t* table, float bound, float scale,
                       float* out, int64_t n) {
  int64_t i = 0;
#ifdef LOCKSTEP_ERFINV_VECTOR
  const hn::ScalableTag<float> df;
  const hn::RebindToUnsigned<decltype(df)> du;
  const hn::RebindToSigned<decltype(df)> di;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(df));
  for (; i + lanes <= n; i += lanes) {
    const auto k = hn::ShiftRight<8>(hn::LoadU(du, words + i));
    // InitUniform: 2k + 1 - 2^24 is exact in int32 and in binary32, as is the scaling.
    const auto odd =
        hn::Sub(hn::BitCast(di, hn::Add(hn::Add(k, k), hn::Set(du, 1))), hn::Set(di, 1 << 24));
    const auto x =
        hn::Mul(hn::Mul(hn::ConvertTo(df, odd), hn::Set(df, 0x1.0p-24f)), hn::Set(df, bound));
    // InitTableIndex and InitTableCorrection, gathered.
    const auto half = hn::Set(du, kInitTableHalf);
    // k < 2^24, so k >= 2^23 is bit 23.
    const auto a =
        hn::And(hn::IfThenElse(hn::TestBit(k, half), k, hn::Not(k)), hn::Sub(half, hn::Set(du, 1)));
    const auto entry = hn::GatherIndex(du, table, hn::BitCast(di, hn::ShiftRight<3>(a)));
    const auto shift = hn::ShiftLeft<2>(hn::And(a, hn::Set(du, 7)));
    const auto d = hn::Sub(hn::And(hn::Shr(entry, shift), hn::Set(du, 15)), hn::Set(du, 8));
    const auto y = hn::BitCast(df, hn::Add(hn::BitCast(du, InitFirst(df, x)), d));
    hn::StoreU(hn::Mul(hn::Set(df, scale), y), df, out + i);
  }
#endif
  ref::InitErfinvByTable(words + i, table, bound, scale, out + i, n - i);
}
#undef LOCKSTEP_ERFINV_VECTOR

}  // namespace lockstep::rk::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace lockstep::rk::simd {
HWY_EXPORT(ErfinvInPlace);
HWY_EXPORT(InitErfinvFirstApproximationInPlace);
HWY_EXPORT(InitErfinvByTable);

void ErfinvInPlace(float* x, int64_t n) { HWY_DYNAMIC_DISPATCH(ErfinvInPlace)(x, n); }
void InitErfinvFirstApproximationInPlace(float* x, int64_t n) {
  HWY_DYNAMIC_DISPATCH(InitErfinvFirstApproximationInPlace)(x, n);
}
void InitErfinvByTable(const uint32_t* words, const uint32_t* table, float bound, float scale,
                       float* out, int64_t n) {
  HWY_DYNAMIC_DISPATCH(InitErfinvByTable)(words, table, bound, scale, out, n);
}
}  // namespace lockstep::rk::simd
#endif
