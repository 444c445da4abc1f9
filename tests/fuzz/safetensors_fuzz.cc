#include "fuzz/fuzz_target.h"
#include "lockstep/state.h"

LOCKSTEP_FUZZ_TARGET({
  const lockstep::SafetensorsFile file =
      lockstep::ParseSafetensors(std::vector<uint8_t>(text.begin(), text.end()), "fuzz.safetensors");
  for (const lockstep::NamedTensor& t : file.tensors()) (void)file.Get(t.name);
})
