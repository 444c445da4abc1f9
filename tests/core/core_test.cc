// Core: thread settings, ParallelFor and ParallelForEachThread coverage, decimal numbers in text,
// the floating-point environment check.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <map>
#include <mutex>
#include <thread>
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

TEST(ParallelForEachThread, RunsEachThreadIndexOnceOnTheSameThreadEveryCall) {
  for (int threads : {1, 2, 3, 4, 7}) {
    SetThreads(threads);
    std::map<int64_t, std::thread::id> first;  // thread index -> the thread that ran it
    for (int call = 0; call < 50; ++call) {
      std::mutex mutex;
      std::map<int64_t, std::thread::id> ran;
      std::atomic<int> calls{0};
      ParallelForEachThread([&](int64_t t) {
        ++calls;
        std::lock_guard<std::mutex> lock(mutex);
        ran[t] = std::this_thread::get_id();
      });
      ASSERT_EQ(calls.load(), threads);
      ASSERT_EQ(ran.size(), static_cast<size_t>(threads)) << threads << " threads";
      EXPECT_EQ(ran.begin()->first, 0);
      EXPECT_EQ(ran.rbegin()->first, threads - 1);
      EXPECT_EQ(ran[0], std::this_thread::get_id()) << "index 0 runs on the caller";
      if (call == 0) first = ran;
      EXPECT_EQ(ran, first) << "call " << call << ", " << threads << " threads";
    }
    // Mixed with dynamic loops, which reuse the same workers in any order.
    std::vector<std::atomic<int>> hits(100);
    ParallelFor(static_cast<int64_t>(hits.size()), [&](int64_t i) { hits[i]++; });
    ParallelForEachThread([&](int64_t t) { EXPECT_EQ(std::this_thread::get_id(), first[t]); });
    // Nested inside a parallel loop, every index runs in order on the calling thread.
    ParallelFor(3, [&](int64_t) {
      const std::thread::id outer = std::this_thread::get_id();
      std::vector<int64_t> order;
      ParallelForEachThread([&](int64_t t) {
        EXPECT_EQ(std::this_thread::get_id(), outer);
        order.push_back(t);
      });
      ASSERT_EQ(order.size(), static_cast<size_t>(threads));
      for (int t = 0; t < threads; ++t) EXPECT_EQ(order[t], t);
    });
  }
  SetThreads(1);
}

// A progress line in units (stderr is not a terminal here: a line per tenth): the count, the
// unit, the time left; with a delay, work that ends sooner prints nothing at all.
TEST(ProgressLine, CountsUnitsWithTheTimeLeftAndStaysQuietForShortWork) {
  ::testing::internal::CaptureStderr();
  {
    ProgressLine line("step 7: forward and backward", 4, true, "microbatches", 0);
    for (int i = 0; i < 4; ++i) line.Add(1);
  }
  const std::string shown = ::testing::internal::GetCapturedStderr();
  EXPECT_NE(shown.find("step 7: forward and backward:  25% (1 / 4 microbatches, "),
            std::string::npos)
      << shown;
  EXPECT_NE(shown.find("s left)"), std::string::npos) << shown;
  EXPECT_NE(shown.find("100% (4 / 4 microbatches, "), std::string::npos) << shown;
  ::testing::internal::CaptureStderr();
  {
    ProgressLine quiet("short", 4, true, "microbatches", 3600);
    for (int i = 0; i < 4; ++i) quiet.Add(1);
  }
  EXPECT_EQ(::testing::internal::GetCapturedStderr(), "");
}

TEST(ParseDecimalU64, DigitsOnlyFromZeroTo2To64Minus1) {
  EXPECT_EQ(ParseDecimalU64("0"), 0u);
  EXPECT_EQ(ParseDecimalU64("1000"), 1000u);
  EXPECT_EQ(ParseDecimalU64("18446744073709551615"), UINT64_MAX);
  for (const char* bad : {"18446744073709551616", "99999999999999999999", "", "-1", "+1", " 1",
                          "1 ", "0x10", "1e3", "1.5", "01", "00"}) {
    EXPECT_EQ(ParseDecimalU64(bad), std::nullopt) << "'" << bad << "'";
  }
}

// A task that throws (a Fail, a failed allocation of scratch memory) on a worker is carried out
// to the caller after the join: it ended in std::terminate, or unwound past live workers.
TEST(ParallelFor, AnExceptionInATaskReachesTheCallerAfterTheJoin) {
  for (int threads : {1, 2, 3, 7}) {
    SetThreads(threads);
    std::atomic<int64_t> ran{0};
    try {
      ParallelFor(1000, [&](int64_t i) {
        ran++;
        if (i == 500) Fail("task {} failed", i);
      });
      ADD_FAILURE() << "no exception at " << threads << " threads";
    } catch (const Error& e) {
      EXPECT_STREQ(e.what(), "task 500 failed");
    }
    EXPECT_LT(ran.load(), 1000) << "tasks went on after the failure";
    // Each worker's task (t > 0 runs on a worker) throws; the pool stays usable afterwards.
    EXPECT_THROW(ParallelForEachThread([&](int64_t t) {
                   if (t == threads - 1) Fail("thread {} failed", t);
                 }),
                 Error);
    std::vector<int> hits(100, 0);
    ParallelFor(100, [&](int64_t i) { hits[i]++; });
    EXPECT_EQ(std::count(hits.begin(), hits.end(), 1), 100);
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

// A library that sets FTZ on the thread that loads it is named; a worker whose environment
// changed fails the next parallel loop instead of computing other bits. (The worker keeps FTZ:
// this test is the last use of its pool.)
TEST(FloatingPoint, ALibraryThatSetsFtzIsNamedAndAWorkerWithItFailsItsLoop) {
  const unsigned saved = _mm_getcsr();
  _mm_setcsr(saved | (1u << 15));
  try {
    RequireIeeeFloatingPoint("loading libexample.so");
    ADD_FAILURE() << "FTZ accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("loading libexample.so left this thread's"),
              std::string::npos)
        << e.what();
  }
  _mm_setcsr(saved);
  SetThreads(2);
  ParallelForEachThread([](int64_t t) {
    if (t == 1) _mm_setcsr(_mm_getcsr() | (1u << 15));  // the worker's own MXCSR
  });
  EXPECT_THROW(ParallelForEachThread([](int64_t) {}), Error);
  SetThreads(1);
}
#endif

}  // namespace
}  // namespace lockstep
