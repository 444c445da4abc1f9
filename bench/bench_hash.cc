// Hashing speed (issue: "Hashing at >= 0.9 x cores x single-core BLAKE2b speed"). Prints one
// JSON object: libsodium's BLAKE2b-256 over one stream on one core; lockstep's array digest
// (docs/formats/state-hash.md: 1 MiB chunks, Blake2b256Many) on 1 thread and on every
// core; and the ratio of the all-core rate to cores x the single-core rates. Same data, same
// process, best of several rounds.
//
// usage: bench_hash [MIB [THREADS]]   (default 512 MiB, every core)
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <thread>
#include <vector>

#include "lockstep/core.h"
#include "lockstep/state.h"

namespace {

template <typename F>
double BestSeconds(F&& f) {
  double best = 1e30;
  for (int round = 0; round < 5; ++round) {
    const auto start = std::chrono::steady_clock::now();
    f();
    best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  }
  return best;
}

}  // namespace

int main(int argc, char** argv) {
  using namespace lockstep;
  const size_t mib = argc > 1 ? std::strtoull(argv[1], nullptr, 10) : 512;
  std::vector<float> data(mib << 18);
  uint32_t x = 1;
  for (float& f : data) {
    x = x * 1664525u + 1013904223u;
    f = static_cast<float>(x >> 8) * 0x1.0p-24f - 0.5f;
  }
  const double gib = static_cast<double>(data.size() * sizeof(float)) / (1 << 30);
  const int cores = argc > 2 ? std::atoi(argv[2]) : static_cast<int>(std::thread::hardware_concurrency());
  if (cores < 1) {
    std::fprintf(stderr, "usage: bench_hash [MIB [THREADS]]\n");
    return 2;
  }
  Digest sink{};
  const double sodium = BestSeconds([&] { sink = Blake2b().Update(std::span<const float>(data)).Final(); });
  SetThreads(1);
  const double one = BestSeconds([&] { sink = ArrayDigest(data); });
  SetThreads(cores);
  const double all = BestSeconds([&] { sink = ArrayDigest(data); });
  fmt::print(
      "{{\"implementation\": \"{}\", \"gib\": {:.3f}, \"cores\": {},\n"
      " \"libsodium_one_stream_gib_per_s\": {:.3f},\n"
      " \"array_digest_1_thread_gib_per_s\": {:.3f},\n"
      " \"array_digest_{}_threads_gib_per_s\": {:.3f},\n"
      " \"all_cores_over_cores_x_libsodium\": {:.3f},\n"
      " \"all_cores_over_cores_x_1_thread\": {:.3f}, \"target\": 0.9, \"digest_byte0\": {}}}\n",
      Blake2bImplementation(), gib, cores, gib / sodium, gib / one, cores, gib / all,
      (gib / all) / (cores * gib / sodium), (gib / all) / (cores * gib / one), sink[0]);
}
