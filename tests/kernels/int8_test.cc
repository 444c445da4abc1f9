// The int8 ops (docs/numerics.md, "Int8"): the quantizer's stated cases, the GEMM's exact int32
// sums at the largest k, the Hadamard rotation against Sylvester's matrix, bitwise invariance
// over threads and variants, and argument errors.
#include <algorithm>
#include <bit>
#include <cctype>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "kernels/harness.h"
#include "lockstep/core.h"

namespace lockstep::test {
namespace {

const float kInf = std::numeric_limits<float>::infinity();
const float kNaN = std::numeric_limits<float>::quiet_NaN();

struct Quantized {
  std::vector<int8_t> q;
  std::vector<float> scale;
};
Quantized Quantize(const std::vector<float>& x, int64_t rows, int64_t cols) {
  Quantized out{std::vector<int8_t>(x.size()), std::vector<float>(static_cast<size_t>(rows))};
  rk::QuantizeRows(x, out.q, out.scale, rows, cols);
  return out;
}

// The int8 values and scales packed into floats, for the sweep's byte comparison.
std::vector<float> Words(const Quantized& z) {
  std::vector<float> words((z.q.size() + 3) / 4 + z.scale.size());
  std::memcpy(words.data(), z.q.data(), z.q.size());
  std::memcpy(words.data() + (z.q.size() + 3) / 4, z.scale.data(), z.scale.size() * 4);
  return words;
}

TEST(QuantizeRows, TheStatedCases) {
  const int64_t cols = 5;
  const std::vector<float> x = {
      1.0f,        -7.9375f, 0.5f,
      0.03125f,    0.09375f,  // s = 7.9375 / 127 = 1/16, exactly
      -0.0f,       0.0f,     0.0f,
      -0.0f,       0.0f,  // all zero: s = 0, q = 0
      1.0f,        kNaN,     3.0f,
      0.0f,        1.0f,  // a NaN: s = NaN, q = 0
      -kInf,       1.0f,     1.0f,
      1.0f,        1.0f,  // an infinity: the same
      0x1.0p-149f, 0,        0,
      0,           0,  // amax / 127 rounds to 0: s = 0, q = 0
      63.5f,       0.25f,    0.75f,
      -0.25f,      -1.25f};  // s = 0.5: ties to even (0.5, 1.5, -0.5, -2.5)
  const Quantized z = Quantize(x, 6, cols);
  EXPECT_EQ(z.scale[0], 0.0625f);
  EXPECT_EQ(std::vector<int8_t>(z.q.begin(), z.q.begin() + cols),
            (std::vector<int8_t>{16, -127, 8, 0, 2}));  // 0.5 and 1.5 to even
  EXPECT_EQ(std::bit_cast<uint32_t>(z.scale[1]), 0u);
  for (const int64_t r : {2, 3}) {
    EXPECT_EQ(std::bit_cast<uint32_t>(z.scale[r]), dmath::kCanonicalNaNBits) << r;
  }
  EXPECT_EQ(z.scale[4], 0.0f);
  EXPECT_EQ(z.scale[5], 0.5f);
  EXPECT_EQ(std::vector<int8_t>(z.q.begin() + 5 * cols, z.q.end()),
            (std::vector<int8_t>{127, 0, 2, 0, -2}));
  for (int64_t i = cols; i < 5 * cols; ++i) EXPECT_EQ(z.q[i], 0) << i;
}

// A subnormal scale is coarse: x / s can pass 127, and the clamp holds it there.
TEST(QuantizeRows, ASubnormalScaleIsClamped) {
  const std::vector<float> x = {190 * 0x1.0p-149f, -190 * 0x1.0p-149f, 0x1.0p-149f};
  const Quantized z = Quantize(x, 1, 3);
  EXPECT_EQ(z.scale[0], 0x1.0p-149f);  // 190/127 = 1.496 of the smallest subnormal, rounded
  EXPECT_EQ(z.q, (std::vector<int8_t>{127, -127, 1}));
}

// QuantizeRowsByScale with a row's own scale is QuantizeRows; and the stated cases of any scale:
// not above zero (0, negative, NaN) gives zeros, an infinity zeros (x / inf = ±0; inf / inf is
// NaN), a scale too small clamps, and a NaN element is 0.
TEST(QuantizeRowsByScale, OwnScalesAreQuantizeRowsAndAnyScaleIsStated) {
  constexpr int64_t kRows = 9, kCols = 37;
  std::vector<float> x = RandomFloats(kRows * kCols, 11, -3, 3);
  x[3] = kNaN;                                                  // row 0: a NaN scale of its own
  std::ranges::fill(std::span(x).subspan(kCols, kCols), 0.0f);  // row 1: scale 0
  const Quantized own = Quantize(x, kRows, kCols);
  std::vector<int8_t> q(x.size());
  rk::QuantizeRowsByScale(x, own.scale, q, kRows, kCols);
  EXPECT_EQ(q, own.q);
  const std::vector<float> scale = {1.0f, -1.0f, kNaN, kInf, 0x1.0p-20f, 0.0f, 0.5f, 1.0f, 2.0f};
  std::vector<float> y(x.size());
  for (int64_t r = 0; r < kRows; ++r) {
    for (int64_t i = 0; i < kCols; ++i) y[r * kCols + i] = static_cast<float>(i - 18) * 0.75f;
  }
  y[7 * kCols] = kNaN;
  y[7 * kCols + 1] = kInf;
  y[7 * kCols + 2] = -kInf;
  rk::QuantizeRowsByScale(y, scale, q, kRows, kCols);
  for (int64_t i = 0; i < kCols; ++i) {
    const auto at = [&](int64_t r) { return static_cast<int>(q[r * kCols + i]); };
    const float v = static_cast<float>(i - 18) * 0.75f;
    EXPECT_EQ(at(1), 0) << i;                                // negative
    EXPECT_EQ(at(2), 0) << i;                                // NaN
    EXPECT_EQ(at(3), 0) << i;                                // infinite: x / inf = ±0
    EXPECT_EQ(at(4), v == 0 ? 0 : v > 0 ? 127 : -127) << i;  // clamped
    EXPECT_EQ(at(5), 0) << i;                                // zero
    EXPECT_EQ(at(6), static_cast<int>(std::nearbyint(v / 0.5f))) << i;
    if (i >= 3) {
      EXPECT_EQ(at(7), static_cast<int>(std::nearbyint(v))) << i;
    }
  }
  EXPECT_EQ(q[7 * kCols], 0);        // NaN element
  EXPECT_EQ(q[7 * kCols + 1], 127);  // ±inf: clamped
  EXPECT_EQ(q[7 * kCols + 2], -127);
  for (int64_t i = 0; i < kCols; ++i) {  // ties to even: 0.75 · (i - 18) / 2
    EXPECT_EQ(q[8 * kCols + i], static_cast<int8_t>(std::nearbyint((i - 18) * 0.375f))) << i;
  }
}

TEST(QuantizeRowsByScale, ArgumentsAreChecked) {
  std::vector<float> x(12), scale(3);
  std::vector<int8_t> q(12);
  EXPECT_THROW(rk::QuantizeRowsByScale(x, std::span(scale).first(2), q, 3, 4), Error);
  EXPECT_THROW(rk::QuantizeRowsByScale(x, scale, std::span(q).first(11), 3, 4), Error);
  EXPECT_THROW(rk::QuantizeRowsByScale(std::span(x).first(11), scale, q, 3, 4), Error);
  EXPECT_THROW(rk::QuantizeRowsByScale(x, scale, q, -1, 4), Error);
}

// The weight scales' refresh: folding a matrix's rows in any split into pieces, and sets of
// maxima in any order, gives the maxima of the whole rows (NaN for a row with a NaN or an
// infinity); ScalesOfMaxima of them is QuantizeRows' scale of each row.
TEST(WeightScales, AnySplitIntoPiecesGivesQuantizeRowsScales) {
  constexpr int64_t kRows = 7, kCols = 53;
  std::vector<float> w = RandomFloats(kRows * kCols, 12, -2, 2);
  w[kCols + 5] = kInf;
  w[3 * kCols + 52] = kNaN;
  std::ranges::fill(std::span(w).subspan(4 * kCols, kCols), -0.0f);
  const Quantized own = Quantize(w, kRows, kCols);
  for (const int64_t piece : {int64_t{1}, int64_t{17}, kCols, kCols + 1, kRows * kCols}) {
    std::vector<float> a(kRows, 0.0f), b(kRows, 0.0f);  // even pieces into a, odd into b
    for (int64_t begin = 0, k = 0; begin < kRows * kCols; begin += piece, ++k) {
      const int64_t n = std::min(piece, kRows * kCols - begin);
      rk::FoldRowMaxima(std::span(w).subspan(static_cast<size_t>(begin), static_cast<size_t>(n)),
                        begin, kCols, k % 2 == 0 ? a : b);
    }
    rk::FoldMaxima(b, a);
    std::vector<float> scale(kRows);
    rk::ScalesOfMaxima(a, scale);
    for (int64_t r = 0; r < kRows; ++r) {
      EXPECT_EQ(std::bit_cast<uint32_t>(scale[r]), std::bit_cast<uint32_t>(own.scale[r]))
          << "row " << r << ", pieces of " << piece;
    }
  }
  std::vector<float> maxima(kRows);
  EXPECT_THROW(rk::FoldRowMaxima(w, 1, kCols, maxima), Error);  // past the matrix
  EXPECT_THROW(rk::FoldMaxima(std::span(maxima).first(3), maxima), Error);
}

// The int32 sum is exact at the largest k: k·127² < 2^31, with every product at its extreme.
// Also where a variant's intermediate sums wrap: the dot form's (AVX3_DL, AVX2_VNNI) correction
// 128 · Σ x is
// ±2,164,388,864 here, past int32, and must still give the exact sum.
TEST(GemmI8XWt, TheSumIsExactAtTheLargestK) {
  const int64_t k = rk::kInt8MaxK;
  const std::vector<int8_t> minus(static_cast<size_t>(k), -127), plus(static_cast<size_t>(k), 127);
  const std::vector<float> one = {1.0f};
  std::vector<float> y(1);
  const rk::Isa saved = rk::ActiveIsa();
  for (const rk::Isa& isa : rk::UsableIsas()) {
    rk::SetIsa(isa);
    // ±133144 · 16129 = ±2147479576, converted to float with round-to-nearest-even.
    rk::GemmI8XWt(minus, one, minus, one, y, 1, 1, k);
    EXPECT_EQ(y[0], static_cast<float>(int64_t{2147479576})) << isa.name;
    rk::GemmI8XWt(plus, one, minus, one, y, 1, 1, k);
    EXPECT_EQ(y[0], static_cast<float>(int64_t{-2147479576})) << isa.name;
    rk::GemmI8XWt(minus, one, plus, one, y, 1, 1, k);
    EXPECT_EQ(y[0], static_cast<float>(int64_t{-2147479576})) << isa.name;
  }
  rk::SetIsa(saved);
  std::vector<int8_t> longer(static_cast<size_t>(k + 1));
  EXPECT_THROW(rk::GemmI8XWt(longer, one, longer, one, y, 1, 1, k + 1), Error);
}

// A target with an int8 dot-product extension (AVX2: AVX-VNNI; NEON: sdot) is two variants, the
// extended one first; each is chosen by its name, is active as itself, and is refused, naming
// it, where the CPU lacks it (the sweeps then check every usable one against the reference).
TEST(GemmI8XWt, ATargetWithAnInt8DotIsTwoVariants) {
  const std::vector<rk::Isa> compiled = rk::CompiledIsas(), usable = rk::UsableIsas();
  const rk::Isa saved = rk::ActiveIsa();
  int dot_variants = 0;
  for (size_t i = 0; i < compiled.size(); ++i) {
    const rk::Isa& isa = compiled[i];
    if (!isa.int8_dot) continue;
    ++dot_variants;
    ASSERT_LT(i + 1, compiled.size());
    EXPECT_EQ(compiled[i + 1].hwy_target, isa.hwy_target);
    EXPECT_FALSE(compiled[i + 1].int8_dot);
    EXPECT_EQ(isa.name,
              compiled[i + 1].name + (isa.name.ends_with("_VNNI") ? "_VNNI" : "_DOTPROD"));
    std::string lower = isa.name;
    for (char& c : lower) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    EXPECT_EQ(rk::IsaByName(lower), isa);
    if (std::find(usable.begin(), usable.end(), isa) != usable.end()) {
      rk::SetIsa(isa);
      EXPECT_EQ(rk::ActiveIsa(), isa);
      rk::SetIsa(compiled[i + 1]);
      EXPECT_EQ(rk::ActiveIsa(), compiled[i + 1]);
    } else {
      try {
        rk::SetIsa(isa);
        ADD_FAILURE() << isa.name << " is not usable here, yet SetIsa took it";
      } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find(isa.name), std::string::npos) << e.what();
      }
    }
  }
#if defined(__x86_64__) || defined(__aarch64__)
  EXPECT_EQ(dot_variants, 1);
#endif
  rk::SetIsa(saved);
}

TEST(GemmI8XWt, DequantizesWithTheScaleProductRoundedOnce) {
  const std::vector<int8_t> a = {3, -5, 7}, b = {2, 2, -1, 0, 1, 127};
  const std::vector<float> sx = {0.1f}, sw = {3.0f, 0.7f};
  std::vector<float> y(2);
  rk::GemmI8XWt(a, sx, b, sw, y, 1, 2, 3);
  EXPECT_EQ(y[0], static_cast<float>(3 * 2 - 5 * 2 - 7) * (0.1f * 3.0f));
  EXPECT_EQ(y[1], static_cast<float>(0 - 5 + 7 * 127) * (0.1f * 0.7f));
}

// float(q) · scale, one multiply per element: a NaN scale gives NaN, a zero scale +0.
TEST(DequantizeRows, IsOneMultiplyPerElement) {
  const std::vector<int8_t> q = {-127, 0, 3, 127, 0, 0, 5, -5, 0};
  const std::vector<float> scale = {0.25f, kNaN, 0x1p-140f};
  std::vector<float> y(9);
  rk::DequantizeRows(q, scale, y, 3, 3);
  EXPECT_EQ(y[0], -31.75f);
  EXPECT_TRUE(y[1] == 0.0f && !std::signbit(y[1]));
  EXPECT_EQ(y[2], 0.75f);
  for (int i = 3; i < 6; ++i) EXPECT_TRUE(std::isnan(y[i])) << i;
  EXPECT_EQ(y[6], 5 * 0x1p-140f);
  EXPECT_EQ(y[7], -5 * 0x1p-140f);
  // A quantized row comes back within half a step of every element.
  const std::vector<float> x = {0.3f, -1.7f, 2.9f, -0.01f};
  const Quantized z = Quantize(x, 1, 4);
  std::vector<float> back(4);
  rk::DequantizeRows(z.q, z.scale, back, 1, 4);
  for (size_t i = 0; i < x.size(); ++i) EXPECT_LE(std::fabs(back[i] - x[i]), z.scale[0] / 2) << i;
  std::vector<float> wrong(8);
  EXPECT_THROW(rk::DequantizeRows(q, scale, wrong, 3, 3), Error);  // y is not rows*cols
}

// The Hadamard matrix of order b (a power of two) by Sylvester's rule, independently of the
// kernel's butterflies: H[i][j] = (-1)^popcount(i & j).
double SylvesterEntry(int64_t i, int64_t j) { return std::popcount(uint64_t(i & j)) % 2 ? -1 : 1; }

TEST(HadamardRows, TheBlockIsTheLargestPowerOfFourUpTo64DividingTheLength) {
  EXPECT_EQ(rk::HadamardBlock(4096), 64);
  EXPECT_EQ(rk::HadamardBlock(192), 64);
  EXPECT_EQ(rk::HadamardBlock(32), 16);  // 32 is no power of 4: 16
  EXPECT_EQ(rk::HadamardBlock(80), 16);
  EXPECT_EQ(rk::HadamardBlock(36), 4);
  EXPECT_EQ(rk::HadamardBlock(2), 1);
  EXPECT_EQ(rk::HadamardBlock(37), 1);
}

// Small integers: every butterfly sum is exact, so the rotation is exactly the matrix product
// x · H / √b computed in double, block by block, transposed or not.
TEST(HadamardRows, IsTheBlockDiagonalOrthonormalHadamardProduct) {
  for (const int64_t len : {192, 80, 36, 7}) {
    const int64_t block = rk::HadamardBlock(len), rows = 3;
    std::vector<float> x(static_cast<size_t>(rows * len));
    for (size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>(int64_t(i * 7919 % 61) - 30);
    std::vector<float> expected(x.size());
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t c = 0; c < len; ++c) {
        const int64_t b0 = c / block * block;
        double sum = 0;
        for (int64_t j = 0; j < block; ++j) {
          sum += x[static_cast<size_t>(r * len + b0 + j)] * SylvesterEntry(j, c - b0);
        }
        expected[static_cast<size_t>(r * len + c)] =
            static_cast<float>(sum / std::sqrt(static_cast<double>(block)));
      }
    }
    std::vector<float> y(x.size());
    rk::HadamardRows(x, y, rows, len, /*transpose=*/false);
    EXPECT_EQ(y, expected) << len;
    // The same rows given as the columns of xᵀ.
    std::vector<float> xt(x.size());
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t c = 0; c < len; ++c)
        xt[static_cast<size_t>(c * rows + r)] = x[static_cast<size_t>(r * len + c)];
    }
    std::vector<float> yt(x.size());
    rk::HadamardRows(xt, yt, len, rows, /*transpose=*/true);
    EXPECT_EQ(yt, expected) << len;
    // In place, and twice: H / √b is its own inverse (exactly, for these values).
    rk::HadamardRows(y, y, rows, len, false);
    EXPECT_EQ(y, x) << len;
  }
}

// The fused op is QuantizeRows of HadamardRows, bit for bit, under the active variant: rows of x
// and of xᵀ, a row with a NaN (NaN scale), an all-zero row (scale 0), past a tile of 64 columns.
TEST(HadamardQuantizeRows, IsQuantizeRowsOfTheRotation) {
  for (const bool transpose : {false, true}) {
    const int64_t rows = transpose ? 128 : 70, cols = transpose ? 70 : 128;
    std::vector<float> x = RandomFloats(rows * cols, 11, -4, 4);
    x[transpose ? 5 * cols + 3 : 3 * cols + 5] = kNaN;  // line 3 of the rotated
    for (int64_t e = 0; e < (transpose ? rows : cols); ++e) {
      x[transpose ? e * cols + 9 : 9 * cols + e] = 0.0f;  // line 9: zeros
    }
    const int64_t lines = transpose ? cols : rows;
    std::vector<float> rotated(x.size());
    rk::HadamardRows(x, rotated, rows, cols, transpose);
    const Quantized want = Quantize(rotated, lines, rows * cols / lines);
    Quantized got{std::vector<int8_t>(x.size()), std::vector<float>(static_cast<size_t>(lines))};
    rk::HadamardQuantizeRows(x, got.q, got.scale, rows, cols, transpose);
    EXPECT_EQ(got.q, want.q) << "transpose " << transpose;
    EXPECT_EQ(std::memcmp(got.scale.data(), want.scale.data(), 4 * got.scale.size()), 0)
        << "transpose " << transpose;
    EXPECT_TRUE(std::isnan(got.scale[3])) << "transpose " << transpose;
    EXPECT_EQ(got.scale[9], 0.0f) << "transpose " << transpose;
  }
  std::vector<float> x(12), scale(4);
  std::vector<int8_t> q(12);
  EXPECT_THROW(rk::HadamardQuantizeRows(x, q, std::span(scale).first(3), 3, 4, true), Error);
  EXPECT_THROW(rk::HadamardQuantizeRows(x, std::span(q).first(11), scale, 3, 4, true), Error);
}

TEST(HadamardRows, ArgumentsAreChecked) {
  std::vector<float> x(12), y(12);
  EXPECT_THROW(rk::HadamardRows(x, std::span(y).first(11), 3, 4, false), Error);  // y: rows*cols
  EXPECT_THROW(rk::HadamardRows(std::span(x).first(11), y, 3, 4, true), Error);   // x: rows*cols
  EXPECT_THROW(rk::HadamardRows(x, x, 3, 4, true), Error);  // transposed in place
  EXPECT_THROW(rk::HadamardRows(std::span(x).first(6), std::span(x).subspan(3, 6), 2, 3, false),
               Error);  // overlapping, not in place
  EXPECT_THROW(rk::HadamardRows(x, y, -1, 4, false), Error);
}

TEST(Int8, BitwiseInvariant) {
  for (const int64_t rows : {1, 5}) {
    for (const int64_t cols : kAwkwardSizes) {
      ExpectBitwiseInvariant(fmt::format("quantize_rows rows={} cols={}", rows, cols), [&] {
        std::vector<float> x = RandomFloats(rows * cols, cols, -3, 3);
        if (cols > 3) x[2] = kNaN;  // row 0 has a NaN
        return Words(Quantize(x, rows, cols));
      });
      ExpectBitwiseInvariant(fmt::format("quantize_rows_by_scale rows={} cols={}", rows, cols),
                             [&] {
                               std::vector<float> x = RandomFloats(rows * cols, cols, -3, 3);
                               if (cols > 3) x[2] = kNaN;
                               std::vector<float> scale = RandomFloats(rows, cols + 5, 0, 0.02f);
                               scale[0] = rows > 1 ? -1.0f : scale[0];
                               std::vector<int8_t> q(x.size());
                               rk::QuantizeRowsByScale(x, scale, q, rows, cols);
                               return Words(Quantized{q, {}});
                             });
      ExpectBitwiseInvariant(fmt::format("dequantize_rows rows={} cols={}", rows, cols), [&] {
        std::vector<float> x = RandomFloats(rows * cols, cols + 3, -3, 3);
        if (cols > 3) x[2] = kNaN;  // row 0 has a NaN scale
        const Quantized z = Quantize(x, rows, cols);
        std::vector<float> y(x.size());
        rk::DequantizeRows(z.q, z.scale, y, rows, cols);
        return y;
      });
      ExpectBitwiseInvariant(fmt::format("gemm_i8_xwt m={} n=7 k={}", rows, cols), [&] {
        const Quantized a = Quantize(RandomFloats(rows * cols, cols + 1), rows, cols);
        const Quantized b = Quantize(RandomFloats(7 * cols, cols + 2), 7, cols);
        std::vector<float> y(static_cast<size_t>(rows * 7));
        rk::GemmI8XWt(a.q, a.scale, b.q, b.scale, y, rows, 7, cols);
        return y;
      });
    }
  }
  // 19 rows; transposed also 150 (xᵀ's rows in tiles of 64: two whole tiles and a part).
  for (const std::pair<bool, int64_t>& shape :
       {std::pair<bool, int64_t>{false, 19}, {true, 19}, {true, 150}}) {
    const bool transpose = shape.first;  // not a structured binding: lambdas capture these
    const int64_t count = shape.second;
    for (const int64_t len : {64, 80, 4100, 37}) {
      const std::string what =
          fmt::format("hadamard_rows len={} rows={} transpose={}", len, count, transpose);
      ExpectBitwiseInvariant(what, [&] {
        std::vector<float> x = RandomFloats(count * len, len + 5, -3, 3);
        x[3] = kNaN;
        x[len + 1] = kInf;
        std::vector<float> y(x.size());
        rk::HadamardRows(x, y, transpose ? len : count, transpose ? count : len, transpose);
        return y;
      });
      // The fused op, against the sweep's reference: QuantizeRows of the reference rotation.
      ExpectBitwiseInvariant("hadamard_quantize_rows" + what.substr(what.find(' ')), [&] {
        std::vector<float> x = RandomFloats(count * len, len + 6, -3, 3);
        x[3] = kNaN;
        x[len + 1] = kInf;
        x[2 * len + 2] = 0x1.0p-140f;
        Quantized z{std::vector<int8_t>(x.size()), std::vector<float>(static_cast<size_t>(count))};
        rk::HadamardQuantizeRows(x, z.q, z.scale, transpose ? len : count, transpose ? count : len,
                                 transpose);
        return Words(z);
      });
    }
  }
  // Shapes across the variants' register blocks, thread tasks and packed panels: rows past a
  // multiple of 6 and of a task's 48, columns past a 64-column panel, k past a group of 2 or 4;
  // and k a multiple of 4 over three blocks of k with rows past a multiple of 8 (the dot form
  // reads X in place there, row m - 1 for the rows past m).
  struct Shape {
    int64_t m, n, k;
  };
  for (const Shape s : {Shape{50, 70, 129}, Shape{97, 130, 66}, Shape{7, 257, 1023},
                        Shape{1, 1000, 3}, Shape{200, 5, 8}, Shape{13, 100, 1028}}) {
    ExpectBitwiseInvariant(fmt::format("gemm_i8_xwt m={} n={} k={}", s.m, s.n, s.k), [&] {
      std::vector<float> x = RandomFloats(s.m * s.k, s.k + s.m, -2, 2);
      x[0] = kInf;  // row 0's scale is NaN
      const Quantized a = Quantize(x, s.m, s.k);
      const Quantized b = Quantize(RandomFloats(s.n * s.k, s.n + 1, -1, 1), s.n, s.k);
      std::vector<float> y(static_cast<size_t>(s.m * s.n));
      rk::GemmI8XWt(a.q, a.scale, b.q, b.scale, y, s.m, s.n, s.k);
      return y;
    });
    // W packed once (rk::PackI8ForGemm): the product from a packing made under the running
    // variant, and from one made under the default variant (which another variant does not read:
    // it multiplies by qw itself), gives GemmI8XWt's bits.
    const Quantized w = Quantize(RandomFloats(s.n * s.k, s.n + 3, -1, 1), s.n, s.k);
    const rk::I8Packing packed = rk::PackI8ForGemm(w.q, s.n, s.k);
    EXPECT_GT(packed.form, 0) << "the default variant packs";
    EXPECT_EQ(packed.packed.size(), rk::PackedI8Bytes(s.n, s.k));
    ExpectBitwiseInvariant(fmt::format("gemm_i8_xwt packed m={} n={} k={}", s.m, s.n, s.k), [&] {
      const Quantized a = Quantize(RandomFloats(s.m * s.k, s.k + 2 * s.m, -2, 2), s.m, s.k);
      std::vector<float> want(static_cast<size_t>(s.m * s.n)), y = want;
      rk::GemmI8XWt(a.q, a.scale, w.q, w.scale, want, s.m, s.n, s.k);
      rk::GemmI8XWtPacked(a.q, a.scale, rk::PackI8ForGemm(w.q, s.n, s.k), w.scale, y, s.m);
      EXPECT_EQ(std::memcmp(y.data(), want.data(), y.size() * sizeof(float)), 0) << "packed here";
      rk::GemmI8XWtPacked(a.q, a.scale, packed, w.scale, y, s.m);
      EXPECT_EQ(std::memcmp(y.data(), want.data(), y.size() * sizeof(float)), 0);
      return y;
    });
  }
}

TEST(Int8, ArgumentsAreChecked) {
  std::vector<float> x(6), scale(2), y(4);
  std::vector<int8_t> q(6);
  EXPECT_THROW(rk::QuantizeRows(x, q, scale, 2, 4), Error);  // x is not rows*cols
  EXPECT_THROW(rk::QuantizeRows(x, std::span(q).first(5), scale, 2, 3), Error);
  EXPECT_THROW(rk::QuantizeRows(x, q, std::span(x).first(2), 2, 3), Error);  // scale overlaps x
  EXPECT_THROW(rk::GemmI8XWt(q, scale, q, scale, y, 2, 2, 4), Error);        // qx is not m*k
  std::vector<float> ys(4);
  EXPECT_THROW(rk::GemmI8XWt(q, std::span(ys).first(2), q, scale, ys, 2, 2, 3), Error);  // y, sx
}

}  // namespace
}  // namespace lockstep::test
