// Tests that edit a kit the way a dishonest publisher would: after changing a file, make
// kit.json list its new size and sha256, so that only the deeper checks can tell.
#pragma once

#include <filesystem>
#include <string>
#include <vector>

#include "lockstep/core.h"
#include "lockstep/state.h"

namespace lockstep::test {

inline void RelistKitFile(const std::filesystem::path& kit, const std::string& path) {
  kit::KitManifest m = kit::ReadManifest(kit);
  for (kit::KitFile& f : m.files) {
    if (f.path != path) continue;
    const std::vector<uint8_t> bytes = ReadFileBytes(kit / path);
    f.size = bytes.size();
    f.sha256 = Sha256(bytes);
  }
  WriteFileSynced(kit / kit::kManifestName, kit::ManifestJson(m));
}

// `tiny`'s config with a checkpoint every `every` steps, written to `path`: kits of many short
// units. Fails (Error) if tiny.yaml no longer says ckpt_every: 10.
inline void WriteTinyWithCheckpointEvery(const std::filesystem::path& path, int every) {
  std::string config =
      ReadFileText(std::filesystem::path(LOCKSTEP_SOURCE_DIR) / "configs/tiny.yaml");
  const size_t at = config.find("ckpt_every: 10");
  if (at == std::string::npos) Fail("configs/tiny.yaml: no 'ckpt_every: 10' to replace");
  config.replace(at, 14, "ckpt_every: " + std::to_string(every));
  WriteFileSynced(path, config);
}

}  // namespace lockstep::test
