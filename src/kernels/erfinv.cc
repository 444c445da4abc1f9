// lockstep::dmath::Erfinv, the inverse error function (used by the truncated-normal init).
//
// Hand-written because no library available on Debian provides a deterministic erfinv: SLEEF
// has none, and libm/Boost/std implementations are neither fixed in operation order nor the
// same across versions. Every operation below is an IEEE basic operation (correctly rounded,
// so the same bits on every conforming unit), std::fma (correctly rounded by C99/C++, whether
// done in hardware or in software), or a SLEEF function of the deterministic "finz" family.
// The file is compiled with -ffp-contract=off, so no multiply-add is fused behind our back,
// and fp64 arithmetic on every supported platform (x86-64 SSE2, AArch64) is true binary64.
//
// Method (docs/numerics.md (dmath) gives the same steps as a specification):
//  1. A first approximation y0 in fp32 from M. Giles, "Approximating the erfinv function",
//     GPU Computing Gems Jade Edition (2011): with w = -log((1 - x)(1 + x)), erfinv(x) = x p(w)
//     where p is a degree-8 polynomial in w - 2.5 (w < 5) or in sqrt(w) - 3 (w >= 5). Alone
//     it is within 3.1 ulp of erfinv(x) (docs/numerics.md (dmath)).
//  2. One Newton step on erf(y) = x in fp64 with SLEEF's fp64 erf and exp. Newton converges
//     quadratically (the new error is about y0 * e0^2 for an absolute error e0), so the step
//     leaves an error near 1e-12 relative, and the final rounding to fp32 dominates: the
//     result is within 0.5 ulp plus a negligible fraction (tests/kernels/dmath_test.cc).
//     The step is done in fp64 because fp32 cannot do it: near |x| = 1 the residual
//     erf(y0) - x would be swamped by the 1 ulp error of an fp32 erf (erfinv's condition
//     number there is in the thousands).
#include <sleef.h>

#include <sys/mman.h>

#include <atomic>
#include <bit>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <vector>

#include "kernels/erfinv_impl.h"
#include "kernels/philox_impl.h"
#include "kernels/internal.h"
#include "lockstep/kernels.h"

namespace lockstep::dmath {
namespace {

// sqrt(pi) / 2 = 1 / erf'(0), rounded to fp64.
constexpr double kHalfSqrtPi = 0.88622692545275801365;

// Giles' single-precision approximation, for 0 < |x| < 1. Horner's rule from the highest
// coefficient, each step one fused multiply-add: p = fma(p, t, c).
float GilesErfinv(float x) {
  const float w = -Log((1.0f - x) * (1.0f + x));
  float p;
  if (w < 5.0f) {
    const float t = w - 2.5f;
    p = 2.81022636e-08f;
    p = std::fma(p, t, 3.43273939e-07f);
    p = std::fma(p, t, -3.5233877e-06f);
    p = std::fma(p, t, -4.39150654e-06f);
    p = std::fma(p, t, 0.00021858087f);
    p = std::fma(p, t, -0.00125372503f);
    p = std::fma(p, t, -0.00417768164f);
    p = std::fma(p, t, 0.246640727f);
    p = std::fma(p, t, 1.50140941f);
  } else {
    const float t = Sqrt(w) - 3.0f;
    p = -0.000200214257f;
    p = std::fma(p, t, 0.000100950558f);
    p = std::fma(p, t, 0.00134934322f);
    p = std::fma(p, t, -0.00367342844f);
    p = std::fma(p, t, 0.00573950773f);
    p = std::fma(p, t, -0.0076224613f);
    p = std::fma(p, t, 0.00943887047f);
    p = std::fma(p, t, 1.00167406f);
    p = std::fma(p, t, 2.83297682f);
  }
  return p * x;
}

}  // namespace

float Erfinv(float x) {
  if (!(std::fabs(x) < 1.0f)) {  // |x| >= 1 or NaN
    if (std::fabs(x) == 1.0f) return std::copysign(std::numeric_limits<float>::infinity(), x);
    return std::numeric_limits<float>::quiet_NaN();
  }
  if (x == 0.0f) return x;  // +0 -> +0, -0 -> -0

  // Newton step y1 = y0 - (erf(y0) - x) / erf'(y0), erf'(y) = exp(-y^2) / (sqrt(pi)/2),
  // written as y1 = y0 - ((erf(y0) - x) * (sqrt(pi)/2)) * exp(y0 * y0), in this order.
  // y0 is below 4 in magnitude (|x| <= 1 - 2^-24), so exp(y0 * y0) < e^16 cannot overflow;
  // for subnormal x, fp64 holds y0 and the residual without underflow.
  const double y0 = static_cast<double>(GilesErfinv(x));
  const double residual = Sleef_cinz_erfd1_u10purec(y0) - static_cast<double>(x);
  const double step = (residual * kHalfSqrtPi) * Sleef_cinz_expd1_u10purec(y0 * y0);
  return static_cast<float>(y0 - step);
}

}  // namespace lockstep::dmath

namespace lockstep::rk {

void PhiloxWords(PhiloxKey key, uint64_t first, std::span<uint32_t> out) {
  const auto kernel = detail::UsingReference() ? &ref::PhiloxWords : &simd::PhiloxWords;
  kernel(key[0], key[1], first, out.data(), static_cast<int64_t>(out.size()));
}

void ErfinvInPlace(std::span<float> x) {
  const auto kernel = detail::UsingReference() ? &ref::ErfinvInPlace : &simd::ErfinvInPlace;
  kernel(x.data(), static_cast<int64_t>(x.size()));
}

void InitErfinvFirstApproximationInPlace(std::span<float> x) {
  const auto kernel = detail::UsingReference() ? &ref::InitErfinvFirstApproximationInPlace
                                               : &simd::InitErfinvFirstApproximationInPlace;
  kernel(x.data(), static_cast<int64_t>(x.size()));
}

namespace {

// Erf((float)sqrt(2)): sqrt(2) * erfinv(t * bound) stays inside (-2, 2).
float Bound() {
  static const float bound = dmath::Erf(0x1.6a09e6p+0f);
  return bound;
}

std::atomic<bool> table_made{false};

}  // namespace

float InitErfinvArgument(uint32_t word) { return InitUniform(word) * Bound(); }

// Made from the kernels themselves (8.4M erfinvs), so it holds their bits. Four bits per entry
// and one half for both signs: 4 MiB (a byte per entry, 8 MiB, ran 1.3 s slower in the open-1b
// init: the lookups are random, and a smaller table stays in the caches better). Its memory is
// aligned to 2 MiB and advised into huge pages where the kernel makes them (transparent huge
// pages not "never"): two pages for what took 1,024 of 4 KiB, whose translations the random
// lookups missed (the open-1b init unit 6.7 s against 7.3-9.1 s on a Zen 3, alternating runs).
std::span<const uint32_t> InitErfinvTable() {
  static const std::span<uint32_t> table = [] {
    constexpr int64_t kBlock = 16384;  // entries per task: whole words of the table
    constexpr size_t kHugePage = size_t{2} << 20;
    static_assert(kInitErfinvTableBytes % kHugePage == 0);
    auto* memory = static_cast<uint32_t*>(std::aligned_alloc(kHugePage, kInitErfinvTableBytes));
    if (memory == nullptr)
      Fail("the init's erfinv table: cannot allocate {} bytes", kInitErfinvTableBytes);
    ::madvise(memory, kInitErfinvTableBytes, MADV_HUGEPAGE);  // advice only: else 4 KiB pages
    std::memset(memory, 0, kInitErfinvTableBytes);
    const std::span<uint32_t> entries(memory, kInitErfinvTableBytes / sizeof(uint32_t));
    static_assert(kInitErfinvTableBytes * 2 == kInitTableHalf);
    std::atomic<int64_t> outside{-1};  // a k whose distance does not fit in four bits
    ParallelFor(kInitTableHalf / kBlock, [&](int64_t block) {
      std::vector<float> y0(static_cast<size_t>(kBlock)), y(y0.size());
      for (int64_t j = 0; j < kBlock; ++j) {
        const auto k = static_cast<uint32_t>(kInitTableHalf + block * kBlock + j);
        y0[static_cast<size_t>(j)] = y[static_cast<size_t>(j)] = InitErfinvArgument(k << 8);
      }
      InitErfinvFirstApproximationInPlace(y0);
      ErfinvInPlace(y);
      for (size_t j = 0; j < y.size(); ++j) {
        const int64_t d = int64_t{std::bit_cast<uint32_t>(y[j])} - std::bit_cast<uint32_t>(y0[j]);
        const size_t a = static_cast<size_t>(block * kBlock) + j;
        if (d < -8 || d > 7) outside = kInitTableHalf + static_cast<int64_t>(a);
        entries[a / 8] |= static_cast<uint32_t>((d + 8) & 15) << (4 * (a % 8));
      }
    });
    if (outside >= 0) {
      Fail(
          "the init's erfinv table: Erfinv of draw k = {} is not within -8 to 7 ulp of its "
          "first approximation (a broken erfinv kernel)",
          outside.load());
    }
    table_made = true;
    return entries;
  }();
  return table;
}

bool InitErfinvTableMade() { return table_made; }

void InitErfinvByTable(std::span<const uint32_t> words, float scale, std::span<float> out) {
  if (words.size() != out.size()) {
    Fail("InitErfinvByTable: {} words for {} outputs", words.size(), out.size());
  }
  LOCKSTEP_CHECK(table_made, "InitErfinvByTable before the table is made");
  const auto kernel = detail::UsingReference() ? &ref::InitErfinvByTable : &simd::InitErfinvByTable;
  kernel(words.data(), InitErfinvTable().data(), Bound(), scale, out.data(),
         static_cast<int64_t>(out.size()));
}

}  // namespace lockstep::rk
