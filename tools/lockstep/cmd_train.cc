// `lockstep train`.
#include <memory>

#include "lockstep/train.h"
#include "tools/lockstep/commands.h"

namespace lockstep::cli {

void AddTrainCommand(CLI::App& app, int* exit_code) {
  auto options = std::make_shared<train::TrainOptions>();
  options->config = "smoke";
  CLI::App* cmd = app.add_subcommand(
      "train",
      "train a model on a token dataset; writes metrics.jsonl, state_hashes.jsonl (the chained "
      "state hash of every step) and checkpoints/step_%09d/ into the run directory. Under "
      "`mpirun -np N` (or srun) N processes train together with the same bits as one "
      "(docs/distributed.md); N must divide the config's train.grad_groups. Exit 0 when done, 1 "
      "when the spike protocol halted the run, 2 on bad input, 3 when a rank died or hung");
  cmd->add_option("--config", options->config, ConfigHelp())->capture_default_str();
  cmd->add_option("--data", options->data_dir, "dataset directory (lockstep data synth|tokenize)")
      ->required();
  cmd->add_option("--out", options->run_dir, "run directory")
      ->required()
      ->check(OutputPath(OutputKind::kDirectory));
  auto steps = std::make_shared<int64_t>(-1);
  auto* steps_opt = cmd->add_option("--steps", *steps,
                                    "stop once this many steps are done (default: the config's "
                                    "train.steps; the learning-rate "
                                    "schedule always follows train.steps). A new run always writes "
                                    "the initial state as checkpoint "
                                    "step 0; --steps 0 stops there")
                        ->check(IntegerIn(0, uint64_t{1} << 40));
  cmd->add_option("--threads", options->threads, "worker threads (results do not depend on it)")
      ->capture_default_str()
      ->check(IntegerIn(1, 1024));
  cmd->add_flag("--resume", options->resume,
                "continue the run in --out from its newest complete checkpoint, bit-exact");
  auto spill_dir = std::make_shared<std::string>();
  cmd->add_option("--spill-dir", *spill_dir,
                  "keep parameters, AdamW moments and gradients on disk in this directory (files "
                  "of 4 MiB chunks, each digested and checked when read back; unlinked at once, so "
                  "they vanish even if the run is killed), "
                  "with only what a pass needs in RAM: for models larger than memory. Same bits as "
                  "training in RAM")
      ->check(OutputPath(OutputKind::kDirectory));
  AddRecomputeOption(cmd, &options->activations);
  cmd->add_option("--comm-timeout", options->comm_timeout_seconds,
                  "multi-process runs (mpirun -np N lockstep train ...): seconds a rank waits for "
                  "the others in one exchange before it stops the run with an error (a rank died "
                  "or hangs)")
      ->capture_default_str()
      ->check(PositiveNumber());
  auto sign_key = std::make_shared<std::string>();
  cmd->add_option("--sign-key", *sign_key,
                  "sign every chain line as it is appended, and after every checkpoint a Merkle "
                  "root over the chain so far, with this Ed25519 key (lockstep keygen) into "
                  "RUN/signatures.jsonl; a signed run must be resumed with the same key");
  auto full_gradients = std::make_shared<bool>(false);
  cmd->add_flag("--full-gradients", *full_gradients,
                "checkpoints keep the post-clip gradients themselves (grads.safetensors, 16 bytes "
                "per parameter in all) instead of only their digests (12 bytes per parameter): "
                "needed to localise a later disagreement down to gradient elements. The state "
                "hash is the same either way");
  cmd->add_flag("--progress,!--no-progress", options->progress,
                "show (default) or hide the progress line on stderr");
  AddTestFaultOptions(cmd, &options->faults, /*replica=*/true);
  auto device = std::make_shared<std::string>("cpu");
  AddDeviceOption(cmd, device.get());
  cmd->final_callback([options, exit_code, steps_opt, steps, spill_dir, sign_key, full_gradients,
                       device] {
    std::string device_name;
    const std::unique_ptr<OpExecutor> executor = MakeExecutor(*device, &device_name);
    options->executor = executor.get();
    options->device = *device;
    if (!sign_key->empty()) options->sign_key = *sign_key;
    if (*full_gradients) options->checkpoint_gradients = Gradients::kFull;
    if (steps_opt->count() > 0) options->steps = *steps;
    if (!spill_dir->empty()) options->spill_dir = *spill_dir;
    // The run directory is written (and with --resume read too: that is its purpose); what
    // only feeds the run may not lie under it or under the spill directory.
    std::vector<NamedPath> inputs = {{"--data", options->data_dir}, {"--sign-key", *sign_key}};
    if (std::filesystem::exists(options->config)) inputs.push_back({"--config", options->config});
    RefuseOutputsOntoInputs({{"--out", options->run_dir}, {"--spill-dir", *spill_dir}}, inputs);
    *exit_code = train::RunTraining(*options);
  });
}

}  // namespace lockstep::cli
