// lockstep device: the ops of the op table (rk::OpTable) in OpenCL C, run on a GPU -- through
// an OpenCL driver, or through CUDA's driver API on the PTX the build makes of the same sources --
// or on PoCL's CPU device in tests, with the numerics contract's bits (docs/devices.md).
//
// One kernel source (src/device/kernels/*.cl) for every device. Every source starts with
// `#pragma OPENCL FP_CONTRACT OFF` and writes `fma()` wherever the contract has one; programs are
// built with -cl-fp32-correctly-rounded-divide-sqrt and never with mad, fast, unsafe or
// denormal-flushing options; a device whose single-precision config lacks denormals, FMA or
// correctly rounded divide and sqrt is refused, naming the missing bit. Nothing ever falls back
// to the CPU or to another runtime.
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

// Whether this binary was built with OpenCL (cmake -DLOCKSTEP_WITH_OPENCL=ON, the default), and
// how many programs' PTX it carries for the CUDA runtime (0: built without clang-15 and libclc-15,
// so `--device cuda` is refused).
bool OpenClBuiltIn();
int CudaProgramsBuiltIn();

// --device: "cpu" (nullopt), "opencl" / "opencl:P:D" (platform P, device D of the OpenCL
// platforms; "opencl" is 0:0) or "cuda" / "cuda:N" (CUDA device N; "cuda" is 0). Fails naming
// the text otherwise.
struct DeviceChoice {
  enum class Runtime { kOpenCl, kCuda } runtime = Runtime::kOpenCl;
  int platform = 0;  // OpenCL only
  int device = 0;
  // As --device takes it: "opencl:P:D" or "cuda:N".
  std::string Flag() const;
};
std::optional<DeviceChoice> ParseDeviceFlag(std::string_view text);

// A device as its driver describes it.
struct DeviceInfo {
  DeviceChoice choice;
  // OpenCL: the platform, the device's OpenCL and OpenCL C versions. CUDA: "CUDA", the compute
  // capability ("compute capability 9.0") and the PTX ISA the driver takes ("PTX ISA 9.0").
  std::string platform_name, name, version, c_version, driver;
  uint64_t global_memory = 0;
  uint64_t max_allocation = 0;  // the largest single buffer (CL_DEVICE_MAX_MEM_ALLOC_SIZE)
  uint64_t max_work_group = 0;
  uint64_t local_memory = 0;  // bytes per work-group (CL_DEVICE_LOCAL_MEM_SIZE; CUDA's shared)
  bool gpu = false;  // CL_DEVICE_TYPE_GPU or _ACCELERATOR, or CUDA: the GEMM tiling is measured
  // The single-precision config bits the contract needs (OpenCL's CL_DEVICE_SINGLE_FP_CONFIG;
  // on CUDA, PTX's .rn instructions give all three, which scripts/ptx-check.sh checks).
  bool denorm = false, fma = false, correctly_rounded_divide_sqrt = false;
  // Whether the device has binary64 as the norm sums need it (cl_khr_fp64, its double config
  // with CL_FP_FMA, CL_FP_DENORM, CL_FP_INF_NAN and CL_FP_ROUND_TO_NEAREST; every CUDA device):
  // without it, block_squares runs on the CPU (docs/devices.md, "What runs where").
  bool fp64 = false;
  // Why a run refuses the device although its floating point meets the contract (a CUDA device
  // older than the PTX's target); empty when it does not.
  std::string refused_because;
  // Empty when the device meets the contract; else what it lacks, e.g. "CL_FP_DENORM".
  std::string Missing() const;
  // "--device opencl:P:D (NAME)": the device as the user chose it and as the driver names it.
  std::string Described() const;
};

// Every OpenCL device of every platform; empty when no OpenCL platform is installed (or the
// binary was built without OpenCL). Fails only on a driver error other than "no platform".
std::vector<DeviceInfo> ListDevices();
// Every CUDA device, and when there is none, why ("no libcuda.so.1: ...", cuInit's error, no
// PTX built in).
struct CudaDevices {
  std::vector<DeviceInfo> devices;
  std::string none_because;
};
CudaDevices ListCudaDevices();

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

// An OpenCL C source (src/device/kernels/*.cl, embedded in the binary) by file name.
struct KernelSource {
  std::string_view name, text;
};
// An open device that meets the contract, with its programs built: an OpExecutor of every op
// of the op table it runs (the others stay on the CPU).
class Device : public OpExecutor {
 public:
  const DeviceInfo& info() const { return info_; }

  // Whether the device runs `op`: whether it has a recipe for it (src/device/ops.cc, RecipeOf):
  // every op but global_norm (a sum of the block sums, which the host holds after the ranks share
  // them), and block_squares only on a device with fp64.
  virtual bool Implements(rk::Op op) const = 0;
  // The op of the op table on `in`, on the device: every output, with the bits of spec.run.
  // Copies in and out; for the tests and the selftest.
  virtual void Run(rk::Op op, const rk::OpValues& in, rk::OpValues& out) = 0;
  // OpExecutor: the op on tensors where the caller holds them (false for an op the device does
  // not run). An input is read from host memory, or from the device's copy where it lies in a
  // kept region (Keep); an output is written to host memory, or, in a kept region, to the
  // device's copy only (ToHost brings it back). An output whose role is also an input's is that
  // input updated in place, at the same address. Keep, Forget, ToHost and HostWrites as
  // OpExecutor says; traffic() counts the bytes copied since the device was opened and those of
  // the copies it keeps now. Plan refuses a run larger than the device's memory or its largest
  // buffer, and the device running out of memory later is told with that plan.
  using OpExecutor::Run;

  // The work-group size of the element- and row-wise kernels (0: the runtime's choice), and the
  // GEMM's tiling. Speed only; the tests vary both and demand the same bits.
  virtual void set_work_group(size_t size) = 0;
  virtual void set_gemm_tiling(const GemmTiling& tiling) = 0;
  virtual const GemmTiling& gemm_tiling() const = 0;

  // The programs as the device's compiler built them (PTX text on NVIDIA) as (name, bytes): what
  // scripts/ptx-check.sh inspects.
  virtual std::vector<std::pair<std::string, std::string>> ProgramBinaries() = 0;
  // Whether the device can run `tiling` (work-group size, local memory, a program for it), and
  // set it; set fails naming the limit a tiling exceeds.
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

// Opens device `choice`, refusing (an error naming the device and the missing bit or library)
// one that does not meet the contract or cannot be reached, and building every program with the
// contract's options.
std::unique_ptr<Device> Open(const DeviceChoice& choice);
// For the mutation test only, which shows that the rules matter: an OpenCL device whose programs
// are built with the pragma removed from every source.
struct Mutation {
  bool drop_fp_contract_pragma = false;
};
std::unique_ptr<Device> OpenMutated(const DeviceChoice& choice, const Mutation& mutation);

// --device as train, replay, audit, dispute and trace take it: null for "cpu", else the device
// opened, its GEMM tiling measured on a GPU (TuneGemm at 2048³), what runs where said on stderr.
std::unique_ptr<Device> OpenForRun(std::string_view flag);

// The build options every program gets, and those it must never get (docs/devices.md).
std::string_view BuildOptions();
std::span<const std::string_view> ForbiddenBuildOptions();

// The OpenCL C sources, by file name.
std::span<const KernelSource> KernelSources();

// When no OpenCL platform is found under OCL_ICD_VENDORS (the ICD loader then reads only that
// directory's .icd files): ": OCL_ICD_VENDORS=DIR names no vendor library that loads"; else "".
std::string NoOpenClPlatformBecause();

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
