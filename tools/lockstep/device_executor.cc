// --device for train and replay: an OpExecutor that runs on an OpenCL device every op of the op
// table the device runs (docs/devices.md), each op's inputs copied to the device and its outputs
// back, and leaves the others to the CPU kernels.
#include <fmt/format.h>

#include <cstring>

#include "lockstep/device.h"
#include "lockstep/model.h"
#include "tools/lockstep/commands.h"

namespace lockstep::cli {
namespace {

class DeviceExecutor final : public OpExecutor {
 public:
  explicit DeviceExecutor(std::unique_ptr<device::Device> device) : device_(std::move(device)) {}

  bool Run(rk::Op op, std::span<const OpArg> args, std::span<const OpTensor> inputs,
           std::span<const OpOutput> outputs) override {
    if (!device_->Implements(op)) return false;
    rk::OpValues in, out;
    for (const OpArg& a : args) in.args[std::string(a.name)] = a.value;
    for (const OpTensor& t : inputs) {
      const std::string role(t.role);
      if (!t.u32.empty()) {
        in.u32[role].assign(t.u32.begin(), t.u32.end());
      } else if (!t.f64.empty()) {
        in.f64[role].assign(t.f64.begin(), t.f64.end());
      } else {
        in.f32[role].assign(t.f32.begin(), t.f32.end());
      }
    }
    device_->Run(op, in, out);
    for (const OpOutput& o : outputs) {
      const auto it = out.f32.find(o.role);
      if (it == out.f32.end() || it->second.size() != o.f32.size() || !o.f64.empty()) {
        Fail("internal error: the device's {} gave no {} of {} floats", rk::Spec(op).name,
             o.role, o.f32.size());
      }
      std::memcpy(o.f32.data(), it->second.data(), o.f32.size_bytes());
    }
    return true;
  }

 private:
  std::unique_ptr<device::Device> device_;
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
             "ops on {} ({}): {} of the step's {} ops, each op's tensors copied in and out; the "
             "rest on the CPU (docs/devices.md)\n",
             *name, device->info().name, ops, rk::OpTable().size());
  return std::make_unique<DeviceExecutor>(std::move(device));
}

void AddDeviceOption(CLI::App* cmd, std::string* flag) {
  cmd->add_option("--device", *flag,
                  "where the step's ops run: cpu, or opencl / opencl:P:D (an OpenCL device as "
                  "`lockstep --version` lists them; the ops it does not run stay on the CPU; "
                  "docs/devices.md). The bits are the same on every device")
      ->capture_default_str();
}

}  // namespace lockstep::cli
