// Scalar reference GEMM (normative): docs/numerics.md, "GEMM".
#include <cmath>

#include "kernels/impl.h"
#include "lockstep/core.h"

namespace lockstep::rk::ref {

void Gemm(const GemmArgs& g) {
  ParallelFor(g.m, [&](int64_t i) {
    for (int64_t j = 0; j < g.n; ++j) {
      float* out = &g.c[i * g.n + j];
      float total = g.accumulate ? *out : 0.0f;
      bool have_total = g.accumulate;
      for (int64_t r0 = 0; r0 < g.k; r0 += kGemmKChunk) {
        const int64_t r1 = std::min(g.k, r0 + kGemmKChunk);
        float chunk = 0.0f;
        for (int64_t r = r0; r < r1; ++r) {
          chunk = std::fma(g.a[i * g.a_rs + r * g.a_cs], g.b[r * g.b_rs + j * g.b_cs], chunk);
        }
        total = have_total ? total + chunk : chunk;
        have_total = true;
      }
      *out = total;
    }
  });
}

}  // namespace lockstep::rk::ref
