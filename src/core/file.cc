#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "lockstep/core.h"

namespace lockstep {
namespace {
// Closes the descriptor on every path out.
struct Fd {
  int fd;
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
};
}  // namespace

int OpenRegularFileForReading(const std::filesystem::path& path) {
  // O_NONBLOCK: opening a FIFO for reading would otherwise wait for a writer forever.
  const int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) Fail("{}: cannot open for reading: {}", path.string(), std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    Fail("{}: not a regular file", path.string());
  }
  ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) & ~O_NONBLOCK);
  return fd;
}

std::vector<uint8_t> ReadFileBytes(const std::filesystem::path& path) {
  Fd f{OpenRegularFileForReading(path)};
  std::vector<uint8_t> bytes;
  uint8_t buf[1 << 16];
  for (;;) {
    const ssize_t n = ::read(f.fd, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) Fail("{}: read failed: {}", path.string(), std::strerror(errno));
    if (n == 0) break;
    bytes.insert(bytes.end(), buf, buf + n);
  }
  return bytes;
}

std::string ReadFileText(const std::filesystem::path& path) {
  const std::vector<uint8_t> bytes = ReadFileBytes(path);
  return std::string(bytes.begin(), bytes.end());
}

void WriteFileSynced(const std::filesystem::path& path, std::span<const uint8_t> bytes) {
  Fd f{::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644)};
  if (f.fd < 0) Fail("{}: cannot open for writing: {}", path.string(), std::strerror(errno));
  size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n = ::write(f.fd, bytes.data() + done, bytes.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) Fail("{}: write failed: {}", path.string(), std::strerror(errno));
    done += static_cast<size_t>(n);
  }
  if (::fsync(f.fd) != 0) Fail("{}: fsync failed: {}", path.string(), std::strerror(errno));
}

// WriteFileSynced replaces a file; a log needs O_APPEND, so that a crash can at worst leave a
// torn last line (which its reader reports) and never lose earlier ones.
void AppendFileSynced(const std::filesystem::path& path, std::string_view text) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0) Fail("{}: cannot open for appending: {}", path.string(), std::strerror(errno));
  size_t done = 0;
  int error = 0;
  while (done < text.size()) {
    const ssize_t n = ::write(fd, text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      error = errno;
      break;
    }
    done += static_cast<size_t>(n);
  }
  if (error == 0 && ::fsync(fd) != 0) error = errno;
  ::close(fd);
  if (error != 0) Fail("{}: append failed: {}", path.string(), std::strerror(error));
}

void WriteFileSynced(const std::filesystem::path& path, std::string_view text) {
  WriteFileSynced(path, std::span(reinterpret_cast<const uint8_t*>(text.data()), text.size()));
}

void SyncDirectory(const std::filesystem::path& dir) {
  Fd f{::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC)};
  if (f.fd < 0) Fail("{}: cannot open directory: {}", dir.string(), std::strerror(errno));
  if (::fsync(f.fd) != 0) Fail("{}: fsync failed: {}", dir.string(), std::strerror(errno));
}

}  // namespace lockstep
