// lockstep::File and the whole-file helpers made of it.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <optional>
#include <vector>

#include "lockstep/core.h"

namespace lockstep {

File File::Open(const std::filesystem::path& path, int flags, unsigned permissions,
                const char* what) {
  int fd;
  do {
    fd = ::open(path.c_str(), flags | O_CLOEXEC, permissions);
  } while (fd < 0 && errno == EINTR);
  if (fd < 0) Fail("{}: cannot open {}: {}", path.string(), what, std::strerror(errno));
  return File(fd, path);
}

File File::OpenForReading(const std::filesystem::path& path) {
  // O_NONBLOCK: opening a FIFO for reading would otherwise wait for a writer forever.
  File file = Open(path, O_RDONLY | O_NONBLOCK, 0, "for reading");
  struct stat st {};
  if (::fstat(file.fd_, &st) != 0 || !S_ISREG(st.st_mode)) {
    Fail("{}: not a regular file", path.string());
  }
  ::fcntl(file.fd_, F_SETFL, ::fcntl(file.fd_, F_GETFL) & ~O_NONBLOCK);
  // Files are mostly read front to back: let the kernel read ahead.
  ::posix_fadvise(file.fd_, 0, 0, POSIX_FADV_SEQUENTIAL);
  return file;
}

File File::Create(const std::filesystem::path& path) {
  if (const std::optional<std::string> problem = OutputProblem(path, OutputKind::kFile)) {
    Fail("{}", *problem);
  }
  // Truncated only once known to be a regular file; O_NOFOLLOW and O_NONBLOCK keep a link or a
  // FIFO that took the name since the check from being written through or waited on.
  File file = Open(path, O_WRONLY | O_CREAT | O_NOFOLLOW | O_NONBLOCK, 0644, "for writing");
  struct stat st {};
  if (::fstat(file.fd_, &st) != 0 || !S_ISREG(st.st_mode)) {
    Fail("{}: not a regular file: refusing to write into it", path.string());
  }
  if (::ftruncate(file.fd_, 0) != 0) {
    Fail("{}: cannot truncate: {}", path.string(), std::strerror(errno));
  }
  ::fcntl(file.fd_, F_SETFL, ::fcntl(file.fd_, F_GETFL) & ~O_NONBLOCK);
  return file;
}

File File::CreateExclusive(const std::filesystem::path& path, unsigned permissions) {
  return Open(path, O_RDWR | O_CREAT | O_EXCL, permissions, "as a new file");
}

File File::OpenForAppend(const std::filesystem::path& path) {
  // As Create: O_NOFOLLOW and O_NONBLOCK keep a link from being written through and a FIFO from
  // being waited on, and only a regular file is appended to.
  struct stat link {};
  if (::lstat(path.c_str(), &link) == 0 && S_ISLNK(link.st_mode)) {
    Fail("{}: a symbolic link: an output is never written through a link", path.string());
  }
  File file =
      Open(path, O_WRONLY | O_APPEND | O_CREAT | O_NOFOLLOW | O_NONBLOCK, 0644, "for appending");
  struct stat st {};
  if (::fstat(file.fd_, &st) != 0 || !S_ISREG(st.st_mode)) {
    Fail("{}: not a regular file: refusing to append to it", path.string());
  }
  ::fcntl(file.fd_, F_SETFL, ::fcntl(file.fd_, F_GETFL) & ~O_NONBLOCK);
  return file;
}

File File::OpenDirectory(const std::filesystem::path& dir) {
  return Open(dir, O_RDONLY | O_DIRECTORY, 0, "as a directory");
}

namespace {

// `open` names the file in errors (it is what the caller knows it by).
std::optional<int> OpenWithODirect(const std::filesystem::path& path, int access,
                                   const std::filesystem::path& name) {
  int fd;
  do {
    fd = ::open(path.c_str(), access | O_DIRECT | O_CLOEXEC);
  } while (fd < 0 && errno == EINTR);
  if (fd < 0 && errno == EINVAL) return std::nullopt;  // the filesystem has no O_DIRECT
  if (fd < 0) Fail("{}: cannot open for direct I/O: {}", name.string(), std::strerror(errno));
  return fd;
}

}  // namespace

std::optional<File> File::OpenDirect(const std::filesystem::path& path) {
  const std::optional<int> fd = OpenWithODirect(path, O_RDWR, path);
  if (!fd) return std::nullopt;
  return File(*fd, path);
}

std::optional<File> File::ReopenDirectForReading() const {
  const std::filesystem::path self = fmt::format("/proc/self/fd/{}", fd_);
  if (!std::filesystem::exists(self)) return std::nullopt;  // no /proc
  const std::optional<int> fd = OpenWithODirect(self, O_RDONLY, path_);
  if (!fd) return std::nullopt;
  return File(*fd, path_);
}

File::File(File&& other) noexcept : fd_(other.fd_), path_(std::move(other.path_)) {
  other.fd_ = -1;
}

File& File::operator=(File&& other) noexcept {
  if (this != &other) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = other.fd_;
    path_ = std::move(other.path_);
    other.fd_ = -1;
  }
  return *this;
}

File::~File() {
  if (fd_ >= 0) ::close(fd_);
}

uint64_t File::Size() const {
  struct stat st {};
  if (::fstat(fd_, &st) != 0) Fail("{}: cannot stat: {}", path_.string(), std::strerror(errno));
  return static_cast<uint64_t>(st.st_size);
}

uint64_t File::AllocatedBytes() const {
  struct stat st {};
  if (::fstat(fd_, &st) != 0) Fail("{}: cannot stat: {}", path_.string(), std::strerror(errno));
  return static_cast<uint64_t>(st.st_blocks) * 512;
}

void File::ReadAt(uint64_t offset, std::span<uint8_t> out) const {
  const size_t done = ReadUpTo(offset, out);
  if (done < out.size()) {
    Fail("{}: ends at byte {}, but {} bytes from byte {} were expected (truncated while read?)",
         path_.string(), offset + done, out.size(), offset);
  }
}

size_t File::ReadUpTo(uint64_t offset, std::span<uint8_t> out) const {
  size_t done = 0;
  while (done < out.size()) {
    const ssize_t n = ::pread(fd_, out.data() + done, out.size() - done,
                              static_cast<off_t>(offset + done));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      Fail("{}: read failed at byte {}: {}", path_.string(), offset + done, std::strerror(errno));
    }
    if (n == 0) break;
    done += static_cast<size_t>(n);
  }
  return done;
}

std::vector<uint8_t> File::ReadAll() const {
  std::vector<uint8_t> bytes;
  uint8_t buf[1 << 16];
  for (;;) {
    const ssize_t n = ::read(fd_, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) Fail("{}: read failed: {}", path_.string(), std::strerror(errno));
    if (n == 0) return bytes;
    bytes.insert(bytes.end(), buf, buf + n);
  }
}

void File::Write(std::span<const uint8_t> bytes) {
  size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n = ::write(fd_, bytes.data() + done, bytes.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      Fail("{}: write failed after {} of {} bytes: {}", path_.string(), done, bytes.size(),
           std::strerror(errno));
    }
    done += static_cast<size_t>(n);
  }
}

void File::Write(std::string_view text) {
  Write(std::span(reinterpret_cast<const uint8_t*>(text.data()), text.size()));
}

void File::WriteAt(uint64_t offset, std::span<const uint8_t> bytes) {
  size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n = ::pwrite(fd_, bytes.data() + done, bytes.size() - done,
                               static_cast<off_t>(offset + done));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      Fail("{}: write failed at byte {} ({} of {} bytes written): {}", path_.string(),
           offset + done, done, bytes.size(), n == 0 ? "nothing written" : std::strerror(errno));
    }
    done += static_cast<size_t>(n);
  }
}

void File::Sync() const {
  if (::fsync(fd_) != 0) Fail("{}: fsync failed: {}", path_.string(), std::strerror(errno));
}

void File::Close() {
  const int fd = fd_;
  fd_ = -1;
  if (fd >= 0 && ::close(fd) != 0) {
    Fail("{}: close failed: {}", path_.string(), std::strerror(errno));
  }
}

std::vector<uint8_t> ReadFileBytes(const std::filesystem::path& path) {
  return File::OpenForReading(path).ReadAll();
}

std::string ReadFileText(const std::filesystem::path& path) {
  const std::vector<uint8_t> bytes = ReadFileBytes(path);
  return std::string(bytes.begin(), bytes.end());
}

std::vector<uint8_t> ReadFileBytes(const std::filesystem::path& path, uint64_t max_bytes,
                                   std::string_view what) {
  const File file = File::OpenForReading(path);
  const uint64_t size = file.Size();
  if (size > max_bytes) {
    Fail("{}: {} bytes, more than {} may hold ({} bytes)", path.string(), size, what, max_bytes);
  }
  std::vector<uint8_t> bytes(static_cast<size_t>(size) + 1);  // one more: a file that grew
  const size_t read = file.ReadUpTo(0, bytes);
  if (read > size) Fail("{}: grew while it was read ({} bytes when opened)", path.string(), size);
  bytes.resize(read);
  return bytes;
}

std::string ReadFileText(const std::filesystem::path& path, uint64_t max_bytes,
                         std::string_view what) {
  const std::vector<uint8_t> bytes = ReadFileBytes(path, max_bytes, what);
  return std::string(bytes.begin(), bytes.end());
}

void WriteFileSynced(const std::filesystem::path& path, std::span<const uint8_t> bytes) {
  File file = File::Create(path);
  file.Write(bytes);
  file.Sync();
  file.Close();
}

void WriteFileSynced(const std::filesystem::path& path, std::string_view text) {
  WriteFileSynced(path, std::span(reinterpret_cast<const uint8_t*>(text.data()), text.size()));
}

// WriteFileSynced replaces a file; a log needs O_APPEND, so that a crash can at worst leave a
// torn last line (which its reader reports) and never lose earlier ones.
void AppendFileSynced(const std::filesystem::path& path, std::string_view text) {
  File file = File::OpenForAppend(path);
  file.Write(text);
  file.Sync();
  file.Close();
}

std::vector<std::string> Lines(std::string_view text) {
  std::vector<std::string> lines;
  while (!text.empty()) {
    const size_t end = text.find('\n');
    lines.emplace_back(text.substr(0, end));
    text.remove_prefix(end == std::string_view::npos ? text.size() : end + 1);
  }
  return lines;
}

std::vector<std::string> LogLines(const std::filesystem::path& path, bool drop_torn) {
  const std::string text = ReadFileText(path);
  std::vector<std::string> lines = Lines(text);
  if (!text.empty() && text.back() != '\n') {
    if (!drop_torn) {
      Fail("{}: line {}: no final newline (an append cut short by a crash or a full disk)",
           path.string(), lines.size());
    }
    std::fprintf(stderr, "%s: dropping a torn last line (%zu bytes without a newline)\n",
                 path.c_str(), lines.back().size());
    lines.pop_back();
  }
  return lines;
}

void SyncDirectory(const std::filesystem::path& dir) { File::OpenDirectory(dir).Sync(); }

namespace {
struct FileIdentity {
  dev_t device;
  ino_t inode;
  bool directory;
  nlink_t links;
  bool operator==(const FileIdentity& o) const { return device == o.device && inode == o.inode; }
};
// stat(2), links followed; nothing when the path does not exist (or cannot be reached).
std::optional<FileIdentity> IdentityOf(const std::filesystem::path& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return std::nullopt;
  return FileIdentity{st.st_dev, st.st_ino, S_ISDIR(st.st_mode), st.st_nlink};
}
// The path and each of its ancestors that exist, after resolving the links in the part that
// exists (so that a link to a file inside a directory is seen inside it).
std::vector<FileIdentity> SelfAndAncestors(const std::filesystem::path& path) {
  std::vector<FileIdentity> chain;
  std::error_code ec;
  std::filesystem::path p = std::filesystem::weakly_canonical(std::filesystem::absolute(path), ec);
  if (ec) p = std::filesystem::absolute(path).lexically_normal();
  for (;;) {
    if (const auto id = IdentityOf(p)) chain.push_back(*id);
    const std::filesystem::path parent = p.parent_path();
    if (parent == p || p.empty()) break;
    p = parent;
  }
  return chain;
}
// Whether a file with identity `id` lies anywhere under `dir` (another hard link of it).
bool HardLinkedUnder(const std::filesystem::path& dir, const FileIdentity& id) {
  std::error_code ec;
  for (auto it = std::filesystem::recursive_directory_iterator(dir, ec);
       !ec && it != std::filesystem::recursive_directory_iterator(); it.increment(ec)) {
    if (const auto entry = IdentityOf(it->path()); entry && *entry == id) return true;
  }
  return false;
}
}  // namespace

void RequireFreeSpace(const std::filesystem::path& path, uint64_t bytes, std::string_view what) {
  std::filesystem::path probe = std::filesystem::absolute(path);
  std::error_code error;
  while (!std::filesystem::exists(probe, error) && probe.has_parent_path() &&
         probe != probe.parent_path()) {
    probe = probe.parent_path();
  }
  const std::filesystem::space_info space = std::filesystem::space(probe, error);
  if (error) Fail("{}: cannot read the free disk space: {}", probe.string(), error.message());
  if (space.available < bytes) {
    Fail("{}: {} needs {} bytes, but the file system holding {} has {} bytes available", what,
         path.string(), bytes, probe.string(), space.available);
  }
}

void RefuseOutputsOntoInputs(const std::vector<NamedPath>& outputs,
                             const std::vector<NamedPath>& inputs) {
  // Two outputs of one command: the second would replace the first. Compared by their paths
  // resolved as far as they exist, and by identity where both exist.
  for (size_t i = 0; i < outputs.size(); ++i) {
    for (size_t j = i + 1; j < outputs.size(); ++j) {
      const NamedPath &a = outputs[i], &b = outputs[j];
      if (a.path.empty() || b.path.empty()) continue;
      std::error_code ec_a, ec_b;
      const std::filesystem::path ca = std::filesystem::weakly_canonical(a.path, ec_a),
                                  cb = std::filesystem::weakly_canonical(b.path, ec_b);
      const std::optional<FileIdentity> ia = IdentityOf(a.path), ib = IdentityOf(b.path);
      if ((!ec_a && !ec_b && ca == cb) || (ia && ib && *ia == *ib)) {
        Fail("{} {} and {} {} are the same file: one output would replace the other", a.name,
             a.path.string(), b.name, b.path.string());
      }
    }
  }
  for (const NamedPath& out : outputs) {
    if (out.path.empty()) continue;
    const std::vector<FileIdentity> holders = SelfAndAncestors(out.path);
    const std::optional<FileIdentity> self = IdentityOf(out.path);
    for (const NamedPath& in : inputs) {
      if (in.path.empty()) continue;
      const std::optional<FileIdentity> input = IdentityOf(in.path);
      if (!input) continue;
      if (self && *self == *input) {
        Fail("{} {} is the input {} {}: the command would write over what it reads", out.name,
             out.path.string(), in.name, in.path.string());
      }
      if (input->directory &&
          (std::ranges::find(holders, *input) != holders.end() ||
           (self && !self->directory && self->links > 1 && HardLinkedUnder(in.path, *self)))) {
        Fail("{} {} lies inside the input {} {}: the command would write into what it reads",
             out.name, out.path.string(), in.name, in.path.string());
      }
    }
  }
}

namespace {

constexpr std::string_view kLinkRefusal =
    "a symbolic link inside the destination: refusing to write through it";

// openat, retried on EINTR; -1 with errno set on failure.
int OpenAt(int dir, const std::string& name, int flags, unsigned permissions = 0) {
  int fd;
  do {
    fd = ::openat(dir, name.c_str(), flags | O_CLOEXEC | O_NOFOLLOW, permissions);
  } while (fd < 0 && errno == EINTR);
  return fd;
}

// Whether `name` in directory `dir` (a descriptor, or AT_FDCWD) is a symbolic link: what an
// open with O_NOFOLLOW met when it failed with ELOOP, or with ENOTDIR under O_DIRECTORY.
bool IsLink(int dir, const std::string& name) {
  struct stat st {};
  return ::fstatat(dir, name.c_str(), &st, AT_SYMLINK_NOFOLLOW) == 0 && S_ISLNK(st.st_mode);
}

// A name directly in a directory: not empty, ".", "..", nor holding '/'.
void CheckName(const std::filesystem::path& dir, std::string_view name) {
  if (name.empty() || name == "." || name == ".." || name.find('/') != std::string_view::npos) {
    LOCKSTEP_INTERNAL("{}: '{}' is not a file name in the directory", dir.string(), name);
  }
}

}  // namespace

Directory Directory::Open(const std::filesystem::path& path, bool create) {
  if (create) {
    std::error_code ec;
    std::filesystem::create_directories(path, ec);  // an existing link fails below, by name
  }
  const int fd = OpenAt(AT_FDCWD, path.string(), O_RDONLY | O_DIRECTORY);
  if (fd < 0) {
    if (IsLink(AT_FDCWD, path.string())) {
      Fail("{}: a symbolic link: refusing to write through it", path.string());
    }
    if (errno == ENOTDIR) Fail("{}: exists and is not a directory", path.string());
    Fail("{}: cannot open as a directory: {}", path.string(), std::strerror(errno));
  }
  return Directory(File(fd, path));
}

Directory Directory::HolderOf(const std::filesystem::path& path) {
  return Directory(File::OpenDirectory(path.parent_path().empty() ? std::filesystem::path(".")
                                                                  : path.parent_path()));
}

Directory Directory::Duplicate() const {
  const int self = ::fcntl(dir_.fd(), F_DUPFD_CLOEXEC, 0);
  if (self < 0)
    Fail("{}: cannot duplicate its descriptor: {}", path().string(), std::strerror(errno));
  return Directory(File(self, path()));
}

Directory Directory::Subdirectory(const std::filesystem::path& relative) const {
  File at = Duplicate().dir_;
  for (const std::filesystem::path& component : relative) {
    const std::string name = component.string();
    if (name.empty() || name == ".") continue;
    CheckName(at.path(), name);
    const std::filesystem::path sub = at.path() / name;
    if (::mkdirat(at.fd(), name.c_str(), 0755) != 0 && errno != EEXIST) {
      Fail("{}: cannot make the directory: {}", sub.string(), std::strerror(errno));
    }
    const int fd = OpenAt(at.fd(), name, O_RDONLY | O_DIRECTORY);
    if (fd < 0) {
      if (IsLink(at.fd(), name)) Fail("{}: {}", sub.string(), kLinkRefusal);
      Fail("{}: cannot open as a directory: {}", sub.string(), std::strerror(errno));
    }
    at = File(fd, sub);
  }
  return Directory(std::move(at));
}

bool Directory::Contains(std::string_view name) const {
  CheckName(path(), name);
  struct stat st {};
  return ::fstatat(dir_.fd(), std::string(name).c_str(), &st, AT_SYMLINK_NOFOLLOW) == 0;
}

File Directory::OpenRegular(std::string_view name, int flags, const char* what) const {
  CheckName(path(), name);
  const std::filesystem::path full = path() / name;
  // O_NONBLOCK: a FIFO is refused below instead of waited on.
  const int fd = OpenAt(dir_.fd(), std::string(name), flags | O_NONBLOCK, 0644);
  if (fd < 0) {
    if (IsLink(dir_.fd(), std::string(name))) Fail("{}: {}", full.string(), kLinkRefusal);
    Fail("{}: cannot open {}: {}", full.string(), what, std::strerror(errno));
  }
  File file(fd, full);
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) Fail("{}: not a regular file", full.string());
  if (st.st_nlink > 1) {
    Fail("{}: has {} hard links: refusing to use a file that is also elsewhere (delete it)",
         full.string(), st.st_nlink);
  }
  ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) & ~O_NONBLOCK);
  return file;
}

File Directory::OpenForReading(std::string_view name) const {
  return OpenRegular(name, O_RDONLY, "for reading");
}

File Directory::OpenForAppend(std::string_view name) const {
  return OpenRegular(name, O_WRONLY | O_APPEND | O_CREAT, "for appending");
}

std::optional<File> Directory::CreateNew(std::string_view name, unsigned permissions) const {
  CheckName(path(), name);
  const int fd = OpenAt(dir_.fd(), std::string(name), O_RDWR | O_CREAT | O_EXCL, permissions);
  if (fd < 0 && errno == EEXIST) return std::nullopt;
  if (fd < 0) Fail("{}: cannot create: {}", (path() / name).string(), std::strerror(errno));
  return File(fd, path() / name);
}

void Directory::WriteFileSynced(std::string_view name, std::string_view text) const {
  StagedFile staged(*this, name, OutputKind::kFile);
  staged.file().Write(text);
  staged.Commit();
}

void Directory::Rename(std::string_view from, std::string_view to) const {
  CheckName(path(), from);
  CheckName(path(), to);
  if (::renameat(dir_.fd(), std::string(from).c_str(), dir_.fd(), std::string(to).c_str()) != 0) {
    Fail("renaming {} to {}: {}", (path() / from).string(), (path() / to).string(),
         std::strerror(errno));
  }
}

void Directory::Remove(std::string_view name) const {
  CheckName(path(), name);
  if (::unlinkat(dir_.fd(), std::string(name).c_str(), 0) != 0 && errno != ENOENT) {
    Fail("{}: cannot delete: {}", (path() / name).string(), std::strerror(errno));
  }
}

void ReplaceFileSynced(const std::filesystem::path& path, std::string_view text) {
  StagedFile staged(path, OutputKind::kFile);
  staged.file().Write(text);
  staged.Commit();
}

// ---- outputs --------------------------------------------------------------------------------

namespace {

bool IsFileKind(OutputKind kind) {
  return kind == OutputKind::kFile || kind == OutputKind::kNewFile;
}

const char* TypeName(mode_t mode) {
  if (S_ISREG(mode)) return "a regular file";
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISLNK(mode)) return "a symbolic link";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISFIFO(mode)) return "a FIFO";
  if (S_ISSOCK(mode)) return "a socket";
  return "a special file";
}

// What is wrong with what `st` describes (lstat: a link is not followed) as an output of `kind`,
// emptiness aside; nothing when a command may write there.
std::optional<std::string> ExistingProblem(const std::string& shown, const struct stat& st,
                                           OutputKind kind) {
  const mode_t mode = st.st_mode;
  if (S_ISLNK(mode)) {
    return fmt::format(
        "{}: a symbolic link: an output is never written through a link nor "
        "replaces one (name the file itself, or another path)",
        shown);
  }
  if (!S_ISREG(mode) && !S_ISDIR(mode)) {
    return fmt::format("{}: {}: an output is never written into nor replaces one", shown,
                       TypeName(mode));
  }
  switch (kind) {
    case OutputKind::kFile:
      if (S_ISDIR(mode)) return fmt::format("{}: a directory, not a file", shown);
      return std::nullopt;
    case OutputKind::kNewFile:
      return fmt::format(
          "{}: exists ({}): this output never replaces anything (remove it or "
          "name another path)",
          shown, TypeName(mode));
    case OutputKind::kNewDirectory:
    case OutputKind::kDirectory:
      if (!S_ISDIR(mode)) return fmt::format("{}: {}, not a directory", shown, TypeName(mode));
      return std::nullopt;
  }
  return std::nullopt;
}

// Fails when what is at `name` in `dir` now (a link not followed) may not be an output of `kind`.
void CheckDestination(int dir, const std::string& name, const std::string& shown, OutputKind kind) {
  struct stat st {};
  if (::fstatat(dir, name.c_str(), &st, AT_SYMLINK_NOFOLLOW) == 0) {
    if (auto problem = ExistingProblem(shown, st, kind)) Fail("{}", *problem);
  } else if (errno != ENOENT) {
    Fail("{}: cannot be examined: {}", shown, std::strerror(errno));
  }
}

std::string StagingName(std::string_view name, int attempt) {
  return fmt::format(".{}.{}-{}.tmp", name, ::getpid(), attempt);
}
constexpr int kStagingAttempts = 1000;

// The directory that will hold output file `out`, once `out` is known to be a possible output.
Directory CheckedHolder(const std::filesystem::path& out, OutputKind kind) {
  if (const std::optional<std::string> problem = OutputProblem(out, kind)) Fail("{}", *problem);
  return Directory::HolderOf(out);
}

// `out` without trailing separators ("kit/" is the directory "kit").
std::filesystem::path WithoutTrailingSlash(std::filesystem::path out) {
  while (!out.has_filename() && out.has_parent_path() && out != out.root_path()) {
    out = out.parent_path();
  }
  return out;
}

// Whether the directory `path` is the root of a mount (statx's STATX_ATTR_MOUNT_ROOT, which
// sees bind mounts too; where the kernel does not report it, a device other than its parent's).
bool IsMountPoint(const std::filesystem::path& path) {
  struct statx self {};
  if (::statx(AT_FDCWD, path.c_str(), AT_SYMLINK_NOFOLLOW, STATX_BASIC_STATS, &self) != 0) {
    return false;
  }
  if ((self.stx_attributes_mask & STATX_ATTR_MOUNT_ROOT) != 0) {
    return (self.stx_attributes & STATX_ATTR_MOUNT_ROOT) != 0;
  }
  struct stat here {
  }, parent{};
  return ::stat(path.c_str(), &here) == 0 && ::stat((path / "..").c_str(), &parent) == 0 &&
         here.st_dev != parent.st_dev;
}

// The directory that will hold output directory `out` (made, with its parents, when absent).
Directory StagingHolder(const std::filesystem::path& out) {
  if (const std::optional<std::string> problem = OutputProblem(out, OutputKind::kNewDirectory)) {
    Fail("{}", *problem);
  }
  const std::filesystem::path target = WithoutTrailingSlash(out);
  const std::filesystem::path name = target.filename();
  if (name.empty() || name == "." || name == "..") {
    Fail("{}: names no directory that can be made (name the new directory itself)", out.string());
  }
  if (IsMountPoint(target)) {
    Fail(
        "{}: a mount point: this output is made beside it and renamed into place, which cannot "
        "replace a mount point (name a new directory inside it, e.g. {})",
        out.string(), (target / "out").string());
  }
  if (target.has_parent_path()) {
    std::error_code ec;
    std::filesystem::create_directories(target.parent_path(), ec);
    if (ec) Fail("{}: cannot make the directory: {}", target.parent_path().string(), ec.message());
  }
  return Directory::HolderOf(target);
}

}  // namespace

std::optional<std::string> OutputProblem(const std::filesystem::path& path, OutputKind kind) {
  const bool file = IsFileKind(kind);
  if (path.empty()) {
    return fmt::format("'': an empty path names no {}", file ? "file" : "directory");
  }
  const std::string shown = path.string();
  const std::filesystem::path name = path.filename();
  if (file && (name.empty() || name == "." || name == "..")) {
    return fmt::format("{}: names a directory, not a file", shown);
  }
  struct stat st {};
  if (::lstat(path.c_str(), &st) == 0) {
    if (std::optional<std::string> problem = ExistingProblem(shown, st, kind)) return problem;
    if (kind == OutputKind::kNewDirectory) {
      std::error_code ec;
      const bool empty = std::filesystem::is_empty(path, ec);
      if (ec) return fmt::format("{}: cannot list the directory: {}", shown, ec.message());
      if (!empty) {
        return fmt::format(
            "{}: a directory that is not empty (this output must be absent or an "
            "empty directory)",
            shown);
      }
    }
    return std::nullopt;
  }
  if (errno == ENOTDIR) return fmt::format("{}: a part of the path is not a directory", shown);
  if (errno != ENOENT)
    return fmt::format("{}: cannot be examined: {}", shown, std::strerror(errno));
  if (!file) return std::nullopt;  // made with its parents
  const std::filesystem::path holder =
      path.parent_path().empty() ? std::filesystem::path(".") : path.parent_path();
  struct stat hs {};
  if (::stat(holder.c_str(), &hs) != 0) {
    return fmt::format("{}: there is no directory {} to write it in{}", shown, holder.string(),
                       errno == ENOENT ? "" : fmt::format(" ({})", std::strerror(errno)));
  }
  if (!S_ISDIR(hs.st_mode)) {
    return fmt::format("{}: {} is {}, not a directory", shown, holder.string(),
                       TypeName(hs.st_mode));
  }
  return std::nullopt;
}

void CheckOutput(const NamedPath& out, OutputKind kind) {
  if (const std::optional<std::string> problem = OutputProblem(out.path, kind)) {
    Fail("{} {}", out.name, *problem);
  }
}

StagedFile::StagedFile(const std::filesystem::path& out, OutputKind kind, unsigned permissions)
    : StagedFile(CheckedHolder(out, kind), out.filename().string(), kind, permissions) {}

StagedFile::StagedFile(const Directory& dir, std::string_view name, OutputKind kind,
                       unsigned permissions)
    : dir_(dir.Duplicate()), name_(name), kind_(kind), file_([&] {
        LOCKSTEP_CHECK(IsFileKind(kind), "StagedFile of a directory kind");
        CheckName(dir_.path(), name_);
        CheckDestination(dir_.dir_.fd(), name_, (dir_.path() / name_).string(), kind);
        for (int attempt = 0;; ++attempt) {
          temp_ = StagingName(name_, attempt);
          if (std::optional<File> file = dir_.CreateNew(temp_, permissions))
            return std::move(*file);
          if (attempt + 1 == kStagingAttempts) {
            Fail("{}: {} staging names beside it are taken", (dir_.path() / name_).string(),
                 kStagingAttempts);
          }
        }
      }()) {}

StagedFile::~StagedFile() {
  if (!committed_) ::unlinkat(dir_.dir_.fd(), temp_.c_str(), 0);
}

void StagedFile::Commit() {
  file_.Sync();
  file_.Close();
  const int fd = dir_.dir_.fd();
  const std::string target = (dir_.path() / name_).string();
  const auto failed = [&] {
    Fail("renaming {} to {}: {}", (dir_.path() / temp_).string(), target, std::strerror(errno));
  };
  // Absent: a rename that never replaces. kFile's present destination: exchanged with the staged
  // file in one step (RENAME_EXCHANGE), then what came out is examined, so that nothing put there
  // at any moment is replaced unseen: a regular file is removed; anything else is exchanged back
  // and refused.
  for (int attempt = 0;; ++attempt) {
    if (attempt == kStagingAttempts) {
      Fail("{}: appeared and vanished {} times while it was renamed into place", target, attempt);
    }
    if (::renameat2(fd, temp_.c_str(), fd, name_.c_str(), RENAME_NOREPLACE) == 0) break;
    if (errno == EINVAL) {  // a file system without renameat2's flags: checked, then renamed
      CheckDestination(fd, name_, target, kind_);
      if (kind_ == OutputKind::kNewFile ? ::linkat(fd, temp_.c_str(), fd, name_.c_str(), 0)
                                        : ::renameat(fd, temp_.c_str(), fd, name_.c_str())) {
        if (errno == EEXIST) Fail("{}: appeared while it was written: never replaced", target);
        failed();
      }
      if (kind_ == OutputKind::kNewFile) ::unlinkat(fd, temp_.c_str(), 0);
      break;
    }
    if (errno != EEXIST) failed();
    if (kind_ == OutputKind::kNewFile) {
      Fail("{}: appeared while it was written: never replaced", target);
    }
    if (::renameat2(fd, temp_.c_str(), fd, name_.c_str(), RENAME_EXCHANGE) != 0) {
      if (errno == ENOENT) continue;  // gone again: rename without replacing
      failed();
    }
    struct stat out {};
    if (::fstatat(fd, temp_.c_str(), &out, AT_SYMLINK_NOFOLLOW) == 0 && S_ISREG(out.st_mode)) {
      ::unlinkat(fd, temp_.c_str(), 0);
      break;
    }
    // Not ours to replace: put back where it was, and this output under its staging name again.
    const std::string problem = ExistingProblem(target, out, kind_).value_or(target + ": changed");
    if (::renameat2(fd, temp_.c_str(), fd, name_.c_str(), RENAME_EXCHANGE) != 0) {
      committed_ = true;  // the staging name now holds what was at the destination: kept
      Fail("{} (it is now at {}, and the output at {})", problem, (dir_.path() / temp_).string(),
           target);
    }
    Fail("{}", problem);
  }
  committed_ = true;
  dir_.Sync();
}

StagedDirectory::StagedDirectory(const std::filesystem::path& out)
    : holder_(StagingHolder(out)), name_(WithoutTrailingSlash(out).filename().string()) {
  for (int attempt = 0;; ++attempt) {
    temp_ = StagingName(name_, attempt);
    if (::mkdirat(holder_.dir_.fd(), temp_.c_str(), 0755) == 0) break;
    if (errno != EEXIST) {
      Fail("{}: cannot make the directory: {}", (holder_.path() / temp_).string(),
           std::strerror(errno));
    }
    if (attempt + 1 == kStagingAttempts) {
      Fail("{}: {} staging names beside it are taken", (holder_.path() / name_).string(),
           kStagingAttempts);
    }
  }
  staging_ = holder_.path() / temp_;
}

StagedDirectory::~StagedDirectory() {
  if (committed_) return;
  std::error_code ignored;
  std::filesystem::remove_all(staging_, ignored);
}

void StagedDirectory::Commit() {
  SyncDirectory(staging_);
  const int fd = holder_.dir_.fd();
  const std::string target = (holder_.path() / name_).string();
  if (::renameat(fd, temp_.c_str(), fd, name_.c_str()) != 0) {
    if (errno == ENOTEMPTY || errno == EEXIST) {
      Fail("{}: no longer an empty directory: nothing replaced", target);
    }
    if (errno == ENOTDIR) Fail("{}: exists and is not a directory: nothing replaced", target);
    if (errno == EBUSY) {
      Fail(
          "{}: a mount point or otherwise in use, which a directory cannot be renamed onto: "
          "nothing replaced",
          target);
    }
    Fail("renaming {} to {}: {}", staging_.string(), target, std::strerror(errno));
  }
  committed_ = true;
  holder_.Sync();
}

}  // namespace lockstep
