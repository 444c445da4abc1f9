// The step's gradient is built in the documented order (docs/training.md, step 3): K groups of
// consecutive microbatches, each accumulated in place by the model, and the group sums added in
// group order. Recomputed here from the Model API alone and compared bit for bit with a
// Trainer's gradient.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "lockstep/data.h"
#include "lockstep/model.h"
#include "lockstep/train.h"

namespace lockstep {
namespace {
namespace fs = std::filesystem;

TEST(GradGroups, StepGradientIsTheGroupSumsAddedInGroupOrder) {
  const fs::path dir = fs::temp_directory_path() / ("lockstep_groups_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  data::WriteSynthCorpus(dir / "data", 7, 100000);
  const data::Dataset dataset = data::OpenDataset(dir / "data");

  RunConfig config = LoadRunConfig("tiny-dp");
  config.train.microbatch = 2;
  config.train.microbatches = 6;
  config.train.grad_groups = 3;  // groups of 2 microbatches: in-place accumulation inside
  config.train.clip_norm = 0;    // the checkpointed gradient is then G itself

  train::Trainer trainer(config, dataset, train::RunDescriptor(config, dataset));
  trainer.Initialize();
  trainer.Step();

  // The same from the model: the init parameters, windows in order from cursor 0.
  const ModelConfig& m = config.model;
  ParamStore params(ParameterSpecs(m)), group(ParameterSpecs(m)), total(ParameterSpecs(m));
  InitParameters(m, config.train.seed, params);
  Model model(m, config.train.vocab_chunk, config.train.microbatch, m.seq_len);
  const data::TokenStream stream(dataset, config.train.data_seed, static_cast<uint32_t>(m.seq_len));
  const int64_t per_group = config.train.microbatches / config.train.grad_groups;
  const float scale = 1.0f / static_cast<float>(config.train.microbatches *
                                                config.train.microbatch * m.seq_len);
  std::vector<uint32_t> tokens(static_cast<size_t>(config.train.microbatch * (m.seq_len + 1)));
  uint64_t window = 0;
  for (int64_t g = 0; g < config.train.grad_groups; ++g) {
    for (int64_t k = 0; k < per_group; ++k) {
      for (int64_t b = 0; b < config.train.microbatch; ++b) {
        stream.Window(window++, std::span(tokens).subspan(static_cast<size_t>(b * (m.seq_len + 1)),
                                                          static_cast<size_t>(m.seq_len + 1)));
      }
      model.ForwardBackward(params, tokens, scale, /*accumulate=*/k > 0, group);
    }
    for (size_t i = 0; i < total.size(); ++i) {
      std::span<float> t = total.Tensor(i);
      const std::span<const float> s = group.Tensor(i);
      for (size_t e = 0; e < t.size(); ++e) t[e] = g == 0 ? s[e] : t[e] + s[e];
    }
  }
  for (size_t i = 0; i < total.size(); ++i) {
    std::vector<float> got(total.Tensor(i).size());
    trainer.ReadPiece(i, StateArray::kGrad, 0, got);
    ASSERT_EQ(std::memcmp(got.data(), total.Tensor(i).data(), got.size() * sizeof(float)), 0)
        << total.Spec(i).name;
  }
  fs::remove_all(dir);
}

}  // namespace
}  // namespace lockstep
