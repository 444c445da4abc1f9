// kit.json: the list of every file in a kit with its size and sha256, and kit verification.
#include <sys/mman.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <map>

#include "lockstep/state.h"
#include "state/internal.h"

namespace lockstep::kit {
namespace {
namespace fs = std::filesystem;
using state_internal::Json;

constexpr std::string_view kManifestFormat = "lockstep-kit";

bool IsPathCharacter(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' ||
         c == '_' || c == '-';
}

}  // namespace

void ValidateKitPath(std::string_view path, std::string_view what) {
  if (path.empty()) Fail("{}: empty file path", what);
  if (path == kManifestName) Fail("{}: \"{}\" may not list itself", what, path);
  size_t begin = 0;
  while (true) {
    const size_t end = std::min(path.find('/', begin), path.size());
    const std::string_view segment = path.substr(begin, end - begin);
    if (segment.empty() || segment == "." || segment == "..") {
      Fail("{}: file path \"{}\" has an empty, \".\" or \"..\" segment", what, path);
    }
    if (!std::all_of(segment.begin(), segment.end(), IsPathCharacter)) {
      Fail("{}: file path \"{}\" has a character outside [A-Za-z0-9._-/]", what, path);
    }
    if (end == path.size()) break;
    begin = end + 1;
  }
}

std::string ManifestJson(const KitManifest& manifest) {
  Json files = Json::array();
  for (const KitFile& f : manifest.files) {
    files.push_back({{"path", f.path}, {"sha256", ToHex(f.sha256)}, {"size", f.size}});
  }
  const Json j = {{"files", files},
                  {"format", kManifestFormat},
                  {"format_version", kKitFormatVersion},
                  {"lockstep",
                   {{"contract_version", manifest.contract_version},
                    {"git_commit", manifest.git_commit},
                    {"version", manifest.lockstep_version}}}};
  return j.dump(2) + "\n";
}

KitManifest ParseManifest(std::string_view text, std::string_view what) {
  using namespace state_internal;
  const Json j = ParseJsonStrict(text, what);
  RequireKeys(j, {"files", "format", "format_version", "lockstep"}, what);
  RequireFormat(j, kManifestFormat, kKitFormatVersion, what);
  KitManifest manifest;
  const std::string lockstep_what = fmt::format("{}: field \"lockstep\"", what);
  const Json& lockstep = j["lockstep"];
  RequireKeys(lockstep, {"contract_version", "git_commit", "version"}, lockstep_what);
  manifest.contract_version = static_cast<int>(
      std::min<uint64_t>(U64Field(lockstep, "contract_version", lockstep_what), INT32_MAX));
  manifest.git_commit = StringField(lockstep, "git_commit", lockstep_what);
  manifest.lockstep_version = StringField(lockstep, "version", lockstep_what);

  if (!j["files"].is_array()) Fail("{}: field \"files\" is not an array", what);
  for (size_t i = 0; i < j["files"].size(); ++i) {
    const std::string entry_what = fmt::format("{}: files[{}]", what, i);
    const Json& entry = j["files"][i];
    RequireKeys(entry, {"path", "sha256", "size"}, entry_what);
    KitFile file{StringField(entry, "path", entry_what), U64Field(entry, "size", entry_what),
                 DigestField(entry, "sha256", entry_what)};
    ValidateKitPath(file.path, entry_what);
    if (!manifest.files.empty() && manifest.files.back().path >= file.path) {
      Fail("{}: path \"{}\" is not after \"{}\" (paths must be sorted and unique)", entry_what,
           file.path, manifest.files.back().path);
    }
    manifest.files.push_back(std::move(file));
  }
  return manifest;
}

KitManifest ReadManifest(const fs::path& kit_dir) {
  const fs::path path = kit_dir / kManifestName;
  return ParseManifest(ReadFileText(path, kMaxJsonBytes, "a kit.json"), path.string());
}

KitFile DescribeFile(const fs::path& file, std::string relative_path) {
  return DescribeFile(File::OpenForReading(file), std::move(relative_path));
}

KitFile DescribeFile(const File& in, std::string relative_path) {
  KitFile result{std::move(relative_path), in.Size(), {}};
  if (result.size == 0) {
    result.sha256 = Sha256({});
    return result;
  }
  const auto size = static_cast<size_t>(result.size);
  void* mapped = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, in.fd(), 0);
  if (mapped == MAP_FAILED) Fail("{}: cannot map: {}", in.path().string(), std::strerror(errno));
  ::madvise(mapped, size, MADV_SEQUENTIAL);
  result.sha256 = Sha256({static_cast<const uint8_t*>(mapped), size});
  ::munmap(mapped, size);
  return result;
}

std::vector<std::string> VerifyKit(const fs::path& kit_dir) {
  const KitManifest manifest = ReadManifest(kit_dir);
  std::map<std::string, const KitFile*> listed;
  for (const KitFile& f : manifest.files) listed.emplace(f.path, &f);

  std::vector<std::string> problems;
  std::error_code ec;
  for (auto it = fs::recursive_directory_iterator(kit_dir, ec); !ec && it != fs::end(it);
       it.increment(ec)) {
    const std::string relative = it->path().lexically_relative(kit_dir).generic_string();
    if (it->is_directory() && !it->is_symlink()) continue;
    if (relative == kManifestName) continue;
    if (!it->is_regular_file() || it->is_symlink()) {
      problems.push_back(fmt::format("{}: not a regular file (kits hold plain files only)",
                                     it->path().string()));
    } else if (!listed.contains(relative)) {
      problems.push_back(fmt::format("{}: not listed in kit.json", it->path().string()));
    }
  }
  if (ec) Fail("{}: cannot list the kit: {}", kit_dir.string(), ec.message());

  for (const KitFile& expected : manifest.files) {
    const fs::path path = kit_dir / expected.path;
    const fs::file_status status = fs::symlink_status(path);
    if (!fs::is_regular_file(status)) {
      if (!fs::exists(status)) {
        problems.push_back(fmt::format("{}: missing (listed in kit.json)", path.string()));
      } else if (fs::is_directory(status)) {
        problems.push_back(fmt::format("{}: a directory, listed in kit.json as a file of {} bytes",
                                       path.string(), expected.size));
      }
      continue;  // anything else was reported above as not a regular file
    }
    const KitFile actual = DescribeFile(path, expected.path);
    if (actual.size != expected.size) {
      problems.push_back(fmt::format("{}: size {} bytes, kit.json says {}", path.string(),
                                     actual.size, expected.size));
    } else if (actual.sha256 != expected.sha256) {
      problems.push_back(fmt::format("{}: sha256 {}, kit.json says {}", path.string(),
                                     ToHex(actual.sha256), ToHex(expected.sha256)));
    }
  }
  std::sort(problems.begin(), problems.end());
  // The units' links, once the files they are read from are those kit.json lists.
  if (problems.empty()) problems = VerifyKitChain(kit_dir);
  return problems;
}

}  // namespace lockstep::kit
