// The auditor's commands through the lockstep binary: init and interval replays match the
// training run's chain at 1 and 2 threads, the output contract, the memory plan against the
// measured peak RSS, refusals before any work, a flipped bit localised, and verify-handoff.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <regex>
#include <string>

#include "lockstep/core.h"
#include "lockstep/data.h"
#include "lockstep/model.h"
#include "lockstep/state.h"
#include "lockstep/train.h"
#include "state/state_fixtures.h"

namespace lockstep {
namespace {

// Under AddressSanitizer (scripts/sanitize.sh) a process's RSS includes shadow memory, so the
// memory plan's accuracy is not checked there.
#if defined(__SANITIZE_ADDRESS__)
constexpr bool kRssIsMeaningful = false;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
constexpr bool kRssIsMeaningful = false;
#else
constexpr bool kRssIsMeaningful = true;
#endif
#else
constexpr bool kRssIsMeaningful = true;
#endif
namespace fs = std::filesystem;
using Json = nlohmann::json;

struct Result {
  int exit_code = -1;
  std::string out, err;
  Json json() const { return Json::parse(out); }
};

// One scratch directory for the whole suite: the data and the trained run are made once.
fs::path Scratch() {
  static const fs::path dir =
      fs::temp_directory_path() / ("lockstep_audit_" + std::to_string(::getpid()));
  return dir;
}

Result Lockstep(const std::string& args) {
  const fs::path out = Scratch() / "stdout.txt", err = Scratch() / "stderr.txt";
  const std::string command = std::string(LOCKSTEP_BINARY) + " " + args + " >" + out.string() +
                              " 2>" + err.string();
  const int status = std::system(command.c_str());
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, ReadFileText(out), ReadFileText(err)};
}

// The hash of `step` in a run's state_hashes.jsonl.
std::string ChainHash(const fs::path& run, uint64_t step) {
  for (const StateHashLine& line : ReadStateHashLines(run / "state_hashes.jsonl")) {
    if (line.step == step) return ToHex(line.hash);
  }
  ADD_FAILURE() << "no line for step " << step;
  return "";
}

class Audit : public ::testing::Test {
 protected:
  // Data for every test; tiny trained 20 steps with checkpoints at 10 and 20.
  static void SetUpTestSuite() {
    fs::remove_all(Scratch());
    fs::create_directories(Scratch());
    Result r = Lockstep("data synth --out " + Data().string() + " --seed 7 --tokens 200000");
    ASSERT_EQ(r.exit_code, 0) << r.err;
    r = Lockstep("train --config tiny --data " + Data().string() + " --out " + Run().string() +
                 " --steps 20 --no-progress");
    ASSERT_EQ(r.exit_code, 0) << r.err;
  }
  static void TearDownTestSuite() { fs::remove_all(Scratch()); }

  static fs::path Data() { return Scratch() / "data"; }
  static fs::path Run() { return Scratch() / "run"; }
  static fs::path Ckpt(const fs::path& run, uint64_t step) { return CheckpointDir(run, step); }

  // A copy of the run, for tests that damage it.
  static fs::path CopyOfRun(const std::string& name) {
    const fs::path copy = Scratch() / name;
    fs::remove_all(copy);
    fs::copy(Run(), copy, fs::copy_options::recursive);
    return copy;
  }

  static Result Interval(const fs::path& run, const std::string& extra) {
    return Lockstep("replay --checkpoint " + Ckpt(run, 10).string() + " --until-step 20 --data " +
                    Data().string() + " " + extra);
  }
};

const std::regex kVerdictLine(
    "replay: state_hash=[0-9a-f]{64} expected=([0-9a-f]{64}|none) MATCH=(True|False|None)");

void ExpectContract(const Result& r, const std::string& mode, int threads) {
  const Json j = r.json();
  for (const char* key : {"step", "consumed_tokens", "peak_rss_bytes", "planned_peak_rss_bytes"}) {
    ASSERT_TRUE(j.contains(key) && j[key].is_number_unsigned()) << key << ": " << r.out;
  }
  EXPECT_TRUE(std::regex_match(j.at("state_hash").get<std::string>(), std::regex("[0-9a-f]{64}")));
  EXPECT_EQ(j.at("mode"), mode);
  EXPECT_TRUE(j.at("device").get<std::string>().starts_with("cpu:")) << j.at("device");
  EXPECT_EQ(j.at("threads"), threads);
  EXPECT_TRUE(j.at("expected").is_string() || j.at("expected").is_null());
  EXPECT_TRUE(j.at("match").is_boolean() || j.at("match").is_null());
  EXPECT_TRUE(j.at("losses").is_array());
  EXPECT_TRUE(j.at("wall_seconds").is_number());
  std::smatch m;
  EXPECT_TRUE(std::regex_search(r.err, m, kVerdictLine)) << r.err;
}

TEST_F(Audit, InitReplayMatchesChainLineZeroAtOneAndTwoThreads) {
  const std::string line0 = ChainHash(Run(), 0);
  for (int threads : {1, 2}) {
    const Result r = Lockstep("replay --from-init --config tiny --data " + Data().string() +
                              " --threads " + std::to_string(threads) + " --expect-hash " + line0);
    ASSERT_EQ(r.exit_code, 0) << r.err;
    ExpectContract(r, "init", threads);
    const Json j = r.json();
    EXPECT_EQ(j.at("state_hash"), line0);
    EXPECT_EQ(j.at("match"), true);
    EXPECT_EQ(j.at("step"), 0);
    EXPECT_TRUE(j.at("losses").empty());
    EXPECT_NE(r.err.find("MATCH=True"), std::string::npos) << r.err;
  }
  // A different seed is a different init, and a mismatch exits 1.
  const Result other = Lockstep("replay --from-init --config tiny --seed 99 --data " +
                                Data().string() + " --expect-hash " + line0);
  EXPECT_EQ(other.exit_code, 1) << other.err;
  EXPECT_NE(other.err.find("MATCH=False"), std::string::npos) << other.err;
}

// An int8 model's init unit makes its scale tensors from the weights' maxima folded as the
// weights pass (InitInPieces), the trainer from each range's weight rows drawn again
// (InitTensorRange): the same state hash.
TEST_F(Audit, InitReplayOfAnInt8ModelMatchesItsTrainer) {
  const fs::path run = Scratch() / "int8-run";
  const Result trained = Lockstep("train --config tiny-int8 --data " + Data().string() + " --out " +
                                  run.string() + " --steps 0 --no-progress");
  ASSERT_EQ(trained.exit_code, 0) << trained.err;
  const Result r = Lockstep("replay --from-init --config tiny-int8 --data " + Data().string() +
                            " --threads 2 --expect-hash " + ChainHash(run, 0));
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.err.find("MATCH=True"), std::string::npos) << r.err;
}

TEST_F(Audit, IntervalReplayMatchesTheChainAtOneAndTwoThreads) {
  const std::string line20 = ChainHash(Run(), 20);
  for (int threads : {1, 2}) {
    const fs::path handoff = Scratch() / ("handoff" + std::to_string(threads));
    const fs::path losses = Scratch() / ("losses" + std::to_string(threads) + ".jsonl");
    const Result r = Interval(Run(), "--threads " + std::to_string(threads) +
                                         " --save-checkpoint-dir " + handoff.string() +
                                         " --loss-log " + losses.string());
    ASSERT_EQ(r.exit_code, 0) << r.err;
    ExpectContract(r, "interval", threads);
    const Json j = r.json();
    EXPECT_EQ(j.at("state_hash"), line20);
    EXPECT_EQ(j.at("expected"), line20);  // from the run's state_hashes.jsonl
    EXPECT_EQ(j.at("match"), true);
    EXPECT_EQ(j.at("step"), 20);
    EXPECT_EQ(j.at("consumed_tokens"), 20 * 2 * 2 * 64);  // steps x microbatches x batch x seq
    EXPECT_EQ(j.at("losses").size(), 10u);
    ASSERT_EQ(j.at("backward_blake2b").size(), 10u);
    EXPECT_NE(r.err.find("replay: state_hash=" + line20 + " expected=" + line20 + " MATCH=True"),
              std::string::npos)
        << r.err;
    // The plan is printed, and within 15 % of the measured peak.
    EXPECT_NE(r.err.find("memory plan: planned peak RSS"), std::string::npos) << r.err;
    const double planned = j.at("planned_peak_rss_bytes").get<double>();
    const double measured = j.at("peak_rss_bytes").get<double>();
    if (kRssIsMeaningful) {
      EXPECT_NEAR(planned / measured, 1.0, 0.15)
          << "planned " << planned << ", measured " << measured;
    }
    // The hand-off is the publisher's checkpoint, byte for byte; the loss log has every step.
    for (const char* file : {"model.safetensors", "optimizer.safetensors", "meta.json",
                             "COMPLETE"}) {
      EXPECT_EQ(ReadFileBytes(Ckpt(handoff, 20) / file), ReadFileBytes(Ckpt(Run(), 20) / file))
          << file;
    }
    const std::string log = ReadFileText(losses);
    EXPECT_EQ(std::count(log.begin(), log.end(), '\n'), 10);
    // Its lines are the run's metrics.jsonl lines, timings aside, with the step's state hash.
    const std::vector<std::string> published = Lines(ReadFileText(Run() / "metrics.jsonl"));
    for (const std::string& line : Lines(log)) {
      Json got = Json::parse(line);
      const auto step = got.at("step").get<uint64_t>();
      ASSERT_LE(step, published.size());
      Json want = Json::parse(published[step - 1]);
      EXPECT_EQ(got.at("state_hash"), ChainHash(Run(), step));
      // The backward digest is the publisher's (compared with the rest below) and the result's.
      EXPECT_EQ(got.at("backward_blake2b"), j.at("backward_blake2b")[step - 11]);
      for (const char* other : {"step_seconds", "tokens_per_second", "comm_seconds",
                                "state_hash"}) {
        got.erase(other);
        want.erase(other);
      }
      EXPECT_EQ(got, want) << "step " << step;
    }
  }
}

TEST_F(Audit, MismatchExitsOneAndWritesNoHandoff) {
  const fs::path handoff = Scratch() / "handoff_mismatch";
  const Result r = Interval(Run(), "--expect-hash " + ChainHash(Run(), 19) +
                                       " --save-checkpoint-dir " + handoff.string());
  EXPECT_EQ(r.exit_code, 1) << r.err;
  EXPECT_EQ(r.json().at("match"), false);
  EXPECT_NE(r.err.find("MATCH=False"), std::string::npos) << r.err;
  EXPECT_FALSE(fs::exists(handoff));
}

TEST_F(Audit, MalformedExpectHashIsRefusedBeforeAnyWork) {
  const std::string hash = ChainHash(Run(), 20);
  std::string upper = hash;
  for (char& c : upper) c = static_cast<char>(std::toupper(c));
  // The checkpoint does not exist: the hash must be refused before anything is read.
  for (const std::string& bad : {hash.substr(0, 63), upper}) {
    const Result r = Lockstep("replay --checkpoint /nonexistent --until-step 20 --data " +
                              Data().string() + " --expect-hash " + bad);
    EXPECT_EQ(r.exit_code, 2) << r.err;
    EXPECT_NE(r.err.find("--expect-hash"), std::string::npos) << r.err;
    EXPECT_EQ(r.err.find("/nonexistent"), std::string::npos) << r.err;
    EXPECT_TRUE(r.out.empty()) << r.out;
  }
}

TEST_F(Audit, UntilStepAtOrBeforeTheStartIsRefused) {
  for (const char* until : {"10", "5"}) {
    const Result r = Lockstep("replay --checkpoint " + Ckpt(Run(), 10).string() +
                              " --until-step " + until + " --data " + Data().string());
    EXPECT_EQ(r.exit_code, 2) << r.err;
    EXPECT_NE(r.err.find(std::string("--until-step ") + until), std::string::npos) << r.err;
    EXPECT_NE(r.err.find("(step 10)"), std::string::npos) << r.err;
    EXPECT_EQ(r.err.find("memory plan"), std::string::npos) << r.err;  // refused before work
  }
}

// A checkpoint of tiny with a 2^28-token vocabulary: each embedding matrix is 128 GiB, more than
// any machine this runs on holds even with the state spilled to disk. The tensor files are sparse
// (headers written, data never): the plan refuses before any of it is read.
fs::path ForgeHugeCheckpoint(const fs::path& dir, const fs::path& model_checkpoint,
                             const fs::path& data) {
  RunConfig config = LoadRunConfig("tiny");
  config.model.vocab = int64_t{1} << 28;
  const std::string descriptor =
      train::RunDescriptor(config, data::OpenDataset(data));
  fs::create_directories(dir);
  std::vector<TensorShape> params, moments;
  for (const ParamSpec& spec : ParameterSpecs(config.model)) {
    params.push_back({spec.name, spec.shape});
    moments.push_back({spec.name + ".exp_avg", spec.shape});
    moments.push_back({spec.name + ".exp_avg_sq", spec.shape});
  }
  Json meta = Json::parse(ReadFileText(model_checkpoint / "meta.json"));
  meta["descriptor"] = descriptor;
  const std::string meta_text = meta.dump(2) + "\n";
  WriteFileSynced(dir / "meta.json", meta_text);
  Json files = {{"meta.json",
                 {{"blake2b", ToHex(Blake2b256(std::span(
                                  reinterpret_cast<const uint8_t*>(meta_text.data()),
                                  meta_text.size())))},
                  {"size", meta_text.size()}}}};
  const uint64_t step = meta["step"].get<uint64_t>();
  auto sparse = [&](const char* name, const char* content, std::span<const TensorShape> tensors) {
    const uint64_t size = test::WriteSparseTensorFile(dir / name, content, step, tensors);
    files[name] = {{"digest", std::string(64, '0')}, {"size", size}};  // never read that far
  };
  sparse("model.safetensors", "model", params);
  sparse("optimizer.safetensors", "optimizer", moments);
  sparse("grads.safetensors", "grads", params);
  const Json complete = {
      {"files", files}, {"format", "lockstep-checkpoint-complete"},
      {"format_version", kCheckpointFormatVersion}};
  WriteFileSynced(dir / "COMPLETE", complete.dump(2) + "\n");
  return dir;
}

// A replay the machine cannot hold, even with the state on disk, is refused with the plan's
// numbers before anything large is read or allocated; train refuses a run whose state does not
// fit in RAM and names --spill-dir.
TEST_F(Audit, AMemoryPlanTheMachineCannotHoldIsRefused) {
  const fs::path huge = ForgeHugeCheckpoint(Scratch() / "huge" / "step_000000010", Ckpt(Run(), 10),
                                            Data());
  const Result r = Lockstep("replay --checkpoint " + huge.string() + " --until-step 11 --data " +
                            Data().string());
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_NE(r.err.find("the replay does not fit in RAM"), std::string::npos) << r.err;
  const std::regex refusal(
      "memory plan: the replay needs [0-9]+ bytes beyond what is resident now \\(planned peak RSS "
      "[0-9]+ bytes\\), but /proc/meminfo has MemAvailable [0-9]+ bytes; pass --force");
  EXPECT_TRUE(std::regex_search(r.err, refusal)) << r.err;
  EXPECT_LT(std::stoull(r.err.substr(r.err.find("planned peak RSS ") + 17)), uint64_t{1} << 45)
      << "the plan counts the spilled step, not the 2 TiB state";

  RunConfig config = LoadRunConfig("tiny");
  const fs::path yaml = Scratch() / "huge.yaml";
  std::string text = ReadFileText(fs::path(LOCKSTEP_SOURCE_DIR) / "configs/tiny.yaml");
  text.replace(text.find("vocab: 512"), 10, "vocab: 268435456");
  WriteFileSynced(yaml, text);
  const Result t = Lockstep("train --config " + yaml.string() + " --data " + Data().string() +
                            " --out " + (Scratch() / "huge-run").string() + " --no-progress");
  EXPECT_EQ(t.exit_code, 2) << t.err;
  EXPECT_NE(t.err.find("give --spill-dir DIR"), std::string::npos) << t.err;
  EXPECT_FALSE(fs::exists(Scratch() / "huge-run" / "checkpoints"));
}

// Flips one bit of element 40 of layers.1.attn.wv.weight inside model.safetensors' data.
void FlipBitInModel(const fs::path& checkpoint) {
  const fs::path file = checkpoint / "model.safetensors";
  std::vector<uint8_t> bytes = ReadFileBytes(file);
  uint64_t header = 0;
  std::memcpy(&header, bytes.data(), sizeof header);
  const Json index = Json::parse(bytes.begin() + 8, bytes.begin() + 8 + header);
  const uint64_t begin = index.at("layers.1.attn.wv.weight").at("data_offsets").at(0);
  bytes[8 + header + begin + 40 * sizeof(float) + 2] ^= 0x01;
  WriteFileSynced(file, bytes);
}

TEST_F(Audit, FlippedBitIsRefusedAndWithForceLocalised) {
  const fs::path run = CopyOfRun("flipped");
  FlipBitInModel(Ckpt(run, 10));
  const Result refused = Interval(run, "");
  EXPECT_EQ(refused.exit_code, 2) << refused.err;
  EXPECT_NE(refused.err.find("model.safetensors"), std::string::npos) << refused.err;
  EXPECT_NE(refused.err.find("COMPLETE"), std::string::npos) << refused.err;

  const Result forced =
      Interval(run, "--force --compare-checkpoint " + Ckpt(Run(), 20).string());
  EXPECT_EQ(forced.exit_code, 1) << forced.err;
  EXPECT_NE(forced.err.find("WARNING"), std::string::npos) << forced.err;
  EXPECT_NE(forced.err.find("MATCH=False"), std::string::npos) << forced.err;
  const Json localisation = forced.json().at("localisation");
  ASSERT_FALSE(localisation.empty());
  const std::string last = localisation.back();
  EXPECT_NE(last.find("param:layers.1.attn.wv.weight at flat index 40 [0, 40]"),
            std::string::npos)
      << last;
  EXPECT_NE(forced.err.find("localisation: " + last), std::string::npos);
  // The reference checkpoint keeps the gradients' digests only: a differing gradient is named
  // with both digests, and what would localise it is said.
  const std::string grad_line = "grad:layers.1.attn.wv.weight differs: digest replayed ";
  EXPECT_TRUE(std::ranges::any_of(localisation, [&](const Json& line) {
    const std::string text = line.get<std::string>();
    return text.starts_with(grad_line) && text.find("--full-gradients") != std::string::npos;
  })) << localisation.dump(1);
}

// Rewrites COMPLETE's entry for `name` to the file's current size and digest.
void RelistInComplete(const fs::path& checkpoint, const std::string& name) {
  Json complete = Json::parse(ReadFileText(checkpoint / "COMPLETE"));
  const std::vector<uint8_t> bytes = ReadFileBytes(checkpoint / name);
  complete["files"][name] = test::CompleteEntry(name, bytes);
  WriteFileSynced(checkpoint / "COMPLETE", complete.dump(2) + "\n");
}

TEST_F(Audit, VerifyHandoffAcceptsTheGenuineCheckpointAndRejectsAnyChange) {
  const std::string hash = ChainHash(Run(), 20), prev = ChainHash(Run(), 19);
  auto verify = [](const fs::path& ckpt, const std::string& expect, const std::string& previous) {
    return Lockstep("verify-handoff --checkpoint " + ckpt.string() + " --expect-hash " + expect +
                    " --prev-hash " + previous);
  };
  const Result genuine = verify(Ckpt(Run(), 20), hash, prev);
  EXPECT_EQ(genuine.exit_code, 0) << genuine.out << genuine.err;
  EXPECT_NE(genuine.out.find("verdict: ACCEPTED"), std::string::npos) << genuine.out;

  const Result wrong_prev = verify(Ckpt(Run(), 20), hash, ChainHash(Run(), 18));
  EXPECT_EQ(wrong_prev.exit_code, 1) << wrong_prev.out;
  EXPECT_NE(wrong_prev.out.find("verdict: REJECTED"), std::string::npos) << wrong_prev.out;
  const Result wrong_hash = verify(Ckpt(Run(), 20), prev, prev);
  EXPECT_EQ(wrong_hash.exit_code, 1) << wrong_hash.out;
  EXPECT_NE(wrong_hash.out.find("verdict: REJECTED"), std::string::npos) << wrong_hash.out;
  const Result malformed = verify(Ckpt(Run(), 20), hash, prev.substr(1));
  EXPECT_EQ(malformed.exit_code, 2) << malformed.err;
  EXPECT_NE(malformed.err.find("--prev-hash"), std::string::npos) << malformed.err;

  // One float of the optimizer state, and the data cursor in meta.json, each changed with
  // COMPLETE relisted so that the files read back cleanly: only the hash can tell.
  const fs::path moment = Ckpt(CopyOfRun("moment"), 20);
  {
    std::vector<uint8_t> bytes = ReadFileBytes(moment / "optimizer.safetensors");
    bytes[bytes.size() - 2] ^= 0x01;  // inside the last tensor's data
    WriteFileSynced(moment / "optimizer.safetensors", bytes);
    RelistInComplete(moment, "optimizer.safetensors");
  }
  const fs::path cursor = Ckpt(CopyOfRun("cursor"), 20);
  {
    Json meta = Json::parse(ReadFileText(cursor / "meta.json"));
    meta["data_cursor"] = meta["data_cursor"].get<uint64_t>() + 1;
    WriteFileSynced(cursor / "meta.json", meta.dump(2) + "\n");
    RelistInComplete(cursor, "meta.json");
  }
  for (const fs::path& changed : {moment, cursor}) {
    const Result r = verify(changed, hash, prev);
    EXPECT_EQ(r.exit_code, 1) << changed << r.out << r.err;
    EXPECT_NE(r.out.find("verdict: REJECTED"), std::string::npos) << r.out;
  }
}

// Spilled, an interval replay reads its checkpoint in place, and its first step verifies it
// from the digests of what it read: a genuine checkpoint matches the chain ten steps on, and a
// changed one is refused as in RAM, before any verdict, whether COMPLETE was relisted to hide
// the change or not, and in what the step never read (full gradients, which it overwrites).
TEST_F(Audit, ACheckpointReadInPlaceIsVerifiedByTheFirstStep) {
  const std::string spill = " --spill-dir " + (Scratch() / "in-place-spill").string();
  const Result genuine = Interval(Run(), spill);
  ASSERT_EQ(genuine.exit_code, 0) << genuine.err;
  EXPECT_EQ(genuine.json().at("match"), true) << genuine.out;
  EXPECT_NE(genuine.err.find("read in place by step 11"), std::string::npos) << genuine.err;

  const auto refused = [](const Result& r, const std::string& reason) {
    EXPECT_EQ(r.exit_code, 2) << r.err;
    EXPECT_NE(r.err.find(reason), std::string::npos) << r.err;
    EXPECT_EQ(r.err.find("MATCH="), std::string::npos) << r.err;
  };
  const fs::path flipped = CopyOfRun("in-place-flipped");
  FlipBitInModel(Ckpt(flipped, 10));
  refused(Interval(flipped, spill), "model.safetensors: digest");

  const fs::path moment = CopyOfRun("in-place-moment");
  {
    std::vector<uint8_t> bytes = ReadFileBytes(Ckpt(moment, 10) / "optimizer.safetensors");
    bytes[bytes.size() - 2] ^= 0x01;  // inside the last tensor's data
    WriteFileSynced(Ckpt(moment, 10) / "optimizer.safetensors", bytes);
    RelistInComplete(Ckpt(moment, 10), "optimizer.safetensors");
  }
  refused(Interval(moment, spill), "the state hash recomputed from the files");

  const fs::path full = Scratch() / "in-place-full";
  ASSERT_EQ(Lockstep("train --config smoke --data " + Data().string() + " --out " + full.string() +
                     " --steps 0 --full-gradients --no-progress")
                .exit_code,
            0);
  const std::string replay = "replay --checkpoint " + Ckpt(full, 0).string() +
                             " --until-step 1 --data " + Data().string();
  const Result in_ram = Lockstep(replay), in_place = Lockstep(replay + spill);
  ASSERT_EQ(in_ram.exit_code, 0) << in_ram.err;
  ASSERT_EQ(in_place.exit_code, 0) << in_place.err;
  EXPECT_EQ(in_ram.json().at("state_hash"), in_place.json().at("state_hash"));
  // The gradients, overwritten by the step before it read them, are read by the check.
  uint64_t grads = 0;
  for (const ParamSpec& spec : ParameterSpecs(LoadRunConfig("smoke").model)) {
    grads += static_cast<uint64_t>(spec.numel()) * sizeof(float);
  }
  const Json verify = in_place.json().at("phases").back();
  EXPECT_EQ(verify.at("name"), "step 1: verify checkpoint");
  EXPECT_EQ(verify.at("read_bytes"), grads);
  EXPECT_EQ(verify.at("hashed_bytes"), grads);
  {
    std::vector<uint8_t> bytes = ReadFileBytes(Ckpt(full, 0) / "grads.safetensors");
    bytes[bytes.size() - 2] ^= 0x40;
    WriteFileSynced(Ckpt(full, 0) / "grads.safetensors", bytes);
  }
  refused(Lockstep(replay + spill), "grads.safetensors: digest");
}

// smoke: its init replay equals `train --steps 0`'s line 0, and a one-step interval replay from
// that step-0 checkpoint is planned within 15 % of its measured peak RSS.
TEST_F(Audit, SmokeInitMatchesAndOneStepPlanIsAccurate) {
  const fs::path run = Scratch() / "smoke";
  const Result trained = Lockstep("train --config smoke --data " + Data().string() + " --out " +
                                  run.string() + " --steps 0 --no-progress");
  ASSERT_EQ(trained.exit_code, 0) << trained.err;
  const Result init =
      Lockstep("replay --from-init --config smoke --data " + Data().string() + " --threads 2");
  ASSERT_EQ(init.exit_code, 0) << init.err;
  EXPECT_EQ(init.json().at("state_hash"), ChainHash(run, 0));

  const Result r = Lockstep("replay --checkpoint " + Ckpt(run, 0).string() +
                            " --until-step 1 --data " + Data().string());
  ASSERT_EQ(r.exit_code, 0) << r.err;  // no line for step 1 in the chain: no target
  const Json j = r.json();
  EXPECT_TRUE(j.at("match").is_null());
  EXPECT_NE(r.err.find("MATCH=None"), std::string::npos) << r.err;
  const double planned = j.at("planned_peak_rss_bytes").get<double>();
  const double measured = j.at("peak_rss_bytes").get<double>();
  if (kRssIsMeaningful) {
    EXPECT_NEAR(planned / measured, 1.0, 0.15) << "planned " << planned << ", measured " << measured;
  }
}

// An interval replay reports where its time went: the load, then each step's phases. In RAM a
// step touches no disk; spilled, each phase's traffic is what the step must move. smoke trains
// one microbatch: each parameter is read by the forward and again by the backward (but the
// embedding table, whose backward only scatters into its gradient), each gradient written
// once (the norm sums its squares before it is written) and read back by the update, which also
// reads the parameters and both moments and digests all four arrays once more.
TEST_F(Audit, IntervalReplayReportsItsPhasesAndTheirDiskTraffic) {
  const fs::path run = Scratch() / "phases";
  ASSERT_EQ(Lockstep("train --config smoke --data " + Data().string() + " --out " + run.string() +
                     " --steps 0 --no-progress")
                .exit_code,
            0);
  uint64_t p = 0, table = 0;  // bytes of one array of every tensor, and of the embedding table
  for (const ParamSpec& spec : ParameterSpecs(LoadRunConfig("smoke").model)) {
    p += static_cast<uint64_t>(spec.numel()) * sizeof(float);
    if (spec.name == "tok_embeddings.weight") table = static_cast<uint64_t>(spec.numel()) * sizeof(float);
  }
  ASSERT_GT(table, 0u);
  const fs::path checkpoint = Ckpt(run, 0);
  const uint64_t files =
      fs::file_size(checkpoint / "model.safetensors") + fs::file_size(checkpoint / "optimizer.safetensors");
  const std::string replay = "replay --checkpoint " + checkpoint.string() +
                             " --until-step 1 --data " + Data().string();
  const Result in_ram = Lockstep(replay);
  const Result spilled = Lockstep(replay + " --spill-dir " + (Scratch() / "phases-spill").string());
  ASSERT_EQ(in_ram.exit_code, 0) << in_ram.err;
  ASSERT_EQ(spilled.exit_code, 0) << spilled.err;
  EXPECT_EQ(in_ram.json().at("state_hash"), spilled.json().at("state_hash"));

  struct Traffic {
    std::string name;
    uint64_t read, written, hashed;
  };
  const auto traffic = [](const Result& r) {
    std::vector<Traffic> phases;
    const Json j = r.json();
    for (const Json& phase : j.at("phases")) {
      EXPECT_GE(phase.at("seconds").get<double>(), 0.0) << phase;
      EXPECT_LE(phase.at("read_seconds").get<double>(), phase.at("seconds").get<double>()) << phase;
      phases.push_back({phase.at("name"), phase.at("read_bytes"), phase.at("written_bytes"),
                        phase.at("hashed_bytes")});
    }
    return phases;
  };
  const auto expect = [](const std::vector<Traffic>& got, const std::vector<Traffic>& want) {
    ASSERT_EQ(got.size(), want.size());
    for (size_t i = 0; i < want.size(); ++i) {
      EXPECT_EQ(got[i].name, want[i].name);
      EXPECT_EQ(got[i].read, want[i].read) << want[i].name;
      EXPECT_EQ(got[i].written, want[i].written) << want[i].name;
      EXPECT_EQ(got[i].hashed, want[i].hashed) << want[i].name;
    }
  };
  expect(traffic(in_ram), {{"load checkpoint", files, 0, files},
                           {"step 1: forward and backward", 0, 0, 0},
                           {"step 1: global norm", 0, 0, 0},
                           {"step 1: update and hash", 0, 0, 4 * p}});
  // Spilled, the checkpoint is read in place: each byte once, by the step, which then verifies
  // it from the digests of what it read, reading nothing more.
  expect(traffic(spilled), {{"load checkpoint", 0, 0, 0},
                            {"step 1: forward and backward", 2 * p - table, p, 3 * p - table},
                            {"step 1: global norm", 0, 0, 0},
                            {"step 1: update and hash", 4 * p, 0, 8 * p},
                            {"step 1: verify checkpoint", 0, 0, 0}});
}

// open-100m (~100M parameters, tensors of several spill chunks): the streamed init unit equals
// the step 0 the trainer writes with its state on disk, with RAM ~ two 4 MiB pieces (planned
// within 15 %).
TEST_F(Audit, OpenHundredMillionInitUnitMatchesTheSpilledTrainer) {
  const fs::path run = Scratch() / "open-100m";
  const Result trained =
      Lockstep("train --config open-100m --data " + Data().string() + " --out " + run.string() +
               " --steps 0 --threads 2 --no-progress --spill-dir " + (Scratch() / "spill").string());
  ASSERT_EQ(trained.exit_code, 0) << trained.err;
  const Result init = Lockstep("replay --from-init --config open-100m --data " + Data().string() +
                               " --threads 2 --expect-hash " + ChainHash(run, 0));
  ASSERT_EQ(init.exit_code, 0) << init.err;
  const Json j = init.json();
  EXPECT_EQ(j.at("match"), true) << init.out;
  const double planned = j.at("planned_peak_rss_bytes").get<double>();
  const double measured = j.at("peak_rss_bytes").get<double>();
  if (kRssIsMeaningful) {
    EXPECT_NEAR(planned / measured, 1.0, 0.15) << "planned " << planned << ", measured " << measured;
    EXPECT_LT(measured, 64.0 * 1024 * 1024) << "the init unit holds one piece, not the model";
  }
  EXPECT_FALSE(fs::exists(Scratch() / "spill")) << "the trainer left its spill files";
}

}  // namespace
}  // namespace lockstep
