// The run config a checkpoint was trained with, rebuilt from the run descriptor it records.
#include <nlohmann/json.hpp>

#include "lockstep/audit.h"
#include "lockstep/json.h"

namespace lockstep::audit {

RunConfig ConfigOfDescriptor(std::string_view descriptor, const std::string& source) {
  const nlohmann::json parsed = ParseJsonStrict(descriptor, source + " (the run descriptor)");
  if (!parsed.is_object()) Fail("{}: the run descriptor is not a JSON object", source);
  nlohmann::json config;
  for (const char* key : {"name", "model", "train"}) {
    if (!parsed.contains(key)) Fail("{}: the run descriptor has no \"{}\"", source, key);
    config[key] = parsed[key];
  }
  // JSON is YAML: the config parser checks every field as it does for a config file.
  return ParseRunConfig(config.dump(), source);
}

RunConfig ConfigOfCheckpoint(const Checkpoint& checkpoint) {
  return ConfigOfDescriptor(checkpoint.state.descriptor,
                            (checkpoint.dir / RunLayout::kMeta).string() + " descriptor");
}

RunConfig ConfigOfCheckpoint(const CheckpointIndex& checkpoint) {
  return ConfigOfDescriptor(checkpoint.state.descriptor,
                            (checkpoint.dir / RunLayout::kMeta).string() + " descriptor");
}

}  // namespace lockstep::audit
