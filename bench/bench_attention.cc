// Attention forward + backward throughput at the shapes of a small Llama-style model.
//
//   bench_attention [--json]
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
  int64_t head_dim, window;
  int threads;
  double seconds, gflops;
};

Result Measure(const AttentionShape& s, int threads) {
  const int64_t nq = s.batch * s.seq * s.q_heads * s.head_dim;
  const int64_t nkv = s.batch * s.seq * s.kv_heads * s.head_dim;
  const std::vector<float> q = Filled(nq, 2.0f), k = Filled(nkv, 2.0f), v = Filled(nkv, 2.0f),
                           dout = Filled(nq, 1.0f);
  std::vector<float> out(nq), lse(s.batch * s.q_heads * s.seq), dq(nq), dk(nkv), dv(nkv);
  lockstep::SetThreads(threads);
  const auto run = [&] {
    lockstep::rk::AttentionForward(s, q, k, v, out, lse);
    lockstep::rk::AttentionBackward(s, q, k, v, out, lse, dout, dq, dk, dv);
  };
  run();  // warm-up: page faults, first dispatch
  double best = 1e30;
  for (int rep = 0; rep < 5; ++rep) {
    const auto start = std::chrono::steady_clock::now();
    run();
    best = std::min(
        best, std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  }
  const double forward_flops =
      4.0 * static_cast<double>(s.head_dim) * VisiblePairs(s) * s.batch * s.q_heads;
  return {s.head_dim, s.window, threads, best, 3.5 * forward_flops / best * 1e-9};
}

}  // namespace

int main(int argc, char** argv) {
  const bool json = argc > 1 && std::strcmp(argv[1], "--json") == 0;
  std::vector<Result> results;
  for (int64_t head_dim : {64, 128}) {
    for (int64_t window : {0, 512}) {
      const AttentionShape s{
          1, 1024, 16, 4, head_dim, window, 1.0f / std::sqrt(static_cast<float>(head_dim))};
      for (int threads : {1, 2}) results.push_back(Measure(s, threads));
    }
  }
  if (json) {
    std::printf("[\n");
    for (size_t i = 0; i < results.size(); ++i) {
      const Result& r = results[i];
      std::printf(
          "  {\"head_dim\": %lld, \"window\": %lld, \"threads\": %d, \"seconds\": %.6f, "
          "\"gflops\": %.3f}%s\n",
          static_cast<long long>(r.head_dim), static_cast<long long>(r.window), r.threads,
          r.seconds, r.gflops, i + 1 < results.size() ? "," : "");
    }
    std::printf("]\n");
  } else {
    std::printf("attention fwd+bwd, B=1 T=1024 Hq=16 Hkv=4, variant %s\n",
                lockstep::rk::ActiveIsa().name.c_str());
    std::printf("%8s %7s %7s %10s %8s\n", "head_dim", "window", "threads", "seconds", "GFLOP/s");
    for (const Result& r : results) {
      std::printf("%8lld %7lld %7d %10.4f %8.2f\n", static_cast<long long>(r.head_dim),
                  static_cast<long long>(r.window), r.threads, r.seconds, r.gflops);
    }
  }
  return 0;
}
