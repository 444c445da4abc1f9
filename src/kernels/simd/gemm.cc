

// SIMD GEMM: packed panels and a register-blocked microkernel (Goto/BLIS structure).
//
// The contract (docs/numerics.md, "GEMM") fixes, for every output element, the order of its
// fused multiply-adds: the reduced index in chunks of kGemmKChunk, each chunk accumulated from
// +0 in increasing order, the chunk sums added in order. The KC blocking of the Goto loop nest
// *is* that chunking, and a microkernel lane owns exactly one output element, so every
// vector width, tile size and thread split gives the reference's bits. Threads split output
// elements, never the reduction: rows (the chunk loop pc sequential, with a barrier between
// chunks), or, for a C of few rows and many columns, columns (each thread alone on its share).
// GemmXWt with at most kGemvMaxRows rows (decode) skips the packing: Gemv, below.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels/simd/gemm.cc"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>
#include <hwy/cache_control.h>

#include <algorithm>
#include <bit>
#include <type_traits>

#include "kernels/impl.h"
#include "lockstep/core.h"

HWY_BEFORE_NAMESPACE();
namespace lockstep::rk::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

constexpr int64_t kMr = 6;                // microkernel rows
constexpr int64_t kKc = kGemmKChunk;      // the contract's chunk is the K block
constexpr int64_t kMcPanels = 16;         // row panels of A per packed block (L2-resident)
constexpr int64_t kNc = 8192;             // columns of B packed per panel (L3-resident)

// Transposes the 4x4 block whose rows are r0..r3: on return r_p holds column p.
HWY_INLINE void Transpose4x4(hn::Full128<float> d4, hn::Vec128<float>& r0, hn::Vec128<float>& r1,
                             hn::Vec128<float>& r2, hn::Vec128<float>& r3) {
  const auto t0 = hn::InterleaveLower(d4, r0, r1);  // r0[0] r1[0] r0[1] r1[1]
  const auto t1 = hn::InterleaveLower(d4, r2, r3);  // r2[0] r3[0] r2[1] r3[1]
  const auto t2 = hn::InterleaveUpper(d4, r0, r1);  // r0[2] r1[2] r0[3] r1[3]
  const auto t3 = hn::InterleaveUpper(d4, r2, r3);  // r2[2] r3[2] r2[3] r3[3]
  r0 = hn::ConcatLowerLower(d4, t1, t0);
  r1 = hn::ConcatUpperUpper(d4, t1, t0);
  r2 = hn::ConcatLowerLower(d4, t3, t2);
  r3 = hn::ConcatUpperUpper(d4, t3, t2);
}

// Packs rows [i0, i0+mc) x reduced [r0, r0+kc) of A as panels of kMr rows: row i0 + q*kMr + i
// at ap[q*kMr*kc + p*kMr + i], the last panel zero-padded. Packing only moves bytes: how it is
// done never changes a result.
void PackA(const GemmArgs& g, int64_t i0, int64_t mc, int64_t r0, int64_t kc, float* ap) {
  const hn::Full128<float> d4;
  const hn::Full64<float> d2;
  const int64_t full = mc / kMr;  // whole panels
  if (mc % kMr != 0) std::fill(ap + full * kMr * kc, ap + (full + 1) * kMr * kc, 0.0f);
  if (g.a_cs == 1) {
    // Rows contiguous: each panel walks its rows side by side, four reduced steps at a time
    // (rows 0-3 by a 4x4 transpose, rows 4-5 zipped), writing sequentially.
    static_assert(kMr == 6, "the vector path packs six rows");
    for (int64_t q = 0; q * kMr < mc; ++q) {
      const int64_t mr = std::min(kMr, mc - q * kMr);
      float* const panel = ap + q * kMr * kc;
      const float* src[kMr];
      for (int64_t i = 0; i < mr; ++i) src[i] = g.a + (i0 + q * kMr + i) * g.a_rs + r0;
      int64_t p = 0;
      for (; mr == kMr && p + 4 <= kc; p += 4) {
        auto v0 = hn::LoadU(d4, src[0] + p), v1 = hn::LoadU(d4, src[1] + p);
        auto v2 = hn::LoadU(d4, src[2] + p), v3 = hn::LoadU(d4, src[3] + p);
        const auto v4 = hn::LoadU(d4, src[4] + p), v5 = hn::LoadU(d4, src[5] + p);
        Transpose4x4(d4, v0, v1, v2, v3);
        const auto lo = hn::InterleaveLower(d4, v4, v5);  // r4[0] r5[0] r4[1] r5[1]
        const auto hi = hn::InterleaveUpper(d4, v4, v5);  // r4[2] r5[2] r4[3] r5[3]
        float* out = panel + p * kMr;
        hn::StoreU(v0, d4, out);
        hn::StoreU(hn::LowerHalf(d2, lo), d2, out + 4);
        hn::StoreU(v1, d4, out + 6);
        hn::StoreU(hn::UpperHalf(d2, lo), d2, out + 10);
        hn::StoreU(v2, d4, out + 12);
        hn::StoreU(hn::LowerHalf(d2, hi), d2, out + 16);
        hn::StoreU(v3, d4, out + 18);
        hn::StoreU(hn::UpperHalf(d2, hi), d2, out + 22);
      }
      for (; p < kc; ++p) {
        for (int64_t i = 0; i < mr; ++i) panel[p * kMr + i] = src[i][p];
      }
    }
    return;
  }
  // Columns contiguous (A is a transposed activation): walk the reduced steps, each one's mc
  // values contiguous when a_rs == 1, and deal them out to the panels.
  for (int64_t p = 0; p < kc; ++p) {
    const float* src = g.a + (r0 + p) * g.a_cs + i0 * g.a_rs;
    int64_t q = 0;
    for (; g.a_rs == 1 && q < full; ++q) {
      float* out = ap + q * kMr * kc + p * kMr;
      hn::StoreU(hn::LoadU(d4, src + q * kMr), d4, out);
      hn::StoreU(hn::LoadU(d2, src + q * kMr + 4), d2, out + 4);
    }
    for (int64_t i = q * kMr; i < mc; ++i) {
      ap[i / kMr * kMr * kc + p * kMr + i % kMr] = src[i * g.a_rs];
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
    return;
  }
  // Columns of B contiguous (B is a transposed weight): 4x4 blocks, transposed in registers.
  const auto column = [&](int64_t j) { return g.b + (j0 + j) * g.b_cs + r0 * g.b_rs; };
  int64_t j = 0;
  if (g.b_rs == 1) {
    const hn::Full128<float> d4;
    const int64_t kc4 = kc / 4 * 4;
    for (; j + 4 <= nr; j += 4) {
      const float *s0 = column(j), *s1 = column(j + 1), *s2 = column(j + 2), *s3 = column(j + 3);
      for (int64_t p = 0; p < kc4; p += 4) {
        auto v0 = hn::LoadU(d4, s0 + p), v1 = hn::LoadU(d4, s1 + p);
        auto v2 = hn::LoadU(d4, s2 + p), v3 = hn::LoadU(d4, s3 + p);
        Transpose4x4(d4, v0, v1, v2, v3);
        float* out = bp + p * nr_max + j;
        hn::StoreU(v0, d4, out);
        hn::StoreU(v1, d4, out + nr_max);
        hn::StoreU(v2, d4, out + 2 * nr_max);
        hn::StoreU(v3, d4, out + 3 * nr_max);
      }
      for (int64_t p = kc4; p < kc; ++p) {
        for (int64_t jj = j; jj < j + 4; ++jj) bp[p * nr_max + jj] = column(jj)[p];
      }
    }
  }
  for (; j < nr; ++j) {
    const float* src = column(j);
    for (int64_t p = 0; p < kc; ++p) bp[p * nr_max + j] = src[p * g.b_rs];
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

// ---- Decode: GemmXWt with at most kGemvMaxRows rows ----
//
// Decoding a token multiplies 1 (batch 1) to 8 (batch 8) rows of activations by every weight
// matrix, W[n, k] stored row by row. The loop nest above then costs what it saves: it copies
// all of W, transposed, into packed panels on every call, and runs the 6-row microkernel on
// tiles mostly of zero rows; it read W at 6-12 GB/s where the machine streams 25-30. Here each
// vector lane owns one output column j (one row of W) for the whole reduction, and W is read
// once, in place: L rows x L reduced steps are loaded and transposed in registers, so vector q
// holds W[j0..j0+L, r+q], and each output row's accumulator takes the L steps as fused
// multiply-adds in increasing r. Per lane this is the contract's chain exactly: each chunk of
// kKc from +0 in order, the chunk sums added in order (onto the old output when accumulating).
// Threads split the columns. Up to 8 rows it beat the loop nest on every decode shape measured
// (docs/performance.md, "Generation"): 2.3-3.2x at one row, 1.5-2.4x at eight (AVX-512).
// A weight multiplied many times (the decoder's linears) is packed once instead (PackGemv): the
// same lanes' steps read as one stream, without the transposes.

// Transposes the L x L tile (L = lanes of d, a multiple of 4) whose row l is t[l]: on return
// t[q] holds column q. 4x4 transposes within each 128-bit block, then the blocks themselves
// (adjacent ones swapped, then 256-bit halves), so every target uses the same few shuffles.
template <class D>
HWY_INLINE void TransposeTile(D d, hn::Vec<D>* t) {
  constexpr size_t L = hn::MaxLanes(D());
  static_assert(L % 4 == 0 && L <= 16, "4, 8 or 16 float lanes");
  const hn::Repartition<uint64_t, D> d64;
  using V = hn::Vec<D>;
  V u[L];
  for (size_t g = 0; g < L; g += 4) {  // rows g..g+3; u[g + c] block b: column 4b + c
    const auto t0 = hn::BitCast(d64, hn::InterleaveLower(d, t[g], t[g + 1]));
    const auto t1 = hn::BitCast(d64, hn::InterleaveLower(d, t[g + 2], t[g + 3]));
    const auto t2 = hn::BitCast(d64, hn::InterleaveUpper(d, t[g], t[g + 1]));
    const auto t3 = hn::BitCast(d64, hn::InterleaveUpper(d, t[g + 2], t[g + 3]));
    u[g + 0] = hn::BitCast(d, hn::InterleaveLower(d64, t0, t1));
    u[g + 1] = hn::BitCast(d, hn::InterleaveUpper(d64, t0, t1));
    u[g + 2] = hn::BitCast(d, hn::InterleaveLower(d64, t2, t3));
    u[g + 3] = hn::BitCast(d, hn::InterleaveUpper(d64, t2, t3));
  }
  if constexpr (L >= 8) {  // blocks: u[4g + c] block b -> block g of column 4b + c
    for (size_t g = 0; g < L; g += 8) {
      for (size_t c = 0; c < 4; ++c) {
        const V x = u[g + c], y = u[g + 4 + c];
        u[g + c] = hn::OddEvenBlocks(hn::SwapAdjacentBlocks(y), x);
        u[g + 4 + c] = hn::OddEvenBlocks(y, hn::SwapAdjacentBlocks(x));
      }
    }
  }
  if constexpr (L == 16) {
    for (size_t c = 0; c < 8; ++c) {
      const V x = u[c], y = u[8 + c];
      u[c] = hn::ConcatLowerLower(d, y, x);
      u[8 + c] = hn::ConcatUpperUpper(d, y, x);
    }
  }
  for (size_t q = 0; q < L; ++q) t[q] = u[q];
}

// Output rows [0, M) x columns [j0, j0 + L) of C (those below n), lane l owning column j0 + l.
template <int M, class D>
HWY_NOINLINE void GemvColumns(D d, const GemmArgs& g, int64_t j0) {
  using V = hn::Vec<D>;
  constexpr int64_t L = hn::MaxLanes(D());
  const int64_t cols = std::min(L, g.n - j0);
  const float* w[L];  // lane l's row of W; past n a repeat of the last, its lanes discarded
  for (int64_t l = 0; l < L; ++l) w[l] = g.b + std::min(j0 + l, g.n - 1) * g.b_cs;
  HWY_ALIGN float buf[L * L];
  V out[M];
  for (int64_t pc = 0; pc < g.k; pc += kKc) {
    const int64_t pend = std::min(g.k, pc + kKc);
    V s[M];
    for (int i = 0; i < M; ++i) s[i] = hn::Zero(d);
    const auto steps = [&](const V* t, int64_t r, int64_t count) {
      for (int64_t q = 0; q < count; ++q) {
        for (int i = 0; i < M; ++i)
          s[i] = hn::MulAdd(hn::Set(d, g.a[i * g.a_rs + r + q]), t[q], s[i]);
      }
    };
    int64_t r = pc;
    for (; r + L <= pend; r += L) {
      V t[L];
      for (int64_t l = 0; l < L; ++l) t[l] = hn::LoadU(d, w[l] + r);
      TransposeTile(d, t);
      steps(t, r, L);
    }
    if (r < pend) {  // the last chunk's last pend - r < L steps
      std::fill(buf, buf + L * L, 0.0f);
      V t[L];
      for (int64_t l = 0; l < L; ++l) {
        std::copy(w[l] + r, w[l] + pend, buf + l * L);
        t[l] = hn::Load(d, buf + l * L);
      }
      TransposeTile(d, t);
      steps(t, r, pend - r);
    }
    for (int i = 0; i < M; ++i) {
      if (pc > 0) {
        out[i] = hn::Add(out[i], s[i]);
      } else if (g.accumulate) {
        std::copy(g.c + i * g.n + j0, g.c + i * g.n + j0 + cols, buf);
        out[i] = hn::Add(hn::LoadU(d, buf), s[i]);
      } else {
        out[i] = s[i];
      }
    }
  }
  for (int i = 0; i < M; ++i) {
    hn::Store(out[i], d, buf);
    std::copy(buf, buf + cols, g.c + i * g.n + j0);
  }
}

template <int M>
void GemvRows(const GemmArgs& g) {
  const hn::ScalableTag<float> d;
  constexpr int64_t L = hn::MaxLanes(hn::ScalableTag<float>());
  const int64_t blocks = (g.n + L - 1) / L, threads = Threads();
  ParallelForEachThread([&](int64_t t) {
    for (int64_t b = blocks * t / threads; b < blocks * (t + 1) / threads; ++b) {
      GemvColumns<M>(d, g, b * L);
    }
  });
}

// f(std::integral_constant<int, M>()) for M = m, 1 .. kGemvMaxRows: the row count as a
// template argument, so that each few-row kernel keeps its M accumulators in registers.
template <class F>
void WithRows(int64_t m, F&& f) {
  static_assert(kGemvMaxRows == 8);
  switch (m) {
    case 1:
      return f(std::integral_constant<int, 1>());
    case 2:
      return f(std::integral_constant<int, 2>());
    case 3:
      return f(std::integral_constant<int, 3>());
    case 4:
      return f(std::integral_constant<int, 4>());
    case 5:
      return f(std::integral_constant<int, 5>());
    case 6:
      return f(std::integral_constant<int, 6>());
    case 7:
      return f(std::integral_constant<int, 7>());
    default:
      return f(std::integral_constant<int, 8>());
  }
}

void Gemv(const GemmArgs& g) {
  WithRows(g.m, [&](auto rows) { GemvRows<decltype(rows)::value>(g); });
}

int64_t GemvLanes() { return static_cast<int64_t>(hn::MaxLanes(hn::ScalableTag<float>())); }

// Block b of L columns: packed[(b·k + r)·L + l] = W[j0 + l, r], j0 = b·L, past n a repeat of the
// last row (as GemvColumns' lanes past n); as bf16 (T = uint16_t) each value's upper 16 bits,
// which are the whole value when it is a bfloat16 (PackForGemv has checked that it is).
template <typename T>
void PackGemvAs(const float* w, int64_t n, int64_t k, T* packed) {
  const int64_t L = GemvLanes(), blocks = (n + L - 1) / L;
  ParallelFor(blocks, [&](int64_t b) {
    T* out = packed + b * k * L;
    for (int64_t l = 0; l < L; ++l) {
      const float* row = w + std::min(b * L + l, n - 1) * k;
      for (int64_t r = 0; r < k; ++r) {
        if constexpr (std::is_same_v<T, float>) {
          out[r * L + l] = row[r];
        } else {
          out[r * L + l] = static_cast<uint16_t>(std::bit_cast<uint32_t>(row[r]) >> 16);
        }
      }
    }
  });
}
void PackGemv(const float* w, int64_t n, int64_t k, float* packed) { PackGemvAs(w, n, k, packed); }
void PackGemvBf16(const float* w, int64_t n, int64_t k, uint16_t* packed) {
  PackGemvAs(w, n, k, packed);
}

// Vector r of a packed block: L floats, or L bfloat16s widened exactly (their bits shifted into
// the upper half of a binary32).
template <class D>
HWY_INLINE hn::Vec<D> LoadPacked(D d, const float* p) {
  return hn::LoadU(d, p);
}
template <class D>
HWY_INLINE hn::Vec<D> LoadPacked(D d, const uint16_t* p) {
  const hn::RebindToUnsigned<D> du;
  const hn::Rebind<uint16_t, D> d16;
  return hn::BitCast(d, hn::ShiftLeft<16>(hn::PromoteTo(du, hn::LoadU(d16, p))));
}

// GemvColumns on NB consecutive packed blocks: vector r of block b is W[j0 + b·L .. + L, r], the
// same steps in the same order. With few rows each block's chain of fused multiply-adds waits on
// the one before, so several blocks run side by side (their chains independent). Each stream is
// prefetched 4 KiB ahead (into the next block near a block's end).
inline constexpr int64_t kGemvPrefetchBytes = 4096;
template <int M, int NB, class D, typename T>
HWY_NOINLINE void GemvPackedColumns(D d, const float* x, const T* first, float* y, int64_t n,
                                    int64_t k, int64_t j0) {
  using V = hn::Vec<D>;
  constexpr int64_t L = hn::MaxLanes(D());
  HWY_ALIGN float buf[L];
  V out[NB][M];
  for (int64_t pc = 0; pc < k; pc += kKc) {
    const int64_t pend = std::min(k, pc + kKc);
    V s[NB][M];
    for (int b = 0; b < NB; ++b) {
      for (int i = 0; i < M; ++i) s[b][i] = hn::Zero(d);
    }
    for (int64_t r = pc; r < pend; ++r) {
      for (int b = 0; b < NB; ++b) {
        const T* at = first + (b * k + r) * L;
        hwy::Prefetch(reinterpret_cast<const char*>(at) + kGemvPrefetchBytes);
        const V t = LoadPacked(d, at);
        for (int i = 0; i < M; ++i) s[b][i] = hn::MulAdd(hn::Set(d, x[i * k + r]), t, s[b][i]);
      }
    }
    for (int b = 0; b < NB; ++b) {
      for (int i = 0; i < M; ++i) out[b][i] = pc > 0 ? hn::Add(out[b][i], s[b][i]) : s[b][i];
    }
  }
  for (int b = 0; b < NB; ++b) {
    const int64_t j = j0 + b * L, cols = std::min(L, n - j);
    for (int i = 0; i < M; ++i) {
      hn::Store(out[b][i], d, buf);
      std::copy(buf, buf + cols, y + i * n + j);
    }
  }
}

template <int M, typename T>
void GemvPackedRows(const float* x, const T* packed, float* y, int64_t n, int64_t k) {
  const hn::ScalableTag<float> d;
  constexpr int64_t L = hn::MaxLanes(hn::ScalableTag<float>());
  constexpr int NB = M == 1 ? 4 : M == 2 ? 2 : 1;  // blocks side by side: M·NB chains
  const int64_t blocks = (n + L - 1) / L, threads = Threads();
  ParallelForEachThread([&](int64_t t) {
    const int64_t end = blocks * (t + 1) / threads;
    int64_t b = blocks * t / threads;
    for (; b + NB <= end; b += NB)
      GemvPackedColumns<M, NB>(d, x, packed + b * k * L, y, n, k, b * L);
    for (; b < end; ++b) GemvPackedColumns<M, 1>(d, x, packed + b * k * L, y, n, k, b * L);
  });
}

void GemvPacked(const float* x, const float* packed, float* y, int64_t m, int64_t n, int64_t k) {
  WithRows(m, [&](auto rows) { GemvPackedRows<decltype(rows)::value>(x, packed, y, n, k); });
}
void GemvPackedBf16(const float* x, const uint16_t* packed, float* y, int64_t m, int64_t n,
                    int64_t k) {
  WithRows(m, [&](auto rows) { GemvPackedRows<decltype(rows)::value>(x, packed, y, n, k); });
}

void Gemm(const GemmArgs& g) {
  const hn::ScalableTag<float> d;
  const int64_t nr_max = 2 * static_cast<int64_t>(hn::Lanes(d));
  if (g.k == 0) {  // the empty sum: +0, or the output unchanged when accumulating
    if (!g.accumulate) std::fill(g.c, g.c + g.m * g.n, 0.0f);
    return;
  }
  // GemmXWt (x rows and W rows contiguous along the reduction) with few rows: decode.
  if (g.m <= kGemvMaxRows && g.a_cs == 1 && g.b_rs == 1) return Gemv(g);
  const int64_t threads = Threads();
  const int64_t a_panels = (g.m + kMr - 1) / kMr;
  // Rows [ic, ic + mc) of A, packed in ap_block, times slivers [0, nc) of a packed B panel bp
  // (columns jc.. of C, kc terms of the chunk): C tile by tile.
  const auto multiply = [&](const float* ap_block, int64_t ic, int64_t mc, const float* bp_panel,
                            int64_t jc, int64_t nc, int64_t kc, bool add) {
    HWY_ALIGN float tile[kMr * 2 * hn::MaxLanes(hn::ScalableTag<float>())];
    for (int64_t jr = 0; jr < nc; jr += nr_max) {
      const int64_t nr = std::min(nr_max, nc - jr);
      const float* bp = bp_panel + jr * kc;
      for (int64_t ir = 0; ir < mc; ir += kMr) {
        const int64_t mr = std::min(kMr, mc - ir);
        const float* ap = ap_block + ir * kc;
        float* c = g.c + (ic + ir) * g.n + jc + jr;
        if (mr == kMr && nr == nr_max) {
          Microkernel(d, ap, bp, kc, c, g.n, add);
          continue;
        }
        // Edge tile: run the full microkernel on a local tile, copy the valid part.
        for (int64_t i = 0; i < mr; ++i) {
          for (int64_t j = 0; j < nr; ++j) tile[i * nr_max + j] = add ? c[i * g.n + j] : 0.0f;
        }
        Microkernel(d, ap, bp, kc, tile, nr_max, add);
        for (int64_t i = 0; i < mr; ++i) {
          std::copy(tile + i * nr_max, tile + i * nr_max + nr, c + i * g.n);
        }
      }
    }
  };
  // Slivers [sl0, sl1) of the B panel of columns jc.., chunk pc (nc columns, kc terms) into bp.
  const auto pack_slivers = [&](int64_t pc, int64_t kc, int64_t jc, int64_t nc, int64_t sl0,
                                int64_t sl1, float* bp) {
    for (int64_t sl = sl0; sl < sl1; ++sl) {
      const int64_t j0 = sl * nr_max;
      PackB(g, pc, kc, jc + j0, std::min(nr_max, nc - j0), nr_max, bp + j0 * kc);
    }
  };
  if (threads > 1 && g.m * threads <= g.n) {
    // Few rows, many columns (the dW of a small projection): thread t owns a range of C's
    // columns and runs the whole loop nest on them alone, packing all of A and its own slivers
    // of B. Nothing is shared, so no chunk waits for another thread; per element the chunks
    // are still added in order. Split by rows, each thread read the whole shared B panel, half
    // of it from the other core's cache, every chunk: bench-8x512's dW of wk and wv
    // (128 x 512 over 2048 rows) ran slower at two threads than at one (225 against 246
    // GFLOP/s), and at 410-417 this way.
    ParallelForEachThread([&](int64_t t) {
      const int64_t slivers = (g.n + nr_max - 1) / nr_max;
      const int64_t j_begin = slivers * t / threads * nr_max;
      const int64_t j_end = std::min(g.n, slivers * (t + 1) / threads * nr_max);
      if (j_begin >= j_end) return;
      float* const ap_block =
          ScratchFloats(Scratch::kGemmA, static_cast<size_t>(kKc * kMr * kMcPanels));
      float* const bp = ScratchFloats(
          Scratch::kGemmB, static_cast<size_t>(kKc * std::min(kNc, (j_end - j_begin + nr_max - 1) /
                                                                       nr_max * nr_max)));
      for (int64_t jc = j_begin; jc < j_end; jc += kNc) {
        const int64_t nc = std::min(kNc, j_end - jc);
        for (int64_t pc = 0; pc < g.k; pc += kKc) {
          const int64_t kc = std::min(kKc, g.k - pc);
          pack_slivers(pc, kc, jc, nc, 0, (nc + nr_max - 1) / nr_max, bp);
          for (int64_t pb = 0; pb < a_panels; pb += kMcPanels) {
            const int64_t ic = pb * kMr, mc = std::min((pb + kMcPanels) * kMr, g.m) - ic;
            PackA(g, ic, mc, pc, kc, ap_block);
            multiply(ap_block, ic, mc, bp, jc, nc, kc, g.accumulate || pc > 0);
          }
        }
      }
    });
    return;
  }
  // Split by rows, the loop nest runs steps (column panel jc, chunk pc) in order, jc outer, pc
  // inner. Thread t owns the same rows of C in every step, so its block of C and the A rows it
  // packs stay in its core's caches; sharing them across cores through dynamically claimed
  // tasks cost 2-12 % at two threads on bench-8x512's layer shapes. The B panel of a step is
  // shared: each thread packs a share of it into one of two buffers during the previous step,
  // and the return of each step's ParallelForEachThread is the barrier that completes chunk pc
  // everywhere before chunk pc+1 is added.
  const int64_t panel_cols = std::min(kNc, (g.n + nr_max - 1) / nr_max * nr_max);
  const int64_t b_floats = kKc * panel_cols;
  float* const bp_buf = ScratchFloats(Scratch::kGemmB, static_cast<size_t>(2 * b_floats));
  const int64_t chunks = (g.k + kKc - 1) / kKc;
  const int64_t steps = (g.n + kNc - 1) / kNc * chunks;
  struct Step {
    int64_t jc, nc, pc, kc, slivers;
    float* bp;
  };
  const auto step_at = [&](int64_t s) {
    const int64_t jc = s / chunks * kNc, pc = s % chunks * kKc;
    const int64_t nc = std::min(kNc, g.n - jc);
    return Step{jc, nc, pc, std::min(kKc, g.k - pc), (nc + nr_max - 1) / nr_max,
                bp_buf + s % 2 * b_floats};
  };
  const auto pack_b_share = [&](const Step& st, int64_t t) {
    pack_slivers(st.pc, st.kc, st.jc, st.nc, st.slivers * t / threads,
                 st.slivers * (t + 1) / threads, st.bp);
  };
  const Step first = step_at(0);
  ParallelForEachThread([&](int64_t t) { pack_b_share(first, t); });
  for (int64_t s = 0; s < steps; ++s) {
    const Step st = step_at(s);
    const bool add = g.accumulate || st.pc > 0;
    ParallelForEachThread([&](int64_t t) {
      // This thread's row panels, in blocks of kMcPanels: a block of A is packed into the
      // thread's own scratch (L2-resident) and multiplied by every sliver of the B panel.
      float* const ap_block =
          ScratchFloats(Scratch::kGemmA, static_cast<size_t>(kKc * kMr * kMcPanels));
      const int64_t p_end = a_panels * (t + 1) / threads;
      for (int64_t pb = a_panels * t / threads; pb < p_end; pb += kMcPanels) {
        const int64_t ic = pb * kMr;
        const int64_t mc = std::min(std::min(p_end, pb + kMcPanels) * kMr, g.m) - ic;
        PackA(g, ic, mc, st.pc, st.kc, ap_block);
        multiply(ap_block, ic, mc, st.bp, st.jc, st.nc, st.kc, add);
      }
      if (s + 1 < steps) pack_b_share(step_at(s + 1), t);
    });
  }
}

}  // namespace lockstep::rk::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace lockstep::rk::simd {
HWY_EXPORT(Gemm);
HWY_EXPORT(GemvLanes);
HWY_EXPORT(PackGemv);
HWY_EXPORT(GemvPacked);
HWY_EXPORT(PackGemvBf16);
HWY_EXPORT(GemvPackedBf16);
void Gemm(const GemmArgs& g) { HWY_DYNAMIC_DISPATCH(Gemm)(g); }
int64_t GemvLanes() { return HWY_DYNAMIC_DISPATCH(GemvLanes)(); }
void PackGemv(const float* w, int64_t n, int64_t k, float* packed) {
  HWY_DYNAMIC_DISPATCH(PackGemv)(w, n, k, packed);
}
void GemvPacked(const float* x, const float* packed, float* y, int64_t m, int64_t n, int64_t k) {
  HWY_DYNAMIC_DISPATCH(GemvPacked)(x, packed, y, m, n, k);
}
void PackGemvBf16(const float* w, int64_t n, int64_t k, uint16_t* packed) {
  HWY_DYNAMIC_DISPATCH(PackGemvBf16)(w, n, k, packed);
}
void GemvPackedBf16(const float* x, const uint16_t* packed, float* y, int64_t m, int64_t n,
                    int64_t k) {
  HWY_DYNAMIC_DISPATCH(GemvPackedBf16)(x, packed, y, m, n, k);
}
}  // namespace lockstep::rk::simd
#endif
