// lockstep core: errors, parallel loops over independent work, floating-point environment.
#pragma once

#include <fmt/format.h>

#include <cstdint>
#include <stdexcept>
#include <string>
#include <utility>

namespace lockstep {

// Every failure lockstep reports is an Error whose message names the operation (or file),
// the argument (or field) and the offending values.
class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

template <typename... Args>
[[noreturn]] void Fail(fmt::format_string<Args...> format, Args&&... args) {
  throw Error(fmt::format(format, std::forward<Args>(args)...));
}

// ---- threads ------------------------------------------------------------------------------
// The number of worker threads kernels may use. Results never depend on it (the numerics
// contract); only speed does. Default: 1.
void SetThreads(int threads);
int Threads();

// Runs body(i) for i in [0, count) on up to Threads() threads. Tasks must write disjoint
// outputs; which thread runs which task is unspecified. body must not throw.
void ParallelFor(int64_t count, void (*body)(int64_t, void*), void* context);

template <typename Body>
void ParallelFor(int64_t count, Body&& body) {
  ParallelFor(
      count, [](int64_t i, void* ctx) { (*static_cast<Body*>(ctx))(i); },
      const_cast<void*>(static_cast<const void*>(&body)));
}

// ---- floating-point environment -------------------------------------------------------------
// Fails (Error) when the current thread flushes subnormals (x86 MXCSR FTZ/DAZ, Arm FPCR.FZ)
// or does not round to nearest-even: the numerics contract needs IEEE behaviour.
void RequireIeeeFloatingPoint();

// Describes the floating-point control state, e.g. "MXCSR=0x1f80 (FTZ off, DAZ off, RN)".
std::string DescribeFloatingPointState();

}  // namespace lockstep
