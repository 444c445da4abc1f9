// Per-target vector forms of lockstep::dmath, for Highway kernels. Include after
// <hwy/highway.h> in a file compiled through foreach_target. Each function gives, lane by lane,
// exactly the bits of the scalar dmath function: AVX2 / AVX-512 call SLEEF's vector members of
// the same deterministic "cinz" family (the AVX member, which AVX2 CPUs run, and AVX-512F);
// any other width falls back to the scalar function per lane.
#if defined(LOCKSTEP_KERNELS_SIMD_DMATH_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef LOCKSTEP_KERNELS_SIMD_DMATH_INL_H_
#undef LOCKSTEP_KERNELS_SIMD_DMATH_INL_H_
#else
#define LOCKSTEP_KERNELS_SIMD_DMATH_INL_H_
#endif

#include "lockstep/kernels.h"

#if HWY_ARCH_X86 && !defined(LOCKSTEP_SLEEF_X86_DECLARED)
#define LOCKSTEP_SLEEF_X86_DECLARED
#include <immintrin.h>
// sleef.h declares these only when the whole translation unit is compiled with -mavx /
// -mavx512f; Highway compiles per target with function attributes instead, so declare the
// members of the cinz family used below ourselves (signatures as in sleef.h 3.5).
extern "C" {
// The target attributes give the vector arguments their AVX / AVX-512 calling convention (Clang
// refuses the declarations without them).
#define LOCKSTEP_SLEEF_DECLARE(fn)                                                     \
  __attribute__((target("avx"))) __m256 Sleef_cinz_##fn##f8_u10avx(__m256);            \
  __attribute__((target("avx512f"))) __m512 Sleef_cinz_##fn##f16_u10avx512fnofma(__m512);
LOCKSTEP_SLEEF_DECLARE(exp)
LOCKSTEP_SLEEF_DECLARE(log)
LOCKSTEP_SLEEF_DECLARE(sin)
LOCKSTEP_SLEEF_DECLARE(cos)
LOCKSTEP_SLEEF_DECLARE(erf)
#undef LOCKSTEP_SLEEF_DECLARE
}
#endif

HWY_BEFORE_NAMESPACE();
namespace lockstep::rk::HWY_NAMESPACE {
namespace dmath_hn = hwy::HWY_NAMESPACE;

template <class D, class V = dmath_hn::Vec<D>>
HWY_INLINE V PerLane(D d, V v, float (*f)(float)) {
  HWY_ALIGN float buf[dmath_hn::MaxLanes(d)];
  dmath_hn::Store(v, d, buf);
  for (size_t i = 0; i < dmath_hn::Lanes(d); ++i) buf[i] = f(buf[i]);
  return dmath_hn::Load(d, buf);
}

// lockstep::dmath::Canonical on every lane: SLEEF's vector members return NaN bits as the
// hardware makes them.
template <class D, class V = dmath_hn::Vec<D>>
HWY_INLINE V VCanonical(D d, V v) {
  const V canonical = dmath_hn::BitCast(
      d, dmath_hn::Set(dmath_hn::RebindToUnsigned<D>(), lockstep::dmath::kCanonicalNaNBits));
  return dmath_hn::IfThenElse(dmath_hn::IsNaN(v), canonical, v);
}

#if HWY_TARGET == HWY_AVX2
#define LOCKSTEP_DMATH_VEC(name, sleef_fn)                                          \
  template <class D, class V = dmath_hn::Vec<D>>                                    \
  HWY_INLINE V V##name(D d, V v) {                                                  \
    if constexpr (dmath_hn::MaxLanes(D()) == 8) {                                   \
      return VCanonical(d, V{sleef_fn##8_u10avx(v.raw)});                           \
    } else {                                                                        \
      return PerLane(d, v, &lockstep::dmath::name);                                 \
    }                                                                               \
  }
#elif HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX3_DL || HWY_TARGET == HWY_AVX3_ZEN4
#define LOCKSTEP_DMATH_VEC(name, sleef_fn)                                          \
  template <class D, class V = dmath_hn::Vec<D>>                                    \
  HWY_INLINE V V##name(D d, V v) {                                                  \
    if constexpr (dmath_hn::MaxLanes(D()) == 16) {                                  \
      return VCanonical(d, V{sleef_fn##16_u10avx512fnofma(v.raw)});                 \
    } else {                                                                        \
      return PerLane(d, v, &lockstep::dmath::name);                                 \
    }                                                                               \
  }
#else
#define LOCKSTEP_DMATH_VEC(name, sleef_fn)                                          \
  template <class D, class V = dmath_hn::Vec<D>>                                    \
  HWY_INLINE V V##name(D d, V v) {                                                  \
    return PerLane(d, v, &lockstep::dmath::name);                                   \
  }
#endif

// VExp(d, v), VLog(d, v), VSin(d, v), VCos(d, v), VErf(d, v).
LOCKSTEP_DMATH_VEC(Exp, Sleef_cinz_expf)
LOCKSTEP_DMATH_VEC(Log, Sleef_cinz_logf)
LOCKSTEP_DMATH_VEC(Sin, Sleef_cinz_sinf)
LOCKSTEP_DMATH_VEC(Cos, Sleef_cinz_cosf)
LOCKSTEP_DMATH_VEC(Erf, Sleef_cinz_erff)
#undef LOCKSTEP_DMATH_VEC

}  // namespace lockstep::rk::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#endif  // include guard with HWY_TARGET_TOGGLE
