// The int8 ops: arguments checked, then the reference or the SIMD variant.
#include <algorithm>
#include <cmath>
#include <limits>

#include "kernels/impl.h"
#include "kernels/internal.h"
#include "kernels/ref/int8_rules.h"

namespace lockstep::rk {

void QuantizeRows(std::span<const float> x, std::span<int8_t> q, std::span<float> scale,
                  int64_t rows, int64_t cols) {
  detail::CheckNonNegative("QuantizeRows", "rows", rows);
  detail::CheckNonNegative("QuantizeRows", "cols", cols);
  detail::CheckSize("QuantizeRows", "x", x, {rows, cols}, "rows*cols");
  detail::CheckSize("QuantizeRows", "q", q, {rows, cols}, "rows*cols");
  detail::CheckSize("QuantizeRows", "scale", scale, rows, "rows");
  detail::CheckDisjoint("QuantizeRows", "q", q, "x", x);
  detail::CheckDisjoint("QuantizeRows", "scale", scale, "x", x);
  detail::CheckDisjoint("QuantizeRows", "scale", scale, "q", q);
  if (rows == 0) return;
  if (detail::UsingReference()) {
    ref::QuantizeRows(x.data(), q.data(), scale.data(), rows, cols);
  } else {
    simd::QuantizeRows(x.data(), q.data(), scale.data(), rows, cols);
  }
}

void QuantizeRowsByScale(std::span<const float> x, std::span<const float> scale,
                         std::span<int8_t> q, int64_t rows, int64_t cols) {
  const char* op = "QuantizeRowsByScale";
  detail::CheckNonNegative(op, "rows", rows);
  detail::CheckNonNegative(op, "cols", cols);
  detail::CheckSize(op, "x", x, {rows, cols}, "rows*cols");
  detail::CheckSize(op, "scale", scale, rows, "rows");
  detail::CheckSize(op, "q", q, {rows, cols}, "rows*cols");
  detail::CheckDisjoint(op, "q", q, "x", x);
  detail::CheckDisjoint(op, "q", q, "scale", scale);
  if (rows == 0) return;
  if (detail::UsingReference()) {
    ref::QuantizeRowsByScale(x.data(), scale.data(), q.data(), rows, cols);
  } else {
    simd::QuantizeRowsByScale(x.data(), scale.data(), q.data(), rows, cols);
  }
}

namespace {
// A row's fold with one more element's magnitude (FoldRowMaxima's rule).
float Fold(float maximum, float x) {
  return std::isnan(maximum) || !std::isfinite(x) ? std::numeric_limits<float>::quiet_NaN()
                                                  : std::max(maximum, std::fabs(x));
}
}  // namespace

void FoldRowMaxima(std::span<const float> x, int64_t begin, int64_t cols, std::span<float> maxima) {
  const auto rows = static_cast<int64_t>(maxima.size());
  if (cols < 1 || begin < 0 || begin + static_cast<int64_t>(x.size()) > rows * cols) {
    Fail("FoldRowMaxima: elements [{}, {}) of a {} x {} matrix", begin,
         begin + static_cast<int64_t>(x.size()), rows, cols);
  }
  for (size_t e = 0; e < x.size();) {
    const int64_t at = begin + static_cast<int64_t>(e);
    const int64_t row = at / cols, end = std::min<int64_t>((row + 1) * cols - begin, x.size());
    float m = maxima[static_cast<size_t>(row)];
    for (; e < static_cast<size_t>(end); ++e) m = Fold(m, x[e]);
    maxima[static_cast<size_t>(row)] = m;
  }
}

void FoldMaxima(std::span<const float> from, std::span<float> into) {
  if (from.size() != into.size()) Fail("FoldMaxima: {} maxima into {}", from.size(), into.size());
  for (size_t r = 0; r < from.size(); ++r) {
    into[r] = Fold(into[r], from[r]);  // a NaN maximum is not finite: NaN
  }
}

void ScalesOfMaxima(std::span<const float> maxima, std::span<float> scale) {
  if (maxima.size() != scale.size()) {
    Fail("ScalesOfMaxima: {} maxima for {} scales", maxima.size(), scale.size());
  }
  for (size_t r = 0; r < maxima.size(); ++r) {
    scale[r] = int8::RowScale(maxima[r], !std::isnan(maxima[r]));
  }
}

namespace {
// GemmI8XWt's checks of its operands, under the name `op`.
void CheckGemmI8(const char* op, std::span<const int8_t> qx, std::span<const float> sx,
                 std::span<const int8_t> qw, std::span<const float> sw, std::span<float> y,
                 int64_t m, int64_t n, int64_t k) {
  detail::CheckNonNegative(op, "m", m);
  detail::CheckNonNegative(op, "n", n);
  detail::CheckNonNegative(op, "k", k);
  if (k > kInt8MaxK) {
    Fail("{}: k = {} (at most {}: k·127² must stay below 2^31 for the int32 sum to be exact)", op,
         k, kInt8MaxK);
  }
  detail::CheckSize(op, "qx", qx, {m, k}, "m*k");
  detail::CheckSize(op, "sx", sx, m, "m");
  detail::CheckSize(op, "qw", qw, {n, k}, "n*k");
  detail::CheckSize(op, "sw", sw, n, "n");
  detail::CheckSize(op, "y", y, {m, n}, "m*n");
  detail::CheckDisjoint(op, "y", y, "sx", sx);
  detail::CheckDisjoint(op, "y", y, "sw", sw);
  detail::CheckDisjoint(op, "y", y, "qx", qx);
  detail::CheckDisjoint(op, "y", y, "qw", qw);
}

// The form a packing under the active variant has: 0 under the reference.
int64_t ActiveI8Form() { return detail::UsingReference() ? 0 : simd::I8PackingForm(); }
}  // namespace

void GemmI8XWt(std::span<const int8_t> qx, std::span<const float> sx, std::span<const int8_t> qw,
               std::span<const float> sw, std::span<float> y, int64_t m, int64_t n, int64_t k) {
  CheckGemmI8("GemmI8XWt", qx, sx, qw, sw, y, m, n, k);
  if (m == 0 || n == 0) return;
  if (detail::UsingReference()) {
    ref::GemmI8XWt(qx.data(), sx.data(), qw.data(), sw.data(), y.data(), m, n, k);
  } else {
    simd::GemmI8XWt(qx.data(), sx.data(), qw.data(), sw.data(), y.data(), m, n, k);
  }
}

uint64_t PackedI8Bytes(int64_t n, int64_t k) {
  if (ActiveI8Form() == 0 || n == 0 || k == 0) return 0;
  return static_cast<uint64_t>(simd::PackedI8Bytes(n, k));
}

I8Packing PackI8ForGemm(std::span<const int8_t> qw, int64_t n, int64_t k) {
  detail::CheckNonNegative("PackI8ForGemm", "n", n);
  detail::CheckNonNegative("PackI8ForGemm", "k", k);
  detail::CheckSize("PackI8ForGemm", "qw", qw, {n, k}, "n*k");
  I8Packing p{qw, n, k, 0, {}};
  const uint64_t bytes = PackedI8Bytes(n, k);
  if (bytes == 0) return p;
  p.form = simd::I8PackingForm();
  p.packed.resize(bytes);
  simd::PackI8(qw.data(), n, k, reinterpret_cast<uint8_t*>(p.packed.data()));
  return p;
}

void GemmI8XWtPacked(std::span<const int8_t> qx, std::span<const float> sx, const I8Packing& w,
                     std::span<const float> sw, std::span<float> y, int64_t m) {
  if (w.form == 0 || ActiveI8Form() != w.form) {
    GemmI8XWt(qx, sx, w.w, sw, y, m, w.n, w.k);
    return;
  }
  CheckGemmI8("GemmI8XWtPacked", qx, sx, w.w, sw, y, m, w.n, w.k);
  if (m == 0 || w.n == 0) return;
  simd::GemmI8XWtPacked(qx.data(), sx.data(), reinterpret_cast<const uint8_t*>(w.packed.data()),
                        sw.data(), y.data(), m, w.n, w.k);
}

void DequantizeRows(std::span<const int8_t> q, std::span<const float> scale, std::span<float> y,
                    int64_t rows, int64_t cols) {
  const char* op = "DequantizeRows";
  detail::CheckNonNegative(op, "rows", rows);
  detail::CheckNonNegative(op, "cols", cols);
  detail::CheckSize(op, "q", q, {rows, cols}, "rows*cols");
  detail::CheckSize(op, "scale", scale, rows, "rows");
  detail::CheckSize(op, "y", y, {rows, cols}, "rows*cols");
  detail::CheckDisjoint(op, "y", y, "q", q);
  detail::CheckDisjoint(op, "y", y, "scale", scale);
  if (rows == 0) return;
  if (detail::UsingReference()) {
    ref::DequantizeRows(q.data(), scale.data(), y.data(), rows, cols);
  } else {
    simd::DequantizeRows(q.data(), scale.data(), y.data(), rows, cols);
  }
}

int64_t HadamardBlock(int64_t length) {
  for (const int64_t block : {64, 16, 4}) {
    if (length % block == 0) return block;
  }
  return 1;
}

void HadamardRows(std::span<const float> x, std::span<float> y, int64_t rows, int64_t cols,
                  bool transpose) {
  const char* op = "HadamardRows";
  detail::CheckNonNegative(op, "rows", rows);
  detail::CheckNonNegative(op, "cols", cols);
  detail::CheckSize(op, "x", x, {rows, cols}, "rows*cols");
  detail::CheckSize(op, "y", y, {rows, cols}, "rows*cols");
  detail::CheckDisjoint(op, "y", y, "x", x, /*allow_identical=*/!transpose);
  if (rows == 0 || cols == 0) return;
  if (detail::UsingReference()) {
    ref::HadamardRows(x.data(), y.data(), rows, cols, transpose);
  } else {
    simd::HadamardRows(x.data(), y.data(), rows, cols, transpose);
  }
}

void HadamardQuantizeRows(std::span<const float> x, std::span<int8_t> q, std::span<float> scale,
                          int64_t rows, int64_t cols, bool transpose) {
  const char* op = "HadamardQuantizeRows";
  detail::CheckNonNegative(op, "rows", rows);
  detail::CheckNonNegative(op, "cols", cols);
  detail::CheckSize(op, "x", x, {rows, cols}, "rows*cols");
  detail::CheckSize(op, "q", q, {rows, cols}, "rows*cols");
  detail::CheckSize(op, "scale", scale, transpose ? cols : rows, transpose ? "cols" : "rows");
  detail::CheckDisjoint(op, "q", q, "x", x);
  detail::CheckDisjoint(op, "scale", scale, "x", x);
  detail::CheckDisjoint(op, "scale", scale, "q", q);
  if (rows == 0 || cols == 0) {
    std::ranges::fill(scale, 0.0f);  // QuantizeRows' scale of an empty row
    return;
  }
  if (detail::UsingReference()) {
    ref::HadamardQuantizeRows(x.data(), q.data(), scale.data(), rows, cols, transpose);
  } else {
    simd::HadamardQuantizeRows(x.data(), q.data(), scale.data(), rows, cols, transpose);
  }
}

}  // namespace lockstep::rk
