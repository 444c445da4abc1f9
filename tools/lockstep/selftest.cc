// `lockstep selftest`: every op on fixed inputs, every usable variant x {1,2,3,4,7} threads,
// compared bit for bit with the scalar reference at one thread.
#include <fmt/format.h>

#include <memory>

#include <bit>
#include <cmath>
#include <cstdint>
#include <iterator>
#include <functional>
#include <string>
#include <vector>

#include "lockstep/core.h"
#include "lockstep/kernels.h"
#include "lockstep/model.h"
#include "tools/lockstep/commands.h"

namespace lockstep::cli {
namespace {

using Floats = std::vector<float>;

// The special values and range edges every op meets: signed zeros, infinities, NaNs of both
// signs, subnormals, the normal range's ends, and the edges of exp's and erfinv's ranges.
constexpr float kSpecials[] = {
    -0.0f, 0.0f, INFINITY, -INFINITY, NAN, -NAN,
    0x1.0p-149f, -0x1.0p-149f, 0x1.0p-140f, 0x1.0p-126f, -0x1.0p-126f,
    0x1.fffffep127f, -0x1.fffffep127f,
    88.72283f, 88.72284f, -87.33654f, -103.97208f, -103.97209f,
    1.0f, -1.0f, 0x1.fffffep-1f, -0x1.fffffep-1f, 0x1.0p+100f};

// Fixed inputs: a 32-bit LCG mapped exactly to [-1, 1), with the special values above spread
// over the array (sparsely, so that most outputs still see ordinary values only).
Floats Inputs(int64_t n, uint32_t seed, bool specials = true) {
  Floats v(static_cast<size_t>(n));
  uint32_t s = seed * 2654435761u + 12345u;
  for (float& x : v) {
    s = s * 1664525u + 1013904223u;
    x = static_cast<float>(static_cast<int32_t>(s >> 8) - (1 << 23)) * 0x1.0p-23f;
  }
  constexpr auto kCount = static_cast<int64_t>(std::size(kSpecials));
  if (specials && n >= 16 * kCount) {
    const int64_t stride = n / kCount, offset = seed % stride;
    for (int64_t k = 0; k < kCount; ++k) v[static_cast<size_t>(k * stride + offset)] = kSpecials[k];
  }
  return v;
}

std::vector<uint32_t> Ids(int64_t n, uint32_t vocab, uint32_t seed) {
  std::vector<uint32_t> ids(static_cast<size_t>(n));
  uint32_t s = seed;
  for (uint32_t& id : ids) {
    s = s * 1664525u + 1013904223u;
    id = (s >> 8) % vocab;
  }
  return ids;
}

void Append(Floats& out, const Floats& more) { out.insert(out.end(), more.begin(), more.end()); }

struct Case {
  std::string name;
  std::function<Floats()> run;
};

// docs/numerics.md ("NaN"): only dmath, the global norm and AdamW fix the bits of the NaNs they
// return; in every other op a NaN's sign and payload are not part of the contract (the trainer
// canonicalises what it hashes), so those cases compare NaNs as the canonical NaN.
std::function<Floats()> NaNsCanonical(std::function<Floats()> run) {
  return [run = std::move(run)] {
    Floats out = run();
    rk::CanonicalizeNaNs(out);
    return out;
  };
}

std::vector<Case> Cases() {
  std::vector<Case> cases;
  cases.push_back({"gemm x·wᵀ 67x45x531", NaNsCanonical([] {
                     Floats x = Inputs(67 * 531, 1), w = Inputs(45 * 531, 2), y(67 * 45);
                     rk::GemmXWt(x, w, y, 67, 45, 531);
                     return y;
                   })});
  cases.push_back({"gemm dy·w 67x45x531", NaNsCanonical([] {
                     Floats dy = Inputs(67 * 45, 3), w = Inputs(45 * 531, 4), dx(67 * 531);
                     rk::GemmDyW(dy, w, dx, 67, 45, 531);
                     return dx;
                   })});
  cases.push_back({"gemm dyᵀ·x 300x45x37 (+accumulate)", NaNsCanonical([] {
                     Floats dy = Inputs(300 * 45, 5), x = Inputs(300 * 37, 6), dw(45 * 37);
                     rk::GemmDytX(dy, x, dw, 300, 45, 37);
                     rk::GemmDytX(dy, x, dw, 300, 45, 37, /*accumulate=*/true);
                     return dw;
                   })});
  cases.push_back({"row sum / sumsq / max 9x1001", NaNsCanonical([] {
                     Floats x = Inputs(9 * 1001, 7), out(27);
                     rk::RowSum(x, std::span(out).subspan(0, 9), 9, 1001);
                     rk::RowSumSquares(x, std::span(out).subspan(9, 9), 9, 1001);
                     rk::RowMax(x, std::span(out).subspan(18, 9), 9, 1001);
                     return out;
                   })});
  cases.push_back({"rmsnorm fwd+bwd 13x257 (gain, no gain)", NaNsCanonical([] {
                     Floats x = Inputs(13 * 257, 8), dy = Inputs(13 * 257, 9), g = Inputs(257, 10);
                     Floats out;
                     for (bool gain : {true, false}) {
                       Floats y(x.size()), r(13), dx(x.size()), dg(gain ? 257 : 0);
                       std::span<const float> gs = gain ? std::span<const float>(g) : std::span<const float>();
                       rk::RmsNormForward(x, gs, 1e-5f, y, r, 13, 257);
                       rk::RmsNormBackward(dy, x, gs, r, dx, dg, 13, 257);
                       for (const Floats* f : {&y, &r, &dx, &dg}) Append(out, *f);
                     }
                     return out;
                   })});
  cases.push_back({"rope fwd+bwd 2x19x3x34 θ=5e5", NaNsCanonical([] {
                     const auto table = rk::MakeRopeTable(19, 34, 500000.0f);
                     Floats x = Inputs(2 * 19 * 3 * 34, 11), y(x.size()), dx(x.size());
                     rk::RopeForward(x, y, table, 2, 19, 3, 34);
                     rk::RopeBackward(y, dx, table, 2, 19, 3, 34);
                     Floats out = y;
                     Append(out, dx);
                     Append(out, table.cos);
                     Append(out, table.sin);
                     return out;
                   })});
  for (int64_t window : {0, 7}) {
    cases.push_back({fmt::format("attention fwd+bwd T=70 4q/2kv D=19 window={}", window), NaNsCanonical([window] {
                       rk::AttentionShape s{2, 70, 4, 2, 19, window, 0.25f};
                       const int64_t nq = 2 * 70 * 4 * 19, nkv = 2 * 70 * 2 * 19;
                       Floats q = Inputs(nq, 12), k = Inputs(nkv, 13), v = Inputs(nkv, 14);
                       Floats out(nq), lse(2 * 4 * 70), dout = Inputs(nq, 15);
                       Floats dq(nq), dk(nkv), dv(nkv);
                       rk::AttentionForward(s, q, k, v, out, lse);
                       rk::AttentionBackward(s, q, k, v, out, lse, dout, dq, dk, dv);
                       Floats all = out;
                       for (const Floats* f : {&lse, &dq, &dk, &dv}) Append(all, *f);
                       return all;
                     })});
  }
  cases.push_back({"swiglu fwd+bwd 11x133", NaNsCanonical([] {
                     Floats h = Inputs(11 * 266, 16), dout = Inputs(11 * 133, 17);
                     for (float& x : h) x *= 8.0f;
                     Floats out(11 * 133), dh(h.size());
                     rk::SwigluForward(h, out, 11, 133);
                     rk::SwigluBackward(h, dout, dh, 11, 133);
                     Append(out, dh);
                     return out;
                   })});
  cases.push_back({"embedding fwd+bwd V=50 d=37 n=200", NaNsCanonical([] {
                     Floats table = Inputs(50 * 37, 18), dout = Inputs(200 * 37, 19);
                     const auto ids = Ids(200, 50, 20);
                     Floats out(200 * 37), dtable = Inputs(50 * 37, 21);
                     rk::EmbeddingForward(table, ids, out, 50, 37);
                     rk::EmbeddingBackward(dout, ids, dtable, 50, 37);
                     Append(out, dtable);
                     return out;
                   })});
  cases.push_back({"cross-entropy+z-loss fwd+bwd rows=23 d=40 V=700", NaNsCanonical([] {
                     rk::CrossEntropyShape s{23, 40, 700, 256, 1e-4f};
                     Floats h = Inputs(23 * 40, 22), w = Inputs(700 * 40, 23);
                     const auto targets = Ids(23, 700, 24);
                     Floats loss(23), z(23), lse(23), dh(23 * 40), dw(700 * 40);
                     rk::CrossEntropyForward(s, h, w, targets, loss, z, lse);
                     rk::CrossEntropyBackward(s, h, w, targets, lse, 1.0f / 23, dh, dw);
                     for (const Floats* f : {&z, &lse, &dh, &dw}) Append(loss, *f);
                     return loss;
                   })});
  cases.push_back({"adamw 30 steps n=1003", [] {
                     Floats p = Inputs(1003, 25), m(1003), v(1003);
                     for (int64_t step = 1; step <= 30; ++step) {
                       const Floats g = Inputs(1003, 100 + static_cast<uint32_t>(step));
                       rk::AdamWUpdate({1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, step}, p, g, m, v);
                     }
                     Append(p, m);
                     Append(p, v);
                     return p;
                   }});
  cases.push_back({"global norm + clip 3 tensors (70000, 17, 131073), with and without NaN", [] {
                     Floats out;
                     for (bool specials : {true, false}) {
                       Floats a = Inputs(70000, 26, specials), b = Inputs(17, 27),
                              c = Inputs(131073, 28, specials);
                       const std::span<const float> list[] = {a, b, c};
                       const float norm = rk::GlobalNorm(list);
                       const float factor = rk::ClipFactor(norm, 1.0f);
                       out.push_back(norm);
                       out.push_back(factor);
                       if (!std::isnan(factor)) rk::Scale(b, factor);
                       Append(out, b);
                     }
                     return out;
                   }});
  cases.push_back({"dmath exp/log/sin/cos/pow/erf/erfinv/sqrt/rsqrt", [] {
                     Floats x = Inputs(4099, 29), out;
                     x.insert(x.end(), std::begin(kSpecials), std::end(kSpecials));
                     for (float v : x) {
                       const float a = v * 80.0f;
                       for (float r : {dmath::Exp(a), dmath::Log(v * v * 1e3f), dmath::Sin(a),
                                       dmath::Cos(a), dmath::Pow(v * v * 4.0f, a * 0.1f),
                                       dmath::Erf(v * 4.0f), dmath::Erfinv(v),
                                       dmath::Sqrt(v * v), dmath::Rsqrt(v * v)}) {
                         out.push_back(r);
                       }
                     }
                     return out;
                   }});
  cases.push_back({"erfinv over an array (the init's vector form) n=4099+specials", [] {
                     Floats x = Inputs(4099, 31);
                     x.insert(x.end(), std::begin(kSpecials), std::end(kSpecials));
                     rk::ErfinvInPlace(x);
                     return x;
                   }});
  cases.push_back({"erfinv first approximation over an array n=4099+specials", [] {
                     Floats x = Inputs(4099, 32);
                     x.insert(x.end(), std::begin(kSpecials), std::end(kSpecials));
                     rk::ErfinvFirstApproximationInPlace(x);
                     return x;
                   }});
  cases.push_back({"philox words n=4099 from word 2^34+3", [] {
                     std::vector<uint32_t> words(4099);
                     rk::PhiloxWords(PhiloxKeyFromSeed(77), (uint64_t{1} << 34) + 3, words);
                     Floats out;
                     for (const uint32_t w : words) out.push_back(std::bit_cast<float>(w));
                     return out;
                   }});
  cases.push_back({"truncated-normal init n=70001 (first draw 5), and 70001 of a matrix large "
                   "enough for the erfinv table",
                   [] {
                     ModelConfig model = LoadRunConfig("tiny").model;
                     Floats out(70001), large(70001);
                     const ParamSpec spec{"w", {70001}, true, true};
                     InitTensorRange(model, 99, spec, 5, 0, out);
                     const ParamSpec matrix{"w", {2, kInitTableDraws}, true, true};
                     InitTensorRange(model, 99, matrix, 5, kInitTableDraws - 20000, large);
                     Append(out, large);
                     return out;
                   }});
  return cases;
}

struct SelftestOptions {
  bool verbose = false;
};

int RunSelftest(const SelftestOptions& options) {
  const std::vector<rk::Isa> usable = rk::UsableIsas();
  std::string variants;
  for (const rk::Isa& isa : usable) variants += (variants.empty() ? "" : ", ") + isa.name;
  fmt::print("lockstep selftest: every op vs the scalar reference at 1 thread\n");
  fmt::print("variants: {}; threads: 1 2 3 4 7; {}\n\n", variants, DescribeFloatingPointState());
  fmt::print("{:<52} {:>9}  {}\n", "op", "floats", "variant x threads");
  int failures = 0;
  for (const Case& c : Cases()) {
    const auto results = rk::SweepVariants(c.run, rk::kSweepThreadCounts);
    std::string row;
    bool ok = true;
    for (const rk::Isa& isa : usable) {
      row += fmt::format(" {}:", isa.name);
      for (const rk::SweepResult& r : results) {
        if (r.isa != isa) continue;
        row += r.equal ? fmt::format(" {}=", r.threads) : fmt::format(" {}≠", r.threads);
        if (!r.equal) {
          ok = false;
          if (options.verbose) {
            row += fmt::format("(first difference at element {} of {})", r.first_diff, r.size);
          }
        }
      }
    }
    fmt::print("{:<52} {:>9} {} {}\n", c.name, results.empty() ? 0 : results.front().size, row,
               ok ? "OK" : "MISMATCH");
    failures += ok ? 0 : 1;
  }
  fmt::print("\n{} ops, {} mismatching: {}\n", Cases().size(), failures,
             failures == 0 ? "every result is bit-identical to the reference" : "FAILED");
  return failures == 0 ? 0 : 1;
}

}  // namespace

void AddSelftestCommand(CLI::App& app, int* exit_code) {
  auto options = std::make_shared<SelftestOptions>();
  CLI::App* cmd = app.add_subcommand(
      "selftest",
      "run every kernel on fixed inputs with every usable SIMD variant and the scalar reference "
      "at 1, 2, 3, 4 and 7 threads; exit 0 only if every result equals the reference bit for bit");
  cmd->add_flag("--verbose", options->verbose, "name the first differing element of a mismatch");
  cmd->final_callback([options, exit_code] { *exit_code = RunSelftest(*options); });
}

}  // namespace lockstep::cli
