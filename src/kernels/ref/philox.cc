// Reference Philox word stream: lockstep::Philox4x32 one counter at a time.
#include "kernels/philox_impl.h"
#include "lockstep/core.h"

namespace lockstep::rk::ref {

void PhiloxWords(uint32_t k0, uint32_t k1, uint64_t first, uint32_t* out, int64_t n) {
  for (int64_t i = 0; i < n;) {
    const uint64_t g = first + static_cast<uint64_t>(i);
    const uint64_t c = g / 4;
    const PhiloxCounter words =
        Philox4x32({static_cast<uint32_t>(c), static_cast<uint32_t>(c >> 32), 0, 0}, {k0, k1});
    for (uint64_t w = g % 4; w < 4 && i < n; ++w) out[i++] = words[w];
  }
}

}  // namespace lockstep::rk::ref
