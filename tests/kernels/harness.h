// Shared helpers for the kernel tests: deterministic inputs, the variant sweep as a gtest
// assertion, fp64 comparisons and finite differences.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "common/expect_error.h"
#include "lockstep/core.h"
#include "lockstep/kernels.h"

namespace lockstep::test {

// Deterministic uniform floats in [lo, hi) from a 64-bit seed (splitmix64; exact int->float).
inline std::vector<float> RandomFloats(int64_t n, uint64_t seed, float lo = -1.0f,
                                       float hi = 1.0f) {
  std::vector<float> v(static_cast<size_t>(n));
  uint64_t s = seed * 0x9E3779B97F4A7C15ull + 1;
  for (auto& x : v) {
    s += 0x9E3779B97F4A7C15ull;
    uint64_t z = s;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    const double u = static_cast<double>(z >> 11) * 0x1.0p-53;
    x = static_cast<float>(lo + (hi - lo) * u);
  }
  return v;
}

inline std::vector<uint32_t> RandomIds(int64_t n, uint32_t vocab, uint64_t seed) {
  std::vector<uint32_t> ids(static_cast<size_t>(n));
  const std::vector<float> u = RandomFloats(n, seed, 0.0f, 1.0f);
  for (size_t i = 0; i < ids.size(); ++i) {
    ids[i] = std::min<uint32_t>(vocab - 1, static_cast<uint32_t>(u[i] * static_cast<float>(vocab)));
  }
  return ids;
}

// Asserts that `run` gives the same bits on every usable variant at 1, 2, 3, 4 and 7 threads
// as the reference at one thread.
inline void ExpectBitwiseInvariant(const std::string& what,
                                   const std::function<std::vector<float>()>& run) {
  for (const rk::SweepResult& r : rk::SweepVariants(run, rk::kSweepThreadCounts)) {
    EXPECT_TRUE(r.equal) << what << ": variant " << r.isa.name << " at " << r.threads
                         << " threads differs from the reference at element " << r.first_diff
                         << " (of " << r.size << ")";
  }
}

// Max |got - want| / (atol + rtol*|want|) must be <= 1.
inline void ExpectClose(const std::string& what, const std::vector<float>& got,
                        const std::vector<double>& want, double atol, double rtol) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < got.size(); ++i) {
    const double err = std::fabs(static_cast<double>(got[i]) - want[i]);
    if (!(err <= atol + rtol * std::fabs(want[i]))) {
      ADD_FAILURE() << what << ": element " << i << " = " << got[i] << ", fp64 reference "
                    << want[i] << " (|err| " << err << " > " << atol << " + " << rtol
                    << "*|ref|)";
      return;
    }
  }
}

// Awkward sizes: 1, 3, 17, 255, 257 and non-multiples of every tile size.
inline constexpr int64_t kAwkwardSizes[] = {1, 3, 17, 255, 257};

}  // namespace lockstep::test
