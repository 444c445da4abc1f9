// verify-handoff: a checkpoint handed over between auditors is checked from its files alone.
#include <fmt/ranges.h>

#include "lockstep/audit.h"

namespace lockstep::audit {

std::string HandoffVerdict::Report() const {
  auto mark = [](bool ok) { return ok ? "ok" : "DIFFERS"; };
  std::string text = fmt::format("verify-handoff: {} (step {})\n", checkpoint.string(), step);
  text += fmt::format("  state hash recomputed from the files: {}\n", ToHex(recomputed));
  text += fmt::format("  state_hash recorded in meta.json:    {}  {}\n", ToHex(recorded),
                      mark(recorded == recomputed));
  text += fmt::format("  --expect-hash:                       {}  {}\n", ToHex(expected),
                      mark(expected == recomputed));
  text += fmt::format("  prev_hash recorded in meta.json:     {}\n", ToHex(prev_hash));
  text += fmt::format("  --prev-hash:                         {}  {}\n", ToHex(expected_prev),
                      mark(prev_ok()));
  std::vector<std::string> reasons;
  if (recomputed != recorded) {
    reasons.push_back("the files do not hash to meta.json's state_hash (changed after hashing)");
  }
  if (recomputed != expected) reasons.push_back("the state is not the expected one");
  if (!prev_ok()) reasons.push_back("it does not follow the expected previous state");
  text += accepted() ? std::string("verdict: ACCEPTED\n")
                     : fmt::format("verdict: REJECTED ({})\n", fmt::join(reasons, "; "));
  return text;
}

HandoffVerdict VerifyHandoff(const std::filesystem::path& checkpoint, const Digest& expect_hash,
                             const Digest& expect_prev_hash) {
  // Streamed: RAM ~ one piece, whatever the model's size; every file's digest is checked.
  const CheckpointIndex read = OpenCheckpoint(checkpoint);
  return HandoffVerdict{.checkpoint = checkpoint,
                        .step = read.state.step,
                        .recomputed = StreamCheckpoint(read, kCheckpointPieceFloats, {}).hash,
                        .recorded = read.state_hash,
                        .expected = expect_hash,
                        .prev_hash = read.state.prev_hash,
                        .expected_prev = expect_prev_hash};
}

}  // namespace lockstep::audit
