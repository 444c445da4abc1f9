// `lockstep forward`: logits and per-position loss of a token sequence under a checkpoint, for
// cross-checking the model against another framework.
#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <memory>

#include "lockstep/infer.h"
#include "lockstep/model.h"
#include "lockstep/state.h"
#include "tools/lockstep/commands.h"

namespace lockstep::cli {
namespace {

struct ForwardOptions {
  std::filesystem::path checkpoint, tokens, out;
  int threads = 1;
};

int RunForward(const ForwardOptions& o) {
  SetThreads(o.threads);
  RefuseOutputsOntoInputs({{"--out", o.out}},
                          {{"--checkpoint", o.checkpoint}, {"--tokens", o.tokens}});
  // Streamed: only the parameters are kept (RAM ~ the model's weights, not its moments), and
  // nothing is used before every file's digest and the state hash have been checked.
  const infer::VerifiedModel loaded = infer::LoadVerified(o.checkpoint);
  const RunConfig& config = loaded.config;
  const ParamStore& params = loaded.params;
  // T + 1 ids give T positions: at least 2, at most seq_len + 1.
  const std::vector<uint32_t> tokens = infer::ReadTokenFile(
      o.tokens, 2, static_cast<uint64_t>(config.model.seq_len) + 1,
      fmt::format("the model's seq_len is {}", config.model.seq_len), config.model.vocab);
  const int64_t seq = static_cast<int64_t>(tokens.size()) - 1;
  Model model(config.model, config.train.vocab_chunk, 1, seq);
  model.Forward(params, tokens);
  std::vector<float> logits(static_cast<size_t>(seq * config.model.vocab));
  model.Logits(params, logits);
  const std::vector<NamedTensor> out = {
      {"logits", {seq, config.model.vocab}, logits},
      {"loss", {seq}, model.RowLoss()},
      {"zloss", {seq}, model.RowZLoss()},
  };
  WriteSafetensors(o.out, out,
                   {{"checkpoint", o.checkpoint.string()},
                    {"state_hash", ToHex(loaded.state_hash)},
                    {"note", "positions t = 0..seq-1 predict tokens[t+1] from tokens[0..t]"}});
  fmt::print("wrote {} ({} positions, vocab {})\n", o.out.string(), seq, config.model.vocab);
  return 0;
}

}  // namespace

void AddForwardCommand(CLI::App& app, int* exit_code) {
  auto o = std::make_shared<ForwardOptions>();
  CLI::App* cmd = app.add_subcommand(
      "forward",
      "write the logits and per-position loss of a token sequence under a checkpoint's weights "
      "(safetensors: logits [T, V], loss [T], zloss [T]) to cross-check the model elsewhere");
  cmd->add_option("--checkpoint", o->checkpoint, "checkpoint directory (checkpoints/step_*)")
      ->required();
  cmd->add_option("--tokens", o->tokens,
                  "raw little-endian uint32 token ids: T+1 ids give T positions")
      ->required();
  cmd->add_option("--out", o->out, "output .safetensors file")
      ->required()
      ->check(OutputPath(OutputKind::kFile));
  cmd->add_option("--threads", o->threads, "worker threads (results do not depend on it)")
      ->capture_default_str()
      ->check(IntegerIn(1, 1024));
  cmd->final_callback([o, exit_code] { *exit_code = RunForward(*o); });
}

}  // namespace lockstep::cli
