// Training, resuming and auditing with the step's ops on an OpenCL device (PoCL in CI;
// docs/devices.md): the device's run is the golden chain, a run moves between the CPU and the
// device at a resume without a bit changing, and a CPU run's kit audits on the device.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>

#include "common/run_lockstep.h"
#include "lockstep/core.h"

namespace lockstep {
namespace {
namespace fs = std::filesystem;
using test::Lockstep;
using test::Result;

class OnDevice : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = fs::temp_directory_path() / ("lockstep_device_" + std::to_string(::getpid()));
    fs::remove_all(dir_);
    const Result r = Lockstep("data synth --out " + Path("data") + " --seed 7 --tokens 200000");
    ASSERT_EQ(r.exit_code, 0) << r.output;
  }
  static void TearDownTestSuite() { fs::remove_all(dir_); }
  static std::string Path(const std::string& name) { return (dir_ / name).string(); }
  static Result Train(const std::string& run, const std::string& flags,
                      const std::string& config = "tiny") {
    return Lockstep("train --config " + config + " --data " + Path("data") + " --out " + Path(run) +
                    " --threads 2 --no-progress " + flags);
  }
  static std::string Golden(const std::string& fixture = "tiny_chain.jsonl") {
    return ReadFileText(fs::path(LOCKSTEP_SOURCE_DIR) / "tests/fixtures" / fixture);
  }
  static fs::path dir_;
};
fs::path OnDevice::dir_;

TEST_F(OnDevice, TinyTrainedOnTheDeviceIsTheGoldenChain) {
  const Result r = Train("device", "--steps 20 --device opencl");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("ops on opencl:0:0"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("device copies per step:"), std::string::npos) << r.output;
  EXPECT_EQ(ReadFileText(dir_ / "device/state_hashes.jsonl"), Golden());
}

// The int8 ops (tiny-int8: int8 linears and the int8 backward) run on the device too, and give
// the pinned int8 chain.
TEST_F(OnDevice, TinyInt8TrainedOnTheDeviceIsItsGoldenChain) {
  const Result r = Train("device-int8", "--steps 20 --device opencl", "tiny-int8");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("30 of the op table's 31 ops run there; on the CPU: global_norm "),
            std::string::npos)
      << r.output;
  EXPECT_EQ(ReadFileText(dir_ / "device-int8/state_hashes.jsonl"), Golden("tiny_int8_chain.jsonl"));
}

// bf16 storage (tiny-bf16: the rounding op after every activation, gradient and compute copy)
// gives the pinned bf16 chain on the device.
TEST_F(OnDevice, TinyBf16TrainedOnTheDeviceIsItsGoldenChain) {
  const Result r = Train("device-bf16", "--steps 20 --device opencl", "tiny-bf16");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(ReadFileText(dir_ / "device-bf16/state_hashes.jsonl"), Golden("tiny_bf16_chain.jsonl"));
}

// tiny-dp's 8 microbatch groups: the group gradients are kept on the device too and added into
// the state's there, group after group.
TEST_F(OnDevice, MicrobatchGroupsOnTheDeviceGiveTheCpusChain) {
  const auto train = [](const std::string& run, const std::string& flags) {
    return Lockstep("train --config tiny-dp --data " + Path("data") + " --out " + Path(run) +
                    " --threads 2 --no-progress --steps 3 " + flags);
  };
  Result r = train("dp-cpu", "");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  r = train("dp-device", "--device opencl");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(ReadFileText(dir_ / "dp-device/state_hashes.jsonl"),
            ReadFileText(dir_ / "dp-cpu/state_hashes.jsonl"));
}

// open-1b keeps about 37 GiB on a device: PoCL's few GiB refuse it, naming both sizes, before
// anything is allocated or written.
TEST_F(OnDevice, ARunLargerThanTheDeviceIsRefusedBeforeItStarts) {
  const Result r = Lockstep("train --config open-1b --data " + Path("data") + " --out " +
                            Path("too-big") + " --no-progress --device opencl");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("GiB on the device (state "), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("the device has"), std::string::npos) << r.output;
  EXPECT_FALSE(fs::exists(dir_ / "too-big"));
}

TEST_F(OnDevice, AResumeMovesBetweenTheCpuAndTheDeviceBitExactly) {
  Result r = Train("moved", "--steps 10");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  r = Train("moved", "--steps 15 --resume --device opencl");  // CPU -> device
  ASSERT_EQ(r.exit_code, 0) << r.output;
  r = Train("moved", "--steps 20 --resume");  // device -> CPU, from the device's checkpoint 15
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(ReadFileText(dir_ / "moved/state_hashes.jsonl"), Golden());
}

TEST_F(OnDevice, ACpuRunsKitAuditsOnTheDevice) {
  Result r = Train("cpu", "--steps 20");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  r = Lockstep("kit build --run " + Path("cpu") + " --data " + Path("data") + " --out " +
               Path("kit"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  r = Lockstep("audit " + Path("kit") + " --threads 2 --device opencl --json-out " +
               Path("audit.json"));
  EXPECT_EQ(r.exit_code, 0) << r.output;
  const nlohmann::json audit = nlohmann::json::parse(ReadFileText(dir_ / "audit.json"));
  int intervals = 0;
  for (const auto& unit : audit) {
    EXPECT_EQ(unit["verdict"], "MATCH") << unit.dump();
    if (unit["replay"]["device"].get<std::string>().starts_with("opencl:0:0 with cpu:")) {
      ++intervals;
    }
  }
  EXPECT_GE(intervals, 2) << audit.dump(2);
  // A device that does not exist is refused, naming what there is; nothing falls back.
  r = Lockstep("audit " + Path("kit") + " --device opencl:7:0");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("--device opencl:7:0: there are"), std::string::npos) << r.output;
}

// Every op of a step traced on the device has the CPU's input and output digests: the two traces
// have one Merkle root.
TEST_F(OnDevice, AStepTracedOnTheDeviceIsTheCpusTrace) {
  Result r = Train("traced", "--steps 0");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  std::string roots[2];
  for (const bool device : {false, true}) {
    const std::string out = device ? "trace_device" : "trace_cpu";
    r = Lockstep("trace --checkpoint " + Path("traced") + "/checkpoints/step_000000000 --data " +
                 Path("data") + " --step 2 --out " + Path(out) + " --no-progress" +
                 (device ? " --device opencl" : ""));
    ASSERT_EQ(r.exit_code, 0) << r.output;
    roots[device] = nlohmann::json::parse(ReadFileText(dir_ / out / "trace.json"))["merkle_root"];
  }
  EXPECT_EQ(roots[0], roots[1]);
  r = Lockstep("dispute ops " + Path("trace_cpu") + " " + Path("trace_device"));
  EXPECT_EQ(r.exit_code, 0) << r.output;
}

}  // namespace
}  // namespace lockstep
