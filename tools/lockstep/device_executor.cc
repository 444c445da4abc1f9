// --device for train, replay, audit and trace: an OpExecutor that runs on an OpenCL device every
// op of the op table the device runs (docs/devices.md), keeping there the tensors of the host
// regions it is told to keep (the state in RAM, the activations), and leaves the other ops to the
// CPU kernels.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "lockstep/device.h"
#include "lockstep/model.h"
#include "tools/lockstep/commands.h"

namespace lockstep::cli {
namespace {

class DeviceExecutor final : public OpExecutor {
 public:
  DeviceExecutor(std::unique_ptr<device::Device> device, std::string name)
      : device_(std::move(device)), name_(std::move(name)) {}

  bool Run(rk::Op op, std::span<const OpArg> args, std::span<const OpTensor> inputs,
           std::span<const OpOutput> outputs) override {
    if (!device_->Implements(op)) return false;
    device::OpArgs values;
    for (const OpArg& a : args) values[std::string(a.name)] = a.value;
    std::vector<device::TensorIn> in;
    for (const OpTensor& t : inputs) in.push_back({t.role, t.f32, t.u32});
    std::vector<device::TensorOut> out;
    for (const OpOutput& o : outputs) out.push_back({o.role, o.f32, o.f64});
    WithPlan([&] { device_->Run(op, values, in, out); });
    return true;
  }
  void Keep(std::span<const float> region) override { device_->Keep(region); }
  void Forget(std::span<const float> region) override { device_->Forget(region); }
  void ToHost(std::span<const float> data) override {
    WithPlan([&] { device_->ToHost(data); });
  }
  void HostWrites(std::span<const float> data) override {
    WithPlan([&] { device_->HostWrites(data); });
  }

  void Plan(uint64_t bytes, uint64_t largest, std::string_view detail) override {
    const device::DeviceInfo& info = device_->info();
    const auto gib = [](uint64_t b) { return static_cast<double>(b) / (1 << 30); };
    if (bytes > info.global_memory) {
      Fail("--device {} ({}): this run needs {:.2f} GiB on the device ({}), the device has "
           "{:.2f} GiB (docs/devices.md, \"Memory\")",
           name_, info.name, gib(bytes), detail, gib(info.global_memory));
    }
    if (largest > info.max_allocation) {
      Fail("--device {} ({}): this run's largest tensor on the device is {:.2f} GiB, the device "
           "allocates at most {:.2f} GiB at once (CL_DEVICE_MAX_MEM_ALLOC_SIZE; docs/devices.md)",
           name_, info.name, gib(largest), gib(info.max_allocation));
    }
    fmt::print(stderr, "device memory on {}: {:.2f} GiB of {:.2f} GiB ({})\n", name_, gib(bytes),
               gib(info.global_memory), detail);
    planned_ = bytes;
  }
  Traffic traffic() const override {
    const device::Traffic t = device_->traffic();
    return {t.to_device, t.to_host, device_->KeptBytes()};
  }

 private:
  // Runs `call`; the device running out of memory (src/device/opencl.cc) is told with what this
  // run planned to hold there, the device's message kept.
  template <typename Call>
  void WithPlan(const Call& call) {
    try {
      call();
    } catch (const device::OutOfMemory& e) {
      if (planned_ == 0) throw;
      Fail("{} (this run planned {:.2f} GiB on it: docs/devices.md, \"Memory\")", e.what(),
           static_cast<double>(planned_) / (1 << 30));
    }
  }

  std::unique_ptr<device::Device> device_;
  std::string name_;
  uint64_t planned_ = 0;  // bytes, by Plan
};

}  // namespace

std::unique_ptr<OpExecutor> MakeExecutor(const std::string& flag, std::string* name) {
  const std::optional<device::DeviceChoice> choice = device::ParseDeviceFlag(flag);
  if (!choice) {
    *name = "cpu";
    return nullptr;
  }
  std::unique_ptr<device::Device> device = device::Open(*choice);
  int ops = 0;
  for (const rk::OpSpec& spec : rk::OpTable()) ops += device->Implements(spec.op) ? 1 : 0;
  *name = fmt::format("opencl:{}:{}", choice->platform, choice->device);
  fmt::print(stderr,
             "ops on {} ({}): {} of the step's {} ops, the state and the activations kept on the "
             "device; the rest on the CPU (docs/devices.md)\n",
             *name, device->info().name, ops, rk::OpTable().size());
  if (device->info().gpu) {  // seconds: each candidate built once and timed
    constexpr int64_t kTuneN = 2048;
    const std::vector<device::GemmTiming> timings = device::TuneGemm(*device, kTuneN, 2);
    fmt::print(stderr, "GEMM tiling on {}: {}, the fastest of {} at {}³ ({:.2f} TFLOP/s)\n",
               *name, device->gemm_tiling().Name(), timings.size(), kTuneN,
               2.0 * std::pow(double(kTuneN), 3) /
                   std::ranges::min(timings, {}, &device::GemmTiming::seconds).seconds * 1e-12);
  }
  return std::make_unique<DeviceExecutor>(std::move(device), *name);
}

void AddDeviceOption(CLI::App* cmd, std::string* flag) {
  cmd->add_option("--device", *flag,
                  "where the step's ops run: cpu, or opencl / opencl:P:D (an OpenCL device as "
                  "`lockstep --version` lists them; the ops it does not run stay on the CPU; "
                  "docs/devices.md). The bits are the same on every device")
      ->capture_default_str();
}

}  // namespace lockstep::cli
