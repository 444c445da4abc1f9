// The device layer's seam (docs/architecture.md, "Devices"): a Runtime moves bytes to and from
// one device and launches the programs of the program table there; everything else -- the op
// recipes, the residency of kept tensors, the size checks, the GEMM's tilings -- is written once
// above it (src/device/ops.cc). The runtimes: OpenCL (src/device/opencl.cc) and CUDA's driver API
// on the PTX made at build time from the same sources (src/device/cuda.cc).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "lockstep/device.h"

namespace lockstep::device {

// A program: the kernel sources it is built from (src/device/kernels/*.cl, in order) and the -D
// defines it is built with, beside the contract's options (BuildOptions). `name` is unique in
// the program table (src/device/programs.cc) and names the PTX the build makes of it.
struct ProgramSpec {
  std::string name;
  std::vector<std::string_view> sources;
  std::string defines;
};

// A kernel argument: a device buffer, or a scalar of OpenCL C's long, int or float.
struct KernelArg {
  enum class Kind { kBuffer, kLong, kInt, kFloat } kind;
  uint64_t buffer = 0;
  int64_t long_value = 0;
  int32_t int_value = 0;
  float float_value = 0;
};

class Runtime {
 public:
  // A buffer, program or kernel as the runtime names it (an address, a pointer); never 0.
  using Handle = uint64_t;
  virtual ~Runtime() = default;
  virtual const DeviceInfo& info() const = 0;

  // Buffers. Allocate gives `bytes` bytes (an empty buffer holds one unused word); failures name
  // the device, and running out of memory throws OutOfMemory.
  virtual Handle Allocate(size_t bytes) = 0;
  virtual void Release(Handle buffer) noexcept = 0;
  virtual void Write(Handle buffer, std::span<const std::byte> bytes) = 0;  // from offset 0
  virtual void Read(Handle buffer, std::span<std::byte> bytes) = 0;         // from offset 0
  virtual void FillZeros(Handle buffer, size_t bytes) = 0;
  virtual void Copy(Handle from, Handle to, size_t bytes) = 0;

  // Programs: whether the runtime can build `spec` (the CUDA runtime has PTX for the program
  // table's programs only), and the program, built once and kept until the runtime ends.
  virtual bool CanBuild(const ProgramSpec& spec) const = 0;
  virtual Handle Program(const ProgramSpec& spec) = 0;
  // The kernel `name` of `program`, made once and kept; the most work-items a work-group of it
  // may have (its registers may allow fewer than the device's maximum).
  virtual Handle Kernel(Handle program, const char* name) = 0;
  virtual size_t KernelWorkGroupLimit(Handle kernel) = 0;
  // The program as the device's compiler built it (PTX text on NVIDIA's drivers).
  virtual std::string ProgramBinary(Handle program) = 0;

  // Enqueues `kernel` with `args` over `global` work-items in `dims` (1 or 2) dimensions, in
  // work-groups of `local` items (a multiple of it in each dimension), or of the runtime's
  // choice when local[0] is 0 (1-D only: the global size is then padded as the runtime needs, and
  // every kernel ignores the items past its end). Work runs in the order enqueued; Read waits
  // for it.
  virtual void Launch(Handle kernel, std::span<const KernelArg> args, int dims,
                      std::array<size_t, 2> global, std::array<size_t, 2> local) = 0;
  // Waits for every enqueued launch.
  virtual void Finish() = 0;
};

// The runtimes, opened on device `choice`: each refuses, naming the device and what
// is missing, a device that does not meet the contract.
std::unique_ptr<Runtime> OpenOpenCl(const DeviceChoice& choice, const Mutation& mutation);
std::unique_ptr<Runtime> OpenCuda(const DeviceChoice& choice);

// The program table (src/device/programs.cc): every program a device builds.
// The int8 GEMM's block of outputs per work-item (kInt8Tile x kInt8Tile; int8.cl's I8_TILE).
inline constexpr int64_t kInt8Tile = 4;
ProgramSpec MainProgram();  // every source but the GEMM's and the fp64 norm's, dmath.cl first
ProgramSpec NormProgram();  // norm.cl (fp64), with the contract's block and lane counts
ProgramSpec GemmProgram(const GemmTiling& tiling);
// The main and norm programs and the GEMM at every candidate tiling: what the build compiles to
// PTX.
std::vector<ProgramSpec> ProgramTable();

}  // namespace lockstep::device
