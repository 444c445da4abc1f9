// GEMM: bitwise invariance across variants/threads, the chunk contract, fp64 accuracy, special
// values and argument errors.
#include <algorithm>
#include <bit>
#include <cstring>
#include <limits>

#include "kernels/harness.h"
#include "lockstep/core.h"

namespace lockstep::test {
namespace {

enum class Form { kXWt, kDyW, kDytX };
const char* Name(Form f) { return f == Form::kXWt ? "XWt" : f == Form::kDyW ? "DyW" : "DytX"; }

// Operand sizes: A-like then B-like input, then the output, for output dims and reduction.
struct Problem {
  Form form;
  int64_t m, n, k;  // the public API's m, n, k
  std::vector<float> in1, in2, out;
};

Problem Make(Form form, int64_t m, int64_t n, int64_t k, uint64_t seed) {
  Problem p{form, m, n, k, {}, {}, {}};
  switch (form) {
    case Form::kXWt: p.in1 = RandomFloats(m * k, seed); p.in2 = RandomFloats(n * k, seed + 1);
      p.out.assign(m * n, 0.0f); break;
    case Form::kDyW: p.in1 = RandomFloats(m * n, seed); p.in2 = RandomFloats(n * k, seed + 1);
      p.out.assign(m * k, 0.0f); break;
    case Form::kDytX: p.in1 = RandomFloats(m * n, seed); p.in2 = RandomFloats(m * k, seed + 1);
      p.out.assign(n * k, 0.0f); break;
  }
  return p;
}

void RunGemm(Problem& p, bool accumulate = false) {
  switch (p.form) {
    case Form::kXWt: rk::GemmXWt(p.in1, p.in2, p.out, p.m, p.n, p.k, accumulate); break;
    case Form::kDyW: rk::GemmDyW(p.in1, p.in2, p.out, p.m, p.n, p.k, accumulate); break;
    case Form::kDytX: rk::GemmDytX(p.in1, p.in2, p.out, p.m, p.n, p.k, accumulate); break;
  }
}

// Output element (i, j) of the form and its reduction terms, in fp64.
std::vector<double> Fp64(const Problem& p) {
  std::vector<double> out;
  const auto& a = p.in1;
  const auto& b = p.in2;
  auto rows = p.form == Form::kDytX ? p.n : p.m;
  auto cols = p.form == Form::kXWt ? p.n : p.k;
  auto red = p.form == Form::kXWt ? p.k : p.form == Form::kDyW ? p.n : p.m;
  for (int64_t i = 0; i < rows; ++i) {
    for (int64_t j = 0; j < cols; ++j) {
      double s = 0;
      for (int64_t r = 0; r < red; ++r) {
        double x = 0, y = 0;
        if (p.form == Form::kXWt) { x = a[i * p.k + r]; y = b[j * p.k + r]; }
        if (p.form == Form::kDyW) { x = a[i * p.n + r]; y = b[r * p.k + j]; }
        if (p.form == Form::kDytX) { x = a[r * p.n + i]; y = b[r * p.k + j]; }
        s += x * y;
      }
      out.push_back(s);
    }
  }
  return out;
}

TEST(Gemm, BitwiseInvariantOnAwkwardShapes) {
  for (Form form : {Form::kXWt, Form::kDyW, Form::kDytX}) {
    for (int64_t m : {1, 17, 257}) {
      for (int64_t n : {3, 17, 255}) {
        for (int64_t k : {1, 255, 257, 600}) {
          if (m * n * k > 4'000'000) continue;
          ExpectBitwiseInvariant(fmt::format("Gemm{} m={} n={} k={}", Name(form), m, n, k), [&] {
            Problem p = Make(form, m, n, k, 7);
            RunGemm(p);
            std::vector<float> out = p.out;
            RunGemm(p, /*accumulate=*/true);  // accumulating continues the chunk chain
            out.insert(out.end(), p.out.begin(), p.out.end());
            return out;
          });
        }
      }
    }
  }
}

// Inputs of the decode tests: uniform values with the selftest's special values (±0, ±inf, NaNs
// of both signs, subnormals, the ends of the normal range) spread sparsely, a different subset
// at a different place in each array.
std::vector<float> WithSpecials(int64_t n, uint64_t seed) {
  std::vector<float> v = RandomFloats(n, seed);
  const auto specials = rk::kSelftestSpecials;
  const int64_t count = static_cast<int64_t>(specials.size());
  const int64_t stride = std::max<int64_t>(7, n / count);
  for (int64_t q = 0, at = static_cast<int64_t>(seed % 7); at < n; ++q, at += stride) {
    v[static_cast<size_t>(at)] = specials[static_cast<size_t>((q + seed) % count)];
  }
  return v;
}

TEST(Gemm, DecodeRowsBitwiseInvariantWithSpecialValues) {
  // GemmXWt with m = 1..8 rows, the decode shapes, all at most the SIMD variant's GEMV
  // threshold (rk::kGemvMaxRows = 8), so every case below runs that
  // path: n not a multiple of 4, 8 or 16 lanes, k below, above and not a multiple of the chunk
  // of 256 or of the lanes. Non-accumulating, then accumulating onto outputs that hold special
  // values too (-0 among them). NaN signs and payloads are not part of the contract
  // (docs/numerics.md, "NaN"), so NaNs compare as the canonical NaN.
  for (int64_t m = 1; m <= 8; ++m) {
    for (int64_t n : {1, 3, 17, 40, 255}) {
      for (int64_t k : {1, 5, 17, 255, 256, 600}) {
        ExpectBitwiseInvariant(fmt::format("GemmXWt decode m={} n={} k={}", m, n, k), [&] {
          const uint64_t seed = static_cast<uint64_t>(m * 1000 + n * 10 + k);
          const std::vector<float> x = WithSpecials(m * k, seed), w = WithSpecials(n * k, seed + 1);
          std::vector<float> y(static_cast<size_t>(m * n), 5.0f),
              acc = WithSpecials(m * n, seed + 2);
          rk::GemmXWt(x, w, y, m, n, k);
          rk::GemmXWt(x, w, acc, m, n, k, /*accumulate=*/true);
          y.insert(y.end(), acc.begin(), acc.end());
          rk::CanonicalizeNaNs(y);
          return y;
        });
      }
    }
  }
}

// The decoder's linears: W packed (rk::PackForGemv) under each variant gives GemmXWt's bits
// there, at every thread count, on the decode shapes above; and W packed under one variant gives
// them under every other (a variant of other vectors, or the reference, runs GemmXWt on W
// itself). The same for W rounded to bfloat16 and packed as bf16, in half the bytes.
TEST(Gemm, PackedDecodeIsGemmXWt) {
  for (int64_t m = 1; m <= rk::kGemvMaxRows; ++m) {
    for (int64_t n : {1, 3, 17, 40, 255}) {
      for (int64_t k : {1, 17, 256, 600}) {
        const uint64_t seed = static_cast<uint64_t>(m * 1000 + n * 10 + k);
        const std::vector<float> x = WithSpecials(m * k, seed);
        std::vector<float> w = WithSpecials(n * k, seed + 1);
        const uint64_t f32_bytes = rk::PackForGemv(w, n, k).packed.size();
        for (const Dtype dtype : {Dtype::kF32, Dtype::kBF16}) {
          if (dtype == Dtype::kBF16) {
            for (float& v : w) v = WidenBf16(NarrowToBf16(v));
          }
          const std::string what =
              fmt::format("GemmXWtPacked {} m={} n={} k={}", DtypeName(dtype), m, n, k);
          std::vector<float> want(static_cast<size_t>(m * n));
          rk::GemmXWt(x, w, want, m, n, k);
          rk::CanonicalizeNaNs(want);
          const rk::GemvPacking packed = rk::PackForGemv(w, n, k, dtype);
          EXPECT_GT(packed.lanes, 0) << "the default variant packs";
          EXPECT_EQ(packed.packed.size(), dtype == Dtype::kBF16 ? f32_bytes / 2 : f32_bytes);
          ExpectBitwiseInvariant(what, [&] {
            std::vector<float> y(static_cast<size_t>(m * n), 5.0f);
            rk::GemmXWtPacked(x, rk::PackForGemv(w, n, k, dtype), y, m);
            rk::CanonicalizeNaNs(y);
            EXPECT_EQ(std::memcmp(y.data(), want.data(), y.size() * sizeof(float)), 0)
                << "packed here, " << what;
            rk::GemmXWtPacked(x, packed, y, m);
            rk::CanonicalizeNaNs(y);
            EXPECT_EQ(std::memcmp(y.data(), want.data(), y.size() * sizeof(float)), 0) << what;
            return y;
          });
        }
      }
    }
  }
  const std::vector<float> w(12, 1.0f), x(9 * 3, 1.0f);
  std::vector<float> y(9 * 4);
  const rk::GemvPacking packed = rk::PackForGemv(w, 4, 3);
  ExpectError([&] { rk::GemmXWtPacked(x, packed, y, 9); }, {"GemmXWtPacked", "m = 9"});
  std::vector<float> not_bf16 = w;
  not_bf16[7] = 1.0f + 0x1.0p-20f;
  ExpectError([&] { rk::PackForGemv(not_bf16, 4, 3, Dtype::kBF16); },
              {"PackForGemv", "w[7]", "not a bfloat16"});
  ExpectError([&] { rk::PackForGemv(w, 4, 3, Dtype::kI8); }, {"PackForGemv", "dtype i8"});
}

TEST(Gemm, DecodeSignedZerosAndChunkOrder) {
  // Every product -0: each chunk sum is fma(-0, w, +0) = +0, so y = +0, and accumulating onto -0
  // gives -0 + +0 = +0. Also the chunk order at m = 3, for each row and each of 37 columns (more
  // than two vectors' worth, at every lane position): ChunkContractIsObservable's value.
  const int64_t m = 3, n = 37, k = 512;
  std::vector<float> zeros(m * k, -0.0f), w(n * k, 1.0f), y(m * n, -0.0f);
  std::vector<float> x(m * k);
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t r = 0; r < k; ++r) x[i * k + r] = r < 256 ? 1.0f : 0x1.0p-16f;
  }
  for (const rk::Isa& isa : rk::UsableIsas()) {
    rk::SetIsa(isa);
    for (bool accumulate : {false, true}) {
      std::fill(y.begin(), y.end(), -0.0f);
      rk::GemmXWt(zeros, w, y, m, n, k, accumulate);
      for (float v : y) EXPECT_EQ(std::bit_cast<uint32_t>(v), 0u) << isa.name << accumulate;
    }
    rk::GemmXWt(x, w, y, m, n, k);
    for (float v : y) EXPECT_EQ(v, 256.0f + 0x1.0p-8f) << isa.name;
  }
  rk::SetIsa(rk::UsableIsas().back());
}

TEST(Gemm, LargeTilesAcrossThreadCounts) {
  // Several row blocks, column groups and K chunks: exercises the task split of the SIMD path
  // (rows split at most thread counts, columns at 2, where 2 x 200 rows <= 700 columns).
  ExpectBitwiseInvariant("GemmXWt 200x700x520", [] {
    Problem p = Make(Form::kXWt, 200, 700, 520, 11);
    RunGemm(p);
    return p.out;
  });
  // Few rows, many columns: the columns split at every thread count, a thread's share wider
  // than one packed B panel (8192 columns) at 2 threads, accumulating across K chunks.
  ExpectBitwiseInvariant("GemmXWt 7x17000x300", [] {
    Problem p = Make(Form::kXWt, 7, 17000, 300, 13);
    RunGemm(p);
    std::vector<float> out = p.out;
    RunGemm(p, /*accumulate=*/true);
    out.insert(out.end(), p.out.begin(), p.out.end());
    return out;
  });
}

TEST(Gemm, MatchesFp64WithinChunkedRoundingBound) {
  for (Form form : {Form::kXWt, Form::kDyW, Form::kDytX}) {
    Problem p = Make(form, 33, 45, 700, 3);
    RunGemm(p);
    // |error| <= ~(chunk length + chunks) * eps * sum|terms|; inputs in [-1,1) so
    // sum|terms| <= reduction length. 2^-24 * (256 + 3) * 700 ~ 1.1e-2; the observed errors are
    // random-walk sized, so a 1e-3 bound is still loose but catches any wrong term.
    ExpectClose(fmt::format("Gemm{}", Name(form)), p.out, Fp64(p), 1e-3, 0);
  }
}

TEST(Gemm, ChunkContractIsObservable) {
  // 256 terms of 1.0 then one of 2^-24 * ... : summing in chunks of 256 gives a different result
  // from a single running sum when the second chunk's small terms add up before meeting the big
  // partial sum. Check the exact contract value.
  const int64_t k = 512;
  std::vector<float> x(k), w(k, 1.0f), y(1);
  for (int64_t r = 0; r < 256; ++r) x[r] = 1.0f;                 // chunk 0 sums to 256
  for (int64_t r = 256; r < k; ++r) x[r] = 0x1.0p-16f;           // chunk 1 sums to 2^-8
  for (const rk::Isa& isa : rk::UsableIsas()) {
    rk::SetIsa(isa);
    rk::GemmXWt(x, w, y, 1, 1, k);
    // Chunked: 256 + 2^-8 exactly (representable). A sequential sum would stay at 256 because
    // each 2^-16 is below half an ulp of 256 (ulp(256) = 2^-15): 256 + 2^-16 rounds to 256.
    EXPECT_EQ(y[0], 256.0f + 0x1.0p-8f) << isa.name;
  }
  rk::SetIsa(rk::UsableIsas().back());
}

TEST(Gemm, SpecialValuesPropagate) {
  const float inf = std::numeric_limits<float>::infinity();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float tiny = std::numeric_limits<float>::denorm_min();
  for (const rk::Isa& isa : rk::UsableIsas()) {
    rk::SetIsa(isa);
    // x rows: [inf, 1], [nan, 1], [tiny, 0], [-0, -0]; w: [[1, 1], [1, 0]] (n = 2).
    std::vector<float> x = {inf, 1, nan, 1, tiny, 0, -0.0f, -0.0f}, w = {1, 1, 1, 0}, y(8);
    rk::GemmXWt(x, w, y, 4, 2, 2);
    EXPECT_EQ(y[0], inf) << isa.name;
    EXPECT_TRUE(std::isnan(y[2])) << isa.name;
    EXPECT_EQ(y[4], tiny) << isa.name << ": subnormal flushed";
    // fma(-0, 1, +0) = +0: the chunk starts from +0, so an all -0 product sum is +0.
    EXPECT_FALSE(std::signbit(y[6])) << isa.name;
  }
  rk::SetIsa(rk::UsableIsas().back());
}

TEST(Gemm, EmptyReductionGivesZero) {
  std::vector<float> x, w, y(6, 5.0f);
  rk::GemmXWt(x, w, y, 2, 3, 0);
  for (float v : y) EXPECT_EQ(v, 0.0f);
}

TEST(Gemm, BadArgumentsNameOpArgumentAndShape) {
  std::vector<float> x(6), w(6), y(4);
  try {
    rk::GemmXWt(x, w, std::span<float>(y).first(3), 2, 2, 3);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(), "GemmXWt: y has 3 elements, expected m*n = 4");
  }
  EXPECT_THROW(rk::GemmDyW(x, w, y, 2, 3, -1), Error);
  // Output overlapping an input.
  std::vector<float> buf(16);
  EXPECT_THROW(rk::GemmXWt(std::span<const float>(buf).first(4), std::span<const float>(buf).first(4),
                           std::span<float>(buf).subspan(2, 4), 2, 2, 2),
               Error);
}

}  // namespace
}  // namespace lockstep::test
