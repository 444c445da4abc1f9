// Public entry points of the row reductions, AddInto, RoundToBf16, RMSNorm and RoPE: validation,
// then the reference or the active SIMD variant.
#include <algorithm>

#include "kernels/impl.h"
#include "kernels/internal.h"

namespace lockstep::rk {
namespace {
using detail::CheckDisjoint;
using detail::CheckFinite;
using detail::CheckNonNegative;
using detail::CheckPositive;
using detail::CheckSize;
using detail::Elements;

#define LOCKSTEP_RK_RUN(op, ...)      \
  do {                                \
    if (detail::UsingReference()) {   \
      ref::op(__VA_ARGS__);           \
    } else {                          \
      simd::op(__VA_ARGS__);          \
    }                                 \
  } while (0)

void CheckRowReduction(const char* op, std::span<const float> x, std::span<float> out,
                       int64_t rows, int64_t cols) {
  CheckNonNegative(op, "rows", rows);
  CheckNonNegative(op, "cols", cols);
  CheckSize(op, "x", x, {rows, cols}, "rows*cols");
  CheckSize(op, "out", out, rows, "rows");
  CheckDisjoint(op, "out", out, "x", x);
}
}  // namespace

void RowSum(std::span<const float> x, std::span<float> out, int64_t rows, int64_t cols) {
  CheckRowReduction("RowSum", x, out, rows, cols);
  LOCKSTEP_RK_RUN(RowSum, x.data(), out.data(), rows, cols);
}

void RowSumSquares(std::span<const float> x, std::span<float> out, int64_t rows, int64_t cols) {
  CheckRowReduction("RowSumSquares", x, out, rows, cols);
  LOCKSTEP_RK_RUN(RowSumSquares, x.data(), out.data(), rows, cols);
}

void RowMax(std::span<const float> x, std::span<float> out, int64_t rows, int64_t cols) {
  CheckRowReduction("RowMax", x, out, rows, cols);
  LOCKSTEP_RK_RUN(RowMax, x.data(), out.data(), rows, cols);
}

void AddInto(std::span<const float> x, std::span<float> y) {
  CheckSize("AddInto", "x", x, static_cast<int64_t>(y.size()), "y.size()");
  CheckDisjoint("AddInto", "y", y, "x", x);
  LOCKSTEP_RK_RUN(AddInto, x.data(), y.data(), static_cast<int64_t>(y.size()));
}

// y[i] = convert(x[i]): the bf16 conversions, memory-bound with one result per element and
// nothing to vectorise by hand, so the same code on every variant.
template <typename From, typename To, typename Convert>
void ConvertEach(const char* op, std::span<const From> x, std::span<To> y, Convert convert) {
  CheckSize(op, "x", x, static_cast<int64_t>(y.size()), "y.size()");
  constexpr int64_t kBlock = int64_t{1} << 15;
  const auto n = static_cast<int64_t>(x.size());
  ParallelFor((n + kBlock - 1) / kBlock, [&](int64_t block) {
    for (int64_t i = block * kBlock; i < std::min(n, (block + 1) * kBlock); ++i) {
      y[static_cast<size_t>(i)] = convert(x[static_cast<size_t>(i)]);
    }
  });
}

void ToBf16(std::span<const float> x, std::span<BFloat16> y) {
  ConvertEach("ToBf16", x, y, NarrowToBf16);
}

void FromBf16(std::span<const BFloat16> x, std::span<float> y) {
  ConvertEach("FromBf16", x, y, WidenBf16);
}

void RoundToBf16(std::span<const float> x, std::span<float> y) {
  CheckSize("RoundToBf16", "x", x, static_cast<int64_t>(y.size()), "y.size()");
  if (x.data() != y.data()) CheckDisjoint("RoundToBf16", "y", y, "x", x);
  LOCKSTEP_RK_RUN(RoundToBf16, x.data(), y.data(), static_cast<int64_t>(y.size()));
}

void RmsNormForward(std::span<const float> x, std::span<const float> gain, float eps,
                    std::span<float> y, std::span<float> rstd, int64_t rows, int64_t d) {
  const char* op = "RmsNormForward";
  CheckNonNegative(op, "rows", rows);
  CheckPositive(op, "d", d);
  CheckFinite(op, "eps", eps);
  if (eps < 0) Fail("{}: eps = {} (must be >= 0)", op, eps);
  CheckSize(op, "x", x, {rows, d}, "rows*d");
  if (!gain.empty()) CheckSize(op, "gain", gain, d, "d");
  CheckSize(op, "y", y, {rows, d}, "rows*d");
  CheckSize(op, "rstd", rstd, rows, "rows");
  CheckDisjoint(op, "y", y, "x", x, /*allow_identical=*/true);
  CheckDisjoint(op, "y", y, "gain", gain);
  CheckDisjoint(op, "rstd", rstd, "x", x);
  CheckDisjoint(op, "rstd", rstd, "y", y);
  LOCKSTEP_RK_RUN(RmsNormForward, x.data(), gain.empty() ? nullptr : gain.data(), eps, y.data(),
                  rstd.data(), rows, d);
}

void RmsNormBackward(std::span<const float> dy, std::span<const float> x,
                     std::span<const float> gain, std::span<const float> rstd,
                     std::span<float> dx, std::span<float> dgain, int64_t rows, int64_t d) {
  const char* op = "RmsNormBackward";
  CheckNonNegative(op, "rows", rows);
  CheckPositive(op, "d", d);
  CheckSize(op, "dy", dy, {rows, d}, "rows*d");
  CheckSize(op, "x", x, {rows, d}, "rows*d");
  CheckSize(op, "rstd", rstd, rows, "rows");
  CheckSize(op, "dx", dx, {rows, d}, "rows*d");
  if (gain.empty() != dgain.empty()) {
    Fail("{}: gain has {} elements but dgain has {} (both empty, or both d = {})", op,
         gain.size(), dgain.size(), d);
  }
  if (!gain.empty()) {
    CheckSize(op, "gain", gain, d, "d");
    CheckSize(op, "dgain", dgain, d, "d");
  }
  CheckDisjoint(op, "dx", dx, "dy", dy, /*allow_identical=*/true);
  CheckDisjoint(op, "dx", dx, "x", x);
  CheckDisjoint(op, "dx", dx, "gain", gain);
  CheckDisjoint(op, "dx", dx, "rstd", rstd);
  for (auto [name, in] : {std::pair{"dy", dy}, {"x", x}, {"gain", gain}, {"rstd", rstd}}) {
    CheckDisjoint(op, "dgain", dgain, name, in);
  }
  CheckDisjoint(op, "dgain", dgain, "dx", dx);
  LOCKSTEP_RK_RUN(RmsNormBackward, dy.data(), x.data(), gain.empty() ? nullptr : gain.data(),
                  rstd.data(), dx.data(), dgain.empty() ? nullptr : dgain.data(), rows, d);
}

RopeTable MakeRopeTable(int64_t seq, int64_t head_dim, float theta) {
  const char* op = "MakeRopeTable";
  CheckPositive(op, "seq", seq);
  CheckPositive(op, "head_dim", head_dim);
  if (head_dim % 2 != 0) Fail("{}: head_dim = {} (must be even)", op, head_dim);
  CheckFinite(op, "theta", theta);
  if (theta <= 1.0f) Fail("{}: theta = {} (must be > 1)", op, theta);
  RopeTable table{seq, head_dim / 2, {}, {}};
  table.cos.resize(static_cast<size_t>(seq * table.half));
  table.sin.resize(table.cos.size());
  for (int64_t i = 0; i < table.half; ++i) {
    // As in the Llama reference: inv_freq = 1 / theta^(2i / head_dim), all in fp32.
    const float exponent = static_cast<float>(2 * i) / static_cast<float>(head_dim);
    const float inv_freq = 1.0f / dmath::Pow(theta, exponent);
    for (int64_t t = 0; t < seq; ++t) {
      const float angle = static_cast<float>(t) * inv_freq;
      table.cos[t * table.half + i] = dmath::Cos(angle);
      table.sin[t * table.half + i] = dmath::Sin(angle);
    }
  }
  return table;
}

namespace {
void RunRope(const char* op, std::span<const float> x, std::span<float> y, const RopeTable& table,
             int64_t batch, int64_t seq, int64_t heads, int64_t head_dim, int64_t first_position,
             bool inverse) {
  CheckPositive(op, "batch", batch);
  CheckPositive(op, "seq", seq);
  CheckPositive(op, "heads", heads);
  CheckPositive(op, "head_dim", head_dim);
  CheckNonNegative(op, "first_position", first_position);
  if (head_dim != 2 * table.half || first_position > table.seq - seq) {
    Fail(
        "{}: table is for positions < {} and head_dim {}, called for positions {} .. {} and "
        "head_dim {}",
        op, table.seq, 2 * table.half, first_position, first_position + seq - 1, head_dim);
  }
  const int64_t n = Elements(op, "batch*seq*heads*head_dim", {batch, seq, heads, head_dim});
  CheckSize(op, inverse ? "dy" : "x", x, n, "batch*seq*heads*head_dim");
  CheckSize(op, inverse ? "dx" : "y", y, n, "batch*seq*heads*head_dim");
  CheckDisjoint(op, inverse ? "dx" : "y", y, inverse ? "dy" : "x", x, /*allow_identical=*/true);
  const int64_t first = first_position * table.half;
  LOCKSTEP_RK_RUN(Rope, x.data(), y.data(), table.cos.data() + first, table.sin.data() + first,
                  batch, seq, heads, head_dim, inverse);
}
}  // namespace

void RopeForward(std::span<const float> x, std::span<float> y, const RopeTable& table,
                 int64_t batch, int64_t seq, int64_t heads, int64_t head_dim,
                 int64_t first_position) {
  RunRope("RopeForward", x, y, table, batch, seq, heads, head_dim, first_position, false);
}

void RopeBackward(std::span<const float> dy, std::span<float> dx, const RopeTable& table,
                  int64_t batch, int64_t seq, int64_t heads, int64_t head_dim) {
  RunRope("RopeBackward", dy, dx, table, batch, seq, heads, head_dim, 0, true);
}

}  // namespace lockstep::rk
