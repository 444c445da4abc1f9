// Checkpoints: round trip, byte-identical rewrites, every damaged-file case named, the latest
// complete checkpoint, the state-hash log, and the independent Python recomputation.
#include <sys/wait.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "state/state_fixtures.h"

namespace lockstep {
namespace {
namespace fs = std::filesystem;
using test::ExpectError;
using test::Forge;
using test::Replace;
using test::SampleState;

class CheckpointTest : public test::ScratchDirTest {};

// The names in `dir` that start with '.' (staging directories, anyone's), sorted.
std::vector<std::string> DotNames(const fs::path& dir) {
  std::vector<std::string> names;
  for (const fs::directory_entry& e : fs::directory_iterator(dir)) {
    const std::string name = e.path().filename().string();
    if (name.starts_with('.')) names.push_back(name);
  }
  std::ranges::sort(names);
  return names;
}

void ExpectSameBits(std::span<const float> a, std::span<const float> b, const std::string& what) {
  ASSERT_EQ(a.size(), b.size()) << what;
  EXPECT_EQ(0, std::memcmp(a.data(), b.data(), a.size_bytes())) << what;
}

TEST_F(CheckpointTest, RoundTripKeepsStateTensorsAndHash) {
  const SampleState s;
  // A staging name already taken (a writer that crashed at this step, with this process's id,
  // or anyone) is passed over and kept as it was; the writer's own staging is gone once it
  // commits.
  const fs::path taken = dir_ / "checkpoints" / fmt::format(".step_000000007.{}-0.tmp", ::getpid());
  fs::create_directories(taken);
  WriteFileSynced(taken / "model.safetensors", "junk");
  const fs::path dir = WriteCheckpoint(dir_, s.state, s.Tensors());
  EXPECT_EQ(dir, dir_ / "checkpoints" / "step_000000007");
  EXPECT_EQ(dir, CheckpointDir(dir_, 7));
  EXPECT_EQ(ReadFileText(taken / "model.safetensors"), "junk");
  EXPECT_EQ(DotNames(dir_ / "checkpoints"), std::vector<std::string>{taken.filename().string()});

  const Checkpoint c = ReadCheckpoint(dir);
  const StepState& got = c.state;
  EXPECT_EQ(got.step, s.state.step);
  EXPECT_EQ(got.optimizer_step, s.state.optimizer_step);
  EXPECT_EQ(std::bit_cast<uint32_t>(got.lr), std::bit_cast<uint32_t>(s.state.lr));
  EXPECT_EQ(std::bit_cast<uint32_t>(got.grad_norm), std::bit_cast<uint32_t>(s.state.grad_norm));
  EXPECT_EQ(std::bit_cast<uint32_t>(got.clip_factor), std::bit_cast<uint32_t>(s.state.clip_factor));
  EXPECT_EQ(got.skipped, s.state.skipped);
  EXPECT_EQ(got.tokens_digest, s.state.tokens_digest);
  EXPECT_EQ(got.rng_seed, s.state.rng_seed);
  EXPECT_EQ(got.rng_counter, s.state.rng_counter);
  EXPECT_EQ(got.data_cursor, s.state.data_cursor);
  EXPECT_EQ(got.spike.total_skips, s.state.spike.total_skips);
  EXPECT_EQ(got.spike.recent_skips, s.state.spike.recent_skips);
  EXPECT_EQ(got.prev_hash, s.state.prev_hash);
  EXPECT_EQ(got.descriptor, s.state.descriptor);

  // By default the gradients are kept as their digests: no grads.safetensors.
  const std::vector<TensorState> want = s.Tensors();
  EXPECT_FALSE(c.grads.has_value());
  EXPECT_FALSE(fs::exists(dir / "grads.safetensors"));
  ASSERT_EQ(c.tensors.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) {
    EXPECT_EQ(c.tensors[i].name, want[i].name);
    EXPECT_EQ(c.tensors[i].shape, want[i].shape);
    ExpectSameBits(c.tensors[i].param, want[i].param, want[i].name + " param");
    ExpectSameBits(c.tensors[i].m, want[i].m, want[i].name + " m");
    ExpectSameBits(c.tensors[i].v, want[i].v, want[i].name + " v");
    EXPECT_TRUE(c.tensors[i].grad.empty()) << want[i].name;
    EXPECT_EQ(c.tensors[i].grad_digest, ArrayDigest(want[i].grad)) << want[i].name;
  }
  const Digest expected = ComputeStateHash(s.state, want).hash;
  EXPECT_EQ(c.state_hash, expected);
  EXPECT_EQ(VerifyCheckpointHash(c).hash, expected);

  // The optimizer file uses the exp_avg / exp_avg_sq names.
  EXPECT_EQ(c.optimizer.tensors()[0].name, "embed.weight.exp_avg");
  EXPECT_EQ(c.optimizer.tensors()[1].name, "embed.weight.exp_avg_sq");

  // With full gradients: the same state hash, and the gradients' elements come back too.
  const fs::path full = WriteCheckpoint(dir_ / "full", s.state, want, Gradients::kFull);
  const Checkpoint f = ReadCheckpoint(full);
  ASSERT_TRUE(f.grads.has_value());
  for (size_t i = 0; i < want.size(); ++i) {
    ExpectSameBits(f.tensors[i].grad, want[i].grad, want[i].name + " grad");
    EXPECT_EQ(f.tensors[i].grad_digest, ArrayDigest(want[i].grad)) << want[i].name;
  }
  EXPECT_EQ(f.state_hash, expected);
  EXPECT_EQ(VerifyCheckpointHash(f).hash, expected);
  // Model and optimizer files are the same bytes either way; meta.json too.
  for (const char* name : {"model.safetensors", "optimizer.safetensors", "meta.json"}) {
    EXPECT_EQ(ReadFileBytes(dir / name), ReadFileBytes(full / name)) << name;
  }
  // A checkpoint read back (gradients known by their digests) is written again as the same bytes.
  EXPECT_EQ(WriteCheckpoint(dir_ / "again", c.state, c.tensors), dir_ / "again" / dir.lexically_relative(dir_));
  EXPECT_EQ(ReadFileBytes(dir_ / "again" / dir.lexically_relative(dir_) / "COMPLETE"),
            ReadFileBytes(dir / "COMPLETE"));
  // ... but not with full gradients, which it does not have.
  ExpectError([&] { WriteCheckpoint(dir_ / "again_full", c.state, c.tensors, Gradients::kFull); },
              {"embed.weight", "full gradients", "only its digest"});
}

// 12 bytes per parameter plus headers: parameters and two moments; the gradients are digests.
TEST_F(CheckpointTest, DigestOnlyCheckpointsHoldTwelveBytesPerParameter) {
  const SampleState s;
  uint64_t params = 0;
  for (const TensorState& t : s.Tensors()) params += t.param.size();
  const fs::path dir = WriteCheckpoint(dir_, s.state, s.Tensors());
  uint64_t data = 0;
  for (const char* name : {"model.safetensors", "optimizer.safetensors"}) {
    const std::vector<uint8_t> bytes = ReadFileBytes(dir / name);
    uint64_t header = 0;
    std::memcpy(&header, bytes.data(), 8);
    data += bytes.size() - 8 - header;
  }
  EXPECT_EQ(data, 12 * params);
  const fs::path full = WriteCheckpoint(dir_ / "full", s.state, s.Tensors(), Gradients::kFull);
  const std::vector<uint8_t> grads = ReadFileBytes(full / "grads.safetensors");
  uint64_t header = 0;
  std::memcpy(&header, grads.data(), 8);
  EXPECT_EQ(grads.size() - 8 - header, 4 * params);
}

TEST_F(CheckpointTest, SameStateGivesIdenticalBytesAndRewritesAreNoOps) {
  const SampleState s;
  const fs::path a = WriteCheckpoint(dir_ / "run_a", s.state, s.Tensors());
  const fs::path b = WriteCheckpoint(dir_ / "run_b", s.state, s.Tensors());
  for (const char* name : {"model.safetensors", "optimizer.safetensors", "meta.json",
                           "COMPLETE"}) {
    EXPECT_EQ(ReadFileBytes(a / name), ReadFileBytes(b / name)) << name;
  }
  EXPECT_EQ(WriteCheckpoint(dir_ / "run_a", s.state, s.Tensors()), a);

  SampleState other;
  other.state.rng_counter++;
  ExpectError([&] { WriteCheckpoint(dir_ / "run_a", other.state, other.Tensors()); },
              {a.string(), "already exists", "refusing"});
  EXPECT_TRUE(DotNames(dir_ / "run_a" / "checkpoints").empty());
  EXPECT_EQ(ReadCheckpoint(a).state.rng_counter, s.state.rng_counter);
}

TEST_F(CheckpointTest, DamagedCheckpointsNameTheFile) {
  const SampleState s;
  const fs::path dir = WriteCheckpoint(dir_, s.state, s.Tensors(), Gradients::kFull);
  const std::vector<uint8_t> model = ReadFileBytes(dir / "model.safetensors");

  WriteFileSynced(dir / "model.safetensors", std::span(model).first(model.size() - 3));
  ExpectError([&] { ReadCheckpoint(dir); },
              {(dir / "model.safetensors").string(), std::to_string(model.size() - 3) + " bytes",
               "lists " + std::to_string(model.size())});

  std::vector<uint8_t> flipped = model;
  flipped[flipped.size() - 5] ^= 0x10;
  WriteFileSynced(dir / "model.safetensors", flipped);
  ExpectError([&] { ReadCheckpoint(dir); },
              {(dir / "model.safetensors").string(), ToHex(TensorFileDigest(flipped, "m")),
               ToHex(TensorFileDigest(model, "m")), "corrupt"});
  WriteFileSynced(dir / "model.safetensors", model);
  EXPECT_NO_THROW(ReadCheckpoint(dir));

  fs::rename(dir / "grads.safetensors", dir / "grads.moved");
  ExpectError([&] { ReadCheckpoint(dir); }, {(dir / "grads.safetensors").string(), "missing"});
  fs::rename(dir / "grads.moved", dir / "grads.safetensors");

  // Gradients that do not hash to meta.json's grad_digests (relisted in COMPLETE: only meta.json
  // can tell), in memory and streamed.
  const std::vector<uint8_t> grads = ReadFileBytes(dir / "grads.safetensors");
  std::vector<uint8_t> other = grads;
  other[other.size() - 1] ^= 0x01;  // the last gradient: final_norm.gain
  Forge(dir, "grads.safetensors", std::string(other.begin(), other.end()));
  const Checkpoint c = ReadCheckpoint(dir);
  ExpectError([&] { VerifyCheckpointHash(c); },
              {"final_norm.gain", "gradient", ToHex(ArrayDigest(s.Tensors()[1].grad))});
  ExpectError([&] { StreamCheckpoint(OpenCheckpoint(dir), 3, {}); },
              {(dir / "grads.safetensors").string(), "final_norm.gain", "grad_digests"});
  Forge(dir, "grads.safetensors", std::string(grads.begin(), grads.end()));

  // COMPLETE that does not list grads.safetensors: a checkpoint of digests (the file is not read).
  nlohmann::json complete = nlohmann::json::parse(ReadFileText(dir / "COMPLETE"));
  const std::string listed = ReadFileText(dir / "COMPLETE");
  complete["files"].erase("grads.safetensors");
  WriteFileSynced(dir / "COMPLETE", complete.dump(2) + "\n");
  EXPECT_FALSE(ReadCheckpoint(dir).grads.has_value());
  complete["files"]["extra.bin"] = complete["files"]["meta.json"];
  WriteFileSynced(dir / "COMPLETE", complete.dump(2) + "\n");
  ExpectError([&] { ReadCheckpoint(dir); }, {(dir / "COMPLETE").string(), "extra.bin"});
  WriteFileSynced(dir / "COMPLETE", listed);

  fs::remove(dir / "COMPLETE");
  ExpectError([&] { ReadCheckpoint(dir); }, {dir.string(), "no COMPLETE"});
}

TEST_F(CheckpointTest, ForgedMetaIsCaughtByItsParserOrByTheHash) {
  const SampleState s;
  const fs::path dir = WriteCheckpoint(dir_, s.state, s.Tensors());
  const std::string meta = ReadFileText(dir / "meta.json");

  Forge(dir, "meta.json", Replace(meta, "\"rng_seed\": 1234", "\"rng_seed\": -1234"));
  ExpectError([&] { ReadCheckpoint(dir); },
              {(dir / "meta.json").string(), "\"rng_seed\"", "unsigned integer", "-1234"});
  Forge(dir, "meta.json", Replace(meta, "\"lr_bits\": \"", "\"lr_bits\": \"x"));
  ExpectError([&] { ReadCheckpoint(dir); }, {(dir / "meta.json").string(), "\"lr_bits\""});
  Forge(dir, "meta.json", Replace(meta, "\"step\": 7", "\"step\": 8"));
  ExpectError([&] { ReadCheckpoint(dir); }, {"\"step\" is 8", "named for step 7"});

  const std::string digests = "\"grad_digests\": [\n    \"";
  Forge(dir, "meta.json", Replace(meta, digests, digests + "0"));
  ExpectError([&] { ReadCheckpoint(dir); },
              {(dir / "meta.json").string(), "\"grad_digests\"[0]"});
  // One digest short: named with both counts.
  const size_t first = meta.find(digests) + digests.size() - 1;
  Forge(dir, "meta.json", meta.substr(0, first) + meta.substr(meta.find('"', first + 66)));
  ExpectError([&] { ReadCheckpoint(dir); },
              {(dir / "meta.json").string(), "lists 1 digests for 2 parameters"});

  // Well-formed but altered: only the state hash can tell.
  Forge(dir, "meta.json", Replace(meta, "\"data_cursor\": 56", "\"data_cursor\": 57"));
  const Checkpoint c = ReadCheckpoint(dir);
  ExpectError([&] { VerifyCheckpointHash(c); }, {dir.string(), "recomputed", ToHex(c.state_hash)});
}

TEST_F(CheckpointTest, TensorFilesMustAgree) {
  const SampleState s;
  const fs::path dir = WriteCheckpoint(dir_, s.state, s.Tensors(), Gradients::kFull);
  // grads.safetensors with one tensor renamed (and valid metadata and COMPLETE entry).
  const SafetensorsFile grads = ReadSafetensors(dir / "grads.safetensors");
  std::vector<NamedTensor> renamed = grads.tensors();
  renamed[1].name = "other";
  const std::vector<uint8_t> bytes = SafetensorsBytes(renamed, grads.metadata());
  Forge(dir, "grads.safetensors", std::string(bytes.begin(), bytes.end()));
  ExpectError([&] { ReadCheckpoint(dir); },
              {(dir / "grads.safetensors").string(), "no tensor named 'final_norm.gain'"});
}

TEST_F(CheckpointTest, LatestCompleteCheckpointIgnoresTempAndIncompleteDirs) {
  EXPECT_EQ(LatestCompleteCheckpoint(dir_), std::nullopt);
  SampleState s;
  for (uint64_t step : {5, 10}) {
    s.state.step = step;
    WriteCheckpoint(dir_, s.state, s.Tensors());
  }
  const fs::path checkpoints = dir_ / "checkpoints";
  fs::create_directories(checkpoints / ".step_000000020.1-0.tmp");
  WriteFileSynced(checkpoints / ".step_000000020.1-0.tmp" / "COMPLETE", "{}");
  fs::create_directories(checkpoints / "step_000000015");  // renamed in without COMPLETE
  fs::create_directories(checkpoints / "step_12");         // not a canonical name
  WriteFileSynced(checkpoints / "step_12" / "COMPLETE", "{}");
  EXPECT_EQ(LatestCompleteCheckpoint(dir_), checkpoints / "step_000000010");
}

TEST_F(CheckpointTest, StateHashLogRoundTripAndValidation) {
  const fs::path path = dir_ / "state_hashes.jsonl";
  std::vector<StateHashLine> lines;
  for (uint64_t step = 0; step < 3; ++step) {
    StateHashLine line{.step = step};
    line.hash.fill(static_cast<uint8_t>(step * 17));
    AppendStateHashLine(path, line);
    lines.push_back(line);
  }
  EXPECT_EQ(ReadStateHashLines(path), lines);
  EXPECT_EQ(ReadFileText(path).substr(0, 20), "{\"step\": 0, \"hash\": ");

  WriteStateHashLines(path, std::span(lines).first(2));
  EXPECT_EQ(ReadStateHashLines(path), std::vector(lines.begin(), lines.begin() + 2));

  const std::string good = ReadFileText(path);
  WriteFileSynced(path, good + "{\"step\": 2, \"hash\": \"00");
  ExpectError([&] { ReadStateHashLines(path); }, {path.string(), "line 3", "newline"});
  WriteFileSynced(path, good + "{\"step\": 1, \"hash\": \"" + std::string(64, 'a') + "\"}\n");
  ExpectError([&] { ReadStateHashLines(path); }, {"line 3", "step 1 does not follow step 1"});
  WriteFileSynced(path, good + "{\"step\": 2, \"hash\": \"" + std::string(63, 'a') + "\"}\n");
  ExpectError([&] { ReadStateHashLines(path); }, {"line 3", "\"hash\"", "63 characters"});
  WriteFileSynced(path, good + "{\"step\": 2}\n");
  ExpectError([&] { ReadStateHashLines(path); }, {"line 3", "missing field \"hash\""});
}

// tools/state_hash.py on a checkpoint directory: its exit status, and its stdout in `output`.
int RunPythonStateHash(const fs::path& dir, std::string* output) {
  const std::string command = std::string("python3 ") + LOCKSTEP_SOURCE_DIR +
                              "/tools/state_hash.py '" + dir.string() + "' 2>/dev/null";
  FILE* pipe = ::popen(command.c_str(), "r");
  if (pipe == nullptr) ADD_FAILURE() << "popen failed: " << command;
  char buf[256];
  while (pipe != nullptr && std::fgets(buf, sizeof buf, pipe) != nullptr) *output += buf;
  const int status = pipe == nullptr ? -1 : ::pclose(pipe);
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

bool HavePython() { return std::system("python3 --version > /dev/null 2>&1") == 0; }

// tools/state_hash.py recomputes the hash from the files with nothing but Python's stdlib: the
// auditor's independent check of the byte layout.
TEST_F(CheckpointTest, PythonRecomputesTheStateHash) {
  if (!HavePython()) {
    GTEST_SKIP() << "python3 is not installed: the independent recomputation is not checked";
  }
  const SampleState s;
  const fs::path dir = WriteCheckpoint(dir_, s.state, s.Tensors());
  std::string output;
  EXPECT_EQ(RunPythonStateHash(dir, &output), 0);
  EXPECT_EQ(output, ToHex(ComputeStateHash(s.state, s.Tensors()).hash) + "\n");
  // With full gradients, which the script checks against meta.json's digests.
  const fs::path full = WriteCheckpoint(dir_ / "full", s.state, s.Tensors(), Gradients::kFull);
  output.clear();
  EXPECT_EQ(RunPythonStateHash(full, &output), 0);
  EXPECT_EQ(output, ToHex(ComputeStateHash(s.state, s.Tensors()).hash) + "\n");
  std::vector<uint8_t> grads = ReadFileBytes(full / "grads.safetensors");
  grads.back() ^= 0x01;
  Forge(full, "grads.safetensors", std::string(grads.begin(), grads.end()));
  output.clear();
  EXPECT_EQ(RunPythonStateHash(full, &output), 2);

  // A forged (self-consistent) meta.json: the script recomputes a different hash, exit 1.
  Forge(dir, "meta.json",
        Replace(ReadFileText(dir / "meta.json"), "\"rng_counter\": 99", "\"rng_counter\": 98"));
  SampleState forged;
  forged.state.rng_counter = 98;
  output.clear();
  EXPECT_EQ(RunPythonStateHash(dir, &output), 1);
  EXPECT_EQ(output, ToHex(ComputeStateHash(forged.state, forged.Tensors()).hash) + "\n");
}

// Arrays of several hash chunks (the sample's are smaller than one): whole chunks of zeros
// (whose digest lockstep computes once), mixed chunks and a short last chunk.
TEST_F(CheckpointTest, PythonRecomputesArraysOfSeveralChunks) {
  if (!HavePython()) {
    GTEST_SKIP() << "python3 is not installed: the independent recomputation is not checked";
  }
  SampleState s;
  const int64_t n = 2 * kHashChunkFloats + kHashChunkFloats / 2 + 3;
  SampleState::Arrays big{"big.weight", {n}, {}, {}, {}, {}};
  for (int64_t i = 0; i < n; ++i) {
    big.param.push_back(static_cast<float>(i % 1000) * 0.001f - 0.5f);
    big.m.push_back(0.0f);
    big.v.push_back(i < kHashChunkFloats ? 0.0f : 1e-6f);
    big.grad.push_back(i == kHashChunkFloats + 7 ? -0.0f : 0.0f);  // one -0 in a chunk of zeros
  }
  s.arrays.push_back(std::move(big));
  const fs::path dir = WriteCheckpoint(dir_, s.state, s.Tensors(), Gradients::kFull);
  std::string output;
  EXPECT_EQ(RunPythonStateHash(dir, &output), 0);
  EXPECT_EQ(output, ToHex(ComputeStateHash(s.state, s.Tensors()).hash) + "\n");
}

}  // namespace
}  // namespace lockstep
