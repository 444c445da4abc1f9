// Scalar reference of causal grouped-query attention: normative. docs/numerics.md (attention)
// states the same order in words; the SIMD variant must give these bits exactly.
//
// Every reduction is a sequential fused multiply-add chain from +0 in increasing index order;
// masked (query, key) pairs are skipped, never added as zeros (0 * inf would poison a row
// with a key it cannot see). Threads split independent output rows only.
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "kernels/attention_impl.h"
#include "lockstep/core.h"

namespace lockstep::rk::ref {
namespace {

constexpr int64_t kTile = kAttentionKeyTile;
constexpr float kInf = std::numeric_limits<float>::infinity();

// Offsets of the head_dim-long vectors and of lse entries in the row-major layouts: T queries,
// S = past + T keys.
struct Layout {
  explicit Layout(const AttentionShape& s)
      : T(s.seq),
        S(s.past + s.seq),
        Hq(s.q_heads),
        Hkv(s.kv_heads),
        D(s.head_dim),
        group(s.q_heads / s.kv_heads) {}
  int64_t Q(int64_t b, int64_t t, int64_t h) const { return ((b * T + t) * Hq + h) * D; }
  int64_t Kv(int64_t b, int64_t j, int64_t g) const { return ((b * S + j) * Hkv + g) * D; }
  int64_t Lse(int64_t b, int64_t h, int64_t t) const { return (b * Hq + h) * T + t; }
  int64_t T, S, Hq, Hkv, D, group;
};

// Query t sees keys FirstKey(t) .. t; key j is seen by queries j .. LastQuery(j).
int64_t FirstKey(const AttentionShape& s, int64_t t) {
  return s.window > 0 ? std::max<int64_t>(0, t - s.window + 1) : 0;
}
int64_t LastQuery(const AttentionShape& s, int64_t j) {
  return s.window > 0 ? std::min(s.seq - 1, j + s.window - 1) : s.seq - 1;
}

float Dot(const float* a, const float* b, int64_t n) {
  float acc = 0.0f;
  for (int64_t i = 0; i < n; ++i) acc = std::fma(a[i], b[i], acc);
  return acc;
}

float Score(const AttentionShape& s, const float* q, const float* k) {
  return Dot(q, k, s.head_dim) * s.scale;
}

}  // namespace

void AttentionForward(const AttentionShape& s, const float* q, const float* k, const float* v,
                      float* out, float* lse) {
  const Layout at(s);
  ParallelFor(s.batch * at.Hq * at.T, [&](int64_t row) {
    const int64_t i = row % at.T, h = (row / at.T) % at.Hq, b = row / (at.T * at.Hq);
    const int64_t g = h / at.group, t = s.past + i;  // query i is position t
    const float* qt = q + at.Q(b, i, h);
    std::vector<float> acc(static_cast<size_t>(at.D), 0.0f);
    float scores[kTile];
    float m = -kInf, l = 0.0f;  // running max and running sum of exp(score - m)
    const int64_t first = FirstKey(s, t);
    for (int64_t j0 = first / kTile * kTile; j0 <= t; j0 += kTile) {
      const int64_t j_begin = std::max(first, j0), j_end = std::min(t + 1, j0 + kTile);
      float tile_max = -kInf;
      for (int64_t j = j_begin; j < j_end; ++j) {
        scores[j - j0] = Score(s, qt, k + at.Kv(b, j, g));
        tile_max = std::max(tile_max, scores[j - j0]);
      }
      const float m_new = std::max(m, tile_max);
      // On the first tile alpha = exp(-inf) = 0 rescales the zeros: no special case needed.
      const float alpha = dmath::Exp(m - m_new);
      l *= alpha;
      for (float& a : acc) a *= alpha;
      for (int64_t j = j_begin; j < j_end; ++j) {
        const float p = dmath::Exp(scores[j - j0] - m_new);
        l += p;
        const float* vj = v + at.Kv(b, j, g);
        for (int64_t d = 0; d < at.D; ++d) acc[d] = std::fma(p, vj[d], acc[d]);
      }
      m = m_new;
    }
    float* ot = out + at.Q(b, i, h);
    for (int64_t d = 0; d < at.D; ++d) ot[d] = acc[d] / l;
    lse[at.Lse(b, h, i)] = m + dmath::Log(l);
  });
}

void AttentionBackward(const AttentionShape& s, const float* q, const float* k, const float* v,
                       const float* out, const float* lse, const float* dout, float* dq, float* dk,
                       float* dv) {
  const Layout at(s);
  const int64_t rows = s.batch * at.Hq * at.T;
  // delta[b,h,t] = dout_t · out_t, laid out like lse.
  std::vector<float> delta(static_cast<size_t>(rows));
  ParallelFor(rows, [&](int64_t row) {
    const int64_t t = row % at.T, h = (row / at.T) % at.Hq, b = row / (at.T * at.Hq);
    delta[row] = Dot(dout + at.Q(b, t, h), out + at.Q(b, t, h), at.D);
  });

  // p = softmax probability of key j for query row (b, h, t); ds = dL/dscore / scale.
  struct Pair {
    float p, ds;
  };
  const auto pair = [&](int64_t b, int64_t h, int64_t t, int64_t j) {
    const int64_t g = h / at.group;
    const float p =
        dmath::Exp(Score(s, q + at.Q(b, t, h), k + at.Kv(b, j, g)) - lse[at.Lse(b, h, t)]);
    const float dp = Dot(dout + at.Q(b, t, h), v + at.Kv(b, j, g), at.D);
    return Pair{p, p * (dp - delta[at.Lse(b, h, t)])};
  };

  // dq_t = scale * sum over visible keys j (increasing) of ds_tj * k_j.
  ParallelFor(rows, [&](int64_t row) {
    const int64_t t = row % at.T, h = (row / at.T) % at.Hq, b = row / (at.T * at.Hq);
    const int64_t g = h / at.group;
    std::vector<float> acc(static_cast<size_t>(at.D), 0.0f);
    for (int64_t j = FirstKey(s, t); j <= t; ++j) {
      const float ds = pair(b, h, t, j).ds;
      const float* kj = k + at.Kv(b, j, g);
      for (int64_t d = 0; d < at.D; ++d) acc[d] = std::fma(ds, kj[d], acc[d]);
    }
    float* dqt = dq + at.Q(b, t, h);
    for (int64_t d = 0; d < at.D; ++d) dqt[d] = acc[d] * s.scale;
  });

  // dk_j = scale * sum of ds_tj * q_t and dv_j = sum of p_tj * dout_t, both over the group's
  // query heads in increasing order, then the queries that see j in increasing order.
  ParallelFor(s.batch * at.Hkv * at.T, [&](int64_t row) {
    const int64_t j = row % at.T, g = (row / at.T) % at.Hkv, b = row / (at.T * at.Hkv);
    std::vector<float> dk_acc(static_cast<size_t>(at.D), 0.0f), dv_acc(dk_acc);
    for (int64_t h = g * at.group; h < (g + 1) * at.group; ++h) {
      for (int64_t t = j; t <= LastQuery(s, j); ++t) {
        const Pair pd = pair(b, h, t, j);
        const float* qt = q + at.Q(b, t, h);
        const float* dot = dout + at.Q(b, t, h);
        for (int64_t d = 0; d < at.D; ++d) {
          dk_acc[d] = std::fma(pd.ds, qt[d], dk_acc[d]);
          dv_acc[d] = std::fma(pd.p, dot[d], dv_acc[d]);
        }
      }
    }
    float* dkj = dk + at.Kv(b, j, g);
    float* dvj = dv + at.Kv(b, j, g);
    for (int64_t d = 0; d < at.D; ++d) {
      dkj[d] = dk_acc[d] * s.scale;
      dvj[d] = dv_acc[d];
    }
  });
}

}  // namespace lockstep::rk::ref
