// Chooses between the scalar reference and the Highway targets compiled into this binary.
#include <hwy/aligned_allocator.h>
#include <hwy/highway.h>
#include <hwy/targets.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cctype>
#include <mutex>

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

Isa MakeIsa(int64_t target) {
  if (target == 0) return Isa{0, "reference"};
  return Isa{target, hwy::TargetName(target)};
}

std::vector<Isa> IsasIn(int64_t targets) {
  std::vector<Isa> isas{ReferenceIsa()};
  // Highway numbers better targets with lower bits; list best first.
  std::vector<int64_t> bits;
  for (int64_t t = targets & HWY_TARGETS & kFmaTargets; t != 0; t &= t - 1) bits.push_back(t & -t);
  for (int64_t b : bits) isas.push_back(MakeIsa(b));
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

int64_t ActiveTarget() {
  int64_t t = g_active.load();
  if (t >= 0) return t;
  std::lock_guard<std::mutex> lock(g_mutex);
  if (g_active.load() < 0) {
    const std::vector<Isa> usable = UsableIsas();
    const int64_t best = usable.size() > 1 ? usable[1].hwy_target : 0;
    if (best != 0) hwy::SetSupportedTargetsForTest(best);
    g_active.store(best);
  }
  return g_active.load();
}
}  // namespace

Isa ReferenceIsa() { return MakeIsa(0); }
std::vector<Isa> CompiledIsas() { return IsasIn(HWY_TARGETS); }
std::vector<Isa> UsableIsas() { return IsasIn(CpuTargets()); }
Isa ActiveIsa() { return MakeIsa(ActiveTarget()); }

void SetIsa(const Isa& isa) {
  const std::vector<Isa> usable = UsableIsas();
  if (std::find(usable.begin(), usable.end(), isa) == usable.end()) {
    std::string names;
    for (const Isa& u : usable) names += (names.empty() ? "" : ", ") + u.name;
    Fail("SetIsa: variant '{}' is not usable on this CPU (usable: {})", isa.name, names);
  }
  std::lock_guard<std::mutex> lock(g_mutex);
  // Highway dispatches to the best target it believes supported: pin it to exactly this one.
  if (isa.hwy_target != 0) hwy::SetSupportedTargetsForTest(isa.hwy_target);
  g_active.store(isa.hwy_target);
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
