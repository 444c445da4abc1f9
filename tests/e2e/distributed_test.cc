// Data-parallel training under mpirun (docs/distributed.md): the chain and the checkpoints do
// not depend on the number of processes, resume works at another world size, an auditor replays
// an N-rank run in one process, and a dead, hung or divergent rank stops the run with an error.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "common/run_lockstep.h"
#include "lockstep/core.h"
#include "lockstep/train.h"

namespace lockstep {
namespace {
namespace fs = std::filesystem;

using test::Lockstep;
using test::Result;

// `mpirun` with the flags this 2-core, root-run machine needs (more ranks than cores).
const std::string kMpirun = "mpirun --oversubscribe --allow-run-as-root";

Result Mpi(int ranks, const std::string& args) {
  return test::Shell(kMpirun + " -np " + std::to_string(ranks) + " " +
                     LOCKSTEP_BINARY + " " + args);
}

class Distributed : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    dir_ = fs::temp_directory_path() /
           (std::string("lockstep_dp_") + info->name() + "_" + std::to_string(::getpid()));
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    const Result r = Lockstep("data synth --out " + Data() + " --seed 7 --tokens 200000");
    ASSERT_EQ(r.exit_code, 0) << r.output;
  }
  void TearDown() override {
    if (!HasFailure()) fs::remove_all(dir_);
  }

  std::string Data() const { return (dir_ / "data").string(); }
  std::string Run(const std::string& name) const { return (dir_ / name).string(); }
  // tiny-dp: 8 microbatches in 8 gradient groups (world sizes 1, 2, 4, 8), 20 steps,
  // checkpoints every 5.
  std::string TrainArgs(const std::string& run, const std::string& extra) const {
    return "train --config tiny-dp --data " + Data() + " --out " + Run(run) + " --no-progress " +
           extra;
  }
  std::string Text(const std::string& path) const { return ReadFileText(dir_ / path); }

  void ExpectSameCheckpoints(const std::string& a, const std::string& b) {
    size_t compared = 0;
    for (const auto& step : fs::directory_iterator(dir_ / a / "checkpoints")) {
      const fs::path other = dir_ / b / "checkpoints" / step.path().filename();
      ASSERT_TRUE(fs::exists(other)) << other;
      for (const auto& file : fs::directory_iterator(step.path())) {
        EXPECT_EQ(ReadFileBytes(file.path()), ReadFileBytes(other / file.path().filename()))
            << b << ": " << step.path().filename() << "/" << file.path().filename();
        ++compared;
      }
    }
    EXPECT_GE(compared, 5u);
  }

  // Builds the run's kit and audits every unit in one process: each of `units` a MATCH.
  void ExpectKitAuditsMatch(const std::string& run, size_t units) {
    Result r = Lockstep("kit build --run " + Run(run) + " --data " + Data() + " --out " +
                        Run(run + "-kit"));
    ASSERT_EQ(r.exit_code, 0) << r.output;
    r = Lockstep("audit " + Run(run + "-kit") + " --all --threads 2");
    EXPECT_EQ(r.exit_code, 0) << r.output;
    size_t matches = 0;
    for (size_t at = r.output.find("\"verdict\": \"MATCH\""); at != std::string::npos;
         at = r.output.find("\"verdict\": \"MATCH\"", at + 1)) {
      ++matches;
    }
    EXPECT_EQ(matches, units) << r.output;
    EXPECT_EQ(r.output.find("MISMATCH"), std::string::npos) << r.output;
  }

  // tiny-dp with `keys` added to its model (as config `name`): 1, 2 and 4 processes commit the same
  // chain and checkpoints, and the run's kit audits MATCH in one process.
  void ExpectSameAtOneTwoAndFourProcessesAndKitAuditsMatch(const std::string& name,
                                                           const std::string& keys) {
    std::string yaml = ReadFileText(fs::path(LOCKSTEP_SOURCE_DIR) / "configs/tiny-dp.yaml");
    const size_t at = yaml.find("train:\n");
    ASSERT_NE(at, std::string::npos);
    yaml.insert(at, keys);
    yaml.replace(yaml.find("name: tiny-dp"), 13, "name: " + name);
    const fs::path config = dir_ / (name + ".yaml");
    WriteFileSynced(config, yaml);
    const auto args = [&](const std::string& run) {
      return "train --config " + config.string() + " --data " + Data() + " --out " + Run(run) +
             " --no-progress --steps 10 --threads 1";
    };
    ASSERT_EQ(Lockstep(args(name + "-n1")).exit_code, 0);
    const Result two = Mpi(2, args(name + "-n2"));
    ASSERT_EQ(two.exit_code, 0) << two.output;
    const Result four = Mpi(4, args(name + "-n4"));
    ASSERT_EQ(four.exit_code, 0) << four.output;
    const std::string chain = Text(name + "-n1/state_hashes.jsonl");
    EXPECT_EQ(std::count(chain.begin(), chain.end(), '\n'), 11);  // steps 0..10
    EXPECT_EQ(chain, Text(name + "-n2/state_hashes.jsonl"));
    EXPECT_EQ(chain, Text(name + "-n4/state_hashes.jsonl"));
    ExpectSameCheckpoints(name + "-n1", name + "-n2");
    ExpectSameCheckpoints(name + "-n1", name + "-n4");
    ExpectKitAuditsMatch(name + "-n4", 3);  // the init and the intervals 0-5 and 5-10
  }

  fs::path dir_;
};

TEST_F(Distributed, OneTwoAndFourProcessesCommitTheSameChainAndCheckpoints) {
  const Result one = Lockstep(TrainArgs("n1", "--threads 2"));
  ASSERT_EQ(one.exit_code, 0) << one.output;
  const Result two = Mpi(2, TrainArgs("n2", "--threads 1"));
  ASSERT_EQ(two.exit_code, 0) << two.output;
  const Result four = Mpi(4, TrainArgs("n4", "--threads 2"));
  ASSERT_EQ(four.exit_code, 0) << four.output;
  EXPECT_NE(four.output.find("training with 4 processes"), std::string::npos) << four.output;
  const std::string chain = Text("n1/state_hashes.jsonl");
  EXPECT_EQ(std::count(chain.begin(), chain.end(), '\n'), 21);  // steps 0..20
  EXPECT_EQ(chain, Text("n2/state_hashes.jsonl"));
  EXPECT_EQ(chain, Text("n4/state_hashes.jsonl"));
  EXPECT_EQ(Text("n1/metrics.jsonl").find("\"skipped\":true"), std::string::npos);
  ExpectSameCheckpoints("n1", "n2");
  ExpectSameCheckpoints("n1", "n4");

  // Every step reports its exchanges: none in one process; with several, the part hidden behind
  // the compute (the next layer's parameters gathered while this one computes) is within the
  // exchanges' time, and over the run more than nothing.
  for (const train::MetricsLine& m : train::ReadMetrics(dir_ / "n1/metrics.jsonl")) {
    EXPECT_EQ(m.comm_seconds, 0.0) << m.step;
    EXPECT_EQ(m.comm_hidden_seconds, 0.0) << m.step;
    EXPECT_EQ(m.comm_bytes, 0u) << m.step;
  }
  // The backward digests, gathered from every rank in microbatch order, are one process's.
  const std::vector<train::MetricsLine> single = train::ReadMetrics(dir_ / "n1/metrics.jsonl");
  for (const char* run : {"n2", "n4"}) {
    const std::vector<train::MetricsLine> many = train::ReadMetrics(dir_ / run / "metrics.jsonl");
    ASSERT_EQ(many.size(), single.size()) << run;
    for (size_t i = 0; i < single.size(); ++i) {
      ASSERT_TRUE(single[i].backward_blake2b.has_value());
      EXPECT_EQ(many[i].backward_blake2b, single[i].backward_blake2b) << run << " step " << i + 1;
    }
  }
  for (const char* run : {"n2", "n4"}) {
    double hidden = 0;
    for (const train::MetricsLine& m : train::ReadMetrics(dir_ / run / "metrics.jsonl")) {
      EXPECT_GT(m.comm_seconds, 0.0) << run << " step " << m.step;
      EXPECT_GT(m.comm_bytes, 0u) << run << " step " << m.step;
      EXPECT_GE(m.comm_hidden_seconds, 0.0) << run << " step " << m.step;
      EXPECT_LE(m.comm_hidden_seconds, m.comm_seconds) << run << " step " << m.step;
      hidden += m.comm_hidden_seconds;
    }
    EXPECT_GT(hidden, 0.0) << run;
  }
}

// An int8 model (int8 linears and the int8 backward).
TEST_F(Distributed, AnInt8RunIsTheSameAtOneTwoAndFourProcessesAndItsKitAuditsMatch) {
  ExpectSameAtOneTwoAndFourProcessesAndKitAuditsMatch("tiny-dp-int8",
                                                      "  linear: int8\n  int8_backward: true\n");
}

// OPEN's whole recipe: int8 linears and backward, bf16 activations and compute weights.
TEST_F(Distributed, AnInt8Bf16RunIsTheSameAtOneTwoAndFourProcessesAndItsKitAuditsMatch) {
  ExpectSameAtOneTwoAndFourProcessesAndKitAuditsMatch(
      "tiny-dp-open",
      "  linear: int8\n  int8_backward: true\n  activations: bf16\n  compute_weights: bf16\n");
}

// Ranks that disagree on what they run are refused at start, every rank naming the rank and the
// field; a refusal only rank 0 can make (its run directory) stops every rank at once, not at
// --comm-timeout.
TEST_F(Distributed, RanksThatDisagreeAreRefusedAndRankZerosRefusalStopsEveryRank) {
  ASSERT_EQ(Lockstep("data synth --out " + Run("other") + " --seed 8 --tokens 200000").exit_code, 0);
  const std::string binary = std::string(" ") + LOCKSTEP_BINARY + " ";
  const auto two = [&](const std::string& rank0, const std::string& rank1) {
    const auto start = std::chrono::steady_clock::now();
    const Result r = test::Shell(kMpirun + " -np 1" + binary + rank0 + " : -np 1" + binary + rank1);
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    return std::pair{r, seconds};
  };
  const auto args = [&](const std::string& data, int steps) {
    return "train --config tiny-dp --out " + Run("agree") +
           " --no-progress --comm-timeout 100 --steps " + std::to_string(steps) + " --data " + data;
  };
  // Another dataset on rank 1.
  auto [r, seconds] = two(args(Data(), 2), args(Run("other"), 2));
  EXPECT_NE(r.exit_code, 0) << r.output;
  EXPECT_LT(seconds, 30) << r.output;
  for (const char* rank : {"rank 0 of 2", "rank 1 of 2"}) {
    EXPECT_NE(r.output.find(std::string(rank) + ": rank 1 was started with another run descriptor "
                                                "(config and data manifest) than rank 0"),
              std::string::npos)
        << r.output;
  }
  // Another --steps on rank 1.
  std::tie(r, seconds) = two(args(Data(), 2), args(Data(), 3));
  EXPECT_NE(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("rank 1 was started with another --steps than rank 0"), std::string::npos)
      << r.output;
  // Another --device, and --sign-key on one rank only: refused before anything is planned.
  std::tie(r, seconds) = two(args(Data(), 2), args(Data(), 2) + " --device opencl");
  EXPECT_NE(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("rank 1 was started with another --device than rank 0"),
            std::string::npos)
      << r.output;
  ASSERT_EQ(Lockstep("keygen --out " + Run("agree-key")).exit_code, 0);
  std::tie(r, seconds) = two(args(Data(), 2), args(Data(), 2) + " --sign-key " + Run("agree-key"));
  EXPECT_NE(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("rank 1 was started with another --sign-key than rank 0"),
            std::string::npos)
      << r.output;
  EXPECT_FALSE(fs::exists(Run("agree") + "/state_hashes.jsonl")) << "a refused job wrote its run";
  // The run directory holds a run and --resume is missing: rank 0 alone can see it.
  ASSERT_EQ(Mpi(2, args(Data(), 2)).exit_code, 0);
  std::tie(r, seconds) = two(args(Data(), 2), args(Data(), 2));
  EXPECT_NE(r.exit_code, 0) << r.output;
  EXPECT_LT(seconds, 30) << "the ranks waited for the timeout: " << r.output;
  EXPECT_NE(r.output.find("rank 0 of 2: " + Run("agree") + " already holds a run"),
            std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("rank 1 of 2: stopped with rank 0, which refused: " + Run("agree") +
                          " already holds a run"),
            std::string::npos)
      << r.output;
}

// Two ranks, each running the step's ops on an OpenCL device (PoCL), commit the chain of one
// process on the CPU (docs/devices.md).
TEST_F(Distributed, TwoRanksOnTheDeviceCommitTheCpusChain) {
  const Result one = Lockstep(TrainArgs("cpu", "--threads 2 --steps 6"));
  ASSERT_EQ(one.exit_code, 0) << one.output;
  const Result two = Mpi(2, TrainArgs("device", "--threads 1 --steps 6 --device opencl"));
  ASSERT_EQ(two.exit_code, 0) << two.output;
  EXPECT_NE(two.output.find("ops on opencl:0:0"), std::string::npos) << two.output;
  EXPECT_EQ(Text("cpu/state_hashes.jsonl"), Text("device/state_hashes.jsonl"));
}

// Spilled ranks (--spill-dir with N > 1): each rank keeps its state in files of its own under
// DIR/rank-R, holding whole spill chunks; 2 ranks, then 4 at a resume, commit the chain and the
// checkpoints of one process in RAM, and leave nothing behind.
TEST_F(Distributed, SpilledRanksCommitTheChainOfOneProcessInRam) {
  const Result one = Lockstep(TrainArgs("ram", "--threads 2 --steps 10"));
  ASSERT_EQ(one.exit_code, 0) << one.output;
  const std::string spill = " --spill-dir " + Run("spill");
  Result r = Mpi(2, TrainArgs("spilled", "--threads 1 --steps 6" + spill));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  r = Mpi(4, TrainArgs("spilled", "--threads 1 --steps 10 --resume" + spill));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(Text("ram/state_hashes.jsonl"), Text("spilled/state_hashes.jsonl"));
  ExpectSameCheckpoints("ram", "spilled");
  EXPECT_FALSE(fs::exists(dir_ / "spill" / "rank-0"));
  EXPECT_FALSE(fs::exists(dir_ / "spill" / "rank-3"));
}

TEST_F(Distributed, AWorldSizeTheGroupsCannotServeIsRefusedWithTheSizesThatWork) {
  const Result three = Mpi(3, TrainArgs("n3", ""));
  EXPECT_NE(three.exit_code, 0) << three.output;
  EXPECT_NE(three.output.find("3 processes cannot train config 'tiny-dp'"), std::string::npos)
      << three.output;
  EXPECT_NE(three.output.find("world sizes that work: 1, 2, 4, 8"), std::string::npos)
      << three.output;
  EXPECT_FALSE(fs::exists(dir_ / "n3" / "state_hashes.jsonl"));
}

// tiny-dp's groups are single microbatches: its runs of 2 and 4 ranks are fully sharded. A run
// moves from 4 sharded ranks to 2 (recomputing the activations), to one process and back to 2.
TEST_F(Distributed, AFourProcessRunResumesWithTwoAndWithOne) {
  ASSERT_EQ(Lockstep(TrainArgs("straight", "")).exit_code, 0);
  Result r = Mpi(4, TrainArgs("moved", "--steps 10"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("fully sharded"), std::string::npos) << r.output;
  r = Mpi(2, TrainArgs("moved", "--steps 15 --resume --recompute-activations"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("step_000000010"), std::string::npos) << r.output;
  r = Lockstep(TrainArgs("moved", "--steps 17 --resume --threads 2"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  r = Mpi(2, TrainArgs("moved", "--resume"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(Text("straight/state_hashes.jsonl"), Text("moved/state_hashes.jsonl"));
  ExpectSameCheckpoints("straight", "moved");
}

TEST_F(Distributed, EveryUnitOfAFourProcessRunsKitReplaysInOneProcess) {
  Result r = Mpi(4, TrainArgs("n4", "--steps 10"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  ExpectKitAuditsMatch("n4", 3);  // the init and the intervals 0-5 and 5-10
}

// The pids of mpirun's children (the ranks).
std::vector<pid_t> ChildrenOf(pid_t parent) {
  std::vector<pid_t> children;
  for (const auto& entry : fs::directory_iterator("/proc")) {
    const std::string name = entry.path().filename().string();
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    std::ifstream stat(entry.path() / "stat");
    std::string pid, comm, state;
    pid_t ppid = 0;
    if (stat >> pid >> comm >> state >> ppid && ppid == parent && comm == "(lockstep)") {
      children.push_back(static_cast<pid_t>(std::stol(pid)));
    }
  }
  return children;
}

struct Outcome {
  int status = 0;
  double seconds = 0;  // from the fault to mpirun's exit
  std::string output;
};

// Starts `mpirun -np 2 lockstep train ...` (output to a file), waits for checkpoint step 5,
// sends `signal` to one rank, and waits (at most 120 s) for mpirun to end.
Outcome FaultOneRank(const fs::path& dir, const std::string& train_args, int signal) {
  const fs::path log = dir / "mpirun.log";
  const pid_t pid = ::fork();
  if (pid == 0) {
    const std::string command = "exec " + kMpirun + " -np 2 " + LOCKSTEP_BINARY + " " +
                                train_args + " > " + log.string() + " 2>&1";
    ::execl("/bin/sh", "sh", "-c", command.c_str(), nullptr);
    ::_exit(127);
  }
  Outcome outcome;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);
  while (!fs::exists(dir / "faulty/checkpoints/step_000000005/COMPLETE") &&
         std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  std::vector<pid_t> ranks = ChildrenOf(pid);
  if (ranks.size() != 2) {
    ::kill(pid, SIGKILL);
    ::waitpid(pid, &outcome.status, 0);
    outcome.output = "expected 2 ranks under mpirun, found " + std::to_string(ranks.size());
    return outcome;
  }
  ::kill(ranks[1], signal);
  const auto fault = std::chrono::steady_clock::now();
  while (::waitpid(pid, &outcome.status, WNOHANG) == 0) {
    if (std::chrono::steady_clock::now() > fault + std::chrono::seconds(120)) {
      ::kill(pid, SIGKILL);
      for (pid_t rank : ranks) ::kill(rank, SIGKILL);
      ::waitpid(pid, &outcome.status, 0);
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  outcome.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - fault).count();
  for (pid_t rank : ranks) ::kill(rank, SIGKILL);  // a stopped rank mpirun left behind
  outcome.output = ReadFileText(log);
  return outcome;
}

TEST_F(Distributed, AKilledRankStopsTheOthersAndTheRunResumesBitExactly) {
  ASSERT_EQ(Lockstep(TrainArgs("straight", "")).exit_code, 0);
  const Outcome killed = FaultOneRank(dir_, TrainArgs("faulty", ""), SIGKILL);
  ASSERT_TRUE(WIFEXITED(killed.status)) << killed.output;
  EXPECT_NE(WEXITSTATUS(killed.status), 0) << killed.output;
  EXPECT_LT(killed.seconds, 60.0) << killed.output;
  const std::string cut = Text("faulty/state_hashes.jsonl");
  ASSERT_LT(std::count(cut.begin(), cut.end(), '\n'), 21) << "the run ended before the kill";
  // Whatever the ranks were doing, the newest complete checkpoint continues the straight run.
  const Result r = Mpi(2, TrainArgs("faulty", "--resume"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(Text("straight/state_hashes.jsonl"), Text("faulty/state_hashes.jsonl"));
  ExpectSameCheckpoints("straight", "faulty");
}

TEST_F(Distributed, AHungRankStopsTheRunWithinTheTimeout) {
  const Outcome hung = FaultOneRank(dir_, TrainArgs("faulty", "--comm-timeout 5"), SIGSTOP);
  ASSERT_TRUE(WIFEXITED(hung.status)) << hung.output;
  EXPECT_NE(WEXITSTATUS(hung.status), 0) << hung.output;
  EXPECT_LT(hung.seconds, 60.0) << hung.output;
  EXPECT_GT(hung.seconds, 4.0) << "stopped before --comm-timeout 5 ran out: " << hung.output;
  // Rank 0 names the rank it waited for, and its host.
  EXPECT_NE(hung.output.find("rank 0 of 2 ("), std::string::npos) << hung.output;
  EXPECT_NE(hung.output.find("for rank 1 ("), std::string::npos) << hung.output;
  EXPECT_NE(hung.output.find("it died or hangs, or the network to it is down"), std::string::npos)
      << hung.output;
}

// In both layouts: a copy gathered in a fully sharded forward, and a replica broadcast after the
// update (spilled ranks keep every parameter on every rank).
TEST_F(Distributed, ADivergentReplicaIsNamedWithItsRankStepAndTensor) {
  for (const std::string& layout : {std::string(), " --spill-dir " + Run("spill")}) {
    SCOPED_TRACE(layout);
    fs::remove_all(dir_ / "faulty");
    const Result r = Mpi(2, TrainArgs("faulty", "--test-corrupt-replica 1:3" + layout));
    EXPECT_NE(r.exit_code, 0) << r.output;
    // Both ranks stop, each naming the divergent rank, the step and the tensor.
    for (const char* rank : {"rank 0 of 2", "rank 1 of 2"}) {
      EXPECT_NE(r.output.find(std::string(rank) + ": step 3: rank 1's copy of elements ["),
                std::string::npos)
          << r.output;
    }
    EXPECT_NE(r.output.find("of parameter tensor 'tok_embeddings.weight' does not hash to"),
              std::string::npos)
        << r.output;
    EXPECT_NE(r.output.find("the replicas diverged"), std::string::npos) << r.output;
    // Nothing past the last good step was committed.
    const std::string chain = Text("faulty/state_hashes.jsonl");
    EXPECT_EQ(std::count(chain.begin(), chain.end(), '\n'), 3);  // steps 0, 1, 2
  }
}

}  // namespace
}  // namespace lockstep
