// A dataset's manifest.json (the shards it names are absent: their checks must fail cleanly).
#include "fuzz/fuzz_target.h"
#include "lockstep/data.h"

LOCKSTEP_FUZZ_TARGET({
  const std::filesystem::path dir = lockstep::fuzz::Scratch() / "dataset";
  std::filesystem::create_directories(dir);
  lockstep::WriteFileSynced(dir / "manifest.json", text);
  (void)lockstep::data::OpenDataset(dir);
})
