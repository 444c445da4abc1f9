#include <cfenv>

#include "lockstep/core.h"
#if defined(__x86_64__) || defined(__i386__)
#include <xmmintrin.h>
#endif

namespace lockstep {
namespace {
struct FpState {
  bool flush_to_zero = false;
  bool denormals_are_zero = false;
  bool round_to_nearest = true;
  unsigned raw = 0;
};

FpState ReadFpState() {
  FpState s;
#if defined(__x86_64__) || defined(__i386__)
  s.raw = _mm_getcsr();
  s.flush_to_zero = (s.raw & (1u << 15)) != 0;
  s.denormals_are_zero = (s.raw & (1u << 6)) != 0;
  s.round_to_nearest = ((s.raw >> 13) & 3u) == 0;
#elif defined(__aarch64__)
  uint64_t fpcr;
  __asm__ volatile("mrs %0, fpcr" : "=r"(fpcr));
  s.raw = static_cast<unsigned>(fpcr);
  s.flush_to_zero = (fpcr & (1u << 24)) != 0;
  s.round_to_nearest = ((fpcr >> 22) & 3u) == 0;
#endif
  if (std::fegetround() != FE_TONEAREST) s.round_to_nearest = false;
  return s;
}
}  // namespace

std::string DescribeFloatingPointState() {
  const FpState s = ReadFpState();
#if defined(__x86_64__) || defined(__i386__)
  return fmt::format("MXCSR=0x{:04x} (FTZ {}, DAZ {}, {})", s.raw, s.flush_to_zero ? "on" : "off",
                     s.denormals_are_zero ? "on" : "off",
                     s.round_to_nearest ? "round-to-nearest" : "directed rounding");
#else
  return fmt::format("FPCR=0x{:08x} (FZ {}, {})", s.raw, s.flush_to_zero ? "on" : "off",
                     s.round_to_nearest ? "round-to-nearest" : "directed rounding");
#endif
}

void RequireIeeeFloatingPoint(std::string_view cause) {
  const FpState s = ReadFpState();
  if (!s.flush_to_zero && !s.denormals_are_zero && s.round_to_nearest) return;
  if (!cause.empty()) {
    Fail(
        "{} left this thread's floating-point environment at {} (a library built with "
        "-ffast-math sets FTZ/DAZ when it loads); lockstep needs subnormals kept and "
        "round-to-nearest, and refuses to compute with it",
        cause, DescribeFloatingPointState());
  }
  Fail(
      "floating-point environment: {} — lockstep needs subnormals kept and round-to-nearest "
      "(was the process built or started with -ffast-math, or did a library set FTZ/DAZ?)",
      DescribeFloatingPointState());
}

}  // namespace lockstep
