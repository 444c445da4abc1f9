// Attention forward + backward throughput at the shapes of a small Llama-style model.
//
//   bench_attention [--json] [--shape B:T:Hq:Hkv:D:W]...
//
// Default shapes: B=1 T=1024 Hq=16 Hkv=4 at head_dim 64 and 128, causal and with a 512 window;
// and bench-8x512's attention (B=8 T=256 Hq=8 Hkv=2 head_dim 64, causal). --shape (repeatable)
// replaces them: batch, sequence, query heads, key/value heads, head_dim, window (0: causal).
// The forward and the backward are timed apart.
//
// FLOPs are the standard causal/windowed count: the forward does 4·D per visible (query, key)
// pair and head (q·k and p·v), the backward 2.5x the forward. Each configuration is timed as
// the best of several repetitions (shared machines are noisy; the minimum is the cleanest).
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <vector>

#include "lockstep/core.h"
#include "lockstep/kernels.h"

namespace {

using lockstep::rk::AttentionShape;

std::vector<float> Filled(int64_t n, float scale) {
  std::vector<float> x(static_cast<size_t>(n));
  uint32_t state = 12345;
  for (float& v : x) {
    state = state * 1664525u + 1013904223u;
    v = scale * (static_cast<float>(state >> 8) * 0x1.0p-24f - 0.5f);
  }
  return x;
}

double VisiblePairs(const AttentionShape& s) {
  double pairs = 0;
  for (int64_t t = 0; t < s.seq; ++t) {
    pairs += static_cast<double>(s.window > 0 ? std::min(t + 1, s.window) : t + 1);
  }
  return pairs;
}

struct Result {
  AttentionShape shape;
  int threads;
  double forward_seconds, backward_seconds, gflops;
};

Result Measure(const AttentionShape& s, int threads) {
  const int64_t nq = s.batch * s.seq * s.q_heads * s.head_dim;
  const int64_t nkv = s.batch * s.seq * s.kv_heads * s.head_dim;
  const std::vector<float> q = Filled(nq, 2.0f), k = Filled(nkv, 2.0f), v = Filled(nkv, 2.0f),
                           dout = Filled(nq, 1.0f);
  std::vector<float> out(nq), lse(s.batch * s.q_heads * s.seq), dq(nq), dk(nkv), dv(nkv);
  lockstep::SetThreads(threads);
  const auto forward = [&] { lockstep::rk::AttentionForward(s, q, k, v, out, lse); };
  const auto backward = [&] {
    lockstep::rk::AttentionBackward(s, q, k, v, out, lse, dout, dq, dk, dv);
  };
  forward();  // warm-up: page faults, first dispatch
  backward();
  const auto best_of = [](auto&& f) {
    double best = 1e30;
    for (int rep = 0; rep < 5; ++rep) {
      const auto start = std::chrono::steady_clock::now();
      f();
      best = std::min(
          best, std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
    }
    return best;
  };
  const double f = best_of(forward), b = best_of(backward);
  const double forward_flops =
      4.0 * static_cast<double>(s.head_dim) * VisiblePairs(s) * s.batch * s.q_heads;
  return {s, threads, f, b, 3.5 * forward_flops / (f + b) * 1e-9};
}

}  // namespace

int main(int argc, char** argv) {
  bool json = false;
  std::vector<AttentionShape> shapes;
  for (int i = 1; i < argc; ++i) {
    long long b, t, hq, hkv, dim, w;
    char end;
    if (std::strcmp(argv[i], "--json") == 0) {
      json = true;
    } else if (std::strcmp(argv[i], "--shape") == 0 && i + 1 < argc &&
               std::sscanf(argv[i + 1], "%lld:%lld:%lld:%lld:%lld:%lld%c", &b, &t, &hq, &hkv,
                           &dim, &w, &end) == 6 &&
               b > 0 && t > 0 && hkv > 0 && hq % hkv == 0 && dim > 0 && w >= 0) {
      shapes.push_back({b, t, hq, hkv, dim, w, 1.0f / std::sqrt(static_cast<float>(dim))});
      ++i;
    } else {
      std::fprintf(stderr,
                   "usage: bench_attention [--json] [--shape B:T:Hq:Hkv:D:W]...\n"
                   "  (bad or incomplete argument: '%s'; Hq must be a multiple of Hkv)\n",
                   argv[i]);
      return 2;
    }
  }
  if (shapes.empty()) {
    for (int64_t head_dim : {64, 128}) {
      for (int64_t window : {0, 512}) {
        shapes.push_back(
            {1, 1024, 16, 4, head_dim, window, 1.0f / std::sqrt(static_cast<float>(head_dim))});
      }
    }
    shapes.push_back({8, 256, 8, 2, 64, 0, 1.0f / std::sqrt(64.0f)});  // bench-8x512
  }
  std::vector<Result> results;
  for (const AttentionShape& s : shapes) {
    for (int threads : {1, 2}) results.push_back(Measure(s, threads));
  }
  if (json) {
    std::printf("[\n");
    for (size_t i = 0; i < results.size(); ++i) {
      const Result& r = results[i];
      std::printf(
          "  {\"batch\": %lld, \"seq\": %lld, \"q_heads\": %lld, \"kv_heads\": %lld, "
          "\"head_dim\": %lld, \"window\": %lld, \"threads\": %d, "
          "\"forward_seconds\": %.6f, \"backward_seconds\": %.6f, \"gflops\": %.3f}%s\n",
          static_cast<long long>(r.shape.batch), static_cast<long long>(r.shape.seq),
          static_cast<long long>(r.shape.q_heads), static_cast<long long>(r.shape.kv_heads),
          static_cast<long long>(r.shape.head_dim), static_cast<long long>(r.shape.window),
          r.threads, r.forward_seconds, r.backward_seconds, r.gflops,
          i + 1 < results.size() ? "," : "");
    }
    std::printf("]\n");
  } else {
    std::printf("attention forward and backward, variant %s\n",
                lockstep::rk::ActiveIsa().name.c_str());
    std::printf("%5s %5s %3s %3s %4s %6s %7s %10s %10s %8s\n", "B", "T", "Hq", "Hkv", "D",
                "window", "threads", "forward s", "backward s", "GFLOP/s");
    for (const Result& r : results) {
      std::printf("%5lld %5lld %3lld %3lld %4lld %6lld %7d %10.4f %10.4f %8.2f\n",
                  static_cast<long long>(r.shape.batch), static_cast<long long>(r.shape.seq),
                  static_cast<long long>(r.shape.q_heads), static_cast<long long>(r.shape.kv_heads),
                  static_cast<long long>(r.shape.head_dim), static_cast<long long>(r.shape.window),
                  r.threads, r.forward_seconds, r.backward_seconds, r.gflops);
    }
  }
  return 0;
}
