// The init unit against its hashing limit (docs/performance.md, "The init unit"). For a config it
// makes every parameter as `lockstep replay --from-init` does (InitInPieces, piece by piece into
// one buffer of kInitPieceFloats, the pieces hashed by ArrayHasher) and times, best of
// ROUNDS at THREADS:
//   draws_seconds  the parameters made, not hashed;
//   unit_seconds   made and hashed, the replay's work (without its start and its memory plan);
//   hash_limit_seconds  the parameters' bytes (the only bytes the unit hashes: the moments and
//                  gradients are zeros, whose digests need no hashing) hashed at THREADS, the
//                  same ArrayHasher over a piece of the same size;
// and unit_over_hash_limit. The erfinv table is made before the first round (once per process,
// as in the replay; its time is printed as table_seconds).
//
// usage: bench_init [--config NAME_OR_PATH] [--threads N] [--rounds R] [--variant V]
//        (default: bench/configs/open-1b-step.yaml, every core, 3 rounds, the best variant)
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <exception>
#include <ranges>
#include <string>
#include <thread>
#include <vector>

#include "lockstep/core.h"
#include "lockstep/kernels.h"
#include "lockstep/model.h"
#include "lockstep/state.h"

namespace {

using namespace lockstep;

template <typename F>
double BestSeconds(int rounds, F&& f) {
  double best = 1e30;
  for (int round = 0; round < rounds; ++round) {
    const auto start = std::chrono::steady_clock::now();
    f();
    best = std::min(
        best, std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  }
  return best;
}

}  // namespace

int main(int argc, char** argv) {
  std::string config_name = "bench/configs/open-1b-step.yaml";
  int threads = static_cast<int>(std::thread::hardware_concurrency());
  int rounds = 3;
  std::string variant;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (i + 1 < argc && arg == "--config") {
      config_name = argv[++i];
    } else if (i + 1 < argc && arg == "--threads") {
      threads = std::atoi(argv[++i]);
    } else if (i + 1 < argc && arg == "--rounds") {
      rounds = std::atoi(argv[++i]);
    } else if (i + 1 < argc && arg == "--variant") {
      variant = argv[++i];
    } else {
      std::fprintf(
          stderr,
          "usage: bench_init [--config NAME_OR_PATH] [--threads N] [--rounds R] [--variant V]\n");
      return 2;
    }
  }
  if (threads < 1 || rounds < 1) {
    std::fprintf(stderr, "bench_init: --threads and --rounds must be at least 1\n");
    return 2;
  }
  try {
    const RunConfig config = LoadRunConfig(config_name);
    SetThreads(threads);
    if (!variant.empty()) {
      const std::vector<rk::Isa> usable = rk::UsableIsas();
      const auto isa = std::ranges::find(usable, variant, &rk::Isa::name);
      if (isa == usable.end()) Fail("--variant {}: not a variant this CPU runs", variant);
      rk::SetIsa(*isa);
    }
    const std::vector<ParamSpec> specs = ParameterSpecs(config.model);
    int64_t largest = 0, parameters = 0;
    for (const ParamSpec& spec : specs) {
      largest = std::max(largest, spec.numel());
      parameters += spec.numel();
    }
    std::vector<float> piece(static_cast<size_t>(std::min(kInitPieceFloats, largest)));
    const int64_t piece_floats = static_cast<int64_t>(piece.size());
    // Every tensor piece by piece, as the replay makes them; `hash` says whether the pieces are
    // hashed too.
    Digest sink{};
    auto make = [&](bool hash) {
      std::vector<ArrayHasher> hashers(specs.size());
      InitInPieces(config.model, config.train.seed, piece_floats,
                   [&](size_t i, int64_t, std::span<const float> out) {
                     if (hash) hashers[i].Update(out);
                   });
      if (hash) sink = hashers.back().Final();
    };
    const double table = BestSeconds(1, [&] {
      if (std::ranges::any_of(specs, InitByTable)) rk::InitErfinvTable();
    });
    const double draws = BestSeconds(rounds, [&] { make(false); });
    const double unit = BestSeconds(rounds, [&] { make(true); });
    // The same number of bytes hashed: each tensor's element count over a buffer of a piece's
    // size (the hash's speed does not depend on the values).
    const double hash = BestSeconds(rounds, [&] {
      for (const ParamSpec& spec : specs) {
        ArrayHasher hasher;
        for (int64_t begin = 0; begin < spec.numel(); begin += piece_floats) {
          hasher.Update(std::span<const float>(
              piece.data(), static_cast<size_t>(std::min(piece_floats, spec.numel() - begin))));
        }
        sink = hasher.Final();
      }
    });
    fmt::print(
        "{{\"config\": \"{}\", \"parameters\": {}, \"variant\": \"{}\", \"threads\": {}, "
        "\"rounds\": {},\n"
        " \"table_seconds\": {:.3f}, \"draws_seconds\": {:.3f}, \"unit_seconds\": {:.3f},\n"
        " \"hash_limit_seconds\": {:.3f}, \"unit_over_hash_limit\": {:.3f}, \"target\": 1.5,\n"
        " \"draws_ns_per_parameter_per_thread\": {:.3f}, \"digest_byte0\": {}}}\n",
        config.name, parameters, rk::ActiveIsa().name, threads, rounds, table, draws, unit, hash,
        unit / hash, draws * 1e9 * threads / static_cast<double>(parameters), sink[0]);
    return 0;
  } catch (const std::exception& e) {
    fmt::print(stderr, "bench_init: {}\n", e.what());
    return 2;
  }
}
