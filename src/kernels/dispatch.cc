// Chooses between the scalar reference and the Highway targets compiled into this binary.
#include <hwy/aligned_allocator.h>
#include <hwy/highway.h>
#include <hwy/targets.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cctype>
#include <mutex>

#if HWY_ARCH_X86
#include <cpuid.h>
#elif HWY_ARCH_ARM_A64
#include <asm/hwcap.h>
#include <sys/auxv.h>
#endif

#include "kernels/impl.h"
#include "kernels/internal.h"

namespace lockstep::rk {
namespace {

// Targets whose MulAdd is a fused multiply-add. Only these can realise the contract's FMA
// chains bit for bit; the others compiled by Highway (EMU128) are never dispatched.
constexpr int64_t kFmaTargets = 0
#if HWY_ARCH_X86
                                | HWY_AVX2 | HWY_AVX3 | HWY_AVX3_DL
#elif HWY_ARCH_ARM_A64
                                | HWY_NEON
#endif
    ;

// The target whose variants differ by an int8 dot-product extension, and the extension's name.
#if HWY_ARCH_X86
constexpr int64_t kDotTarget = HWY_AVX2;
constexpr const char* kDotSuffix = "_VNNI";
#elif HWY_ARCH_ARM_A64
constexpr int64_t kDotTarget = HWY_NEON;
constexpr const char* kDotSuffix = "_DOTPROD";
#else
constexpr int64_t kDotTarget = 0;
constexpr const char* kDotSuffix = "";
#endif

// Whether this CPU has the int8 dot-product extension: AVX-VNNI (CPUID leaf 7, subleaf 1, EAX
// bit 4), or AArch64's dot product (HWCAP_ASIMDDP).
bool CpuHasInt8Dot() {
#if HWY_ARCH_X86
  unsigned a = 0, b = 0, c = 0, d = 0;
  return __get_cpuid_count(7, 1, &a, &b, &c, &d) != 0 && ((a >> 4) & 1u) != 0;
#elif HWY_ARCH_ARM_A64
  return (getauxval(AT_HWCAP) & HWCAP_ASIMDDP) != 0;
#else
  return false;
#endif
}

Isa MakeIsa(int64_t target, bool int8_dot) {
  if (target == 0) return Isa{0, "reference", false};
  return Isa{target, std::string(hwy::TargetName(target)) + (int8_dot ? kDotSuffix : ""), int8_dot};
}

// The variants of `targets` (and of the dot extension where `dot`), reference first, then best
// first: Highway numbers better targets with lower bits, and a dot variant precedes its plain one.
std::vector<Isa> IsasIn(int64_t targets, bool dot) {
  std::vector<Isa> isas{ReferenceIsa()};
  for (int64_t t = targets & HWY_TARGETS & kFmaTargets; t != 0; t &= t - 1) {
    const int64_t bit = t & -t;
    if (bit == kDotTarget && dot) isas.push_back(MakeIsa(bit, true));
    isas.push_back(MakeIsa(bit, false));
  }
  return isas;
}

int64_t CpuTargets() {
  static const int64_t targets = [] {
    hwy::SetSupportedTargetsForTest(0);
    return hwy::SupportedTargets();
  }();
  return targets;
}

std::mutex g_mutex;
std::atomic<int64_t> g_active{-1};  // -1: not chosen yet
std::atomic<bool> g_int8_dot{false};

void Activate(const Isa& isa) {
  // Highway dispatches to the best target it believes supported: pin it to exactly this one.
  if (isa.hwy_target != 0) hwy::SetSupportedTargetsForTest(isa.hwy_target);
  g_int8_dot.store(isa.int8_dot);
  g_active.store(isa.hwy_target);
}

int64_t ActiveTarget() {
  int64_t t = g_active.load();
  if (t >= 0) return t;
  std::lock_guard<std::mutex> lock(g_mutex);
  if (g_active.load() < 0) {
    const std::vector<Isa> usable = UsableIsas();
    Activate(usable.size() > 1 ? usable[1] : usable[0]);
  }
  return g_active.load();
}
}  // namespace

Isa ReferenceIsa() { return MakeIsa(0, false); }
std::vector<Isa> CompiledIsas() { return IsasIn(HWY_TARGETS, true); }
std::vector<Isa> UsableIsas() { return IsasIn(CpuTargets(), CpuHasInt8Dot()); }
Isa ActiveIsa() {
  const int64_t target = ActiveTarget();
  return MakeIsa(target, g_int8_dot.load());
}

void SetIsa(const Isa& isa) {
  const std::vector<Isa> usable = UsableIsas();
  if (std::find(usable.begin(), usable.end(), isa) == usable.end()) {
    std::string names;
    for (const Isa& u : usable) names += (names.empty() ? "" : ", ") + u.name;
    Fail("SetIsa: variant '{}' is not usable on this CPU (usable: {})", isa.name, names);
  }
  std::lock_guard<std::mutex> lock(g_mutex);
  Activate(isa);
}

Isa IsaByName(const std::string& name) {
  auto lower = [](std::string s) {
    for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    return s;
  };
  const std::vector<Isa> usable = UsableIsas();
  if (lower(name) == "best") return usable.size() > 1 ? usable[1] : usable[0];
  for (const Isa& isa : CompiledIsas()) {
    if (lower(isa.name) == lower(name)) return isa;
  }
  std::string names;
  for (const Isa& c : CompiledIsas()) names += ", " + c.name;
  Fail("unknown SIMD variant '{}' (known: best{})", name, names);
}

namespace detail {
bool UsingReference() { return ActiveTarget() == 0; }
bool Int8DotActive() {
  ActiveTarget();
  return g_int8_dot.load();
}
}  // namespace detail

float* ScratchFloats(Scratch kind, size_t floats) {
  struct Buffer {
    hwy::AlignedFreeUniquePtr<float[]> data;
    size_t floats = 0;
  };
  thread_local std::array<Buffer, static_cast<size_t>(Scratch::kCount)> buffers;
  Buffer& b = buffers[static_cast<size_t>(kind)];
  if (floats > b.floats) {
    b.data.reset();  // the old buffer goes before the new one is mapped
    b.data = hwy::AllocateAligned<float>(floats);
    if (!b.data) Fail("kernels: cannot allocate {} bytes of scratch memory", floats * sizeof(float));
    b.floats = floats;
  }
  return b.data.get();
}

}  // namespace lockstep::rk
