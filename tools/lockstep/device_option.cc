// --device for train, replay, audit, dispute and trace: the device (src/device) is the
// OpExecutor; the ops it does not run stay on the CPU kernels.
#include "lockstep/device.h"
#include "tools/lockstep/commands.h"

namespace lockstep::cli {

std::unique_ptr<OpExecutor> MakeExecutor(const std::string& flag, std::string* name) {
  std::unique_ptr<device::Device> device = device::OpenForRun(flag);
  *name = device == nullptr ? "cpu" : device->info().choice.Flag();
  return device;
}

void AddDeviceOption(CLI::App* cmd, std::string* flag) {
  cmd->add_option("--device", *flag,
                  "where the step's ops run: cpu; opencl / opencl:P:D (an OpenCL device); or "
                  "cuda / cuda:N (a CUDA device, through NVIDIA's driver), as `lockstep "
                  "--version` lists them. The ops a device does not run stay on the CPU; nothing "
                  "falls back to the CPU or another runtime (docs/devices.md). The bits are the "
                  "same on every device")
      ->capture_default_str();
}

}  // namespace lockstep::cli
