// lockstep device: the ops of the op table (rk::OpTable) in OpenCL C, for any OpenCL device -- a
// GPU, or PoCL on a CPU in tests -- with the numerics contract's bits (docs/devices.md).
//
// One kernel source (src/device/kernels/*.cl) for every device. Every source starts with
// `#pragma OPENCL FP_CONTRACT OFF` and writes `fma()` wherever the contract has one; programs are
// built with -cl-fp32-correctly-rounded-divide-sqrt and never with mad, fast, unsafe or
// denormal-flushing options; a device whose single-precision config lacks denormals, FMA or
// correctly rounded divide and sqrt is refused, naming the missing bit. Nothing ever falls back
// to the CPU.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "lockstep/kernels.h"

namespace lockstep::device {

// Whether this binary was built with OpenCL (cmake -DLOCKSTEP_WITH_OPENCL=ON, the default).
bool OpenClBuiltIn();

// An OpenCL device as its driver describes it.
struct DeviceInfo {
  int platform = 0, device = 0;  // indices, as in --device opencl:P:D
  std::string platform_name, name, version, c_version, driver;
  uint64_t global_memory = 0;
  uint64_t max_allocation = 0;  // the largest single buffer (CL_DEVICE_MAX_MEM_ALLOC_SIZE)
  uint64_t max_work_group = 0;
  uint64_t local_memory = 0;  // bytes per work-group (CL_DEVICE_LOCAL_MEM_SIZE)
  bool gpu = false;           // CL_DEVICE_TYPE_GPU or _ACCELERATOR: the GEMM tiling is measured
  // The single-precision config bits the contract needs (CL_DEVICE_SINGLE_FP_CONFIG).
  bool denorm = false, fma = false, correctly_rounded_divide_sqrt = false;
  // Whether the device has binary64 as the norm sums need it (cl_khr_fp64, its double config
  // with CL_FP_FMA, CL_FP_DENORM, CL_FP_INF_NAN and CL_FP_ROUND_TO_NEAREST): without it,
  // block_squares runs on the CPU (docs/devices.md, "What runs where").
  bool fp64 = false;
  // Empty when the device meets the contract; else what it lacks, e.g. "CL_FP_DENORM".
  std::string Missing() const;
};

// Every device of every platform; empty when no OpenCL platform is installed (or the binary was
// built without OpenCL). Fails only on a driver error other than "no platform".
std::vector<DeviceInfo> ListDevices();

// --device: "cpu" (nullopt) or "opencl" / "opencl:P:D" (platform P, device D; "opencl" is 0:0).
// Fails naming the text otherwise.
struct DeviceChoice {
  int platform = 0, device = 0;
};
std::optional<DeviceChoice> ParseDeviceFlag(std::string_view text);

// The GEMM's tiling (src/device/kernels/gemm.cl): a work-group computes a tile_m x tile_n block
// of outputs, each work-item reg_m x reg_n of them, through k-slices of k_tile terms held in
// local memory, in two buffers with double_buffer (the next slice read while this one is
// computed) or one. Speed only: every output is the same FMA chain in the contract's chunk order
// whatever the tiling, which the tests check at several. The default suits a CPU device (PoCL);
// on a GPU the executor measures the candidates (GemmCandidates) and takes the fastest.
struct GemmTiling {
  int tile_m = 32, tile_n = 32, reg_m = 2, reg_n = 2, k_tile = 16, double_buffer = 0;
  // E.g. "64x64/4x4/16/db": tile, registers, k-slice, and "/db" when double-buffered.
  std::string Name() const;
};
// The tilings worth measuring on a GPU (256 or 64 work-items, 16 to 64 outputs each, double-
// buffered or not), the default among them.
std::span<const GemmTiling> GemmCandidates();

// An op call's scalar arguments by name, and its tensors where the caller holds them, by role:
// fp32, or uint32 ids (never kept on the device: they are copied in with every op).
using OpArgs = std::map<std::string, double, std::less<>>;
struct TensorIn {
  std::string_view role;
  std::span<const float> f32;
  std::span<const uint32_t> u32 = {};
};
struct TensorOut {
  std::string_view role;
  std::span<float> f32;
  std::span<double> f64 = {};  // the norm's block sums
};
// Bytes copied from the host to the device and back.
struct Traffic {
  uint64_t to_device = 0, to_host = 0;
};

// An OpenCL C source (src/device/kernels/*.cl, embedded in the binary) by file name.
struct KernelSource {
  std::string_view name, text;
};
// An open device that meets the contract, with its programs built.
class Device {
 public:
  virtual ~Device() = default;
  const DeviceInfo& info() const { return info_; }

  // Whether the device runs `op`: every op but global_norm (a sum of the block sums, which the
  // host holds after the ranks share them), and block_squares only on a device with fp64.
  virtual bool Implements(rk::Op op) const = 0;
  // The op of the op table on `in`, on the device: every output, with the bits of spec.run.
  // Copies in and out; for the tests and the selftest.
  virtual void Run(rk::Op op, const rk::OpValues& in, rk::OpValues& out) = 0;
  // The same op on tensors where the caller holds them: an input is read from host memory, or
  // from the device's copy where it lies in a kept region (Keep); an output is written to host
  // memory, or, in a kept region, to the device's copy only (ToHost brings it back). An output
  // whose role is also an input's is that input updated in place, at the same address.
  virtual void Run(rk::Op op, const OpArgs& args, std::span<const TensorIn> inputs,
                   std::span<const TensorOut> outputs) = 0;

  // Host memory the device keeps copies of between ops. Keep: `region` (long-lived host memory)
  // may have device copies, one per tensor an op reads or writes there, made at first use and
  // kept until Forget (call it before the region is freed). The host side keeps them coherent:
  // ToHost before the host reads `data` (the device's newer bytes are copied back), HostWrites
  // before it writes `data` (the device's copies are dropped, bringing back first any bytes
  // outside `data` that only the device holds).
  virtual void Keep(std::span<const float> region) = 0;
  virtual void Forget(std::span<const float> region) = 0;
  virtual void ToHost(std::span<const float> data) = 0;
  virtual void HostWrites(std::span<const float> data) = 0;
  // Bytes copied between the host and the device since the device was opened, and the bytes of
  // the copies it keeps now.
  virtual Traffic traffic() const = 0;
  virtual uint64_t KeptBytes() const = 0;

  // The work-group size of the element- and row-wise kernels (0: the driver's choice), and the
  // GEMM's tiling. Speed only; the tests vary both and demand the same bits.
  virtual void set_work_group(size_t size) = 0;
  virtual void set_gemm_tiling(const GemmTiling& tiling) = 0;
  virtual const GemmTiling& gemm_tiling() const = 0;

  // The programs as the driver built them (PTX text on NVIDIA) as (name, bytes): what
  // scripts/ptx-check.sh inspects.
  virtual std::vector<std::pair<std::string, std::string>> ProgramBinaries() = 0;
  // Whether the device can run `tiling` (work-group size, local memory), and set it; set fails
  // naming the limit a tiling exceeds.
  virtual bool Fits(const GemmTiling& tiling) const = 0;
  // The best wall time, in seconds, of `repeats` GEMMs y = x·wᵀ of n x n by n x n held on the
  // device (kernel time only: no transfers), at the current tiling.
  virtual double TimeGemm(int64_t n, int repeats) = 0;
  // The device's dmath::Exp and dmath::Log of every element of x (src/device/kernels/dmath.cl),
  // for the tests and scripts/dmath-exhaustive.sh.
  virtual void ExpAndLog(std::span<const float> x, std::span<float> exp,
                         std::span<float> log) = 0;

 protected:
  explicit Device(DeviceInfo info) : info_(std::move(info)) {}
  DeviceInfo info_;
};

// Every candidate tiling the device fits, timed by TimeGemm(n, repeats); the device is left at
// the fastest. What `--device` does at start-up on a GPU, and `selftest --time-gemm` reports.
struct GemmTiming {
  GemmTiling tiling;
  double seconds = 0;
};
std::vector<GemmTiming> TuneGemm(Device& device, int64_t n, int repeats);

// Opens device `choice`, refusing (an error naming the device and the missing bit) one that does
// not meet the contract, and building every program with the contract's options.
std::unique_ptr<Device> Open(const DeviceChoice& choice);
// For the mutation test only, which shows that the rules matter: programs built with the pragma
// removed from every source.
struct Mutation {
  bool drop_fp_contract_pragma = false;
};
std::unique_ptr<Device> OpenMutated(const DeviceChoice& choice, const Mutation& mutation);

// The build options every program gets, and those it must never get (docs/devices.md).
std::string_view BuildOptions();
std::span<const std::string_view> ForbiddenBuildOptions();

// The OpenCL C sources, by file name.
std::span<const KernelSource> KernelSources();

// The name CL/cl.h (OpenCL 3.0) gives an error code ("CL_OUT_OF_RESOURCES"), or the number where
// it names none. Every error of a driver call carries it.
std::string OpenClErrorName(int code);

// A device that ran out of memory (a buffer, or the driver's resources for a kernel): the message
// names the device, the driver's code and call, and what to change; the caller may add its plan.
class OutOfMemory : public Error {
 public:
  using Error::Error;
};

}  // namespace lockstep::device
