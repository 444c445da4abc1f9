// End to end, through the lockstep binary: thread-count invariance of the state-hash chain,
// bit-exact resume (also after SIGKILL), the training signal, and errors that name their cause.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>

#include "common/run_lockstep.h"
#include "lockstep/core.h"
#include "lockstep/model.h"
#include "lockstep/state.h"
#include "state/state_fixtures.h"

namespace lockstep {
namespace {
namespace fs = std::filesystem;

using test::Lockstep;
using test::Result;

// A scratch directory per test, removed afterwards.
class E2e : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    dir_ = fs::temp_directory_path() /
           (std::string("lockstep_e2e_") + info->name() + "_" + std::to_string(::getpid()));
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override {
    if (!HasFailure()) fs::remove_all(dir_);
  }

  // The small synthetic corpus every test here trains on (made once per test: ~0.1 s).
  fs::path Data() {
    const fs::path data = dir_ / "data";
    if (!fs::exists(data)) {
      const Result r = Lockstep("data synth --out " + data.string() + " --seed 7 --tokens 200000");
      EXPECT_EQ(r.exit_code, 0) << r.output;
    }
    return data;
  }

  Result Train(const std::string& run, const std::string& extra) {
    return Lockstep("train --config tiny --data " + Data().string() + " --out " +
                    (dir_ / run).string() + " --no-progress " + extra);
  }

  std::string Text(const fs::path& p) { return ReadFileText(dir_ / p); }

  fs::path dir_;
};

TEST_F(E2e, ChainIsIdenticalAtOneTwoAndThreeThreads) {
  for (int threads : {1, 2, 3}) {
    const Result r = Train("t" + std::to_string(threads), "--steps 30 --threads " +
                                                              std::to_string(threads));
    ASSERT_EQ(r.exit_code, 0) << r.output;
  }
  const std::string chain = Text("t1/state_hashes.jsonl");
  EXPECT_EQ(std::count(chain.begin(), chain.end(), '\n'), 31);  // steps 0..30
  EXPECT_EQ(chain, Text("t2/state_hashes.jsonl"));
  EXPECT_EQ(chain, Text("t3/state_hashes.jsonl"));
}

// int8 linears (tiny-int8, with the int8 backward, and with the straight-through one) keep the
// chain's invariances: the same chain at 1 and 3 threads and after a stop at 2 threads and a
// resume; and each is another chain than tiny's and than the other's.
TEST_F(E2e, Int8LinearsChainIsIdenticalAtAnyThreadCountAndAcrossAResume) {
  std::string yaml = ReadFileText(fs::path(LOCKSTEP_SOURCE_DIR) / "configs/tiny-int8.yaml");
  const std::string on = "  int8_backward: true";
  const size_t at = yaml.find(on);
  ASSERT_NE(at, std::string::npos);
  yaml.replace(at, on.size(), "  int8_backward: false");
  const fs::path straight = dir_ / "tiny-int8-straight-through.yaml";
  WriteFileSynced(straight, yaml);
  ASSERT_EQ(Train("fp32", "--steps 1").exit_code, 0);
  const std::string fp32 = Text("fp32/state_hashes.jsonl");  // steps 0 and 1
  std::vector<std::string> chains;
  for (const std::string& config : {std::string("tiny-int8"), straight.string()}) {
    const auto train = [&](const std::string& run, const std::string& extra) {
      const Result r =
          Lockstep("train --config " + config + " --data " + Data().string() + " --out " +
                   (dir_ / run).string() + " --no-progress --steps " + extra);
      EXPECT_EQ(r.exit_code, 0) << r.output;
    };
    const std::string tag = std::to_string(chains.size());
    train("t1-" + tag, "12 --threads 1");
    train("t3-" + tag, "12 --threads 3");
    train("resumed-" + tag, "6 --threads 2");
    train("resumed-" + tag, "12 --threads 2 --resume");
    const std::string chain = Text("t1-" + tag + "/state_hashes.jsonl");
    EXPECT_EQ(std::count(chain.begin(), chain.end(), '\n'), 13) << config;  // steps 0..12
    EXPECT_EQ(chain, Text("t3-" + tag + "/state_hashes.jsonl")) << config;
    EXPECT_EQ(chain, Text("resumed-" + tag + "/state_hashes.jsonl")) << config;
    EXPECT_NE(chain.substr(0, fp32.size()), fp32) << config;
    chains.push_back(chain);
  }
  EXPECT_NE(chains[0], chains[1]);
}

// bf16 storage (tiny-bf16) keeps the chain's invariances too: the same chain at 1 and 3 threads
// and after a stop at 2 threads and a resume, another chain than tiny's.
TEST_F(E2e, Bf16StorageChainIsIdenticalAtAnyThreadCountAndAcrossAResume) {
  const auto train = [&](const std::string& config, const std::string& run,
                         const std::string& extra) {
    const Result r =
        Lockstep("train --config " + config + " --data " + Data().string() + " --out " +
                 (dir_ / run).string() + " --no-progress --steps " + extra);
    EXPECT_EQ(r.exit_code, 0) << r.output;
  };
  train("tiny", "fp32", "12 --threads 2");
  train("tiny-bf16", "t1", "12 --threads 1");
  train("tiny-bf16", "t3", "12 --threads 3");
  train("tiny-bf16", "resumed", "6 --threads 2");
  train("tiny-bf16", "resumed", "12 --threads 2 --resume");
  const std::string chain = Text("t1/state_hashes.jsonl");
  EXPECT_EQ(std::count(chain.begin(), chain.end(), '\n'), 13);  // steps 0..12
  EXPECT_EQ(chain, Text("t3/state_hashes.jsonl"));
  EXPECT_EQ(chain, Text("resumed/state_hashes.jsonl"));
  EXPECT_NE(chain, Text("fp32/state_hashes.jsonl"));
}

// The int8 linears' scale tensors are state, set from their weights: in every checkpoint each
// scale is its weight row's largest magnitude over 127 (computed here from the checkpoint's own
// weight), refreshed by each update (step 3's differ from step 0's), with AdamW moments of zero.
TEST_F(E2e, Int8ScalesAreTheirWeightsRowMaximaInEveryCheckpoint) {
  const Result r = Lockstep("train --config tiny-int8 --data " + Data().string() + " --out " +
                            (dir_ / "int8").string() + " --no-progress --steps 3");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const ModelConfig config = LoadRunConfig("tiny-int8").model;
  std::map<std::string, std::vector<float>> step0;
  for (const char* step : {"step_000000000", "step_000000003"}) {
    const fs::path ckpt = dir_ / "int8/checkpoints" / step;
    const SafetensorsFile model = ReadSafetensors(ckpt / "model.safetensors");
    const SafetensorsFile optimizer = ReadSafetensors(ckpt / "optimizer.safetensors");
    size_t scales = 0;
    for (const ParamSpec& spec : ParameterSpecs(config)) {
      if (!spec.is_scale) continue;
      ++scales;
      const std::span<const float> scale = model.Get(spec.name).data.As<float>();
      // "layers.l.attn.wq.scale" is of "layers.l.attn.wq.weight" (docs/model.md, "Parameters").
      const std::string_view stem = std::string_view(spec.name).substr(0, spec.name.size() - 5);
      ASSERT_EQ(spec.name.substr(stem.size()), "scale");
      const NamedTensor& weight = model.Get(std::string(stem) + "weight");
      const int64_t cols = weight.shape[1];
      const std::span<const float> w = weight.data.As<float>();
      ASSERT_EQ(static_cast<int64_t>(scale.size()), weight.shape[0]) << spec.name;
      for (size_t row = 0; row < scale.size(); ++row) {
        float amax = 0;
        for (int64_t c = 0; c < cols; ++c) amax = std::max(amax, std::fabs(w[row * cols + c]));
        ASSERT_EQ(scale[row], amax / 127.0f) << step << " " << spec.name << " row " << row;
      }
      for (const char* moment : {".exp_avg", ".exp_avg_sq"}) {
        for (const float m : optimizer.Get(spec.name + moment).data.As<float>()) {
          ASSERT_EQ(m, 0.0f) << step << " " << spec.name << moment;
        }
      }
      if (step0.contains(spec.name)) {
        EXPECT_NE(std::vector<float>(scale.begin(), scale.end()), step0[spec.name]) << spec.name;
      }
      step0[spec.name].assign(scale.begin(), scale.end());
    }
    EXPECT_EQ(scales, static_cast<size_t>(6 * config.n_layers));
  }
  // `model describe` lists them, and counts them apart from the trained parameters.
  const Result describe = Lockstep("model describe --config tiny-int8");
  ASSERT_EQ(describe.exit_code, 0) << describe.output;
  EXPECT_NE(describe.output.find("layers.1.ffn.w_gate_up.scale   [2048]"), std::string::npos)
      << describe.output;
  // 2 layers x (wq 128 + wk 64 + wv 64 + wo 128 + w_gate_up 2048 + w_down 128) outputs.
  EXPECT_NE(describe.output.find("not trained): 5120\n"), std::string::npos) << describe.output;
}

// Every file of two checkpoint directories, byte for byte.
void ExpectSameCheckpoint(const fs::path& a, const fs::path& b) {
  size_t files = 0;
  for (const auto& entry : fs::directory_iterator(a)) {
    const fs::path other = b / entry.path().filename();
    ASSERT_TRUE(fs::exists(other)) << other;
    EXPECT_EQ(ReadFileBytes(entry.path()), ReadFileBytes(other)) << entry.path().filename();
    ++files;
  }
  EXPECT_EQ(files, static_cast<size_t>(std::distance(fs::directory_iterator(b), {})));
  EXPECT_GE(files, 4u);  // model, optimizer, meta.json, COMPLETE (and grads when full)
}

// Checkpoints with full gradients hold the same state and hash: the chain is the same, the
// other files are the same bytes, and a run resumed from gradient digests can go on writing full
// gradients (from its next step).
TEST_F(E2e, FullGradientsChangeNoHash) {
  ASSERT_EQ(Train("digests", "--steps 10").exit_code, 0);
  ASSERT_EQ(Train("full", "--steps 10 --full-gradients").exit_code, 0);
  EXPECT_EQ(Text("digests/state_hashes.jsonl"), Text("full/state_hashes.jsonl"));
  for (const char* step : {"step_000000000", "step_000000010"}) {
    const fs::path d = dir_ / "digests/checkpoints" / step, f = dir_ / "full/checkpoints" / step;
    EXPECT_FALSE(fs::exists(d / "grads.safetensors"));
    EXPECT_TRUE(fs::exists(f / "grads.safetensors"));
    for (const char* file : {"model.safetensors", "optimizer.safetensors", "meta.json"}) {
      EXPECT_EQ(ReadFileBytes(d / file), ReadFileBytes(f / file)) << step << "/" << file;
    }
  }
  const Result resumed = Train("digests", "--steps 12 --resume --full-gradients");
  ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
  ASSERT_EQ(Train("full", "--steps 12 --resume --full-gradients").exit_code, 0);
  EXPECT_EQ(Text("digests/state_hashes.jsonl"), Text("full/state_hashes.jsonl"));
  ExpectSameCheckpoint(dir_ / "digests/checkpoints/step_000000012",
                       dir_ / "full/checkpoints/step_000000012");
}

// A step_N directory without COMPLETE is no checkpoint: the resume starts from the newest
// complete one and, reaching step N, moves the incomplete directory aside (nothing lost) and
// writes the checkpoint; the run is not stuck there.
TEST_F(E2e, ACheckpointWithoutCompleteIsMovedAsideNotAnObstacle) {
  ASSERT_EQ(Train("straight", "--steps 8").exit_code, 0);
  ASSERT_EQ(Train("stuck", "--steps 8").exit_code, 0);
  fs::remove(dir_ / "stuck/checkpoints/step_000000008/COMPLETE");
  const Result r = Train("stuck", "--steps 8 --resume");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("had no COMPLETE (not a committed checkpoint): moved to"),
            std::string::npos)
      << r.output;
  EXPECT_TRUE(fs::exists(dir_ / "stuck/checkpoints/incomplete-step_000000008/model.safetensors"));
  EXPECT_EQ(Text("straight/state_hashes.jsonl"), Text("stuck/state_hashes.jsonl"));
  ExpectSameCheckpoint(dir_ / "straight/checkpoints/step_000000008",
                       dir_ / "stuck/checkpoints/step_000000008");
}

TEST_F(E2e, StopAndResumeEqualsStraightRun) {
  ASSERT_EQ(Train("straight", "--steps 30").exit_code, 0);
  ASSERT_EQ(Train("resumed", "--steps 15").exit_code, 0);
  const Result r = Train("resumed", "--steps 30 --resume");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("step_000000015"), std::string::npos) << r.output;
  EXPECT_EQ(Text("straight/state_hashes.jsonl"), Text("resumed/state_hashes.jsonl"));
  ExpectSameCheckpoint(dir_ / "straight/checkpoints/step_000000030",
                       dir_ / "resumed/checkpoints/step_000000030");
  // metrics.jsonl has one line per step, none repeated by the resume.
  const std::string metrics = Text("resumed/metrics.jsonl");
  EXPECT_EQ(std::count(metrics.begin(), metrics.end(), '\n'), 30);
}

// A run whose state lives on disk (--spill-dir) makes the bits of a run in RAM: the same chain
// and byte-identical checkpoints, through gradient accumulation (tiny: 2 microbatches), a
// resume from a spilled run, at 2 threads and with the activations recomputed; the spill files
// are gone afterwards.
TEST_F(E2e, SpilledRunEqualsRunInRam) {
  ASSERT_EQ(Train("ram", "--steps 12").exit_code, 0);
  const fs::path spill = dir_ / "spill";
  Result r = Train("spilled", "--steps 6 --spill-dir " + spill.string());
  ASSERT_EQ(r.exit_code, 0) << r.output;
  // Activations recomputed from here on (--recompute-activations changes no bit).
  r = Train("spilled", "--steps 12 --resume --threads 2 --recompute-activations --spill-dir " +
                           spill.string());
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(Text("ram/state_hashes.jsonl"), Text("spilled/state_hashes.jsonl"));
  ExpectSameCheckpoint(dir_ / "ram/checkpoints/step_000000012",
                       dir_ / "spilled/checkpoints/step_000000012");
  EXPECT_FALSE(fs::exists(spill)) << "the spill directory was not removed";
}

// The same for open-100m's width with a 32768-token vocabulary and 2 layers: the embedding and
// head are 24 spill chunks each (two pieces: a norm carried across pieces, chunks in parallel),
// with two microbatches of 64 tokens and updates that are applied (spike_threshold raised: the
// initial gradient norm is above 10).
TEST_F(E2e, SpilledMultiChunkStepsEqualStepsInRam) {
  std::string yaml = ReadFileText(fs::path(LOCKSTEP_SOURCE_DIR) / "configs/open-100m.yaml");
  auto set = [&](const std::string& key, const std::string& value) {
    const size_t at = yaml.find("  " + key + ": ");
    ASSERT_NE(at, std::string::npos) << key;
    yaml.replace(at, yaml.find('\n', at) - at, "  " + key + ": " + value);
  };
  set("vocab", "32768");
  set("n_layers", "2");
  set("seq_len", "64");
  set("microbatch", "1");
  set("microbatches", "2");
  set("spike_threshold", "1.0e6");
  const fs::path config = dir_ / "open-100m-short.yaml";
  WriteFileSynced(config, yaml);
  auto train = [&](const std::string& run, const std::string& extra) {
    return Lockstep("train --config " + config.string() + " --data " + Data().string() +
                    " --out " + (dir_ / run).string() + " --no-progress --steps 2 " + extra);
  };
  const Result ram = train("ram", "--threads 1");
  ASSERT_EQ(ram.exit_code, 0) << ram.output;
  const Result spilled = train("spilled", "--threads 2 --spill-dir " + (dir_ / "spill").string());
  ASSERT_EQ(spilled.exit_code, 0) << spilled.output;
  EXPECT_EQ(Text("ram/state_hashes.jsonl"), Text("spilled/state_hashes.jsonl"));
  EXPECT_EQ(ReadFileText(dir_ / "ram/checkpoints/step_000000002/COMPLETE"),
            ReadFileText(dir_ / "spilled/checkpoints/step_000000002/COMPLETE"));
  EXPECT_EQ(Text("ram/metrics.jsonl").find("\"skipped\":true"), std::string::npos);
}

// A diverged step (init_std 1e19: the forward overflows, every gradient is NaN) is skipped,
// and its gradients are hashed and written as the canonical NaN 0x7fc00000: x86 arithmetic
// makes 0xffc00000, Arm 0x7fc00000, so hardware NaN bits would split the chain by CPU. With the
// state on disk too (where the backward's block squares, holding a NaN, send the norm back to
// the gradients to make them canonical).
TEST_F(E2e, NaNGradientsAreHashedAsTheCanonicalNaN) {
  std::string yaml = ReadFileText(fs::path(LOCKSTEP_SOURCE_DIR) / "configs/tiny.yaml");
  const size_t at = yaml.find("init_std: 0.02");
  ASSERT_NE(at, std::string::npos);
  yaml.replace(at, 14, "init_std: 1.0e+19");
  const fs::path config = dir_ / "diverging.yaml";
  WriteFileSynced(config, yaml);
  const Result r = Lockstep("train --config " + config.string() + " --data " + Data().string() +
                            " --out " + (dir_ / "run").string() +
                            " --no-progress --steps 1 --full-gradients");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(Text("run/metrics.jsonl").find("\"skipped\":true"), std::string::npos);
  const Result spilled =
      Lockstep("train --config " + config.string() + " --data " + Data().string() + " --out " +
               (dir_ / "spilled").string() + " --no-progress --steps 1 --full-gradients " +
               "--spill-dir " + (dir_ / "spill").string());
  ASSERT_EQ(spilled.exit_code, 0) << spilled.output;
  EXPECT_EQ(Text("run/state_hashes.jsonl"), Text("spilled/state_hashes.jsonl"));
  const std::vector<uint8_t> file =
      ReadFileBytes(dir_ / "run/checkpoints/step_000000001/grads.safetensors");
  EXPECT_EQ(file, ReadFileBytes(dir_ / "spilled/checkpoints/step_000000001/grads.safetensors"));
  uint64_t header = 0;
  std::memcpy(&header, file.data(), sizeof header);
  int64_t nans = 0;
  for (size_t i = 8 + header; i + 4 <= file.size(); i += 4) {
    uint32_t bits;
    std::memcpy(&bits, file.data() + i, sizeof bits);
    if ((bits & 0x7f800000u) == 0x7f800000u && (bits & 0x007fffffu) != 0) {
      ++nans;
      ASSERT_EQ(bits, 0x7fc00000u) << "a NaN gradient at byte " << i;
    }
  }
  EXPECT_GT(nans, 0);
}

TEST_F(E2e, ResumeAfterSigkillRecoversTheSameChain) {
  ASSERT_EQ(Train("straight", "--steps 30").exit_code, 0);
  const fs::path run = dir_ / "killed";
  // Kill a run at an arbitrary point after its first checkpoint (step 10): whatever it was
  // doing, a resume must reproduce the straight run exactly. The killed run keeps its state on
  // disk: its spill files must vanish with it (they are unlinked once created), so the resume
  // can spill into the same directory.
  const fs::path spill = dir_ / "spill";
  const pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    ::execl(LOCKSTEP_BINARY, LOCKSTEP_BINARY, "train", "--config", "tiny", "--data",
            Data().c_str(), "--out", run.c_str(), "--steps", "30", "--no-progress", "--spill-dir",
            spill.c_str(), nullptr);
    ::_exit(127);
  }
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (!fs::exists(run / "checkpoints/step_000000010/COMPLETE") &&
         std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  ::kill(pid, SIGKILL);
  int status = 0;
  ::waitpid(pid, &status, 0);
  ASSERT_TRUE(fs::exists(run / "checkpoints/step_000000010/COMPLETE"));
  EXPECT_TRUE(fs::is_empty(spill)) << "a killed run left spill files behind";

  // And the state a kill during a checkpoint write leaves: a half-written temporary directory,
  // plus (as if the kill came while step 20 was being written) hash lines past the checkpoint.
  fs::remove_all(run / "checkpoints/step_000000020");
  fs::create_directories(run / "checkpoints/.step_000000020.99999-0.tmp");
  WriteFileSynced(run / "checkpoints/.step_000000020.99999-0.tmp/model.safetensors",
                  std::string_view("partial"));

  const Result r = Lockstep("train --config tiny --data " + Data().string() + " --out " +
                            run.string() + " --steps 30 --resume --no-progress --spill-dir " +
                            spill.string());
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(Text("straight/state_hashes.jsonl"), Text("killed/state_hashes.jsonl"));
  ExpectSameCheckpoint(dir_ / "straight/checkpoints/step_000000030",
                       run / "checkpoints/step_000000030");
}

TEST_F(E2e, StartingOverAnExistingRunIsRefused) {
  ASSERT_EQ(Train("run", "--steps 2").exit_code, 0);
  const Result r = Train("run", "--steps 2");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.output.find("--resume"), std::string::npos) << r.output;
  const Result none = Train("empty", "--steps 2 --resume");
  EXPECT_EQ(none.exit_code, 2);
  EXPECT_NE(none.output.find("no complete checkpoint"), std::string::npos) << none.output;
}

TEST_F(E2e, LossFallsBelowTheUnigramEntropy) {
  ASSERT_EQ(Train("run", "--steps 30").exit_code, 0);
  const auto manifest = nlohmann::json::parse(ReadFileText(Data() / "manifest.json"));
  const double unigram = manifest.at("unigram_entropy_nats").get<double>();
  std::ifstream metrics(dir_ / "run/metrics.jsonl");
  std::string line;
  double first = 0, last = 0;
  while (std::getline(metrics, line)) {
    const auto j = nlohmann::json::parse(line);
    if (j.at("step") == 1) first = j.at("loss").get<double>();
    last = j.at("loss").get<double>();
  }
  EXPECT_GT(first, unigram);  // an untrained model is worse than unigram statistics
  EXPECT_LT(last, unigram - 0.3) << "first " << first << ", unigram " << unigram;
}

TEST_F(E2e, SmokeLossFallsWellBelowTheUnigramEntropy) {
  // The demo's model on the demo's corpus (smaller): 40 of its 300 steps are enough.
  const fs::path data = dir_ / "smoke_data";
  ASSERT_EQ(Lockstep("data synth --out " + data.string() + " --seed 1 --tokens 1000000").exit_code, 0);
  const Result r = Lockstep("train --config smoke --data " + data.string() + " --out " +
                            (dir_ / "run").string() + " --steps 40 --threads 1 --no-progress");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const auto manifest = nlohmann::json::parse(ReadFileText(data / "manifest.json"));
  const double unigram = manifest.at("unigram_entropy_nats").get<double>();
  std::ifstream metrics(dir_ / "run/metrics.jsonl");
  std::vector<double> losses;
  for (std::string line; std::getline(metrics, line);) {
    losses.push_back(nlohmann::json::parse(line).at("loss").get<double>());
  }
  ASSERT_EQ(losses.size(), 40u);
  double last5 = 0;
  for (size_t i = 35; i < 40; ++i) last5 += losses[i] / 5;
  EXPECT_GT(losses[0], unigram);
  EXPECT_LT(last5, unigram - 0.5) << "first " << losses[0] << ", unigram " << unigram;
}

TEST_F(E2e, CorruptShardIsNamedWithBothDigests) {
  const fs::path data = Data();
  fs::path bin;
  for (const auto& e : fs::directory_iterator(data)) {
    if (e.path().extension() == ".bin") bin = e.path();
  }
  ASSERT_FALSE(bin.empty());
  std::vector<uint8_t> bytes = ReadFileBytes(bin);
  bytes[bytes.size() / 2] ^= 0x01;
  WriteFileSynced(bin, bytes);
  const Result r = Train("run", "--steps 1");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.output.find(bin.filename().string()), std::string::npos) << r.output;
  const auto manifest = nlohmann::json::parse(ReadFileText(data / "manifest.json"));
  const std::string expected = manifest.at("shards").at(0).at("bin_blake2b").get<std::string>();
  EXPECT_NE(r.output.find(expected), std::string::npos) << r.output;
  EXPECT_NE(r.output.find(ToHex(Blake2b256(bytes))), std::string::npos) << r.output;
}

TEST_F(E2e, DamagedCheckpointFileIsNamed) {
  // A truncated file in one run, a missing file in another: each error names the file.
  for (const char* damage : {"truncate", "remove"}) {
    const std::string run = std::string("run_") + damage;
    ASSERT_EQ(Train(run, "--steps 10").exit_code, 0);
    const fs::path ckpt = dir_ / run / "checkpoints/step_000000010";
    const fs::path file = ckpt / (damage == std::string("truncate") ? "optimizer.safetensors"
                                                                     : "model.safetensors");
    if (damage == std::string("truncate")) {
      fs::resize_file(file, 100);
    } else {
      fs::remove(file);
    }
    const Result r = Train(run, "--steps 12 --resume");
    EXPECT_EQ(r.exit_code, 2) << damage;
    EXPECT_NE(r.output.find(file.filename().string()), std::string::npos) << r.output;
  }
}

// A Megatron-style dataset written by the independent writer imports through the CLI and trains;
// a vocabulary larger than the model's is refused naming both.
TEST_F(E2e, ImportedMegatronDatasetTrains) {
  if (std::system("python3 --version > /dev/null 2>&1") != 0) {
    GTEST_SKIP() << "python3 is not installed: no independent writer";
  }
  std::vector<std::vector<std::vector<uint32_t>>> documents;
  uint32_t state = 7;
  for (int d = 0; d < 40; ++d) {
    std::vector<uint32_t> tokens;
    for (int t = 0; t < 50 + d * 7; ++t) {
      state = state * 1664525u + 1013904223u;
      tokens.push_back((state >> 8) % 400);
    }
    tokens.push_back(400);  // the end-of-document id, as Megatron's --append-eod writes it
    documents.push_back({tokens});
  }
  const fs::path spec = dir_ / "spec.json";
  WriteFileSynced(spec, nlohmann::json{{"dtype", "uint16"}, {"documents", documents}}.dump());
  ASSERT_EQ(std::system(fmt::format("python3 {}/tests/data/megatron_writer.py {} {}",
                                    LOCKSTEP_SOURCE_DIR, (dir_ / "corpus").string(),
                                    spec.string())
                            .c_str()),
            0);
  WriteFileSynced(dir_ / "tokenizer.json", "{}");
  const auto import = [&](const std::string& out, int vocab) {
    return Lockstep(fmt::format("data import --megatron {} --tokenizer {} --vocab {} --eod 400 "
                                "--out {}",
                                (dir_ / "corpus").string(), (dir_ / "tokenizer.json").string(),
                                vocab, (dir_ / out).string()));
  };
  const Result imported = import("shards", 401);
  ASSERT_EQ(imported.exit_code, 0) << imported.output;
  EXPECT_NE(imported.output.find("tokenizer: tokenizer.json"), std::string::npos) << imported.output;
  EXPECT_NE(imported.output.find("documents: 40"), std::string::npos) << imported.output;
  const Result trained = Lockstep("train --config tiny --data " + (dir_ / "shards").string() +
                                  " --out " + (dir_ / "run").string() + " --no-progress --steps 2");
  ASSERT_EQ(trained.exit_code, 0) << trained.output;
  EXPECT_EQ(Lines(Text("run/state_hashes.jsonl")).size(), 3u);  // steps 0, 1, 2

  ASSERT_EQ(import("wide", 1000).exit_code, 0);  // tiny's model.vocab is 512
  const Result refused = Lockstep("train --config tiny --data " + (dir_ / "wide").string() +
                                  " --out " + (dir_ / "run_wide").string() + " --steps 1");
  EXPECT_EQ(refused.exit_code, 2) << refused.output;
  EXPECT_NE(refused.output.find("model.vocab = 512"), std::string::npos) << refused.output;
  EXPECT_NE(refused.output.find("1000 ids"), std::string::npos) << refused.output;
}

TEST_F(E2e, BadConfigNamesFieldAndValue) {
  const fs::path config = dir_ / "bad.yaml";
  std::string yaml = ReadFileText(fs::path(LOCKSTEP_SOURCE_DIR) / "configs/tiny.yaml");
  const std::string from = "beta2: 0.95";
  ASSERT_NE(yaml.find(from), std::string::npos);
  yaml.replace(yaml.find(from), from.size(), "beta2: 1.5");
  WriteFileSynced(config, yaml);
  const Result r = Lockstep("train --config " + config.string() + " --data " + Data().string() +
                            " --out " + (dir_ / "run").string() + " --steps 1");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.output.find("train.beta2"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("1.5"), std::string::npos) << r.output;
}

TEST_F(E2e, ForwardWritesLogitsConsistentWithItsLoss) {
  ASSERT_EQ(Train("run", "--steps 3").exit_code, 0);
  // A sequence of byte tokens; forward writes logits and per-position loss.
  std::vector<uint32_t> tokens;
  for (char c : std::string("the quick brown fox")) tokens.push_back(static_cast<uint8_t>(c));
  WriteFileSynced(dir_ / "tokens.bin",
                  std::span(reinterpret_cast<const uint8_t*>(tokens.data()), tokens.size() * 4));
  const Result r = Lockstep("forward --checkpoint " +
                            (dir_ / "run/checkpoints/step_000000003").string() + " --tokens " +
                            (dir_ / "tokens.bin").string() + " --out " +
                            (dir_ / "out.safetensors").string());
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const SafetensorsFile out = ReadSafetensors(dir_ / "out.safetensors");
  const NamedTensor& logits = out.Get("logits");
  const NamedTensor& loss = out.Get("loss");
  const int64_t positions = static_cast<int64_t>(tokens.size()) - 1;
  ASSERT_EQ(logits.shape, (std::vector<int64_t>{positions, 512}));
  ASSERT_EQ(loss.shape, (std::vector<int64_t>{positions}));
  // Each position's loss is log-sum-exp of its logits minus the next token's logit (fp64 here).
  for (int64_t t = 0; t < positions; ++t) {
    const float* z = logits.data.As<float>().data() + t * 512;
    double m = z[0], sum = 0;
    for (int v = 1; v < 512; ++v) m = std::max<double>(m, z[v]);
    for (int v = 0; v < 512; ++v) sum += std::exp(z[v] - m);
    EXPECT_NEAR(loss.data.As<float>()[t], m + std::log(sum) - z[tokens[t + 1]], 1e-4)
        << "position " << t;
  }
  const Result bad = Lockstep("forward --checkpoint " + (dir_ / "run").string() + " --tokens " +
                              (dir_ / "tokens.bin").string() + " --out " +
                              (dir_ / "x.safetensors").string());
  EXPECT_EQ(bad.exit_code, 2);
  EXPECT_NE(bad.output.find("COMPLETE"), std::string::npos) << bad.output;

  // A descriptor whose model is not the one the tensors hold (meta.json forged, COMPLETE with
  // it) is refused naming the first tensor that differs, before any tensor data is read.
  const fs::path forged = dir_ / "run/checkpoints/step_000000003";
  nlohmann::json meta = nlohmann::json::parse(ReadFileText(forged / "meta.json"));
  meta["descriptor"] =
      test::Replace(meta["descriptor"].get<std::string>(), "\"n_layers\":2", "\"n_layers\":3");
  test::Forge(forged, "meta.json", meta.dump(2) + "\n");
  const Result wrong =
      Lockstep("forward --checkpoint " + forged.string() + " --tokens " +
               (dir_ / "tokens.bin").string() + " --out " + (dir_ / "y.safetensors").string());
  EXPECT_EQ(wrong.exit_code, 2) << wrong.output;
  RunConfig three = LoadRunConfig("tiny");
  const size_t tensors = ParameterSpecs(three.model).size();
  three.model.n_layers = 3;
  EXPECT_NE(wrong.output.find(fmt::format("holds {} tensors; its descriptor's model has {}",
                                          tensors, ParameterSpecs(three.model).size())),
            std::string::npos)
      << wrong.output;
}

}  // namespace
}  // namespace lockstep
