// state_hashes.jsonl: the run's chain, one {"step": N, "hash": "<64 hex>"} object per line.

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
  const std::vector<std::string> text = LogLines(path, torn == TornLine::kDrop);
  std::vector<StateHashLine> lines;
  for (size_t n = 0; n < text.size(); ++n) {
    const std::string what = fmt::format("{}: line {}", path.string(), n + 1);
    const state_internal::Json value = state_internal::ParseJsonStrict(text[n], what);
    state_internal::RequireKeys(value, {"step", "hash"}, what);
    const StateHashLine line{.step = state_internal::U64Field(value, "step", what),
                             .hash = state_internal::DigestField(value, "hash", what)};
    if (!lines.empty() && line.step <= lines.back().step) {
      Fail("{}: step {} does not follow step {} (steps must increase)", what, line.step,
           lines.back().step);
    }
    lines.push_back(line);
  }
  return lines;
}

}  // namespace lockstep
