#include "fuzz/fuzz_target.h"
#include "lockstep/state.h"

// Both readers: F32 only (checkpoints) and every dtype (trace dumps), whose tensors may need
// moving to be aligned; every element of every tensor is read.
LOCKSTEP_FUZZ_TARGET({
  for (const lockstep::SafetensorsDtypes accept :
       {lockstep::SafetensorsDtypes::kF32, lockstep::SafetensorsDtypes::kAny}) {
    try {
      const lockstep::SafetensorsFile file = lockstep::ParseSafetensors(
          std::vector<uint8_t>(text.begin(), text.end()), "fuzz.safetensors", accept);
      uint8_t sum = 0;
      for (const lockstep::NamedTensor& t : file.tensors()) {
        (void)file.Get(t.name);
        for (const std::byte b : t.data.bytes()) sum = static_cast<uint8_t>(sum + uint8_t(b));
      }
      (void)sum;
    } catch (const lockstep::Error&) {
    }
  }
})
