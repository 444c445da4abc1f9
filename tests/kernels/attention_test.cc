// Causal grouped-query attention: bitwise invariance across variants and thread counts, accuracy
// against fp64, finite-difference gradients, special values, argument errors.
#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "kernels/harness.h"
#include "lockstep/core.h"
#include "lockstep/kernels.h"

namespace lockstep {
namespace {

using test::ExpectError;
using rk::AttentionShape;

AttentionShape Shape(int64_t batch, int64_t seq, int64_t q_heads, int64_t kv_heads,
                     int64_t head_dim, int64_t window) {
  const float scale = 1.0f / std::sqrt(static_cast<float>(head_dim));
  return {batch, seq, q_heads, kv_heads, head_dim, window, scale};
}

std::string Describe(const AttentionShape& s) {
  return "B" + std::to_string(s.batch) + " T" + std::to_string(s.seq) + " Hq" +
         std::to_string(s.q_heads) + " Hkv" + std::to_string(s.kv_heads) + " D" +
         std::to_string(s.head_dim) + " W" + std::to_string(s.window);
}

int64_t QSize(const AttentionShape& s) { return s.batch * s.seq * s.q_heads * s.head_dim; }
int64_t KvSize(const AttentionShape& s) { return s.batch * s.seq * s.kv_heads * s.head_dim; }
int64_t LseSize(const AttentionShape& s) { return s.batch * s.q_heads * s.seq; }

struct Inputs {
  std::vector<float> q, k, v, dout;
};

// q is drawn wider than k so that softmax rows are peaked and the online maximum moves
// between tiles (the rescaling path), not just uniform.
Inputs RandomInputs(const AttentionShape& s, uint64_t seed) {
  return {test::RandomFloats(QSize(s), seed, -3.0f, 3.0f), test::RandomFloats(KvSize(s), seed + 1),
          test::RandomFloats(KvSize(s), seed + 2), test::RandomFloats(QSize(s), seed + 3)};
}

struct Forward {
  std::vector<float> out, lse;
};
Forward RunForward(const AttentionShape& s, const Inputs& in) {
  Forward f{std::vector<float>(QSize(s)), std::vector<float>(LseSize(s))};
  rk::AttentionForward(s, in.q, in.k, in.v, f.out, f.lse);
  return f;
}

struct Gradients {
  std::vector<float> dq, dk, dv;
};
Gradients RunBackward(const AttentionShape& s, const Inputs& in, const Forward& f) {
  Gradients g{std::vector<float>(QSize(s)), std::vector<float>(KvSize(s)),
              std::vector<float>(KvSize(s))};
  rk::AttentionBackward(s, in.q, in.k, in.v, f.out, f.lse, in.dout, g.dq, g.dk, g.dv);
  return g;
}

std::vector<float> Concat(std::initializer_list<const std::vector<float>*> parts) {
  std::vector<float> all;
  for (const auto* p : parts) all.insert(all.end(), p->begin(), p->end());
  return all;
}

void ExpectInvariant(const AttentionShape& s, const Inputs& in) {
  test::ExpectBitwiseInvariant("AttentionForward " + Describe(s), [&] {
    const Forward f = RunForward(s, in);
    return Concat({&f.out, &f.lse});
  });
  // The backward is swept on fixed (reference) forward results so that its own bits are tested.
  const rk::Isa saved = rk::ActiveIsa();
  rk::SetIsa(rk::ReferenceIsa());
  const Forward f = RunForward(s, in);
  rk::SetIsa(saved);
  test::ExpectBitwiseInvariant("AttentionBackward " + Describe(s), [&] {
    const Gradients g = RunBackward(s, in, f);
    return Concat({&g.dq, &g.dk, &g.dv});
  });
}

// Awkward shapes: sequences that are not multiples of the 64-key tile, odd head dims, groups
// of 1, 2 and 3 query heads per kv head, windows of 1 (each query sees itself only), 5, 64.
const AttentionShape kAwkwardShapes[] = {
    Shape(1, 1, 2, 2, 1, 0),    Shape(1, 3, 4, 2, 3, 0),    Shape(2, 17, 3, 1, 16, 5),
    Shape(1, 65, 4, 2, 64, 0),  Shape(1, 130, 4, 2, 3, 64), Shape(2, 130, 2, 2, 16, 0),
    Shape(1, 130, 3, 1, 64, 1), Shape(1, 65, 4, 2, 17, 5),  Shape(1, 130, 4, 2, 64, 5),
    Shape(1, 130, 2, 1, 1, 0),  Shape(1, 200, 2, 1, 8, 70),
};

TEST(Attention, BitwiseInvariantAcrossVariantsAndThreads) {
  uint64_t seed = 100;
  for (const AttentionShape& s : kAwkwardShapes) ExpectInvariant(s, RandomInputs(s, seed += 10));
}

// A KV cache: the T queries at positions past .. past+T-1, against the keys of every position
// from 0, give the bits of those rows of the whole sequence's forward (for every split of the
// sequence, tile boundaries and windows included), on every variant at every thread count.
TEST(Attention, QueriesAfterCachedKeysGiveTheWholeSequencesRows) {
  uint64_t seed = 700;
  for (const AttentionShape& whole :
       {Shape(2, 130, 4, 2, 16, 0), Shape(1, 200, 3, 1, 8, 70), Shape(2, 70, 2, 2, 5, 7)}) {
    const Inputs in = RandomInputs(whole, seed += 10);
    const Forward all = RunForward(whole, in);
    const int64_t S = whole.seq, Hq = whole.q_heads, D = whole.head_dim;
    for (const int64_t past :
         {int64_t{0}, int64_t{1}, int64_t{63}, int64_t{64}, int64_t{65}, S - 1}) {
      AttentionShape s = whole;
      s.past = past;
      s.seq = S - past;
      // The queries of positions past.. of each sequence; k and v whole.
      std::vector<float> q, want_out, want_lse;
      for (int64_t b = 0; b < whole.batch; ++b) {
        const auto rows = [&](const std::vector<float>& x, std::vector<float>& into) {
          into.insert(into.end(), x.begin() + (b * S + past) * Hq * D,
                      x.begin() + (b + 1) * S * Hq * D);
        };
        rows(in.q, q);
        rows(all.out, want_out);
        for (int64_t h = 0; h < Hq; ++h) {
          want_lse.insert(want_lse.end(), all.lse.begin() + (b * Hq + h) * S + past,
                          all.lse.begin() + (b * Hq + h + 1) * S);
        }
      }
      const std::vector<float> want = Concat({&want_out, &want_lse});
      const auto run = [&] {
        Forward f{std::vector<float>(q.size()), std::vector<float>(want_lse.size())};
        rk::AttentionForward(s, q, in.k, in.v, f.out, f.lse);
        return Concat({&f.out, &f.lse});
      };
      EXPECT_EQ(run(), want) << Describe(whole) << " past " << past;
      test::ExpectBitwiseInvariant("AttentionForward past " + std::to_string(past), run);
    }
  }
  // The backward is of whole sequences only.
  AttentionShape s = Shape(1, 3, 2, 2, 4, 0);
  s.past = 1;
  std::vector<float> q(3 * 2 * 4), kv(4 * 2 * 4), lse(2 * 3), dq(q.size()), dkv(kv.size());
  ExpectError([&] { rk::AttentionBackward(s, q, kv, kv, q, lse, q, dq, dkv, dkv); }, {"past = 1"});
}

// ---- fp64 model -----------------------------------------------------------------------------
struct Forward64 {
  std::vector<double> out, lse;
};

// Naive causal softmax attention in fp64: every visible score at once, no tiles.
Forward64 NaiveForward(const AttentionShape& s, const std::vector<double>& q,
                       const std::vector<double>& k, const std::vector<double>& v) {
  const int64_t T = s.seq, D = s.head_dim, Hq = s.q_heads, Hkv = s.kv_heads;
  Forward64 f{std::vector<double>(q.size()), std::vector<double>(LseSize(s))};
  std::vector<double> score(T);
  for (int64_t b = 0; b < s.batch; ++b) {
    for (int64_t h = 0; h < Hq; ++h) {
      const int64_t g = h / (Hq / Hkv);
      for (int64_t t = 0; t < T; ++t) {
        const int64_t first = s.window > 0 ? std::max<int64_t>(0, t - s.window + 1) : 0;
        const double* qt = &q[((b * T + t) * Hq + h) * D];
        double m = -std::numeric_limits<double>::infinity();
        for (int64_t j = first; j <= t; ++j) {
          const double* kj = &k[((b * T + j) * Hkv + g) * D];
          double dot = 0;
          for (int64_t x = 0; x < D; ++x) dot += qt[x] * kj[x];
          score[j] = dot * s.scale;
          m = std::max(m, score[j]);
        }
        double sum = 0;
        for (int64_t j = first; j <= t; ++j) sum += std::exp(score[j] - m);
        double* ot = &f.out[((b * T + t) * Hq + h) * D];
        for (int64_t j = first; j <= t; ++j) {
          const double p = std::exp(score[j] - m) / sum;
          const double* vj = &v[((b * T + j) * Hkv + g) * D];
          for (int64_t x = 0; x < D; ++x) ot[x] += p * vj[x];
        }
        f.lse[(b * Hq + h) * T + t] = m + std::log(sum);
      }
    }
  }
  return f;
}

std::vector<double> ToDouble(const std::vector<float>& x) { return {x.begin(), x.end()}; }

// Observed worst absolute errors over these shapes are 5e-7 (out, |out| < 1) and 7e-7 (lse,
// |lse| < 6): fp32 rounding of up to 64-term dot products and of up to 130-term softmax sums.
// The bounds (1e-5 + 1e-5 |x| for out, 1e-5 + 1e-6 |x| for lse) leave a margin of 20x or more.
TEST(Attention, MatchesFp64NaiveAttention) {
  for (const AttentionShape& s :
       {Shape(1, 130, 4, 2, 64, 0), Shape(2, 200, 2, 1, 8, 70), Shape(1, 65, 3, 1, 17, 5)}) {
    const Inputs in = RandomInputs(s, 7);
    const Forward64 want = NaiveForward(s, ToDouble(in.q), ToDouble(in.k), ToDouble(in.v));
    for (const rk::Isa& isa : rk::UsableIsas()) {
      rk::SetIsa(isa);
      const Forward got = RunForward(s, in);
      test::ExpectClose("out " + Describe(s) + " " + isa.name, got.out, want.out, 1e-5, 1e-5);
      test::ExpectClose("lse " + Describe(s) + " " + isa.name, got.lse, want.lse, 1e-5, 1e-6);
    }
  }
  rk::SetIsa(rk::IsaByName("best"));
}

// The backward is checked against central differences of L = sum(out * dout) computed by the
// fp64 naive forward at the fp32 inputs (step 1e-5: truncation ~1e-10, cancellation ~1e-11).
// The fp32 gradients (|g| < 3) are observed within 9e-7 of it; the bound 5e-6 + 1e-5 |g|
// leaves a margin of 20x or more.
TEST(Attention, BackwardMatchesFiniteDifferencesOfFp64Forward) {
  for (const AttentionShape& s : {Shape(1, 20, 4, 2, 8, 0), Shape(2, 13, 3, 1, 5, 4)}) {
    const Inputs in = RandomInputs(s, 11);
    std::vector<double> q = ToDouble(in.q), k = ToDouble(in.k), v = ToDouble(in.v);
    const std::vector<double> w = ToDouble(in.dout);
    const auto loss = [&] {
      const Forward64 f = NaiveForward(s, q, k, v);
      double sum = 0;
      for (size_t i = 0; i < w.size(); ++i) sum += f.out[i] * w[i];
      return sum;
    };
    const auto central_differences = [&](std::vector<double>& x) {
      constexpr double kStep = 1e-5;
      std::vector<double> grad(x.size());
      for (size_t i = 0; i < x.size(); ++i) {
        const double x0 = x[i];
        x[i] = x0 + kStep;
        const double up = loss();
        x[i] = x0 - kStep;
        const double down = loss();
        x[i] = x0;
        grad[i] = (up - down) / (2 * kStep);
      }
      return grad;
    };
    const std::vector<double> dq = central_differences(q), dk = central_differences(k),
                              dv = central_differences(v);
    for (const rk::Isa& isa : rk::UsableIsas()) {
      rk::SetIsa(isa);
      const Gradients g = RunBackward(s, in, RunForward(s, in));
      const std::string what = Describe(s) + " " + isa.name;
      test::ExpectClose("dq " + what, g.dq, dq, 5e-6, 1e-5);
      test::ExpectClose("dk " + what, g.dk, dk, 5e-6, 1e-5);
      test::ExpectClose("dv " + what, g.dv, dv, 5e-6, 1e-5);
    }
  }
  rk::SetIsa(rk::IsaByName("best"));
}

// ---- special values -------------------------------------------------------------------------
TEST(Attention, SignedZerosAndSubnormalsAreInvariant) {
  const AttentionShape s = Shape(1, 130, 4, 2, 16, 0);
  Inputs in = RandomInputs(s, 21);
  for (size_t i = 0; i < in.q.size(); i += 3) in.q[i] = (i % 2) ? -0.0f : 0.0f;
  for (size_t i = 0; i < in.k.size(); i += 5) in.k[i] = 1e-40f * in.k[i];
  for (size_t i = 0; i < in.v.size(); i += 7) in.v[i] = (i % 2) ? -1e-41f : 3e-39f;
  for (size_t i = 1; i < in.dout.size(); i += 4) in.dout[i] = -0.0f;
  ExpectInvariant(s, in);
}

// With q = 0 every visible key gets probability exactly 1/n; with v a subnormal c, the sum of n
// copies of c is exact and so is the division by n: out = c. A flush-to-zero unit gives 0.
TEST(Attention, SubnormalValuesAreNotFlushed) {
  const AttentionShape s = Shape(1, 70, 2, 1, 3, 0);
  const float c = 3e-41f;
  const Inputs in{std::vector<float>(QSize(s), 0.0f), test::RandomFloats(KvSize(s), 5),
                  std::vector<float>(KvSize(s), c), std::vector<float>(QSize(s), 1.0f)};
  for (const rk::Isa& isa : rk::UsableIsas()) {
    rk::SetIsa(isa);
    const Forward f = RunForward(s, in);
    for (float o : f.out) ASSERT_EQ(o, c) << isa.name;
  }
  rk::SetIsa(rk::IsaByName("best"));
}

// A non-finite value reaches exactly the rows that can see it: a NaN in query row t poisons
// out row t only; an inf or NaN in key/value j poisons the queries that see j and leaves
// every other row bit-identical to the clean run (masked keys are skipped, not multiplied by 0).
TEST(Attention, NonFiniteValuesReachOnlyTheRowsThatSeeThem) {
  const AttentionShape s = Shape(1, 150, 2, 1, 16, 70);
  const Inputs clean = RandomInputs(s, 31);
  const int64_t D = s.head_dim, Hq = s.q_heads, T = s.seq;
  const int64_t poisoned_key = 100;  // seen by queries 100 .. 169 (window 70), i.e. 100 .. 149
  const auto sees_key = [&](int64_t t) { return t >= poisoned_key && t < poisoned_key + 70; };
  for (const rk::Isa& isa : rk::UsableIsas()) {
    rk::SetIsa(isa);
    const Forward base = RunForward(s, clean);
    {
      Inputs in = clean;
      in.q[(40 * Hq + 1) * D + 2] = std::numeric_limits<float>::quiet_NaN();  // t = 40, h = 1
      const Forward f = RunForward(s, in);
      for (int64_t t = 0; t < T; ++t) {
        for (int64_t h = 0; h < Hq; ++h) {
          const bool hit = t == 40 && h == 1;
          EXPECT_EQ(std::isnan(f.lse[h * T + t]), hit) << isa.name << " t " << t;
          for (int64_t x = 0; x < D; ++x) {
            const float o = f.out[(t * Hq + h) * D + x], want = base.out[(t * Hq + h) * D + x];
            if (hit) {
              EXPECT_TRUE(std::isnan(o)) << isa.name;
            } else {
              EXPECT_EQ(o, want) << isa.name << " t " << t;
            }
          }
        }
      }
    }
    for (const float bad :
         {std::numeric_limits<float>::infinity(), std::numeric_limits<float>::quiet_NaN()}) {
      Inputs in = clean;
      in.v[poisoned_key * D + 5] = bad;
      const Forward f = RunForward(s, in);
      const Gradients g0 = RunBackward(s, clean, base), g = RunBackward(s, in, f);
      for (int64_t t = 0; t < T; ++t) {
        for (int64_t h = 0; h < Hq; ++h) {
          const int64_t row = (t * Hq + h) * D;
          EXPECT_EQ(std::isfinite(f.out[row + 5]), !sees_key(t)) << isa.name << " t " << t;
          if (!sees_key(t)) {
            EXPECT_TRUE(
                std::equal(f.out.begin() + row, f.out.begin() + row + D, base.out.begin() + row))
                << isa.name << " t " << t;
            EXPECT_TRUE(std::equal(g.dq.begin() + row, g.dq.begin() + row + D, g0.dq.begin() + row))
                << isa.name << " dq t " << t;
          }
        }
      }
    }
  }
  rk::SetIsa(rk::IsaByName("best"));
}

TEST(Attention, RejectsBadArguments) {
  const AttentionShape s = Shape(1, 5, 4, 2, 3, 0);
  Inputs in = RandomInputs(s, 41);
  Forward f = RunForward(s, in);
  Gradients g = RunBackward(s, in, f);
  const auto forward = [&](const AttentionShape& shape, std::span<const float> q,
                           std::span<float> out) {
    return [=, &in, &f] { rk::AttentionForward(shape, q, in.k, in.v, out, f.lse); };
  };
  ExpectError(forward(s, std::span(in.q).first(10), f.out), {"AttentionForward", "q", "10"});
  AttentionShape bad = s;
  bad.kv_heads = 3;
  ExpectError(forward(bad, in.q, f.out), {"AttentionForward", "q_heads = 4", "kv_heads = 3"});
  bad = s;
  bad.scale = std::numeric_limits<float>::quiet_NaN();
  ExpectError(forward(bad, in.q, f.out), {"AttentionForward", "scale"});
  bad.scale = -1.0f;
  ExpectError(forward(bad, in.q, f.out), {"AttentionForward", "scale = -1"});
  bad = s;
  bad.window = -1;
  ExpectError(forward(bad, in.q, f.out), {"AttentionForward", "window = -1"});
  bad = s;
  bad.head_dim = 0;
  ExpectError(forward(bad, in.q, f.out), {"AttentionForward", "head_dim = 0"});
  // out overlapping q: the same storage viewed as both.
  std::vector<float> shared = in.q;
  ExpectError(forward(s, shared, shared), {"AttentionForward", "out", "overlaps", "q"});
  ExpectError(
      [&] { rk::AttentionBackward(s, in.q, in.k, in.v, f.out, f.lse, in.dout, g.dq, g.dk, g.dk); },
      {"AttentionBackward", "dk", "dv", "overlaps"});
  ExpectError(
      [&] {
        rk::AttentionBackward(s, in.q, in.k, in.v, f.out, f.lse, std::span(in.dout).first(3), g.dq,
                              g.dk, g.dv);
      },
      {"AttentionBackward", "dout", "3"});
}

}  // namespace
}  // namespace lockstep
