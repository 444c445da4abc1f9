// Trainer::DiscardNextState: a spilled step whose new state is not written back gives the same
// state hash as one that keeps it, and the trainer then refuses to go on from the state it no
// longer has.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <functional>
#include <string>

#include "lockstep/data.h"
#include "lockstep/model.h"
#include "lockstep/train.h"

namespace lockstep {
namespace {
namespace fs = std::filesystem;

TEST(DiscardNextState, SameHashWithoutWritingAndNothingAfter) {
  const fs::path dir = fs::temp_directory_path() / ("lockstep_discard_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  data::WriteSynthCorpus(dir / "data", 7, 50000);
  const data::Dataset dataset = data::OpenDataset(dir / "data");
  const RunConfig config = LoadRunConfig("tiny");
  const std::string descriptor = train::RunDescriptor(config, dataset);

  train::Trainer kept(config, dataset, descriptor, {.spill_dir = dir / "kept"});
  train::Trainer discarded(config, dataset, descriptor, {.spill_dir = dir / "discarded"});
  for (train::Trainer* t : {&kept, &discarded}) {
    t->Initialize();
    t->Step();
  }
  kept.Step();
  discarded.DiscardNextState();
  discarded.Step();
  EXPECT_EQ(discarded.hash(), kept.hash());
  EXPECT_EQ(discarded.state().step, 2u);
  for (const auto& next : {std::function<void()>([&] { discarded.Step(); }),
                           std::function<void()>([&] { discarded.WriteCheckpoint(dir / "run"); })}) {
    try {
      next();
      ADD_FAILURE() << "went on from a discarded state";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("was discarded"), std::string::npos) << e.what();
    }
  }
  fs::remove_all(dir);
}

}  // namespace
}  // namespace lockstep
