// The three GEMM forms of a linear layer, mapped onto one strided C = A·B.
#include "kernels/impl.h"
#include "kernels/internal.h"

namespace lockstep::rk {
namespace {

void CheckGemm(const char* op, const char* a_name, std::span<const float> a, int64_t a_size,
               const char* a_shape, const char* b_name, std::span<const float> b,
               int64_t b_size, const char* b_shape, const char* c_name, std::span<float> c,
               int64_t c_size, const char* c_shape, int64_t m, int64_t n, int64_t k) {
  detail::CheckNonNegative(op, "m", m);
  detail::CheckNonNegative(op, "n", n);
  detail::CheckNonNegative(op, "k", k);
  detail::CheckSize(op, a_name, a, a_size, a_shape);
  detail::CheckSize(op, b_name, b, b_size, b_shape);
  detail::CheckSize(op, c_name, c, c_size, c_shape);
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

void GemmXWt(std::span<const float> x, std::span<const float> w, std::span<float> y, int64_t m,
             int64_t n, int64_t k, bool accumulate) {
  CheckGemm("GemmXWt", "x", x, m * k, "m*k", "w", w, n * k, "n*k", "y", y, m * n, "m*n", m, n, k);
  Run({x.data(), k, 1, w.data(), 1, k, y.data(), m, n, k, accumulate});
}

void GemmDyW(std::span<const float> dy, std::span<const float> w, std::span<float> dx, int64_t m,
             int64_t n, int64_t k, bool accumulate) {
  CheckGemm("GemmDyW", "dy", dy, m * n, "m*n", "w", w, n * k, "n*k", "dx", dx, m * k, "m*k", m, n,
            k);
  Run({dy.data(), n, 1, w.data(), k, 1, dx.data(), m, k, n, accumulate});
}

void GemmDytX(std::span<const float> dy, std::span<const float> x, std::span<float> dw, int64_t m,
              int64_t n, int64_t k, bool accumulate) {
  CheckGemm("GemmDytX", "dy", dy, m * n, "m*n", "x", x, m * k, "m*k", "dw", dw, n * k, "n*k", m, n,
            k);
  Run({dy.data(), 1, n, x.data(), k, 1, dw.data(), n, k, m, accumulate});
}

}  // namespace lockstep::rk
