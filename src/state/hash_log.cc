// state_hashes.jsonl: the run's chain, one {"step": N, "hash": "<64 hex>"} object per line.
#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "lockstep/state.h"
#include "state/internal.h"

namespace lockstep {
namespace {
std::string FormatLine(const StateHashLine& line) {
  return fmt::format("{{\"step\": {}, \"hash\": \"{}\"}}\n", line.step, ToHex(line.hash));
}
}  // namespace

// core's WriteFileSynced replaces a file; a log needs O_APPEND, so that a crash can at worst
// leave a torn last line (which the reader reports) and never lose earlier ones.
void AppendStateHashLine(const std::filesystem::path& path, const StateHashLine& line) {
  const std::string text = FormatLine(line);
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

void WriteStateHashLines(const std::filesystem::path& path, std::span<const StateHashLine> lines) {
  std::string text;
  for (const StateHashLine& line : lines) text += FormatLine(line);
  std::filesystem::path temp = path;
  temp += ".tmp";
  WriteFileSynced(temp, text);
  std::error_code ec;
  std::filesystem::rename(temp, path, ec);
  if (ec) Fail("{}: cannot rename to {}: {}", temp.string(), path.string(), ec.message());
  const std::filesystem::path parent = path.parent_path();
  SyncDirectory(parent.empty() ? "." : parent);
}

std::vector<StateHashLine> ReadStateHashLines(const std::filesystem::path& path) {
  const std::string text = ReadFileText(path);
  std::vector<StateHashLine> lines;
  size_t begin = 0;
  for (size_t number = 1; begin < text.size(); ++number) {
    const std::string what = fmt::format("{}: line {}", path.string(), number);
    const size_t end = text.find('\n', begin);
    if (end == std::string::npos) Fail("{}: no final newline (a torn append?)", what);
    const state_internal::Json value =
        state_internal::ParseJsonStrict(std::string_view(text).substr(begin, end - begin), what);
    state_internal::RequireKeys(value, {"step", "hash"}, what);
    const StateHashLine line{.step = state_internal::U64Field(value, "step", what),
                             .hash = state_internal::DigestField(value, "hash", what)};
    if (!lines.empty() && line.step <= lines.back().step) {
      Fail("{}: step {} does not follow step {} (steps must increase)", what, line.step,
           lines.back().step);
    }
    lines.push_back(line);
    begin = end + 1;
  }
  return lines;
}

}  // namespace lockstep
