// A trainer restored from a checkpoint that keeps only the gradients' digests: the same state
// hash as the trainer that wrote it, the same next step, and no gradient read or written from
// the state it does not hold -- in RAM and spilled.
#include <gtest/gtest.h>

#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include "common/expect_error.h"
#include "common/scratch_dir.h"
#include "lockstep/data.h"
#include "lockstep/model.h"
#include "lockstep/train.h"

namespace lockstep {
namespace {
namespace fs = std::filesystem;

class GradientDigests : public test::ScratchDirTest {};

TEST_F(GradientDigests, RestoredStateStepsAlikeAndRefusesTheGradientsItLacks) {
  const fs::path& dir = dir_;
  data::WriteSynthCorpus(dir / "data", 7, 50000);
  const data::Dataset dataset = data::OpenDataset(dir / "data");
  const RunConfig config = LoadRunConfig("tiny");
  const std::string descriptor = train::RunDescriptor(config, dataset);

  train::Trainer writer(config, dataset, descriptor);
  writer.Initialize();
  writer.Step();
  const fs::path digests = writer.WriteCheckpoint(dir / "digests");
  const fs::path full = writer.WriteCheckpoint(dir / "full", Gradients::kFull);
  EXPECT_FALSE(fs::exists(digests / "grads.safetensors"));
  EXPECT_TRUE(fs::exists(full / "grads.safetensors"));
  writer.Step();

  for (const bool spilled : {false, true}) {
    SCOPED_TRACE(spilled ? "spilled" : "in RAM");
    const train::Storage storage =
        spilled ? train::Storage{.spill_dir = dir / "spill"} : train::Storage{};
    train::Trainer restored(config, dataset, descriptor, storage);
    EXPECT_EQ(restored.Restore(OpenCheckpoint(digests)).hash, OpenCheckpoint(full).state_hash);
    int64_t elements = 1;  // a whole tensor: a spilled store reads whole chunks
    for (const int64_t d : restored.tensors()[0].shape) elements *= d;
    std::vector<float> piece(static_cast<size_t>(elements));
    test::ExpectError([&] { restored.ReadPiece(0, StateArray::kGrad, 0, piece); }, {"not held"});
    EXPECT_NO_THROW(restored.ReadPiece(0, StateArray::kM, 0, piece));
    test::ExpectError([&] { restored.WriteCheckpoint(dir / "refused", Gradients::kFull); },
                      {"only their digests"});
    EXPECT_FALSE(fs::exists(dir / "refused" / "checkpoints" / "step_000000001"));
    // Rewriting the checkpoint it came from is a no-op (the same bytes).
    EXPECT_EQ(restored.WriteCheckpoint(dir / "digests"), digests);
    restored.Step();
    EXPECT_EQ(restored.hash(), writer.hash());
    // After a step the gradients are held again.
    EXPECT_NO_THROW(restored.ReadPiece(0, StateArray::kGrad, 0, piece));
  }
}

}  // namespace
}  // namespace lockstep
