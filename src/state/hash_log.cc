// state_hashes.jsonl: the run's chain, one {"step": N, "hash": "<64 hex>"} object per line.
#include <cstdio>

#include "lockstep/state.h"
#include "state/internal.h"

namespace lockstep {
namespace {
std::string FormatLine(const StateHashLine& line) {
  return fmt::format("{{\"step\": {}, \"hash\": \"{}\"}}\n", line.step, ToHex(line.hash));
}
}  // namespace

void AppendStateHashLine(const std::filesystem::path& path, const StateHashLine& line) {
  AppendFileSynced(path, FormatLine(line));
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

std::vector<StateHashLine> ReadStateHashLines(const std::filesystem::path& path, TornLine torn) {
  std::string text = ReadFileText(path);
  if (torn == TornLine::kDrop && !text.empty() && text.back() != '\n') {
    const size_t keep = text.rfind('\n') == std::string::npos ? 0 : text.rfind('\n') + 1;
    std::fprintf(stderr, "%s: dropping a torn last line (%zu bytes without a newline)\n",
                 path.c_str(), text.size() - keep);
    text.resize(keep);
  }
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
