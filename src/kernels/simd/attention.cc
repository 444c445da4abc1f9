// SIMD causal grouped-query attention (flash-style), bit-identical to ref/attention.cc.
//
// Every matrix product here is one shape: for each row i, c[i][x] += a(i, r) * b[r][x] summed
// over r in [lo_i, hi_i) in increasing order (AccumulateRows). A vector lane owns one output x
// and runs the reference's sequential fused chain over r, so neither the lane width, the
// register blocking nor the thread split changes any bit. The products are:
//   forward   scores  S[t][j]  = q_t · k_j    (r = d; b = K tile transposed to [d][j])
//             values  acc[t][x] += p_tj v_j[x] (r = j; b = V tile rows plus a column of ones,
//                                               whose lane accumulates l = sum p exactly)
//   backward  S, dP[t][j] = dout_t · v_j      (r = d, as above)
//             dq[t]  += ds_tj k_j  (r = j),  dk[j] += ds_tj q_t,  dv[j] += p_tj dout_t  (r = t)
// Masked pairs are excluded through the per-row ranges [lo_i, hi_i), exactly as the reference
// skips them. Tiles that no row of a block can see are never visited.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels/simd/attention.cc"
// clang-format off
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>
// clang-format on

#include <algorithm>
#include <array>
#include <cmath>
#include <limits>

#include "kernels/attention_impl.h"
#include "kernels/impl.h"
#include "kernels/simd/dmath-inl.h"
#include "lockstep/core.h"

HWY_BEFORE_NAMESPACE();
namespace lockstep::rk::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;
using DF = hn::ScalableTag<float>;
using VF = hn::Vec<DF>;

constexpr int64_t kTile = kAttentionKeyTile;
// Queries per block (performance only: the order of every sum is fixed per output).
constexpr int64_t kQueryBlock = 64;
constexpr int kBlockRows = 4;  // register block: rows x 2 vectors of accumulators
constexpr float kInf = std::numeric_limits<float>::infinity();

// c[i*ldc + x] += sum_{r = lo_i}^{hi_i - 1} a[i*a_is + r*a_rs] * b[r*ldb + x], x < width.
struct RowsTimesPanel {
  const float* a;
  int64_t a_is, a_rs;
  const float* b;
  int64_t ldb;
  float* c;
  int64_t ldc;
  int64_t width;  // a multiple of the lane count
};

// Rows [i0, i0+R) x vectors [x0, x0 + V*lanes), terms r in [lo, hi).
template <int R, int V>
HWY_INLINE void Block(DF d, const RowsTimesPanel& p, int64_t i0, int64_t x0, int64_t lo,
                      int64_t hi) {
  const int64_t n = static_cast<int64_t>(hn::Lanes(d));
  VF acc[R][V];
#pragma GCC unroll 8
  for (int i = 0; i < R; ++i) {
#pragma GCC unroll 8
    for (int v = 0; v < V; ++v) acc[i][v] = hn::LoadU(d, p.c + (i0 + i) * p.ldc + x0 + v * n);
  }
  const float* a = p.a + i0 * p.a_is + lo * p.a_rs;
  const float* b = p.b + lo * p.ldb + x0;
  for (int64_t r = lo; r < hi; ++r, a += p.a_rs, b += p.ldb) {
    VF bv[V];
#pragma GCC unroll 8
    for (int v = 0; v < V; ++v) bv[v] = hn::LoadU(d, b + v * n);
#pragma GCC unroll 8
    for (int i = 0; i < R; ++i) {
      const VF ai = hn::Set(d, a[i * p.a_is]);
#pragma GCC unroll 8
      for (int v = 0; v < V; ++v) acc[i][v] = hn::MulAdd(ai, bv[v], acc[i][v]);
    }
  }
#pragma GCC unroll 8
  for (int i = 0; i < R; ++i) {
#pragma GCC unroll 8
    for (int v = 0; v < V; ++v) hn::StoreU(acc[i][v], d, p.c + (i0 + i) * p.ldc + x0 + v * n);
  }
}

// Register blocks: rows x vectors of accumulators, plus one vector per column of b and one
// broadcast. x86 targets narrower than AVX-512 have 16 vector registers; AVX-512 and Arm have
// 32, where 4 x 5 (a head of 64 values and the ones column, at 16 lanes) keeps 20 chains in
// flight instead of 8: the FMA latency, not the loads, bounded the 4 x 2 block.
constexpr int kRowsWide = HWY_ARCH_X86 && HWY_MAX_BYTES < 64 ? 2 : 5;  // vectors, 4-row blocks
constexpr int kRowWide = HWY_ARCH_X86 && HWY_MAX_BYTES < 64 ? 4 : 5;   // vectors, single rows

// Rows [i0, i0+R) x vectors [x, width) in blocks of W vectors, then the rest in narrower ones.
template <int R, int W>
HWY_INLINE void Blocks(DF d, const RowsTimesPanel& p, int64_t i0, int64_t x, int64_t lo,
                       int64_t hi) {
  const int64_t n = static_cast<int64_t>(hn::Lanes(d));
  for (; x + W * n <= p.width; x += W * n) Block<R, W>(d, p, i0, x, lo, hi);
  if constexpr (W > 1) {
    if (x < p.width) Blocks<R, W - 1>(d, p, i0, x, lo, hi);
  }
}

void AccumulateRow(DF d, const RowsTimesPanel& p, int64_t i, int64_t lo, int64_t hi) {
  if (lo < hi) Blocks<1, kRowWide>(d, p, i, 0, lo, hi);
}

// Rows of a register block share the terms [max lo, min hi); each row's own leading and
// trailing terms are added before and after it, which keeps every row's order increasing.
void AccumulateRows(DF d, const RowsTimesPanel& p, int64_t rows, const int64_t* lo,
                    const int64_t* hi) {
  int64_t i0 = 0;
  for (; i0 + kBlockRows <= rows; i0 += kBlockRows) {
    const int64_t shared_lo = *std::max_element(lo + i0, lo + i0 + kBlockRows);
    const int64_t shared_hi = *std::min_element(hi + i0, hi + i0 + kBlockRows);
    if (shared_lo >= shared_hi) {
      for (int64_t i = i0; i < i0 + kBlockRows; ++i) AccumulateRow(d, p, i, lo[i], hi[i]);
      continue;
    }
    for (int64_t i = i0; i < i0 + kBlockRows; ++i) AccumulateRow(d, p, i, lo[i], shared_lo);
    Blocks<kBlockRows, kRowsWide>(d, p, i0, 0, shared_lo, shared_hi);
    for (int64_t i = i0; i < i0 + kBlockRows; ++i) AccumulateRow(d, p, i, shared_hi, hi[i]);
  }
  for (; i0 < rows; ++i0) AccumulateRow(d, p, i0, lo[i0], hi[i0]);
}

// out[i] = the reference's Dot of rows a_i and b_i (a_i at a + i*stride, b_i likewise): one
// sequential fused chain per row, over n terms. Eight rows' chains run side by side, since one
// chain alone waits on each FMA's latency.
void RowDots(const float* a, const float* b, int64_t stride, int64_t rows, int64_t n, float* out) {
  constexpr int64_t kChains = 8;
  int64_t i0 = 0;
  for (; i0 + kChains <= rows; i0 += kChains) {
    float acc[kChains] = {};
    for (int64_t x = 0; x < n; ++x) {
      for (int64_t c = 0; c < kChains; ++c) {
        acc[c] = std::fma(a[(i0 + c) * stride + x], b[(i0 + c) * stride + x], acc[c]);
      }
    }
    std::copy(acc, acc + kChains, out + i0);
  }
  for (; i0 < rows; ++i0) {
    float acc = 0.0f;
    for (int64_t x = 0; x < n; ++x) acc = std::fma(a[i0 * stride + x], b[i0 * stride + x], acc);
    out[i0] = acc;
  }
}

// Consecutive arrays of the given float counts in this thread's attention scratch, each
// 64-byte aligned. Contents are undefined: callers fill what they read.
template <size_t N>
std::array<float*, N> ScratchArrays(const std::array<int64_t, N>& floats) {
  constexpr int64_t kAlign = 16;  // floats
  int64_t total = 0;
  for (const int64_t f : floats) total += (f + kAlign - 1) / kAlign * kAlign;
  float* at = ScratchFloats(Scratch::kAttention, static_cast<size_t>(total));
  std::array<float*, N> arrays;
  for (size_t i = 0; i < N; ++i) {
    arrays[i] = at;
    at += (floats[i] + kAlign - 1) / kAlign * kAlign;
  }
  return arrays;
}

int64_t RoundUp(int64_t x, int64_t m) { return (x + m - 1) / m * m; }

struct Geometry {
  explicit Geometry(const AttentionShape& s)
      : T(s.seq),
        S(s.past + s.seq),
        past(s.past),
        Hq(s.q_heads),
        Hkv(s.kv_heads),
        D(s.head_dim),
        W(s.window),
        group(s.q_heads / s.kv_heads) {}
  int64_t Q(int64_t b, int64_t t, int64_t h) const { return ((b * T + t) * Hq + h) * D; }
  int64_t Kv(int64_t b, int64_t j, int64_t g) const { return ((b * S + j) * Hkv + g) * D; }
  int64_t Lse(int64_t b, int64_t h, int64_t t) const { return (b * Hq + h) * T + t; }
  // The query at position t sees keys [FirstKey(t), t]; key j is seen by queries
  // [j, LastQuery(j)] (the backward, where past = 0 and S = T).
  int64_t FirstKey(int64_t t) const { return W > 0 ? std::max<int64_t>(0, t - W + 1) : 0; }
  int64_t LastQuery(int64_t j) const { return W > 0 ? std::min(T - 1, j + W - 1) : T - 1; }
  // T queries at positions past .. past + T - 1; S = past + T keys.
  int64_t T, S, past, Hq, Hkv, D, W, group;
};

// kt[x*kTile + j] = k_{j0+j}[x] for the keys of tile j0 (zero beyond the sequence).
void PackTransposed(const Geometry& at, const float* k, int64_t b, int64_t g, int64_t j0,
                    float* kt) {
  const int64_t kn = std::min(kTile, at.S - j0);
  std::fill(kt, kt + at.D * kTile, 0.0f);
  for (int64_t j = 0; j < kn; ++j) {
    const float* kj = k + at.Kv(b, j0 + j, g);
    for (int64_t x = 0; x < at.D; ++x) kt[x * kTile + j] = kj[x];
  }
}

// rows[i*ld + x] = src_i[x] for x < D, zero up to ld, where src_i starts at src + i*stride.
void PackRows(const float* src, int64_t stride, int64_t n, int64_t d, int64_t ld, float* rows) {
  std::fill(rows, rows + n * ld, 0.0f);
  for (int64_t i = 0; i < n; ++i) std::copy(src + i * stride, src + i * stride + d, rows + i * ld);
}

void ForwardBlock(const AttentionShape& s, const Geometry& at, const float* q, const float* k,
                  const float* v, float* out, float* lse, int64_t b, int64_t h, int64_t q0) {
  const DF d;
  const int64_t n = static_cast<int64_t>(hn::Lanes(d));
  const int64_t g = h / at.group, q1 = std::min(at.T, q0 + kQueryBlock), nq = q1 - q0;
  const int64_t ld = RoundUp(at.D + 1, n);  // value rows: D values, the ones column, padding
  const auto [acc, scores, kt, vx] =
      ScratchArrays<4>({kQueryBlock * ld, kQueryBlock * kTile, at.D * kTile, kTile * ld});
  HWY_ALIGN float m[kQueryBlock], m_new[kQueryBlock], alpha[kQueryBlock];
  int64_t lo[kQueryBlock], hi[kQueryBlock];
  std::fill(acc, acc + nq * ld, 0.0f);
  std::fill(m, m + kQueryBlock, -kInf);

  const RowsTimesPanel score_product{q + at.Q(b, q0, h), at.Hq * at.D, 1, kt, kTile,
                                     scores,             kTile,        kTile};
  const RowsTimesPanel value_product{scores, kTile, 1, vx, ld, acc, ld, ld};
  for (int64_t j0 = at.FirstKey(at.past + q0) / kTile * kTile; j0 < at.past + q1; j0 += kTile) {
    const int64_t kn = std::min(kTile, at.S - j0);
    PackTransposed(at, k, b, g, j0, kt);
    PackRows(v + at.Kv(b, j0, g), at.Hkv * at.D, kn, at.D, ld, vx);
    for (int64_t j = 0; j < kn; ++j) vx[j * ld + at.D] = 1.0f;

    std::fill(scores, scores + nq * kTile, 0.0f);
    std::fill(lo, lo + nq, 0);
    std::fill(hi, hi + nq, at.D);
    AccumulateRows(d, score_product, nq, lo, hi);

    // Scores masked and scaled, and each row's new running maximum.
    for (int64_t i = 0; i < kQueryBlock; ++i) {
      const int64_t t = at.past + q0 + i;  // the query's position
      m_new[i] = m[i];
      if (i >= nq) continue;
      lo[i] = std::max(at.FirstKey(t), j0) - j0;
      hi[i] = std::min(t + 1, j0 + kTile) - j0;
      if (lo[i] >= hi[i]) {  // no visible key in this tile: the row is left untouched
        lo[i] = hi[i] = 0;
        continue;
      }
      float* row = scores + i * kTile;
      const auto visible_lo = hn::Set(d, static_cast<float>(lo[i]));
      const auto visible_hi = hn::Set(d, static_cast<float>(hi[i]));
      VF max = hn::Set(d, -kInf);
      for (int64_t x = 0; x < kTile; x += n) {
        const VF index = hn::Iota(d, static_cast<float>(x));
        const auto visible = hn::And(hn::Ge(index, visible_lo), hn::Lt(index, visible_hi));
        const VF score = hn::IfThenElse(
            visible, hn::Mul(hn::LoadU(d, row + x), hn::Set(d, s.scale)), hn::Set(d, -kInf));
        hn::StoreU(score, d, row + x);
        max = hn::Max(max, score);
      }
      m_new[i] = std::max(m[i], hn::GetLane(hn::MaxOfLanes(d, max)));
    }
    // The rescaling factors exp(m - m_new), a vector of rows at a time: the contract's Exp is
    // the same function in every lane. (Rows left untouched, and those past nq, do not use
    // theirs.)
    for (int64_t i = 0; i < kQueryBlock; i += n) {
      hn::Store(VExp(d, hn::Sub(hn::Load(d, m + i), hn::Load(d, m_new + i))), d, alpha + i);
    }
    for (int64_t i = 0; i < nq; ++i) {
      if (lo[i] >= hi[i]) continue;
      float* row = scores + i * kTile;
      float* acc_row = acc + i * ld;
      const VF a = hn::Set(d, alpha[i]);
      for (int64_t x = 0; x < ld; x += n) {
        hn::StoreU(hn::Mul(hn::LoadU(d, acc_row + x), a), d, acc_row + x);
      }
      const VF shift = hn::Set(d, m_new[i]);
      for (int64_t x = 0; x < kTile; x += n) {
        hn::StoreU(VExp(d, hn::Sub(hn::LoadU(d, row + x), shift)), d, row + x);
      }
      m[i] = m_new[i];
    }
    AccumulateRows(d, value_product, nq, lo, hi);
  }

  for (int64_t i = 0; i < nq; ++i) {
    const float* acc_row = acc + i * ld;
    const float l = acc_row[at.D];
    float* ot = out + at.Q(b, q0 + i, h);
    for (int64_t x = 0; x < at.D; ++x) ot[x] = acc_row[x] / l;
    lse[at.Lse(b, h, q0 + i)] = m[i] + dmath::Log(l);
  }
}

void AttentionForward(const AttentionShape& s, const float* q, const float* k, const float* v,
                      float* out, float* lse) {
  const Geometry at(s);
  const int64_t blocks = (at.T + kQueryBlock - 1) / kQueryBlock;
  ParallelFor(s.batch * at.Hq * blocks, [&](int64_t task) {
    const int64_t qb = task % blocks, h = (task / blocks) % at.Hq, b = task / (blocks * at.Hq);
    ForwardBlock(s, at, q, k, v, out, lse, b, h, qb * kQueryBlock);
  });
}

// One task per (batch, kv head): dk and dv of its keys sum over every query head of the group
// and every query in the contract's order (heads, then queries increasing), so one task owns
// them whole; dq of each query block is finished inside the same loop. No atomics, no partial
// sums to combine.
void BackwardGroup(const AttentionShape& s, const Geometry& at, const float* q, const float* k,
                   const float* v, const float* out, const float* lse, const float* dout, float* dq,
                   float* dk, float* dv, int64_t b, int64_t g) {
  const DF d;
  const int64_t n = static_cast<int64_t>(hn::Lanes(d));
  const int64_t ld = RoundUp(at.D, n);
  const int64_t tiles = (at.T + kTile - 1) / kTile, padded_t = tiles * kTile;
  const auto [kt, vt, k_rows, dk_acc, dv_acc, q_rows, dout_rows, dq_acc, p, ds] =
      ScratchArrays<10>({tiles * at.D * kTile, tiles * at.D * kTile, padded_t * ld,
                         padded_t * ld, padded_t * ld, kQueryBlock * ld, kQueryBlock * ld,
                         kQueryBlock * ld, kQueryBlock * kTile, kQueryBlock * kTile});
  float delta[kQueryBlock];
  int64_t lo[kQueryBlock], hi[kQueryBlock];
  static_assert(kQueryBlock >= kTile, "lo/hi also index the keys of a tile");

  for (int64_t j0 = 0; j0 < at.T; j0 += kTile) {
    PackTransposed(at, k, b, g, j0, kt + j0 * at.D);
    PackTransposed(at, v, b, g, j0, vt + j0 * at.D);
  }
  PackRows(k + at.Kv(b, 0, g), at.Hkv * at.D, at.T, at.D, ld, k_rows);
  std::fill(dk_acc, dk_acc + padded_t * ld, 0.0f);
  std::fill(dv_acc, dv_acc + padded_t * ld, 0.0f);

  for (int64_t h = g * at.group; h < (g + 1) * at.group; ++h) {
    for (int64_t q0 = 0; q0 < at.T; q0 += kQueryBlock) {
      const int64_t q1 = std::min(at.T, q0 + kQueryBlock), nq = q1 - q0;
      PackRows(q + at.Q(b, q0, h), at.Hq * at.D, nq, at.D, ld, q_rows);
      PackRows(dout + at.Q(b, q0, h), at.Hq * at.D, nq, at.D, ld, dout_rows);
      std::fill(dq_acc, dq_acc + nq * ld, 0.0f);
      RowDots(dout + at.Q(b, q0, h), out + at.Q(b, q0, h), at.Hq * at.D, nq, at.D, delta);

      for (int64_t j0 = at.FirstKey(q0) / kTile * kTile; j0 < q1; j0 += kTile) {
        const int64_t kn = std::min(kTile, at.T - j0);
        // p and ds for every (query, key) of the block; masked pairs are computed but unused.
        std::fill(p, p + nq * kTile, 0.0f);
        std::fill(ds, ds + nq * kTile, 0.0f);
        std::fill(lo, lo + nq, 0);
        std::fill(hi, hi + nq, at.D);
        AccumulateRows(d, {q_rows, ld, 1, kt + j0 * at.D, kTile, p, kTile, kTile},
                       nq, lo, hi);
        AccumulateRows(
            d, {dout_rows, ld, 1, vt + j0 * at.D, kTile, ds, kTile, kTile}, nq,
            lo, hi);
        for (int64_t i = 0; i < nq; ++i) {
          const VF row_lse = hn::Set(d, lse[at.Lse(b, h, q0 + i)]);
          const VF row_delta = hn::Set(d, delta[i]);
          float* p_row = p + i * kTile;
          float* ds_row = ds + i * kTile;
          for (int64_t x = 0; x < kTile; x += n) {
            const VF score = hn::Mul(hn::LoadU(d, p_row + x), hn::Set(d, s.scale));
            const VF prob = VExp(d, hn::Sub(score, row_lse));
            hn::StoreU(prob, d, p_row + x);
            hn::StoreU(hn::Mul(prob, hn::Sub(hn::LoadU(d, ds_row + x), row_delta)), d, ds_row + x);
          }
        }

        // dq: query rows, keys of the tile.
        for (int64_t i = 0; i < nq; ++i) {
          const int64_t t = q0 + i;
          lo[i] = std::max(at.FirstKey(t), j0) - j0;
          hi[i] = std::max(lo[i], std::min(t + 1, j0 + kTile) - j0);
        }
        AccumulateRows(d, {ds, kTile, 1, k_rows + j0 * ld, ld, dq_acc, ld, ld},
                       nq, lo, hi);
        // dk, dv: key rows of the tile, queries of the block.
        for (int64_t jj = 0; jj < kn; ++jj) {
          const int64_t j = j0 + jj;
          lo[jj] = std::max(j, q0) - q0;
          hi[jj] = std::max(lo[jj], std::min(at.LastQuery(j) + 1, q1) - q0);
        }
        AccumulateRows(d, {ds, 1, kTile, q_rows, ld, dk_acc + j0 * ld, ld, ld},
                       kn, lo, hi);
        AccumulateRows(d, {p, 1, kTile, dout_rows, ld, dv_acc + j0 * ld, ld, ld},
                       kn, lo, hi);
      }

      for (int64_t i = 0; i < nq; ++i) {
        float* dqt = dq + at.Q(b, q0 + i, h);
        for (int64_t x = 0; x < at.D; ++x) dqt[x] = dq_acc[i * ld + x] * s.scale;
      }
    }
  }

  for (int64_t j = 0; j < at.T; ++j) {
    float* dkj = dk + at.Kv(b, j, g);
    float* dvj = dv + at.Kv(b, j, g);
    for (int64_t x = 0; x < at.D; ++x) {
      dkj[x] = dk_acc[j * ld + x] * s.scale;
      dvj[x] = dv_acc[j * ld + x];
    }
  }
}

void AttentionBackward(const AttentionShape& s, const float* q, const float* k, const float* v,
                       const float* out, const float* lse, const float* dout, float* dq, float* dk,
                       float* dv) {
  const Geometry at(s);
  ParallelFor(s.batch * at.Hkv, [&](int64_t task) {
    BackwardGroup(s, at, q, k, v, out, lse, dout, dq, dk, dv, task / at.Hkv, task % at.Hkv);
  });
}

}  // namespace lockstep::rk::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace lockstep::rk {
HWY_EXPORT(AttentionForward);
HWY_EXPORT(AttentionBackward);

namespace simd {
void AttentionForward(const AttentionShape& s, const float* q, const float* k, const float* v,
                      float* out, float* lse) {
  HWY_DYNAMIC_DISPATCH(AttentionForward)(s, q, k, v, out, lse);
}
void AttentionBackward(const AttentionShape& s, const float* q, const float* k, const float* v,
                       const float* out, const float* lse, const float* dout, float* dq, float* dk,
                       float* dv) {
  HWY_DYNAMIC_DISPATCH(AttentionBackward)(s, q, k, v, out, lse, dout, dq, dk, dv);
}
}  // namespace simd
}  // namespace lockstep::rk
#endif  // HWY_ONCE
