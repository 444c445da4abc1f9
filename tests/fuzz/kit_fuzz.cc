// kit.json and trajectory.json: the first byte picks the reader.
#include "fuzz/fuzz_target.h"
#include "lockstep/state.h"

LOCKSTEP_FUZZ_TARGET({
  if (text.empty()) return 0;
  if (text[0] % 2 == 0) {
    (void)lockstep::kit::ManifestJson(lockstep::kit::ParseManifest(text.substr(1), "fuzz kit.json"));
  } else {
    (void)lockstep::kit::TrajectoryJson(
        lockstep::kit::ParseTrajectory(text.substr(1), "fuzz trajectory.json"));
  }
})
