// Fused output head + cross-entropy + z-loss: bitwise invariance, independence from the vocab
// chunk, fp64 accuracy, finite-difference gradients wrt h and w (z-loss included), special
// values and argument errors (docs/numerics.md (cross_entropy)).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <string>

#include "kernels/harness.h"
#include "lockstep/core.h"

namespace lockstep::test {
namespace {

const float kNaN = std::numeric_limits<float>::quiet_NaN();

struct Problem {
  rk::CrossEntropyShape s;
  std::vector<float> h, w;
  std::vector<uint32_t> targets;
};

Problem MakeProblem(int64_t rows, int64_t d, int64_t vocab, float z_loss, uint64_t seed,
                    float h_range = 2.0f) {
  Problem p;
  p.s = {.rows = rows, .d = d, .vocab = vocab, .vocab_chunk = 256, .z_loss = z_loss};
  p.h = RandomFloats(rows * d, seed, -h_range, h_range);
  p.w = RandomFloats(vocab * d, seed + 1);
  p.targets = RandomIds(rows, static_cast<uint32_t>(vocab), seed + 2);
  return p;
}

// loss, zloss, lse, dh, dw concatenated; dw starts from dw_init.
std::vector<float> ForwardBackward(const Problem& p, int64_t vocab_chunk, float grad_scale,
                       std::vector<float> dw) {
  rk::CrossEntropyShape s = p.s;
  s.vocab_chunk = vocab_chunk;
  std::vector<float> out(3 * s.rows), dh(s.rows * s.d);
  const std::span<float> loss = std::span(out).first(s.rows);
  const std::span<float> zloss = std::span(out).subspan(s.rows, s.rows);
  const std::span<float> lse = std::span(out).subspan(2 * s.rows, s.rows);
  rk::CrossEntropyForward(s, p.h, p.w, p.targets, loss, zloss, lse);
  rk::CrossEntropyBackward(s, p.h, p.w, p.targets, lse, grad_scale, dh, dw);
  out.insert(out.end(), dh.begin(), dh.end());
  out.insert(out.end(), dw.begin(), dw.end());
  return out;
}

// fp64 row objective loss + zloss (and its lse), from fp64 h and w.
double RowObjective(const Problem& p, const std::vector<double>& h, const std::vector<double>& w,
                    int64_t r, double* lse_out = nullptr, double* loss_out = nullptr) {
  const int64_t d = p.s.d, vocab = p.s.vocab;
  std::vector<double> z(vocab);
  for (int64_t v = 0; v < vocab; ++v) {
    double acc = 0;
    for (int64_t c = 0; c < d; ++c) acc += h[r * d + c] * w[v * d + c];
    z[v] = acc;
  }
  const double m = *std::max_element(z.begin(), z.end());
  double sum = 0;
  for (double x : z) sum += std::exp(x - m);
  const double lse = m + std::log(sum);
  const double loss = lse - z[p.targets[r]];
  if (lse_out) *lse_out = lse;
  if (loss_out) *loss_out = loss;
  return loss + p.s.z_loss * lse * lse;
}

std::vector<double> Widen(const std::vector<float>& x) { return {x.begin(), x.end()}; }

TEST(CrossEntropy, BitwiseInvariant) {
  struct Case { int64_t rows, d, vocab; };
  for (const Case c : {Case{1, 1, 1}, Case{3, 17, 17}, Case{17, 3, 300}, Case{2, 255, 257},
                       Case{3, 257, 1000}}) {
    const Problem p = MakeProblem(c.rows, c.d, c.vocab, 1e-3f, c.vocab + c.d);
    ExpectBitwiseInvariant(fmt::format("cross-entropy rows={} d={} vocab={}", c.rows, c.d, c.vocab),
                           [&] { return ForwardBackward(p, 256, 1.0f / c.rows, RandomFloats(c.vocab * c.d, 5)); });
  }
}

// The chunk is a memory knob, never a numerics one: 256, 512 and 1024 give the same bits.
TEST(CrossEntropy, IndependentOfVocabChunk) {
  for (int64_t vocab : {300, 600, 1000}) {
    const Problem p = MakeProblem(5, 33, vocab, 1e-2f, vocab);
    const std::vector<float> dw0 = RandomFloats(vocab * p.s.d, 9);
    for (const rk::Isa& isa : rk::UsableIsas()) {
      rk::SetIsa(isa);
      const std::vector<float> want = ForwardBackward(p, 1024, 0.25f, dw0);
      for (int64_t chunk : {256, 512}) {
        const std::vector<float> got = ForwardBackward(p, chunk, 0.25f, dw0);
        ASSERT_EQ(got.size(), want.size());
        EXPECT_EQ(std::memcmp(got.data(), want.data(), got.size() * sizeof(float)), 0)
            << isa.name << " vocab=" << vocab << " chunk=" << chunk << " differs from chunk=1024";
      }
    }
  }
  rk::SetIsa(rk::IsaByName("best"));
}

// Logits kept by the forward for the backward: the forward leaves each chunk's GemmXWt there
// (chunk v0 as rows x cols from rows*v0), and the backward that uses them gives the bits of the
// backward that computes them again, for any vocab chunk and on every variant.
TEST(CrossEntropy, KeptLogitsGiveTheBitsOfRecomputedOnes) {
  for (int64_t vocab : {1, 300, 1000}) {
    const Problem p = MakeProblem(7, 33, vocab, 1e-2f, vocab + 3);
    const std::vector<float> dw0 = RandomFloats(vocab * p.s.d, 11);
    for (const rk::Isa& isa : rk::UsableIsas()) {
      rk::SetIsa(isa);
      for (int64_t chunk : {256, 512}) {
        rk::CrossEntropyShape s = p.s;
        s.vocab_chunk = chunk;
        const std::vector<float> want = ForwardBackward(p, chunk, 0.5f, dw0);
        std::vector<float> out(3 * s.rows), dh(s.rows * s.d), dw = dw0;
        std::vector<float> logits(s.rows * vocab);
        const std::span<float> lse = std::span(out).subspan(2 * s.rows, s.rows);
        rk::CrossEntropyForward(s, p.h, p.w, p.targets, std::span(out).first(s.rows),
                                std::span(out).subspan(s.rows, s.rows), lse, logits);
        for (int64_t v0 = 0; v0 < vocab; v0 += chunk) {
          const int64_t cols = std::min(chunk, vocab - v0);
          std::vector<float> z(s.rows * cols);
          rk::GemmXWt(p.h, std::span(p.w).subspan(v0 * s.d, cols * s.d), z, s.rows, cols, s.d);
          ASSERT_EQ(std::memcmp(z.data(), logits.data() + s.rows * v0, z.size() * sizeof(float)), 0)
              << isa.name << " vocab=" << vocab << " chunk=" << chunk << ": logits at " << v0;
        }
        rk::CrossEntropyBackward(s, p.h, p.w, p.targets, lse, 0.5f, dh, dw, logits);
        out.insert(out.end(), dh.begin(), dh.end());
        out.insert(out.end(), dw.begin(), dw.end());
        ASSERT_EQ(out.size(), want.size());
        EXPECT_EQ(std::memcmp(out.data(), want.data(), out.size() * sizeof(float)), 0)
            << isa.name << " vocab=" << vocab << " chunk=" << chunk;
      }
    }
  }
  rk::SetIsa(rk::IsaByName("best"));
  // A logits buffer of the wrong size, or overlapping another argument, is refused by name.
  const Problem p = MakeProblem(3, 4, 20, 0.0f, 61);
  std::vector<float> loss(3), zloss(3), lse(3), logits(60), dh(12), dw(80);
  ExpectError([&] { rk::CrossEntropyForward(p.s, p.h, p.w, p.targets, loss, zloss, lse,
                                            std::span(logits).first(59)); },
              {"CrossEntropyForward", "logits has 59", "rows*vocab = 60"});
  ExpectError([&] { rk::CrossEntropyBackward(p.s, p.h, p.w, p.targets, lse, 1.0f, dh, dw,
                                             std::span(dw).first(60)); },
              {"CrossEntropyBackward", "logits", "overlaps", "dw"});
}

TEST(CrossEntropy, ForwardMatchesFp64) {
  // Row 0 has logits in the hundreds: exp of the raw logits would overflow fp32.
  Problem p = MakeProblem(4, 64, 1000, 1e-2f, 21);
  for (int64_t c = 0; c < p.s.d; ++c) p.h[c] *= 60.0f;
  const std::vector<float> out = ForwardBackward(p, 512, 1.0f, std::vector<float>(p.w.size()));
  const std::vector<double> h = Widen(p.h), w = Widen(p.w);
  for (int64_t r = 0; r < p.s.rows; ++r) {
    double lse, loss;
    RowObjective(p, h, w, r, &lse, &loss);
    // Logit error ~ sqrt(d) ulps of |h||w|; 2e-6 relative to the logit scale covers it.
    const double tol = 2e-6 * std::max(1.0, std::fabs(lse));
    EXPECT_NEAR(out[r], loss, tol) << "loss, row " << r;
    EXPECT_NEAR(out[2 * p.s.rows + r], lse, tol) << "lse, row " << r;
    EXPECT_NEAR(out[p.s.rows + r], p.s.z_loss * lse * lse, 2 * tol * p.s.z_loss * std::fabs(lse))
        << "zloss, row " << r;
  }
  EXPECT_GT(out[2 * p.s.rows], 100.0f) << "row 0 should exercise large logits";
}

// dh and dw of grad_scale * sum_r (loss + zloss) against central differences in fp64.
TEST(CrossEntropy, BackwardMatchesFiniteDifferences) {
  const Problem p = MakeProblem(3, 17, 300, 0.05f, 31);
  const float grad_scale = 0.5f;
  const std::vector<float> out = ForwardBackward(p, 256, grad_scale, std::vector<float>(p.w.size(), 0.0f));
  const int64_t rows = p.s.rows, d = p.s.d;
  const std::vector<float> dh(out.begin() + 3 * rows, out.begin() + 3 * rows + rows * d);
  const std::vector<float> dw(out.begin() + 3 * rows + rows * d, out.end());
  std::vector<double> h = Widen(p.h), w = Widen(p.w);
  const double step = 1e-4;
  auto objective = [&](int64_t r0, int64_t r1) {
    double total = 0;
    for (int64_t r = r0; r < r1; ++r) total += RowObjective(p, h, w, r);
    return grad_scale * total;
  };
  auto central = [&](double& x, int64_t r0, int64_t r1) {
    const double x0 = x;
    x = x0 + step;
    const double up = objective(r0, r1);
    x = x0 - step;
    const double down = objective(r0, r1);
    x = x0;
    return (up - down) / (2 * step);
  };
  std::vector<double> want_dh(dh.size()), want_dw(dw.size());
  for (int64_t i = 0; i < rows * d; ++i) want_dh[i] = central(h[i], i / d, i / d + 1);
  for (size_t i = 0; i < w.size(); ++i) want_dw[i] = central(w[i], 0, rows);
  ExpectClose("dh", dh, want_dh, 1e-6, 1e-5);
  ExpectClose("dw", dw, want_dw, 1e-6, 1e-5);
}

// With at most kGemmKChunk rows each dw element receives one chunk sum c: 0 + c, then c + c.
TEST(CrossEntropy, BackwardAccumulatesIntoDw) {
  const Problem p = MakeProblem(3, 5, 40, 1e-3f, 41);
  const std::vector<float> lse_dh = ForwardBackward(p, 256, 1.0f, std::vector<float>(p.w.size(), 0.0f));
  std::vector<float> dw(lse_dh.end() - p.w.size(), lse_dh.end());
  const std::vector<float> once = dw;
  std::vector<float> dh(p.s.rows * p.s.d);
  rk::CrossEntropyBackward(p.s, p.h, p.w, p.targets,
                           std::span(lse_dh).subspan(2 * p.s.rows, p.s.rows), 1.0f, dh, dw);
  for (size_t i = 0; i < dw.size(); ++i) ASSERT_EQ(dw[i], 2 * once[i]) << i;
}

TEST(CrossEntropy, SpecialValues) {
  for (const rk::Isa& isa : rk::UsableIsas()) {
    rk::SetIsa(isa);
    // vocab 1: fifteen lanes stay empty at (-inf, 0) and must fold without NaN.
    Problem one = MakeProblem(2, 3, 1, 0.0f, 51);
    std::vector<float> out = ForwardBackward(one, 256, 1.0f, std::vector<float>(3, 0.0f));
    EXPECT_EQ(out[0], 0.0f) << isa.name << ": loss with a single class";
    EXPECT_EQ(out[1], 0.0f) << isa.name;
    for (size_t i = 6; i < out.size(); ++i) EXPECT_EQ(out[i], 0.0f) << isa.name << " grad " << i;

    // h = 0: every logit is 0, the lanes count them exactly and lse = log(vocab).
    Problem zero = MakeProblem(1, 4, 1000, 1e-2f, 52);
    std::fill(zero.h.begin(), zero.h.end(), 0.0f);
    out = ForwardBackward(zero, 256, 1.0f, std::vector<float>(zero.w.size()));
    EXPECT_EQ(out[2], dmath::Log(1000.0f)) << isa.name;
    EXPECT_EQ(out[0], out[2]) << isa.name;

    // A NaN in row 1 makes that row's results NaN and leaves row 0 alone.
    Problem nan = MakeProblem(2, 8, 100, 1e-2f, 53);
    nan.h[8 + 3] = kNaN;
    out = ForwardBackward(nan, 256, 1.0f, std::vector<float>(nan.w.size()));
    EXPECT_TRUE(std::isfinite(out[0]) && std::isfinite(out[4])) << isa.name;
    EXPECT_TRUE(std::isnan(out[1]) && std::isnan(out[3]) && std::isnan(out[5])) << isa.name;
  }
  rk::SetIsa(rk::IsaByName("best"));
}

TEST(CrossEntropy, RejectsBadArguments) {
  Problem p = MakeProblem(3, 4, 20, 0.0f, 61);
  std::vector<float> loss(3), zloss(3), lse(3), dh(12), dw(80);
  auto forward = [&](rk::CrossEntropyShape s) {
    return [&, s] { rk::CrossEntropyForward(s, p.h, p.w, p.targets, loss, zloss, lse); };
  };
  rk::CrossEntropyShape s = p.s;
  s.vocab_chunk = 300;
  ExpectError(forward(s), {"CrossEntropyForward", "vocab_chunk = 300", "256"});
  s.vocab_chunk = 0;
  ExpectError(forward(s), {"CrossEntropyForward", "vocab_chunk = 0"});
  s = p.s;
  s.z_loss = kNaN;
  ExpectError(forward(s), {"CrossEntropyForward", "z_loss = nan"});
  p.targets[2] = 20;
  ExpectError(forward(p.s), {"CrossEntropyForward", "row 2", "target 20", "vocab = 20"});
  ExpectError([&] { rk::CrossEntropyBackward(p.s, p.h, p.w, p.targets, lse, 1.0f, dh, dw); },
              {"CrossEntropyBackward", "row 2", "target 20"});
  p.targets[2] = 19;
  ExpectError([&] { rk::CrossEntropyBackward(p.s, p.h, p.w, p.targets, lse, kNaN, dh, dw); },
              {"CrossEntropyBackward", "grad_scale = nan"});
  ExpectError([&] { rk::CrossEntropyBackward(p.s, p.h, p.w, p.targets, lse, 1.0f, dh,
                                             std::span(dw).first(79)); },
              {"CrossEntropyBackward", "dw has 79", "vocab*d = 80"});
  ExpectError([&] { rk::CrossEntropyBackward(p.s, p.h, p.w, p.targets, std::span(dh).first(3),
                                             1.0f, dh, dw); },
              {"CrossEntropyBackward", "dh", "overlaps", "lse"});
  ExpectError([&] { rk::CrossEntropyForward(p.s, p.h, p.w, p.targets, loss, loss, lse); },
              {"CrossEntropyForward", "loss", "overlaps", "zloss"});
}

}  // namespace
}  // namespace lockstep::test
