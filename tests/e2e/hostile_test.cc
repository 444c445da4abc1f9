// Hostile and careless inputs (issue: hardening): each gets a clear error and exit 2 -- or, for
// a torn log line, the documented recovery -- and nothing hangs.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "common/kit_edit.h"
#include "common/run_lockstep.h"
#include "lockstep/core.h"
#include "lockstep/state.h"

namespace lockstep {
namespace {
namespace fs = std::filesystem;
using test::Lockstep;
using test::Result;
using test::Shell;

class Hostile : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = fs::temp_directory_path() / ("lockstep_hostile_" + std::to_string(::getpid()));
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    Result r = Lockstep("data synth --out " + Path("data") + " --seed 7 --tokens 100000");
    ASSERT_EQ(r.exit_code, 0) << r.output;
    r = Lockstep(Train("run", "--steps 4"));
    ASSERT_EQ(r.exit_code, 0) << r.output;
  }
  static void TearDownTestSuite() { fs::remove_all(dir_); }
  static std::string Path(const std::string& name) { return (dir_ / name).string(); }
  static std::string Train(const std::string& run, const std::string& extra) {
    return "train --config tiny --data " + Path("data") + " --out " + Path(run) + " --no-progress " +
           extra;
  }
  static void ExpectRefused(const Result& r, const std::string& message) {
    EXPECT_EQ(r.exit_code, 2) << r.output;
    EXPECT_NE(r.output.find(message), std::string::npos) << r.output;
  }
  static fs::path dir_;
};
fs::path Hostile::dir_;

TEST_F(Hostile, PathsOfTheWrongKind) {
  WriteFileSynced(dir_ / "a_file", "x");
  ExpectRefused(Lockstep(Train("a_file", "--steps 1")), "a regular file, not a directory");
  // A FIFO where a shard should be: refused at once, not waited on.
  fs::copy(dir_ / "data", dir_ / "fifo_data", fs::copy_options::recursive);
  fs::remove(dir_ / "fifo_data/shard_00000.bin");
  ASSERT_EQ(::mkfifo((dir_ / "fifo_data/shard_00000.bin").c_str(), 0600), 0);
  ExpectRefused(Shell("timeout 60 " + std::string(LOCKSTEP_BINARY) + " data inspect " +
                      Path("fifo_data")),
                "not a regular file");
}

// Inside a directory a command adds to, the files it writes are its own: a link, a FIFO or
// someone's file at a log's name or at checkpoints/ is refused before any work (never written
// through, waited on or appended to), and a directory at a staging-like name is left alone.
TEST_F(Hostile, WhatLiesInsideARunDirectoryIsNeverWrittenThrough) {
  WriteFileSynced(dir_ / "victim.txt", "theirs\n");
  for (const std::string log : {"metrics.jsonl", "state_hashes.jsonl", "signatures.jsonl"}) {
    const fs::path run = dir_ / ("linked-" + log);
    fs::create_directories(run);
    fs::create_symlink(dir_ / "victim.txt", run / log);
    ExpectRefused(Lockstep(Train(run.filename().string(), "--steps 1")), log);
    EXPECT_FALSE(fs::exists(run / "checkpoints")) << log;
  }
  fs::create_directories(dir_ / "fifo-run");
  ASSERT_EQ(::mkfifo((dir_ / "fifo-run/metrics.jsonl").c_str(), 0600), 0);
  ExpectRefused(
      Shell("timeout 60 " + std::string(LOCKSTEP_BINARY) + " " + Train("fifo-run", "--steps 1")),
      "metrics.jsonl: exists");
  EXPECT_EQ(ReadFileText(dir_ / "victim.txt"), "theirs\n");

  // checkpoints/ a link: refused, nothing written where it points.
  fs::create_directories(dir_ / "elsewhere");
  fs::create_directories(dir_ / "save");
  fs::create_directory_symlink(dir_ / "elsewhere", dir_ / "save/checkpoints");
  ExpectRefused(
      Lockstep("replay --checkpoint " + Path("run/checkpoints/step_000000000") +
               " --until-step 2 --data " + Path("data") + " --save-checkpoint-dir " + Path("save")),
      "checkpoints: a symbolic link");
  EXPECT_TRUE(fs::is_empty(dir_ / "elsewhere"));

  // A directory at a staging-like name in a run being resumed is passed over, kept whole.
  fs::copy(dir_ / "run", dir_ / "resumed", fs::copy_options::recursive);
  fs::remove_all(dir_ / "resumed/checkpoints/step_000000004");
  const fs::path theirs = dir_ / "resumed/checkpoints/.step_000000004.1-0.tmp";
  fs::create_directories(theirs);
  WriteFileSynced(theirs / "keep.txt", "theirs");
  const Result r = Lockstep(Train("resumed", "--steps 4 --resume"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(ReadFileText(theirs / "keep.txt"), "theirs");
  EXPECT_TRUE(fs::exists(dir_ / "resumed/checkpoints/step_000000004/COMPLETE"));
}

// Inputs larger than the memory they would need are refused by their size, before a byte is
// read or allocated (a 1 TiB sparse file), naming the file and the bound.
TEST_F(Hostile, InputsTooLargeToReadWholeAreRefusedBySize) {
  const fs::path big = dir_ / "big.txt";
  { std::ofstream touch(big); }
  fs::resize_file(big, uint64_t{1} << 40);
  ExpectRefused(Shell("timeout 60 " + std::string(LOCKSTEP_BINARY) + " data tokenize --input " +
                      big.string() + " --out " + Path("big-shards")),
                "big.txt: 1099511627776 bytes, more than a fifth of the memory available now");
  EXPECT_FALSE(fs::exists(dir_ / "big-shards"));
  ExpectRefused(
      Shell("timeout 60 " + std::string(LOCKSTEP_BINARY) + " tokenizer train --vocab 300 --input " +
            big.string() + " --out " + Path("big-tokenizer")),
      "big.txt: 1099511627776 bytes, more than a third of the memory available now");
  EXPECT_FALSE(fs::exists(dir_ / "big-tokenizer"));
}

// A kit holds what its own verify accepts: a run whose metrics say a step took a negative or
// an infinite time is refused when the kit is built, naming the file, the line and the field.
TEST_F(Hostile, AKitIsNotBuiltFromImpossibleStepTimes) {
  fs::copy(dir_ / "run", dir_ / "timed", fs::copy_options::recursive);
  const fs::path metrics = dir_ / "timed/metrics.jsonl";
  std::string text = ReadFileText(metrics);
  const size_t at = text.find("\"step_seconds\":");
  ASSERT_NE(at, std::string::npos);
  const size_t end = text.find(',', at);
  text.replace(at, end - at, "\"step_seconds\":-1.0");
  WriteFileSynced(metrics, text);
  ExpectRefused(Lockstep("kit build --run " + Path("timed") + " --data " + Path("data") +
                         " --out " + Path("timed-kit")),
                "metrics.jsonl: line 1: field \"step_seconds\" is -1.0, expected a finite number");
  EXPECT_FALSE(fs::exists(dir_ / "timed-kit"));
}

TEST_F(Hostile, CommandLineValuesOutOfRange) {
  ExpectRefused(Lockstep("replay --checkpoint " + Path("run/checkpoints/step_000000000") +
                         " --until-step 1 --data " + Path("data") + " --expect-hash ''"),
                "--expect-hash");
  EXPECT_EQ(Lockstep(Train("huge", "--steps 99999999999999999999")).exit_code, 2);
  EXPECT_FALSE(fs::exists(dir_ / "huge"));
  // Unsigned options take no sign and do not wrap or saturate: each is refused with its range.
  ExpectRefused(Lockstep("replay --from-init --config tiny --data " + Path("data") + " --seed -1"),
                "--seed -1: expected an integer from 0 to 18446744073709551615");
  ExpectRefused(Lockstep("replay --checkpoint " + Path("run/checkpoints/step_000000000") +
                         " --data " + Path("data") + " --until-step 18446744073709551616"),
                "--until-step 18446744073709551616: expected an integer from 0 to 1099511627776");
  ExpectRefused(Lockstep("trace --checkpoint " + Path("run/checkpoints/step_000000000") +
                         " --data " + Path("data") + " --out " + Path("t") +
                         " --step 18446744073709551615"),
                "--step 18446744073709551615: expected an integer from 0 to 1099511627776");
  ExpectRefused(Lockstep("data synth --out " + Path("s") + " --seed +1 --tokens 10"),
                "--seed +1: expected an integer");
  // A range error says what is wanted, not the 309 digits of the largest double.
  for (const auto& [command, wanted] :
       {std::pair{Train("t0", "--comm-timeout 0"), std::string(": must be > 0, not 0")},
        {"data synth --out " + Path("s") + " --tokens 0",
         ": expected an integer from 1 to 18446744073709551615, not 0"}}) {
    const Result r = Lockstep(command);
    EXPECT_EQ(r.exit_code, 2) << r.output;
    EXPECT_NE(r.output.find(wanted), std::string::npos) << r.output;
    EXPECT_EQ(r.output.find("179769313486231570814527423731704356798070567525844996598917476803"),
              std::string::npos)
        << r.output;
  }
}

// A bug in lockstep is told apart from bad input: "internal error at FILE:LINE", exit status 70,
// where every refusal of input exits 2.
// A write whose size is known is sized against the disk first: nothing is written.
TEST_F(Hostile, WorkLargerThanTheDiskIsRefusedBeforeAnythingIsWritten) {
  const Result r = Lockstep("data synth --out " + Path("huge") + " --tokens 4611686018427387904");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("needs 4611686018427387904 bytes"), std::string::npos) << r.output;
  EXPECT_FALSE(fs::exists(Path("huge")));
  // A token file far larger than the model's positions is refused by its size, unread.
  const std::string sparse = Path("sparse.bin");
  std::filesystem::resize_file((std::ofstream(sparse).close(), sparse),
                               uintmax_t{1} << 40);  // 1 TiB, sparse
  const Result f = Lockstep("forward --checkpoint " + Path("run/checkpoints/step_000000004") +
                            " --tokens " + sparse + " --out " + Path("logits.safetensors"));
  EXPECT_EQ(f.exit_code, 2) << f.output;
  EXPECT_NE(f.output.find("1099511627776 bytes"), std::string::npos) << f.output;
  fs::remove(sparse);
}

TEST_F(Hostile, AnInternalErrorHasItsOwnExitStatus) {
  const Result r = Lockstep("selftest --test-internal-error");
  EXPECT_EQ(r.exit_code, kInternalErrorExit) << r.output;
  EXPECT_NE(r.output.find("lockstep: internal error at tools/lockstep/cmd_selftest.cc:"),
            std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("a bug in lockstep, not in its input"), std::string::npos) << r.output;
}

TEST_F(Hostile, HostileJsonInAChainLineIsRefused) {
  fs::copy(dir_ / "run", dir_ / "deep", fs::copy_options::recursive);
  AppendFileSynced(dir_ / "deep/state_hashes.jsonl",
                   std::string(100000, '[') + std::string(100000, ']') + "\n");
  ExpectRefused(Lockstep("dispute steps " + Path("deep") + " " + Path("run")),
                "nested deeper than 64");
}

TEST_F(Hostile, ATornChainLineIsDroppedOnResume) {
  fs::copy(dir_ / "run", dir_ / "torn", fs::copy_options::recursive);
  AppendFileSynced(dir_ / "torn/state_hashes.jsonl", "{\"step\": 5, \"ha");  // a full disk
  const Result r = Lockstep(Train("torn", "--steps 6 --resume"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("dropping a torn last line"), std::string::npos) << r.output;
  ASSERT_EQ(Lockstep(Train("straight6", "--steps 6")).exit_code, 0);
  EXPECT_EQ(ReadFileText(dir_ / "torn/state_hashes.jsonl"),
            ReadFileText(dir_ / "straight6/state_hashes.jsonl"));
}

// The chain a resume carries forward, and a kit publishes, is the one the checkpoints attest:
// "run" has checkpoints at steps 0 and 4, so step 3's line must be step 4's prev_hash, and no
// line may be missing. An edited or a deleted line is refused by both, naming the step.
TEST_F(Hostile, AnEditedOrDeletedChainLineIsNeitherResumedNorPublished) {
  const std::vector<std::string> lines = Lines(ReadFileText(dir_ / "run/state_hashes.jsonl"));
  ASSERT_EQ(lines.size(), 5u);
  const auto with_lines = [&](const std::string& run, std::vector<std::string> kept) {
    fs::copy(dir_ / "run", dir_ / run, fs::copy_options::recursive);
    std::string text;
    for (const std::string& line : kept) text += line + "\n";
    WriteFileSynced(dir_ / run / "state_hashes.jsonl", text);
  };
  std::vector<std::string> edited = lines;
  edited[3] = "{\"step\": 3, " + lines[2].substr(lines[2].find("\"hash\""));  // step 2's hash
  with_lines("edited", edited);
  ExpectRefused(Lockstep(Train("edited", "--steps 5 --resume")), "has prev_hash");
  ExpectRefused(Lockstep("kit build --run " + Path("edited") + " --data " + Path("data") +
                         " --out " + Path("edited-kit")),
                "has prev_hash");
  EXPECT_FALSE(fs::exists(dir_ / "edited-kit"));

  std::vector<std::string> deleted = lines;
  deleted.erase(deleted.begin() + 2);
  with_lines("deleted", deleted);
  ExpectRefused(Lockstep(Train("deleted", "--steps 5 --resume")), "a line is missing");
  ExpectRefused(Lockstep("kit build --run " + Path("deleted") + " --data " + Path("data") +
                         " --out " + Path("deleted-kit")),
                "a line is missing");
}

TEST_F(Hostile, ARunStoppedBeforeItsFirstCheckpointSaysWhatToDo) {
  fs::create_directories(dir_ / "early/checkpoints/.step_000000000.99999-0.tmp");
  WriteFileSynced(dir_ / "early/state_hashes.jsonl",
                  ReadFileText(dir_ / "run/state_hashes.jsonl").substr(0, 87));
  ExpectRefused(Lockstep(Train("early", "--steps 2")), "delete it");
  ExpectRefused(Lockstep(Train("early", "--steps 2 --resume")), "delete the directory");
}

TEST_F(Hostile, KitsWithoutUnitsOrWithLinksAndStalledServers) {
  Result r = Lockstep("kit build --run " + Path("run") + " --data " + Path("data") + " --out " +
                      Path("kit"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  // No units: nothing to audit is not a pass (kit verify, which audit runs first, wants the init).
  fs::copy(dir_ / "kit", dir_ / "empty", fs::copy_options::recursive);
  nlohmann::json trajectory = nlohmann::json::parse(ReadFileText(dir_ / "empty/trajectory.json"));
  trajectory["units"] = nlohmann::json::array();
  WriteFileSynced(dir_ / "empty/trajectory.json", trajectory.dump(2) + "\n");
  test::RelistKitFile(dir_ / "empty", "trajectory.json");
  r = Lockstep("audit " + Path("empty"));
  EXPECT_NE(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("trajectory.json: 0 init units"), std::string::npos) << r.output;

  // A symbolic link already inside the destination (of an earlier fetch of this kit: its
  // kit.json there) is never written through.
  fs::create_directories(dir_ / "dest");
  fs::copy_file(dir_ / "kit/kit.json", dir_ / "dest/kit.json");
  fs::create_directory_symlink(dir_ / "elsewhere", dir_ / "dest/data");
  ExpectRefused(Lockstep("kit fetch file://" + Path("kit") + " " + Path("dest") + " --no-progress"),
                "a symbolic link inside the destination");
  EXPECT_FALSE(fs::exists(dir_ / "elsewhere"));

  // A server that accepts and then says nothing (until the client hangs up): the fetch stops
  // after --stall-timeout.
  const std::string server =
      "python3 -c \"import socket\ns=socket.socket()\ns.bind(('127.0.0.1',0))\n"
      "s.listen(1)\nprint(s.getsockname()[1],flush=True)\nc=s.accept()[0]\nwhile c.recv(4096): pass\"";
  std::FILE* pipe = ::popen(server.c_str(), "r");
  ASSERT_NE(pipe, nullptr);
  int port = 0;
  ASSERT_EQ(std::fscanf(pipe, "%d", &port), 1);
  const auto start = std::chrono::steady_clock::now();
  r = Lockstep("kit fetch http://127.0.0.1:" + std::to_string(port) + "/kit " + Path("dest2") +
               " --stall-timeout 2 --no-progress");
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  ExpectRefused(r, "Operation too slow");
  EXPECT_LT(seconds, 30.0);
  ::pclose(pipe);

  // A server that answers, then trickles a byte every half second (2 bytes/s, above the old
  // "nothing at all" stall rule): stopped by the minimum rate within --stall-timeout.
  WriteFileSynced(dir_ / "trickler.py", R"py(
import socket, time
s = socket.socket()
s.bind(('127.0.0.1', 0))
s.listen(1)
print(s.getsockname()[1], flush=True)
c = s.accept()[0]
c.recv(4096)
try:
    c.sendall(b'HTTP/1.1 200 OK\r\nContent-Length: 100000\r\n\r\n')
    while True:
        c.sendall(b'{')
        time.sleep(0.5)
except OSError:
    pass
)py");
  const std::string trickler = "python3 " + Path("trickler.py");
  pipe = ::popen(trickler.c_str(), "r");
  ASSERT_NE(pipe, nullptr);
  ASSERT_EQ(std::fscanf(pipe, "%d", &port), 1);
  const auto trickle_start = std::chrono::steady_clock::now();
  r = Lockstep("kit fetch http://127.0.0.1:" + std::to_string(port) + "/kit " + Path("dest3") +
               " --stall-timeout 2 --no-progress");
  ExpectRefused(r, "Operation too slow");
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - trickle_start).count(),
            30.0);
  ::pclose(pipe);
}

// Links prepared inside DEST never carry a fetch's bytes outside it: a .part that is a hard link
// to a file elsewhere, a kit.json that is a dangling symbolic link. Each is refused by name and
// the file outside is unchanged (or, for the dangling link, never made).
TEST_F(Hostile, AFetchNeverWritesOutsideItsDestination) {
  ASSERT_EQ(Lockstep("kit build --run " + Path("run") + " --data " + Path("data") + " --out " +
                     Path("kit2")).exit_code, 0);
  const std::string precious = "someone else's file\n";
  WriteFileSynced(dir_ / "outside.txt", precious);
  fs::create_directories(dir_ / "hard");
  fs::copy_file(dir_ / "kit2/kit.json", dir_ / "hard/kit.json");  // as an earlier fetch left it
  fs::create_hard_link(dir_ / "outside.txt", dir_ / "hard/trajectory.json.part");
  ExpectRefused(Lockstep("kit fetch file://" + Path("kit2") + " " + Path("hard") +
                         " --no-progress"),
                "has 2 hard links");
  EXPECT_EQ(ReadFileText(dir_ / "outside.txt"), precious);

  fs::create_directories(dir_ / "dangling");
  fs::create_symlink(dir_ / "nowhere.json", dir_ / "dangling/kit.json");
  ExpectRefused(Lockstep("kit fetch file://" + Path("kit2") + " " + Path("dangling") +
                         " --no-progress"),
                "a symbolic link inside the destination");
  EXPECT_FALSE(fs::exists(dir_ / "nowhere.json"));

  // Nothing prepared: the kit arrives whole and verifies.
  const Result r = Lockstep("kit fetch file://" + Path("kit2") + " " + Path("clean") +
                            " --no-progress");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(Lockstep("kit verify " + Path("clean")).exit_code, 0);
}

// A party's command in a bisection that prints without end is cut off, not read into memory.
TEST_F(Hostile, APartyThatAnswersWithoutEndIsCutOff) {
  const std::string zero(64, '0'), a(64, 'a'), b(64, 'b');
  for (const auto& [name, last] : {std::pair{"ca.jsonl", a}, std::pair{"cb.jsonl", b}}) {
    WriteFileSynced(dir_ / name, "{\"step\": 0, \"hash\": \"" + zero + "\"}\n{\"step\": 1000, " +
                                     "\"hash\": \"" + last + "\"}\n");
  }
  ExpectRefused(Lockstep("dispute steps " + Path("ca.jsonl") + " " + Path("cb.jsonl") +
                         " --ask-a yes --ask-b echo"),
                "'yes' printed more than 16 MiB");
}

}  // namespace
}  // namespace lockstep
