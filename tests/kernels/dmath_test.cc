// Accuracy and special values of lockstep::dmath, measured against MPFR.
//
// DmathAccuracy.UlpTableAgainstMpfr prints one line per function (the table quoted in
// docs/numerics.md (dmath)): the sampled domain, the number of samples, the largest error in fp32
// ulps and the input where it occurred. Errors are measured against the exact value rounded to
// kRefBits bits; the ulp of a real r is that of the fp32 binade holding |r| (2^(e-23) for |r| in
// [2^e, 2^(e+1))), never below the subnormal spacing 2^-149. All samples are deterministic.
#include <gtest/gtest.h>
#include <mpfr.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "kernels/erfinv_impl.h"
#include "lockstep/kernels.h"

namespace lockstep::dmath {
namespace {

constexpr mpfr_prec_t kRefBits = 128;
constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr float kDenormMin = std::numeric_limits<float>::denorm_min();
constexpr float kMaxFloat = std::numeric_limits<float>::max();

// An mpfr_t at kRefBits bits that frees itself.
class Big {
 public:
  Big() { mpfr_init2(v_, kRefBits); }
  explicit Big(float x) : Big() { mpfr_set_flt(v_, x, MPFR_RNDN); }
  ~Big() { mpfr_clear(v_); }
  Big(const Big&) = delete;
  Big& operator=(const Big&) = delete;
  mpfr_ptr get() { return v_; }

 private:
  mpfr_t v_;
};

// |got - ref| in fp32 ulps of ref (see the file comment). ref must be finite.
double UlpError(float got, mpfr_ptr ref) {
  if (std::isnan(got) || std::isinf(got)) return kInf;
  const long ulp_exponent =
      mpfr_zero_p(ref) ? -149 : std::max<long>(mpfr_get_exp(ref) - 24, -149);
  Big diff(got);
  mpfr_sub(diff.get(), diff.get(), ref, MPFR_RNDN);
  mpfr_mul_2si(diff.get(), diff.get(), -ulp_exponent, MPFR_RNDN);
  return std::fabs(mpfr_get_d(diff.get(), MPFR_RNDN));
}

// Floats ordered as integers: key(-x) = -key(x), consecutive floats have consecutive keys.
int64_t Key(float x) {
  const uint32_t bits = std::bit_cast<uint32_t>(x);
  const int64_t magnitude = bits & 0x7fffffffu;
  return (bits >> 31) ? -magnitude : magnitude;
}
float FromKey(int64_t key) {
  const uint32_t magnitude = static_cast<uint32_t>(key < 0 ? -key : key);
  return std::bit_cast<float>(key < 0 ? (magnitude | 0x80000000u) : magnitude);
}

// A sampled interval [lo, hi]: `count` points equally spaced either in the float order (every
// binade down to the subnormals gets its share) or in value (the working range, densely).
enum class Spacing { kBits, kValue };
struct Range {
  float lo, hi;
  int64_t count;
  Spacing spacing;
};

std::vector<float> Sample(const std::vector<Range>& ranges) {
  std::vector<float> xs;
  for (const Range& r : ranges) {
    for (int64_t i = 0; i < r.count; ++i) {
      const double t = r.count == 1 ? 0.0 : static_cast<double>(i) / (r.count - 1);
      if (r.spacing == Spacing::kBits) {
        const double key = Key(r.lo) + t * static_cast<double>(Key(r.hi) - Key(r.lo));
        xs.push_back(FromKey(std::llround(key)));
      } else {
        xs.push_back(static_cast<float>(r.lo + t * (static_cast<double>(r.hi) - r.lo)));
      }
    }
  }
  return xs;
}

std::string Describe(const std::vector<Range>& ranges) {
  std::string s;
  char buf[96];
  for (const Range& r : ranges) {
    std::snprintf(buf, sizeof buf, "%s[%.6g, %.6g]%s", s.empty() ? "" : " + ", r.lo, r.hi,
                  r.spacing == Spacing::kBits ? "b" : "v");
    s += buf;
  }
  return s;
}

struct Row {
  std::string name, domain;
  int64_t samples = 0;
  double max_ulp = 0;
  float worst_x = 0, worst_y = 0;  // worst_y: Pow's exponent
  bool binary = false;
};

void PrintRow(const Row& r) {
  std::printf("| %-6s | %-66s | %8lld | %7.4f | %a", r.name.c_str(), r.domain.c_str(),
              static_cast<long long>(r.samples), r.max_ulp, r.worst_x);
  if (r.binary) std::printf(", %a", r.worst_y);
  std::printf(" |\n");
}

using RefFn = void (*)(mpfr_ptr out, mpfr_ptr x);

Row MeasureUnary(const char* name, float (*f)(float), RefFn ref,
                 const std::vector<Range>& ranges) {
  Row row{name, Describe(ranges)};
  Big x, want;
  for (float v : Sample(ranges)) {
    mpfr_set_flt(x.get(), v, MPFR_RNDN);
    ref(want.get(), x.get());
    const double err = UlpError(f(v), want.get());
    ++row.samples;
    if (!(err <= row.max_ulp)) {
      row.max_ulp = err;
      row.worst_x = v;
    }
  }
  return row;
}

// erfinv(x) to kRefBits bits by Newton's method on erf(y) = x, started from Erfinv(x) (within a
// few ulp, so two steps reach ~1e-28 and a third only confirms convergence).
void RefErfinv(mpfr_ptr out, mpfr_ptr x) {
  const float xf = mpfr_get_flt(x, MPFR_RNDN);
  Big y(Erfinv(xf)), residual, slope;
  for (int iteration = 0;; ++iteration) {
    ASSERT_LT(iteration, 6) << "MPFR Newton iteration for erfinv(" << xf << ") diverged";
    mpfr_erf(residual.get(), y.get(), MPFR_RNDN);
    mpfr_sub(residual.get(), residual.get(), x, MPFR_RNDN);
    // erf'(y) = 2/sqrt(pi) exp(-y^2).
    mpfr_sqr(slope.get(), y.get(), MPFR_RNDN);
    mpfr_neg(slope.get(), slope.get(), MPFR_RNDN);
    mpfr_exp(slope.get(), slope.get(), MPFR_RNDN);
    mpfr_const_pi(out, MPFR_RNDN);
    mpfr_rec_sqrt(out, out, MPFR_RNDN);
    mpfr_mul_2ui(out, out, 1, MPFR_RNDN);
    mpfr_mul(slope.get(), slope.get(), out, MPFR_RNDN);
    mpfr_div(residual.get(), residual.get(), slope.get(), MPFR_RNDN);
    mpfr_sub(y.get(), y.get(), residual.get(), MPFR_RNDN);
    // Quadratic convergence: after a step of relative size 2^-60 the error is ~2^-120.
    if (mpfr_zero_p(residual.get()) ||
        mpfr_get_exp(residual.get()) < mpfr_get_exp(y.get()) - 60) {
      break;
    }
  }
  mpfr_set(out, y.get(), MPFR_RNDN);
}

constexpr int64_t kN = 40000;  // samples per range; the whole table takes a few seconds

// Pow over four families of (x, y): the whole fp32 range (x in every binade, y chosen so that
// x^y lands anywhere from 2^-149 to 2^127), AdamW's bias correction beta^step, RoPE's
// theta^(-2i/d), and negative bases with integer exponents. Pairs whose exact result is
// outside [2^-149, FLT_MAX] (flushed to 0 or overflowing) are skipped.
Row MeasurePow() {
  std::vector<std::pair<float, float>> xy;
  Big big_x, log2_x;
  const std::vector<float> bases = Sample({{kDenormMin, kMaxFloat, kN, Spacing::kBits}});
  for (size_t i = 0; i < bases.size(); ++i) {
    if (bases[i] == 1.0f) continue;
    mpfr_set_flt(big_x.get(), bases[i], MPFR_RNDN);
    mpfr_log2(log2_x.get(), big_x.get(), MPFR_RNDN);
    // A low-discrepancy walk over the target binary exponent.
    const double target = -149.0 + 276.0 * std::fmod(0.6180339887498949 * i, 1.0);
    xy.emplace_back(bases[i], static_cast<float>(target / mpfr_get_d(log2_x.get(), MPFR_RNDN)));
  }
  const std::vector<float> betas = Sample({{0.8f, 0.99999f, kN, Spacing::kValue}});
  for (size_t i = 0; i < betas.size(); ++i) {
    xy.emplace_back(betas[i], static_cast<float>(1 + (i * 7919) % 1000000));
  }
  const std::vector<float> thetas = Sample({{1e3f, 1e6f, kN, Spacing::kValue}});
  const std::vector<float> ropes = Sample({{-1.0f, 0.0f, kN, Spacing::kValue}});
  for (size_t i = 0; i < thetas.size(); ++i) xy.emplace_back(thetas[i], ropes[(i * 7919) % kN]);
  const std::vector<float> negatives = Sample({{-4.0f, -0.25f, kN, Spacing::kValue}});
  for (size_t i = 0; i < negatives.size(); ++i) {
    xy.emplace_back(negatives[i], static_cast<float>(static_cast<int64_t>(i % 81) - 40));
  }

  Row row{"Pow",
          "x^y: x all >0 [b], beta^step, theta^[-1,0], (-4..-1/4)^int",
          0, 0, 0, 0, true};
  Big big_y, want, max_float(kMaxFloat);
  for (const auto& [x, y] : xy) {
    mpfr_set_flt(big_x.get(), x, MPFR_RNDN);
    mpfr_set_flt(big_y.get(), y, MPFR_RNDN);
    mpfr_pow(want.get(), big_x.get(), big_y.get(), MPFR_RNDN);
    if (!mpfr_number_p(want.get()) || mpfr_cmpabs_ui(want.get(), 0) == 0) continue;
    if (mpfr_cmpabs(want.get(), max_float.get()) > 0 ||
        mpfr_get_exp(want.get()) < -148) {  // |want| < 2^-149
      continue;
    }
    const double err = UlpError(Pow(x, y), want.get());
    ++row.samples;
    if (!(err <= row.max_ulp)) {
      row.max_ulp = err;
      row.worst_x = x;
      row.worst_y = y;
    }
  }
  return row;
}

// Documented bounds (docs/numerics.md (dmath)). SLEEF's u10 functions are specified to 1.0 ulp.
constexpr double kSleefU10Bound = 1.0;
constexpr double kSqrtBound = 0.5;     // correctly rounded
// Two correctly rounded operations: the sqrt's rounding (relative error up to 2^-24) is a full
// ulp of a result just below a power of two (x just above a power of 4), plus the division's
// half ulp.
constexpr double kRsqrtBound = 1.5;
constexpr double kErfTinyBound = 2.0;  // |x| < 2^-124, see the Erf rows
constexpr double kErfinvBound = 0.51;  // Newton step in fp64, then one rounding to fp32

TEST(DmathAccuracy, UlpTableAgainstMpfr) {
  using enum Spacing;
  std::vector<std::pair<Row, double>> rows;

  rows.emplace_back(
      MeasureUnary(
          "Exp", Exp, [](mpfr_ptr o, mpfr_ptr x) { mpfr_exp(o, x, MPFR_RNDN); },
          {{-103.9f, 88.72f, kN, kBits}, {-103.9f, 88.72f, kN, kValue},
           {-1.0f, 1.0f, kN, kValue}}),
      kSleefU10Bound);
  rows.emplace_back(
      MeasureUnary(
          "Log", Log, [](mpfr_ptr o, mpfr_ptr x) { mpfr_log(o, x, MPFR_RNDN); },
          {{kDenormMin, kMaxFloat, kN, kBits}, {0.25f, 4.0f, kN, kValue}}),
      kSleefU10Bound);
  rows.emplace_back(
      MeasureUnary(
          "Sqrt", Sqrt, [](mpfr_ptr o, mpfr_ptr x) { mpfr_sqrt(o, x, MPFR_RNDN); },
          {{kDenormMin, kMaxFloat, kN, kBits}, {0.0f, 4.0f, kN, kValue}}),
      kSqrtBound);
  rows.emplace_back(
      MeasureUnary(
          "Rsqrt", Rsqrt, [](mpfr_ptr o, mpfr_ptr x) { mpfr_rec_sqrt(o, x, MPFR_RNDN); },
          {{kDenormMin, kMaxFloat, kN, kBits}, {0.25f, 4.0f, kN, kValue}}),
      kRsqrtBound);
  // Sin/Cos: every binade, then the RoPE working range (angles t * theta^(-2i/d), t < 2^17).
  const std::vector<Range> trig = {{-kMaxFloat, kMaxFloat, kN, kBits},
                                   {-131072.0f, 131072.0f, kN, kValue},
                                   {-6.3f, 6.3f, kN, kValue}};
  rows.emplace_back(
      MeasureUnary(
          "Sin", Sin, [](mpfr_ptr o, mpfr_ptr x) { mpfr_sin(o, x, MPFR_RNDN); }, trig),
      kSleefU10Bound);
  rows.emplace_back(
      MeasureUnary(
          "Cos", Cos, [](mpfr_ptr o, mpfr_ptr x) { mpfr_cos(o, x, MPFR_RNDN); }, trig),
      kSleefU10Bound);
  // SLEEF's erff keeps its 1 ulp bound down to |x| = 2^-124; below, where erf(x) is subnormal
  // or nearly so, the error grows to about 1.9 subnormal ulps (2^-149 each): a separate row.
  const float tiny = std::ldexp(1.0f, -124);
  rows.emplace_back(
      MeasureUnary(
          "Erf", Erf, [](mpfr_ptr o, mpfr_ptr x) { mpfr_erf(o, x, MPFR_RNDN); },
          {{-5.0f, -tiny, kN, kBits}, {tiny, 5.0f, kN, kBits}, {-5.0f, 5.0f, kN, kValue}}),
      kSleefU10Bound);
  rows.emplace_back(
      MeasureUnary(
          "Erf", Erf, [](mpfr_ptr o, mpfr_ptr x) { mpfr_erf(o, x, MPFR_RNDN); },
          {{-tiny, tiny, kN / 4, kBits}}),
      kErfTinyBound);
  // Erfinv: every binade, the working range, and the last 2^14 floats below 1 (the tail
  // branch, where erfinv is steepest).
  const float below_one = std::nextafter(1.0f, 0.0f);
  rows.emplace_back(
      MeasureUnary("Erfinv", Erfinv, RefErfinv,
                   {{-below_one, below_one, kN, kBits},
                    {-below_one, below_one, kN, kValue},
                    {FromKey(Key(below_one) - 16383), below_one, 16384, kBits}}),
      kErfinvBound);

  rows.emplace_back(MeasurePow(), kSleefU10Bound);

  std::printf("| %-6s | %-66s | %8s | %7s | %s |\n", "fn",
              "domain (b: bit-spaced, v: value-spaced)", "samples", "max ulp", "worst input");
  for (const auto& [row, bound] : rows) {
    PrintRow(row);
    EXPECT_LE(row.max_ulp, bound) << row.name << " at x = " << row.worst_x
                                  << (row.binary ? ", y = " + std::to_string(row.worst_y) : "");
  }
}

// ---- special values ------------------------------------------------------------------------

// got and want are the same float: equal bits (so +0 != -0), or both NaN.
// Bit for bit; a NaN `want` stands for the canonical NaN (docs/numerics.md, "NaN"): any other
// NaN bits fail.
::testing::AssertionResult Same(float got, float want) {
  const float canonical = std::isnan(want) ? std::bit_cast<float>(kCanonicalNaNBits) : want;
  if (std::bit_cast<uint32_t>(got) == std::bit_cast<uint32_t>(canonical)) {
    return ::testing::AssertionSuccess();
  }
  char buf[96];
  std::snprintf(buf, sizeof buf, "got %a, want %a", got, want);
  return ::testing::AssertionFailure() << buf;
}

// Within `bound` ulps of the MPFR value of ref(x).
::testing::AssertionResult Near(float got, float x, RefFn ref, double bound) {
  Big big_x(x), want;
  ref(want.get(), big_x.get());
  const double err = UlpError(got, want.get());
  if (err <= bound) return ::testing::AssertionSuccess();
  char buf[128];
  std::snprintf(buf, sizeof buf, "at x = %a: got %a, %.3f ulp from the exact value", x, got,
                err);
  return ::testing::AssertionFailure() << buf;
}

constexpr float kFloatMin = std::numeric_limits<float>::min();  // smallest normal

TEST(DmathSpecialValues, Exp) {
  EXPECT_TRUE(Same(Exp(0.0f), 1.0f));
  EXPECT_TRUE(Same(Exp(-0.0f), 1.0f));
  EXPECT_TRUE(Same(Exp(kInf), kInf));
  EXPECT_TRUE(Same(Exp(-kInf), 0.0f));
  EXPECT_TRUE(Same(Exp(kNaN), kNaN));
  EXPECT_TRUE(Same(Exp(89.0f), kInf));
  EXPECT_TRUE(Same(Exp(-104.0f), 0.0f));  // e^-104 < 2^-150: rounds to zero
  // A subnormal result is delivered, not flushed to zero.
  const float e100 = Exp(-100.0f);
  EXPECT_GT(e100, 0.0f);
  EXPECT_LT(e100, kFloatMin);
  EXPECT_TRUE(Near(e100, -100.0f, [](mpfr_ptr o, mpfr_ptr x) { mpfr_exp(o, x, MPFR_RNDN); }, 1));
  EXPECT_TRUE(Same(Exp(kDenormMin), 1.0f));
}

TEST(DmathSpecialValues, Log) {
  EXPECT_TRUE(Same(Log(1.0f), 0.0f));
  EXPECT_TRUE(Same(Log(0.0f), -kInf));
  EXPECT_TRUE(Same(Log(-0.0f), -kInf));
  EXPECT_TRUE(Same(Log(kInf), kInf));
  EXPECT_TRUE(Same(Log(-1.0f), kNaN));
  EXPECT_TRUE(Same(Log(-kInf), kNaN));
  EXPECT_TRUE(Same(Log(kNaN), kNaN));
  // Subnormal inputs are finite numbers with finite logarithms (no DAZ).
  for (float x : {kDenormMin, 3 * kDenormMin, kFloatMin / 3}) {
    EXPECT_TRUE(std::isfinite(Log(x)));
    EXPECT_TRUE(Near(Log(x), x, [](mpfr_ptr o, mpfr_ptr v) { mpfr_log(o, v, MPFR_RNDN); }, 1));
  }
}

TEST(DmathSpecialValues, SqrtAndRsqrt) {
  EXPECT_TRUE(Same(Sqrt(0.0f), 0.0f));
  EXPECT_TRUE(Same(Sqrt(-0.0f), -0.0f));
  EXPECT_TRUE(Same(Sqrt(kInf), kInf));
  EXPECT_TRUE(Same(Sqrt(-1.0f), kNaN));
  EXPECT_TRUE(Same(Sqrt(kNaN), kNaN));
  EXPECT_TRUE(Same(Sqrt(kDenormMin), std::ldexp(1.0f, -75) * 1.41421354f));  // 2^-74.5
  EXPECT_TRUE(Same(Sqrt(2 * kDenormMin), std::ldexp(1.0f, -74)));
  EXPECT_TRUE(Same(Rsqrt(0.0f), kInf));
  EXPECT_TRUE(Same(Rsqrt(-0.0f), -kInf));
  EXPECT_TRUE(Same(Rsqrt(kInf), 0.0f));
  EXPECT_TRUE(Same(Rsqrt(-1.0f), kNaN));
  EXPECT_TRUE(Same(Rsqrt(kNaN), kNaN));
  EXPECT_TRUE(Same(Rsqrt(2 * kDenormMin), std::ldexp(1.0f, 74)));
}

TEST(DmathSpecialValues, SinAndCos) {
  for (float z : {0.0f, -0.0f}) {
    EXPECT_TRUE(Same(Sin(z), z));
    EXPECT_TRUE(Same(Cos(z), 1.0f));
  }
  for (float x : {kInf, -kInf, kNaN}) {
    EXPECT_TRUE(Same(Sin(x), kNaN));
    EXPECT_TRUE(Same(Cos(x), kNaN));
  }
  // sin(x) = x and cos(x) = 1 once x^2 is below half an ulp: subnormals pass through.
  for (float x : {kDenormMin, -kDenormMin, kFloatMin / 3, -kFloatMin}) {
    EXPECT_TRUE(Same(Sin(x), x));
    EXPECT_TRUE(Same(Cos(x), 1.0f));
  }
}

TEST(DmathSpecialValues, Pow) {
  for (float x : {0.0f, -0.0f, 2.0f, -2.0f, kInf, kNaN}) EXPECT_TRUE(Same(Pow(x, 0.0f), 1.0f));
  for (float y : {0.5f, -3.0f, kInf, kNaN}) EXPECT_TRUE(Same(Pow(1.0f, y), 1.0f));
  EXPECT_TRUE(Same(Pow(0.0f, 3.0f), 0.0f));
  EXPECT_TRUE(Same(Pow(-0.0f, 3.0f), -0.0f));
  EXPECT_TRUE(Same(Pow(0.0f, -1.0f), kInf));
  EXPECT_TRUE(Same(Pow(-0.0f, -1.0f), -kInf));
  EXPECT_TRUE(Same(Pow(-2.0f, 3.0f), -8.0f));
  EXPECT_TRUE(Same(Pow(-2.0f, 0.5f), kNaN));
  EXPECT_TRUE(Same(Pow(2.0f, kNaN), kNaN));
  EXPECT_TRUE(Same(Pow(kNaN, 2.0f), kNaN));
  EXPECT_TRUE(Same(Pow(0.5f, kInf), 0.0f));
  EXPECT_TRUE(Same(Pow(2.0f, kInf), kInf));
  EXPECT_TRUE(Same(Pow(2.0f, 128.0f), kInf));
  // Exact powers of two down to the smallest subnormal, and AdamW's beta^step underflowing.
  EXPECT_TRUE(Same(Pow(2.0f, -149.0f), kDenormMin));
  EXPECT_TRUE(Same(Pow(2.0f, -140.0f), std::ldexp(1.0f, -140)));
  EXPECT_TRUE(Same(Pow(0.9f, 1e6f), 0.0f));
}

TEST(DmathSpecialValues, Erf) {
  EXPECT_TRUE(Same(Erf(0.0f), 0.0f));
  EXPECT_TRUE(Same(Erf(-0.0f), -0.0f));
  EXPECT_TRUE(Same(Erf(kInf), 1.0f));
  EXPECT_TRUE(Same(Erf(-kInf), -1.0f));
  EXPECT_TRUE(Same(Erf(kNaN), kNaN));
  EXPECT_TRUE(Same(Erf(5.0f), 1.0f));
  // erf(x) ~ 2x/sqrt(pi): a subnormal input gives a nonzero subnormal result.
  const float e = Erf(8 * kDenormMin);
  EXPECT_GT(e, 8 * kDenormMin);
  EXPECT_LT(e, kFloatMin);
}

TEST(DmathSpecialValues, Erfinv) {
  EXPECT_TRUE(Same(Erfinv(0.0f), 0.0f));
  EXPECT_TRUE(Same(Erfinv(-0.0f), -0.0f));
  EXPECT_TRUE(Same(Erfinv(1.0f), kInf));
  EXPECT_TRUE(Same(Erfinv(-1.0f), -kInf));
  for (float x : {std::nextafter(1.0f, 2.0f), -1.5f, 2.0f, kInf, -kInf, kNaN}) {
    EXPECT_TRUE(Same(Erfinv(x), kNaN)) << "x = " << x;
  }
  // erfinv(x) ~ x sqrt(pi)/2 near 0: subnormal in, correctly scaled subnormal out.
  EXPECT_TRUE(Same(Erfinv(kDenormMin), kDenormMin));  // 0.886 * 2^-149 rounds up
  EXPECT_TRUE(Near(Erfinv(1000 * kDenormMin), 1000 * kDenormMin, RefErfinv, kErfinvBound));
  // The extremes of the domain: |x| = 1 - 2^-24, where erfinv is steepest.
  const float below_one = std::nextafter(1.0f, 0.0f);
  EXPECT_TRUE(Near(Erfinv(below_one), below_one, RefErfinv, kErfinvBound));
  EXPECT_TRUE(Same(Erfinv(-below_one), -Erfinv(below_one)));
}

// NaN inputs of either sign and any payload give the canonical NaN, as do invalid operations
// whose hardware NaN is negative on x86 (sqrt(-1), log(-inf): lesson from the first AVX-512 run).
TEST(DmathSpecialValues, EveryNaNIsCanonical) {
  const float nans[] = {kNaN, -kNaN, std::bit_cast<float>(0x7fa00001u),
                        std::bit_cast<float>(0xffc12345u)};
  for (float x : nans) {
    for (float r : {Exp(x), Log(x), Sqrt(x), Rsqrt(x), Sin(x), Cos(x), Erf(x), Erfinv(x),
                    Pow(x, 2.0f), Pow(2.0f, x)}) {
      EXPECT_EQ(std::bit_cast<uint32_t>(r), kCanonicalNaNBits)
          << std::hexfloat << "input bits " << std::hex << std::bit_cast<uint32_t>(x);
    }
  }
  for (float r : {Sqrt(-1.0f), Rsqrt(-1.0f), Log(-kInf), Log(-1.0f), Sin(kInf), Cos(-kInf),
                  Pow(-2.0f, 0.5f), Erfinv(2.0f)}) {
    EXPECT_EQ(std::bit_cast<uint32_t>(r), kCanonicalNaNBits);
  }
}

TEST(DmathSpecialValues, ErfinvIsOdd) {
  // Each step is sign-symmetric (fma, Log of an even argument, SLEEF's odd erf), so
  // Erfinv(-x) = -Erfinv(x) bit for bit.
  for (float x : Sample({{kDenormMin, std::nextafter(1.0f, 0.0f), 200000, Spacing::kBits}})) {
    ASSERT_TRUE(Same(Erfinv(-x), -Erfinv(x))) << "x = " << x;
  }
}

}  // namespace
}  // namespace lockstep::dmath

namespace lockstep {
namespace {

// rk::ErfinvInPlace (the init's vector erfinv) gives dmath::Erfinv's bits on every usable ISA,
// for the init's arguments (t * erf(sqrt 2), t uniform in (-1, 1)), arguments near +-1 and 0,
// random bit patterns (every binade, subnormals, infinities, NaNs) and the special values, at
// every offset of a vector (lengths that are not multiples of the width take the tail path).
TEST(DmathVectorErfinv, BitIdenticalToScalarOnEveryIsa) {
  std::vector<float> x;
  const float bound = dmath::Erf(0x1.6a09e6p+0f);
  for (int32_t k = 0; k < (1 << 24); k += 97) {
    x.push_back(static_cast<float>(2 * k + 1 - (1 << 24)) * 0x1.0p-24f * bound);
  }
  for (float v = 1.0f; v > 0.999f; v = std::nextafter(v, 0.0f)) {
    x.push_back(v);
    x.push_back(-v);
  }
  for (float v = std::numeric_limits<float>::denorm_min(); v < 1e-3f; v *= 1.7f) x.push_back(v);
  uint32_t state = 12345;
  for (int i = 0; i < 100000; ++i) {
    state = state * 1664525u + 1013904223u;
    x.push_back(std::bit_cast<float>(state));
  }
  for (float v : {0.0f, -0.0f, 1.0f, -1.0f, std::numeric_limits<float>::infinity(),
                  -std::numeric_limits<float>::infinity(), std::numeric_limits<float>::quiet_NaN(),
                  -std::numeric_limits<float>::quiet_NaN(), std::nextafter(1.0f, 2.0f)}) {
    x.push_back(v);
  }
  std::vector<uint32_t> want;
  for (float v : x) want.push_back(std::bit_cast<uint32_t>(dmath::Erfinv(v)));
  const rk::Isa saved = rk::ActiveIsa();
  for (const rk::Isa& isa : rk::UsableIsas()) {
    rk::SetIsa(isa);
    for (size_t offset : {size_t{0}, size_t{3}}) {
      std::vector<float> got(x.begin() + offset, x.end());
      rk::ErfinvInPlace(got);
      for (size_t i = 0; i < got.size(); ++i) {
        if (std::bit_cast<uint32_t>(got[i]) != want[i + offset]) {
          ADD_FAILURE() << isa.name << ": Erfinv(" << std::hexfloat << x[i + offset]
                        << ") = " << got[i] << ", the scalar function gives "
                        << std::bit_cast<float>(want[i + offset]);
          break;
        }
      }
    }
  }
  rk::SetIsa(saved);
}

// The init's first approximation (the init's table corrects it): on every one of the init's
// 2^24 arguments within 2 ulp of Erfinv's correctly rounded result (so its corrections lie in
// -2 .. 2, well inside the table's four bits), odd bit for bit, and on every usable ISA the bits
// of the scalar function, at every offset of a vector.
TEST(InitErfinvFirstApproximation, WithinTwoUlpOddAndTheSameOnEveryIsa) {
  std::vector<float> x(1 << 24);
  for (uint32_t k = 0; k < (1u << 24); ++k) x[k] = rk::InitErfinvArgument(k << 8);
  std::vector<float> y0 = x, y = x;
  rk::InitErfinvFirstApproximationInPlace(y0);
  rk::ErfinvInPlace(y);
  int64_t low = 0, high = 0;
  for (uint32_t k = 0; k < (1u << 24); ++k) {
    ASSERT_EQ(rk::InitErfinvFirstApproximation(x[k]), y0[k]) << std::hexfloat << x[k];
    ASSERT_EQ(y0[k], -y0[(1u << 24) - 1 - k]) << k;
    const int64_t d = int64_t{std::bit_cast<uint32_t>(y[k])} - std::bit_cast<uint32_t>(y0[k]);
    low = std::min(low, d);
    high = std::max(high, d);
  }
  EXPECT_GE(low, -2);
  EXPECT_LE(high, 2);
  std::vector<float> sample, want;  // every 97th argument, both signs and every segment
  for (uint32_t k = 0; k < (1u << 24); k += 97) {
    sample.push_back(x[k]);
    want.push_back(rk::InitErfinvFirstApproximation(x[k]));
  }
  const rk::Isa saved = rk::ActiveIsa();
  for (const rk::Isa& isa : rk::UsableIsas()) {
    rk::SetIsa(isa);
    for (size_t offset : {size_t{0}, size_t{3}}) {
      std::vector<float> got(sample.begin() + offset, sample.end());
      rk::InitErfinvFirstApproximationInPlace(got);
      EXPECT_EQ(std::memcmp(got.data(), want.data() + offset, got.size() * sizeof(float)), 0)
          << isa.name << ", offset " << offset;
    }
  }
  rk::SetIsa(saved);
}

}  // namespace
}  // namespace lockstep

namespace lockstep {
namespace {

// rk::PhiloxWords (the init's word stream) gives, on every usable ISA, the words of
// Philox4x32 one counter at a time -- from any first word (not a multiple of 4 included), for
// lengths around the vector widths, and for counters whose high 32 bits are set or about to be.
TEST(PhiloxWords, EqualsPhilox4x32OnEveryIsa) {
  const PhiloxKey key = PhiloxKeyFromSeed(0x0123456789abcdefULL);
  const rk::Isa saved = rk::ActiveIsa();
  for (const uint64_t first : {uint64_t{0}, uint64_t{1}, uint64_t{7}, uint64_t{4} * uint64_t{0xFFFFFFFD} + 2,
                               uint64_t{4} << 40}) {
    std::vector<uint32_t> want(300);
    for (size_t i = 0; i < want.size(); ++i) {
      const uint64_t g = first + i, c = g / 4;
      want[i] = Philox4x32({static_cast<uint32_t>(c), static_cast<uint32_t>(c >> 32), 0, 0}, key)[g % 4];
    }
    for (const rk::Isa& isa : rk::UsableIsas()) {
      rk::SetIsa(isa);
      for (const size_t n : {size_t{0}, size_t{1}, size_t{5}, size_t{32}, size_t{33}, size_t{64},
                             size_t{67}, size_t{300}}) {
        std::vector<uint32_t> got(n);
        rk::PhiloxWords(key, first, got);
        EXPECT_TRUE(std::equal(got.begin(), got.end(), want.begin()))
            << isa.name << ": first word " << first << ", " << n << " words";
      }
    }
  }
  rk::SetIsa(saved);
}

}  // namespace
}  // namespace lockstep
