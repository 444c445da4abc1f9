// `lockstep replay` and `lockstep verify-handoff` (docs/audit.md).
#include <fmt/format.h>

#include <cstdio>
#include <memory>

#include "lockstep/audit.h"
#include "tools/lockstep/commands.h"

namespace lockstep::cli {
namespace {

struct ReplayFlags {
  audit::ReplayOptions options;
  std::string expect_hash, save_checkpoint_dir, loss_log, compare_checkpoint, spill_dir;
  std::string device = "cpu";
  uint64_t seed = 0;
};

void AddReplayCommand(CLI::App& app, int* exit_code) {
  auto f = std::make_shared<ReplayFlags>();
  audit::ReplayOptions& o = f->options;
  CLI::App* cmd = app.add_subcommand(
      "replay",
      "replay one unit of a run and compare its state hash with the target. Init unit: "
      "--from-init --config NAME --data DIR [--seed S]. Interval unit: --checkpoint DIR "
      "--until-step N --data DIR. Prints a JSON result on stdout and 'replay: state_hash=... "
      "expected=... MATCH=True|False|None' on stderr. Exit 0 on a match or with no target, 1 on "
      "a mismatch, 2 on bad input");
  cmd->add_flag("--from-init", o.from_init, "replay the init unit (step 0)");
  cmd->add_option("--config", o.config, "init unit: " + ConfigHelp());
  auto* seed = AddUnsignedOption(cmd, "--seed", &f->seed, UINT64_MAX,
                                 "init unit: overrides the config's train.seed");
  cmd->add_option("--checkpoint", o.checkpoint,
                  "interval unit: the checkpoint to start from (RUN/checkpoints/step_*)");
  AddUnsignedOption(cmd, "--until-step", &o.until_step, kMaxSteps,
                    "interval unit: replay up to this step (after the checkpoint's)");
  cmd->add_option("--data", o.data_dir,
                  "the run's dataset directory (both units: the run descriptor every hash "
                  "covers includes its manifest digest)")
      ->required();
  auto* expect_opt = cmd->add_option(
      "--expect-hash", f->expect_hash,
      "target state hash (64 lowercase hex); an interval unit in a run directory "
      "defaults to the run's state_hashes.jsonl line for --until-step");
  cmd->add_option("--threads", o.threads, "worker threads (results do not depend on it)")
      ->capture_default_str()
      ->check(IntegerIn(1, 1024));
  cmd->add_option("--save-checkpoint-dir", f->save_checkpoint_dir,
                  "after a match, write the hand-off checkpoint DIR/checkpoints/step_N")
      ->check(OutputPath(OutputKind::kDirectory));
  cmd->add_option("--loss-log", f->loss_log, "write each replayed step's loss as JSONL")
      ->check(OutputPath(OutputKind::kFile));
  cmd->add_option("--compare-checkpoint", f->compare_checkpoint,
                  "the publisher's checkpoint at --until-step: on a difference, name each "
                  "differing hash component and the first differing element of each tensor");
  cmd->add_option("--spill-dir", f->spill_dir,
                  "interval unit: keep parameters, AdamW moments and gradients on disk in this "
                  "directory (4 MiB chunks, each digested and checked when read back; unlinked at "
                  "once, so they vanish even if the replay is killed). Default: in RAM when the "
                  "memory plan fits MemAvailable, else on disk "
                  "under the system's temp directory. Same bits either way")
      ->check(OutputPath(OutputKind::kDirectory));
  AddRecomputeOption(cmd, &o.activations);
  cmd->add_flag("--force", o.force,
                "replay even when the memory plan exceeds MemAvailable or the start "
                "checkpoint's digests fail (with a warning); write the hand-off checkpoint "
                "without a match");
  AddTestFaultOptions(cmd, &o.faults, /*replica=*/false);
  AddDeviceOption(cmd, &f->device);
  cmd->final_callback([f, seed, expect_opt, exit_code] {
    audit::ReplayOptions& o = f->options;
    // Validated before any work: a truncated (or empty) hash must not cost a replay, nor pass
    // for no target.
    if (expect_opt->count() > 0) o.expect_hash = DigestFromHex(f->expect_hash, "--expect-hash");
    if (seed->count() > 0) o.seed = f->seed;
    if (!f->save_checkpoint_dir.empty()) o.save_checkpoint_dir = f->save_checkpoint_dir;
    if (!f->loss_log.empty()) o.loss_log = f->loss_log;
    if (!f->compare_checkpoint.empty()) o.compare_checkpoint = f->compare_checkpoint;
    if (!f->spill_dir.empty()) o.spill_dir = f->spill_dir;
    const std::unique_ptr<OpExecutor> executor = MakeExecutor(f->device, &o.device);
    o.executor = executor.get();
    const audit::ReplayResult result = audit::Replay(o);
    fmt::print("{}", audit::ResultJson(result));
    std::fflush(stdout);
    std::fprintf(stderr, "%s\n", audit::VerdictLine(result).c_str());
    *exit_code = audit::ExitCode(result);
  });
}

struct HandoffFlags {
  std::filesystem::path checkpoint;
  std::string expect_hash, prev_hash;
};

void AddVerifyHandoffCommand(CLI::App& app, int* exit_code) {
  auto f = std::make_shared<HandoffFlags>();
  CLI::App* cmd = app.add_subcommand(
      "verify-handoff",
      "check a hand-off checkpoint from its files alone (no forward or backward): its state hash "
      "recomputed from the files must equal --expect-hash and meta.json's, and its prev_hash "
      "--prev-hash. Exit 0 accepted, 1 rejected, 2 unreadable input");
  cmd->add_option("--checkpoint", f->checkpoint, "checkpoint directory (checkpoints/step_*)")
      ->required();
  cmd->add_option("--expect-hash", f->expect_hash, "the published state hash of its step")
      ->required();
  cmd->add_option("--prev-hash", f->prev_hash, "the published state hash of the step before")
      ->required();
  cmd->final_callback([f, exit_code] {
    const Digest expect = DigestFromHex(f->expect_hash, "--expect-hash");
    const Digest prev = DigestFromHex(f->prev_hash, "--prev-hash");
    const audit::HandoffVerdict verdict = audit::VerifyHandoff(f->checkpoint, expect, prev);
    fmt::print("{}", verdict.Report());
    *exit_code = verdict.accepted() ? 0 : 1;
  });
}

}  // namespace

void AddReplayCommands(CLI::App& app, int* exit_code) {
  AddReplayCommand(app, exit_code);
  AddVerifyHandoffCommand(app, exit_code);
}

}  // namespace lockstep::cli
