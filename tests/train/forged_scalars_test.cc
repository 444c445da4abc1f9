// A checkpoint's scalars are checked against its own run when it is restored (resume, replay,
// audit): a forger who reseals everything -- files, COMPLETE, meta.json's state hash -- still
// cannot hand over a state that training could not have reached. Each forged field is refused
// naming meta.json and the field.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include "lockstep/core.h"
#include "lockstep/data.h"
#include "lockstep/state.h"
#include "lockstep/train.h"

namespace lockstep {
namespace {
namespace fs = std::filesystem;

TEST(ForgedScalars, AResealedCheckpointThatTrainingCannotReachIsRefused) {
  const fs::path dir =
      fs::temp_directory_path() / ("lockstep_forged_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  data::WriteSynthCorpus(dir / "data", 7, 100000);
  const data::Dataset dataset = data::OpenDataset(dir / "data");
  const RunConfig config = LoadRunConfig("tiny");
  const std::string descriptor = train::RunDescriptor(config, dataset);
  {
    train::Trainer trainer(config, dataset, descriptor);
    trainer.Initialize();
    trainer.Step();
    trainer.Step();
    trainer.WriteCheckpoint(dir / "run");
  }
  const Checkpoint good = ReadCheckpoint(CheckpointDir(dir / "run", 2));

  // Each forgery written as a whole new, correctly sealed checkpoint of step 2.
  int n = 0;
  const auto refused = [&](const std::function<void(StepState&)>& forge,
                           const std::string& field) {
    SCOPED_TRACE(field);
    StepState state = good.state;
    forge(state);
    const fs::path run = dir / ("forged" + std::to_string(n++));
    const fs::path written = WriteCheckpoint(run, state, good.tensors);
    train::Trainer trainer(config, dataset, descriptor);
    try {
      trainer.Restore(OpenCheckpoint(written));
      ADD_FAILURE() << "restored a checkpoint with a forged " << field;
    } catch (const Error& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find((written / "meta.json").string()), std::string::npos) << what;
      EXPECT_NE(what.find("field \"" + field + "\""), std::string::npos) << what;
      EXPECT_NE(what.find("contradicts its own run"), std::string::npos) << what;
    }
  };
  refused([](StepState& s) { s.data_cursor += 1; }, "data_cursor");
  refused([](StepState& s) { s.rng_seed += 1; }, "rng_seed");
  refused([](StepState& s) { s.rng_counter = 0; }, "rng_counter");
  refused([](StepState& s) { s.optimizer_step += 1; }, "optimizer_step");
  refused([](StepState& s) { s.lr = std::nextafter(s.lr, 1.0f); }, "lr_bits");
  refused([](StepState& s) { s.clip_factor = 0.5f; }, "clip_factor_bits");
  refused([](StepState& s) { s.spike.recent_skips = {7}; }, "spike.recent_skips");
  refused(
      [](StepState& s) {  // a skip of step 2 (a non-finite loss) counted, but not in the window
        s.skipped = true;
        s.clip_factor = 1.0f;
        s.optimizer_step -= 1;
        s.spike.total_skips += 1;
      },
      "spike.recent_skips");

  // The untouched state, resealed the same way, restores.
  const fs::path same = WriteCheckpoint(dir / "same", good.state, good.tensors);
  train::Trainer trainer(config, dataset, descriptor);
  EXPECT_NO_THROW(trainer.Restore(OpenCheckpoint(same)));
  fs::remove_all(dir);
}

}  // namespace
}  // namespace lockstep
