#include "state/internal.h"

#include <fcntl.h>
#include <fmt/ranges.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <set>
#include <vector>

namespace lockstep::state_internal {

std::string Shown(const Json& value) { return ShownJson(value); }

uint64_t ElementCount(const std::vector<int64_t>& shape, std::string_view what) {
  constexpr uint64_t kMaxElements = (uint64_t{1} << 61) - 1;  // so that bytes fit in int64
  uint64_t count = 1;
  for (int64_t dim : shape) {
    if (dim < 0) Fail("{}: negative dimension {} in shape [{}]", what, dim, fmt::join(shape, ", "));
    const auto d = static_cast<uint64_t>(dim);
    if (d != 0 && count > kMaxElements / d) {
      Fail("{}: shape [{}] has more than 2^61 elements", what, fmt::join(shape, ", "));
    }
    count *= d;
  }
  return count;
}

void RequireKeys(const Json& value, std::initializer_list<std::string_view> keys,
                 std::string_view what) {
  if (!value.is_object()) Fail("{}: expected a JSON object, got {}", what, Shown(value));
  for (std::string_view key : keys) {
    if (!value.contains(key)) Fail("{}: missing field \"{}\"", what, key);
  }
  for (const auto& [key, unused] : value.items()) {
    bool known = false;
    for (std::string_view k : keys) known = known || k == key;
    if (!known) Fail("{}: unknown field \"{}\"", what, key);
  }
}

uint64_t AsU64(const Json& value, std::string_view what) {
  // nlohmann parses every non-negative integer literal as number_unsigned; anything else
  // (negative, fractional, string) would otherwise be converted silently.
  if (!value.is_number_unsigned()) {
    Fail("{}: expected an unsigned integer, got {}", what, Shown(value));
  }
  return value.get<uint64_t>();
}

void RequireFormat(const Json& object, std::string_view format, uint64_t version,
                   std::string_view what) {
  const std::string got = StringField(object, "format", what);
  if (got != format) Fail("{}: field \"format\" is '{}', expected '{}'", what, got, format);
  const uint64_t got_version = U64Field(object, "format_version", what);
  if (got_version != version) {
    Fail("{}: field \"format_version\" is {}, this build reads version {}", what, got_version,
         version);
  }
}

uint64_t U64Field(const Json& object, const char* key, std::string_view what) {
  return AsU64(object.at(key), fmt::format("{}: field \"{}\"", what, key));
}

std::string StringField(const Json& object, const char* key, std::string_view what) {
  const Json& value = object.at(key);
  if (!value.is_string())
    Fail("{}: field \"{}\": expected a string, got {}", what, key, Shown(value));
  return value.get<std::string>();
}

Digest DigestField(const Json& object, const char* key, std::string_view what) {
  return DigestFromHex(StringField(object, key, what), fmt::format("{}: field \"{}\"", what, key));
}

File File::OpenForReading(const std::filesystem::path& path) {
  const int fd = OpenRegularFileForReading(path);
  // Pieces are read front to back: let the kernel read ahead while the last piece is hashed.
  ::posix_fadvise(fd, 0, 0, POSIX_FADV_SEQUENTIAL);
  return File(fd, path);
}

File File::Create(const std::filesystem::path& path) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) Fail("{}: cannot open for writing: {}", path.string(), std::strerror(errno));
  return File(fd, path);
}

File::File(File&& other) noexcept : fd_(other.fd_), path_(std::move(other.path_)) {
  other.fd_ = -1;
}

File::~File() {
  if (fd_ >= 0) ::close(fd_);
}

uint64_t File::Size() const {
  struct stat st;
  if (::fstat(fd_, &st) != 0) Fail("{}: cannot stat: {}", path_.string(), std::strerror(errno));
  return static_cast<uint64_t>(st.st_size);
}

void File::ReadAt(uint64_t offset, std::span<uint8_t> out) const {
  size_t done = 0;
  while (done < out.size()) {
    const ssize_t n = ::pread(fd_, out.data() + done, out.size() - done,
                              static_cast<off_t>(offset + done));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) Fail("{}: read failed at byte {}: {}", path_.string(), offset + done,
                    std::strerror(errno));
    if (n == 0) {
      Fail("{}: ends at byte {}, but {} bytes from byte {} were expected (truncated while read?)",
           path_.string(), offset + done, out.size(), offset);
    }
    done += static_cast<size_t>(n);
  }
}

void File::Write(std::span<const uint8_t> bytes) {
  size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n = ::write(fd_, bytes.data() + done, bytes.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) Fail("{}: write failed: {}", path_.string(), std::strerror(errno));
    done += static_cast<size_t>(n);
  }
}

void File::Sync() {
  if (::fsync(fd_) != 0) Fail("{}: fsync failed: {}", path_.string(), std::strerror(errno));
}

}  // namespace lockstep::state_internal
