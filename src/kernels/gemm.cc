// The three GEMM forms of a linear layer, mapped onto one strided C = A·B.
#include <bit>

#include "kernels/impl.h"
#include "kernels/internal.h"

namespace lockstep::rk {
namespace {

// Each operand's size against its shape, a product of two of m, n, k named as "m*k" and so on.
void CheckGemm(const char* op, const char* a_name, std::span<const float> a, const char* a_shape,
               const char* b_name, std::span<const float> b, const char* b_shape,
               const char* c_name, std::span<float> c, const char* c_shape, int64_t m, int64_t n,
               int64_t k) {
  detail::CheckNonNegative(op, "m", m);
  detail::CheckNonNegative(op, "n", n);
  detail::CheckNonNegative(op, "k", k);
  const auto factors = [&](const char* shape) {
    const auto dim = [&](char c) { return c == 'm' ? m : c == 'n' ? n : k; };
    return detail::Elements(op, shape, {dim(shape[0]), dim(shape[2])});
  };
  detail::CheckSize(op, a_name, a, factors(a_shape), a_shape);
  detail::CheckSize(op, b_name, b, factors(b_shape), b_shape);
  detail::CheckSize(op, c_name, c, factors(c_shape), c_shape);
  detail::CheckDisjoint(op, c_name, c, a_name, a);
  detail::CheckDisjoint(op, c_name, c, b_name, b);
}

void Run(const GemmArgs& g) {
  if (g.m == 0 || g.n == 0) return;
  if (detail::UsingReference()) {
    ref::Gemm(g);
  } else {
    simd::Gemm(g);
  }
}
}  // namespace

uint64_t PackedGemvBytes(int64_t n, int64_t k, Dtype dtype) {
  if (detail::UsingReference() || n == 0 || k == 0) return 0;
  const int64_t lanes = simd::GemvLanes();
  return static_cast<uint64_t>((n + lanes - 1) / lanes * lanes * k) *
         static_cast<uint64_t>(InfoOf(dtype).size);
}

GemvPacking PackForGemv(std::span<const float> w, int64_t n, int64_t k, Dtype dtype) {
  detail::CheckNonNegative("PackForGemv", "n", n);
  detail::CheckNonNegative("PackForGemv", "k", k);
  detail::CheckSize("PackForGemv", "w", w, detail::Elements("PackForGemv", "n*k", {n, k}), "n*k");
  if (dtype != Dtype::kF32 && dtype != Dtype::kBF16) {
    Fail("PackForGemv: dtype {} (f32 or bf16)", DtypeName(dtype));
  }
  if (dtype == Dtype::kBF16) {
    for (size_t i = 0; i < w.size(); ++i) {
      if ((std::bit_cast<uint32_t>(w[i]) & 0xFFFFu) != 0) {
        Fail("PackForGemv: w[{}] = {} is not a bfloat16 (its low 16 bits are not zero)", i, w[i]);
      }
    }
  }
  GemvPacking p{w, n, k, 0, dtype, {}};
  const uint64_t bytes = PackedGemvBytes(n, k, dtype);
  if (bytes == 0) return p;
  p.lanes = simd::GemvLanes();
  p.packed.resize(bytes);
  if (dtype == Dtype::kBF16) {
    simd::PackGemvBf16(w.data(), n, k, reinterpret_cast<uint16_t*>(p.packed.data()));
  } else {
    simd::PackGemv(w.data(), n, k, reinterpret_cast<float*>(p.packed.data()));
  }
  return p;
}

void GemmXWtPacked(std::span<const float> x, const GemvPacking& w, std::span<float> y, int64_t m) {
  if (m < 0 || m > kGemvMaxRows) {
    Fail("GemmXWtPacked: m = {} (the packed product is for 0 to {} rows)", m, kGemvMaxRows);
  }
  if (w.lanes == 0 || detail::UsingReference() || simd::GemvLanes() != w.lanes) {
    GemmXWt(x, w.w, y, m, w.n, w.k);
    return;
  }
  CheckGemm("GemmXWtPacked", "x", x, "m*k", "w", w.w, "n*k", "y", y, "m*n", m, w.n, w.k);
  if (m == 0 || w.n == 0) return;
  if (w.dtype == Dtype::kBF16) {
    simd::GemvPackedBf16(x.data(), reinterpret_cast<const uint16_t*>(w.packed.data()), y.data(), m,
                         w.n, w.k);
  } else {
    simd::GemvPacked(x.data(), reinterpret_cast<const float*>(w.packed.data()), y.data(), m, w.n,
                     w.k);
  }
}

void GemmXWt(std::span<const float> x, std::span<const float> w, std::span<float> y, int64_t m,
             int64_t n, int64_t k, bool accumulate) {
  CheckGemm("GemmXWt", "x", x, "m*k", "w", w, "n*k", "y", y, "m*n", m, n, k);
  Run({x.data(), k, 1, w.data(), 1, k, y.data(), m, n, k, accumulate});
}

void GemmDyW(std::span<const float> dy, std::span<const float> w, std::span<float> dx, int64_t m,
             int64_t n, int64_t k, bool accumulate) {
  CheckGemm("GemmDyW", "dy", dy, "m*n", "w", w, "n*k", "dx", dx, "m*k", m, n, k);
  Run({dy.data(), n, 1, w.data(), k, 1, dx.data(), m, k, n, accumulate});
}

void GemmDytX(std::span<const float> dy, std::span<const float> x, std::span<float> dw, int64_t m,
              int64_t n, int64_t k, bool accumulate) {
  CheckGemm("GemmDytX", "dy", dy, "m*n", "x", x, "m*k", "dw", dw, "n*k", m, n, k);
  Run({dy.data(), 1, n, x.data(), k, 1, dw.data(), n, k, m, accumulate});
}

}  // namespace lockstep::rk
