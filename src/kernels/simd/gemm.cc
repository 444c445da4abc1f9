// SIMD GEMM: packed panels and a register-blocked microkernel (Goto/BLIS structure).
//
// The contract (docs/numerics.md, "GEMM") fixes, for every output element, the order of its
// fused multiply-adds: the reduced index in chunks of kGemmKChunk, each chunk accumulated from
// +0 in increasing order, the chunk sums added in order. The KC blocking of the Goto loop nest
// *is* that chunking, and a microkernel lane owns exactly one output element, so every
// vector width, tile size and thread split gives the reference's bits. Threads split output
// tiles only; the chunk loop (pc) is sequential with a barrier between chunks.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels/simd/gemm.cc"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>
#include <hwy/cache_control.h>

#include <algorithm>

#include "kernels/impl.h"
#include "lockstep/core.h"

HWY_BEFORE_NAMESPACE();
namespace lockstep::rk::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

constexpr int64_t kMr = 6;                // microkernel rows
constexpr int64_t kKc = kGemmKChunk;      // the contract's chunk is the K block
constexpr int64_t kMcPanels = 16;         // most row panels of A per task (L2-resident)
constexpr int64_t kNc = 8192;             // columns of B packed per panel (L3-resident)
constexpr int64_t kColumnGroup = 512;     // columns of the panel handled per task

// Packs rows [i0, i0+mr) x reduced [r0, r0+kc) of A into ap[p*kMr + i], zero-padding rows.
void PackA(const GemmArgs& g, int64_t i0, int64_t mr, int64_t r0, int64_t kc, float* ap) {
  if (mr < kMr) std::fill(ap, ap + kc * kMr, 0.0f);
  if (g.a_cs == 1) {  // rows contiguous: walk the mr rows side by side, writing sequentially
    const float* src[kMr];
    for (int64_t i = 0; i < mr; ++i) src[i] = g.a + (i0 + i) * g.a_rs + r0;
    for (int64_t p = 0; p < kc; ++p) {
      for (int64_t i = 0; i < mr; ++i) ap[p * kMr + i] = src[i][p];
    }
  } else {
    for (int64_t p = 0; p < kc; ++p) {
      const float* src = g.a + (r0 + p) * g.a_cs + i0 * g.a_rs;
      for (int64_t i = 0; i < mr; ++i) ap[p * kMr + i] = src[i * g.a_rs];
    }
  }
}

// Packs reduced [r0, r0+kc) x columns [j0, j0+nr) of B into bp[p*nr_max + j], zero-padding.
void PackB(const GemmArgs& g, int64_t r0, int64_t kc, int64_t j0, int64_t nr, int64_t nr_max,
           float* bp) {
  if (nr < nr_max) std::fill(bp, bp + kc * nr_max, 0.0f);
  if (g.b_cs == 1) {
    for (int64_t p = 0; p < kc; ++p) {
      const float* src = g.b + (r0 + p) * g.b_rs + j0;
      std::copy(src, src + nr, bp + p * nr_max);
    }
  } else {
    for (int64_t j = 0; j < nr; ++j) {
      const float* src = g.b + (j0 + j) * g.b_cs + r0 * g.b_rs;
      for (int64_t p = 0; p < kc; ++p) bp[p * nr_max + j] = src[p * g.b_rs];
    }
  }
}

// c[kMr x 2 vectors] (row stride ldc) = or += the chunk sum of ap·bp over kc terms.
template <class D>
HWY_INLINE void Microkernel(D d, const float* HWY_RESTRICT ap, const float* HWY_RESTRICT bp,
                            int64_t kc, float* HWY_RESTRICT c, int64_t ldc, bool add) {
  using V = hn::Vec<D>;
  const size_t L = hn::Lanes(d);
  // The C tile is read back only after kc steps: start fetching it now (it is usually not in
  // cache, since the contract's chunk of 256 makes C round trips frequent).
  for (int64_t i = 0; i < kMr; ++i) {
    hwy::Prefetch(c + i * ldc);
    hwy::Prefetch(c + i * ldc + 2 * L - 1);
  }
  V c00 = hn::Zero(d), c01 = hn::Zero(d), c10 = hn::Zero(d), c11 = hn::Zero(d);
  V c20 = hn::Zero(d), c21 = hn::Zero(d), c30 = hn::Zero(d), c31 = hn::Zero(d);
  V c40 = hn::Zero(d), c41 = hn::Zero(d), c50 = hn::Zero(d), c51 = hn::Zero(d);
#pragma GCC unroll 4
  for (int64_t p = 0; p < kc; ++p) {
    const V b0 = hn::Load(d, bp);
    const V b1 = hn::Load(d, bp + L);
    V a = hn::Set(d, ap[0]);
    c00 = hn::MulAdd(a, b0, c00);
    c01 = hn::MulAdd(a, b1, c01);
    a = hn::Set(d, ap[1]);
    c10 = hn::MulAdd(a, b0, c10);
    c11 = hn::MulAdd(a, b1, c11);
    a = hn::Set(d, ap[2]);
    c20 = hn::MulAdd(a, b0, c20);
    c21 = hn::MulAdd(a, b1, c21);
    a = hn::Set(d, ap[3]);
    c30 = hn::MulAdd(a, b0, c30);
    c31 = hn::MulAdd(a, b1, c31);
    a = hn::Set(d, ap[4]);
    c40 = hn::MulAdd(a, b0, c40);
    c41 = hn::MulAdd(a, b1, c41);
    a = hn::Set(d, ap[5]);
    c50 = hn::MulAdd(a, b0, c50);
    c51 = hn::MulAdd(a, b1, c51);
    ap += kMr;
    bp += 2 * L;
  }
  const auto put = [&](float* row, V v0, V v1) {
    if (add) {
      v0 = hn::Add(hn::LoadU(d, row), v0);
      v1 = hn::Add(hn::LoadU(d, row + L), v1);
    }
    hn::StoreU(v0, d, row);
    hn::StoreU(v1, d, row + L);
  };
  put(c + 0 * ldc, c00, c01);
  put(c + 1 * ldc, c10, c11);
  put(c + 2 * ldc, c20, c21);
  put(c + 3 * ldc, c30, c31);
  put(c + 4 * ldc, c40, c41);
  put(c + 5 * ldc, c50, c51);
}

void Gemm(const GemmArgs& g) {
  const hn::ScalableTag<float> d;
  const int64_t nr_max = 2 * static_cast<int64_t>(hn::Lanes(d));
  if (g.k == 0) {  // the empty sum: +0, or the output unchanged when accumulating
    if (!g.accumulate) std::fill(g.c, g.c + g.m * g.n, 0.0f);
    return;
  }
  const int64_t panel_cols = std::min(kNc, (g.n + nr_max - 1) / nr_max * nr_max);
  const int64_t a_panels = (g.m + kMr - 1) / kMr;
  float* const bp_all = ScratchFloats(Scratch::kGemmB, static_cast<size_t>(kKc * panel_cols));
  float* const ap_all = ScratchFloats(Scratch::kGemmA, static_cast<size_t>(kKc * kMr * a_panels));
  for (int64_t jc = 0; jc < g.n; jc += kNc) {
    const int64_t nc = std::min(kNc, g.n - jc);
    const int64_t slivers = (nc + nr_max - 1) / nr_max;
    const int64_t groups = (nc + kColumnGroup - 1) / kColumnGroup;
    // kMcPanels row panels per task, fewer when that would leave under four tasks per thread:
    // with 128 rows, two tasks of 96 and 32 rows kept one of two threads idle a third of the time.
    // (How the tiles are split among tasks never changes a result.)
    const int64_t block_panels = std::clamp(
        (a_panels * groups + 4 * int64_t{Threads()} - 1) / (4 * int64_t{Threads()}), int64_t{1},
        kMcPanels);
    const int64_t mc_max = block_panels * kMr;
    const int64_t row_blocks = (g.m + mc_max - 1) / mc_max;
    for (int64_t pc = 0; pc < g.k; pc += kKc) {
      const int64_t kc = std::min(kKc, g.k - pc);
      const bool add = g.accumulate || pc > 0;
      // Pack the B panel and all of A for this chunk, shared by every task. A is repacked per
      // column panel only when n > kNc.
      ParallelFor(slivers + a_panels, [&](int64_t s) {
        if (s < slivers) {
          const int64_t j0 = s * nr_max;
          PackB(g, pc, kc, jc + j0, std::min(nr_max, nc - j0), nr_max, bp_all + j0 * kc);
        } else {
          const int64_t i0 = (s - slivers) * kMr;
          PackA(g, i0, std::min(kMr, g.m - i0), pc, kc, ap_all + i0 * kc);
        }
      });
      // The panels are packed. Each task owns a block of C tiles; ParallelFor returning is the
      // barrier that completes chunk pc everywhere before chunk pc+1 is added.
      ParallelFor(row_blocks * groups, [&](int64_t task) {
        HWY_ALIGN float tile[kMr * 2 * hn::MaxLanes(hn::ScalableTag<float>())];
        const int64_t ic = (task / groups) * mc_max;
        const int64_t mc = std::min(mc_max, g.m - ic);
        const int64_t g0 = (task % groups) * kColumnGroup;
        const int64_t g1 = std::min(nc, g0 + kColumnGroup);
        for (int64_t jr = g0; jr < g1; jr += nr_max) {
          const int64_t nr = std::min(nr_max, g1 - jr);
          const float* bp = bp_all + jr * kc;
          for (int64_t ir = 0; ir < mc; ir += kMr) {
            const int64_t mr = std::min(kMr, mc - ir);
            const float* ap = ap_all + (ic + ir) * kc;
            float* c = g.c + (ic + ir) * g.n + jc + jr;
            if (mr == kMr && nr == nr_max) {
              Microkernel(d, ap, bp, kc, c, g.n, add);
              continue;
            }
            // Edge tile: run the full microkernel on a local tile, copy the valid part.
            for (int64_t i = 0; i < mr; ++i) {
              for (int64_t j = 0; j < nr; ++j) {
                tile[i * nr_max + j] = add ? c[i * g.n + j] : 0.0f;
              }
            }
            Microkernel(d, ap, bp, kc, tile, nr_max, add);
            for (int64_t i = 0; i < mr; ++i) {
              std::copy(tile + i * nr_max, tile + i * nr_max + nr, c + i * g.n);
            }
          }
        }
      });
    }
  }
}

}  // namespace lockstep::rk::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace lockstep::rk::simd {
HWY_EXPORT(Gemm);
void Gemm(const GemmArgs& g) { HWY_DYNAMIC_DISPATCH(Gemm)(g); }
}  // namespace lockstep::rk::simd
#endif
