// Core: thread settings, ParallelFor coverage, the floating-point environment check.
#include <gtest/gtest.h>

#include <atomic>
#include <vector>
#if defined(__x86_64__)
#include <xmmintrin.h>
#endif

#include "lockstep/core.h"

namespace lockstep {
namespace {

TEST(Threads, RejectsNonsense) {
  EXPECT_THROW(SetThreads(0), Error);
  EXPECT_THROW(SetThreads(-3), Error);
  SetThreads(3);
  EXPECT_EQ(Threads(), 3);
  SetThreads(1);
}

TEST(ParallelFor, RunsEveryTaskExactlyOnce) {
  for (int threads : {1, 2, 3, 4, 7}) {
    SetThreads(threads);
    std::vector<std::atomic<int>> hits(1000);
    ParallelFor(static_cast<int64_t>(hits.size()), [&](int64_t i) { hits[i]++; });
    for (auto& h : hits) EXPECT_EQ(h.load(), 1) << threads << " threads";
  }
  SetThreads(1);
}

TEST(FloatingPoint, IeeeByDefault) { EXPECT_NO_THROW(RequireIeeeFloatingPoint()); }

#if defined(__x86_64__)
TEST(FloatingPoint, RefusesFlushToZeroAndDenormalsAreZero) {
  const unsigned saved = _mm_getcsr();
  for (unsigned bit : {1u << 15, 1u << 6}) {  // FTZ, DAZ
    _mm_setcsr(saved | bit);
    try {
      RequireIeeeFloatingPoint();
      _mm_setcsr(saved);
      FAIL() << "FTZ/DAZ accepted";
    } catch (const Error& e) {
      _mm_setcsr(saved);
      EXPECT_NE(std::string(e.what()).find("MXCSR"), std::string::npos) << e.what();
    }
  }
  _mm_setcsr(saved);
}
#endif

}  // namespace
}  // namespace lockstep
