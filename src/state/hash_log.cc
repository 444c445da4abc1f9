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
    const state_internal::Json value = ParseJsonStrict(text[n], what);
    RequireKeys(value, {"step", "hash"}, what);
    const StateHashLine line{.step = U64Field(value, "step", what),
                             .hash = DigestField(value, "hash", what)};
    if (!lines.empty() && line.step <= lines.back().step) {
      Fail("{}: step {} does not follow step {} (steps must increase)", what, line.step,
           lines.back().step);
    }
    lines.push_back(line);
  }
  return lines;
}

std::vector<ChainAnchor> CheckpointAnchors(const std::filesystem::path& run_dir,
                                           uint64_t last_step) {
  std::vector<ChainAnchor> anchors;
  for (const uint64_t step : CompleteCheckpointSteps(run_dir)) {
    if (step > last_step) break;
    const std::filesystem::path dir = CheckpointDir(run_dir, step);
    const CheckpointIndex index = OpenCheckpoint(dir);
    anchors.push_back(
        {dir, index.state.step, index.state_hash, index.state.prev_hash, index.state.chain});
  }
  return anchors;
}

void CheckChainAncestry(const std::filesystem::path& path, std::span<const StateHashLine> lines,
                        std::span<const ChainAnchor> anchors) {
  for (size_t n = 0; n < lines.size(); ++n) {
    if (lines[n].step != n) {
      Fail("{}: line {} is step {}, expected step {}: a line is missing (the chain has one line "
           "per step from 0)",
           path.string(), n + 1, lines[n].step, n);
    }
  }
  // chains[s]: the lines' chain through step s.
  std::vector<Digest> chains;
  for (const StateHashLine& line : lines) {
    chains.push_back(ChainAfter(chains.empty() ? Digest{} : chains.back(), line.step, line.hash));
  }
  uint64_t pinned = 0;  // the lines before this step were pinned by an earlier anchor's chain
  for (const ChainAnchor& a : anchors) {
    const auto line_hash = [&](uint64_t step) -> std::string {
      return step < lines.size() ? ToHex(lines[step].hash) : "no line";
    };
    if (a.step >= lines.size() || lines[a.step].hash != a.hash) {
      Fail("{}: step {} holds {}, but checkpoint {} has state hash {}: the chain was edited, or "
           "is not this run's",
           path.string(), a.step, line_hash(a.step), a.checkpoint.string(), ToHex(a.hash));
    }
    const Digest expected_prev = a.step == 0 ? Digest{} : lines[a.step - 1].hash;
    if (a.prev_hash != expected_prev) {
      Fail("{}: step {} holds {}, but checkpoint {} has prev_hash {}: the chain was edited, or "
           "is not this run's",
           path.string(), a.step == 0 ? 0 : a.step - 1,
           a.step == 0 ? std::string("nothing (the init has no previous step)")
                       : line_hash(a.step - 1),
           a.checkpoint.string(), ToHex(a.prev_hash));
    }
    if (a.chain && chains[a.step] != *a.chain) {
      Fail(
          "{}: a line from step {} to step {} is not the one checkpoint {} recorded (its "
          "chain_blake2b {}, the lines chain to {}): the chain was edited, or is not this run's",
          path.string(), pinned, a.step, a.checkpoint.string(), ToHex(*a.chain),
          ToHex(chains[a.step]));
    }
    if (a.chain) pinned = a.step + 1;
  }
}

Digest ChainAfter(const Digest& previous, uint64_t step, const Digest& hash) {
  return Blake2b().Update(previous).UpdateU64(step).Update(hash).Final();
}

}  // namespace lockstep
