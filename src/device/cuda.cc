// The CUDA runtime of the device layer (src/device/runtime.h): the PTX that clang-15 and libclc
// make of the OpenCL C sources at build time (the program table, src/device/programs.cc), the
// same PTX scripts/ptx-check.sh inspects, loaded and launched through CUDA's driver API.
//
// libcuda.so.1 is opened at run time and the few entry points used here are declared below, as
// Blender's cuew does, so that neither building nor running lockstep needs a CUDA toolkit: a
// machine without NVIDIA's driver builds the same binary, and `--device cuda` there is refused,
// saying so. The declarations follow the CUDA Driver API reference (the types, the entry points'
// versioned names such as cuMemAlloc_v2, and the enumerators' values, which are ABI).
#include <dlfcn.h>
#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <type_traits>
#include <vector>

#include "device/ptx.h"
#include "device/runtime.h"
#include "lockstep/device.h"

namespace lockstep::device {

int CudaProgramsBuiltIn() { return static_cast<int>(std::size(kPtxPrograms)) - 1; }

namespace {

// The driver API's types: handles are opaque pointers, a device an int, device memory a 64-bit
// address.
using CUresult = int;
using CUdevice = int;
using CUdeviceptr = uint64_t;
using CUcontext = struct CUctx_st*;
using CUmodule = struct CUmod_st*;
using CUfunction = struct CUfunc_st*;
using CUstream = struct CUstream_st*;
constexpr CUresult CUDA_SUCCESS = 0;
constexpr CUresult CUDA_ERROR_OUT_OF_MEMORY = 2;
constexpr CUresult CUDA_ERROR_NO_DEVICE = 100;
constexpr CUresult CUDA_ERROR_UNSUPPORTED_PTX_VERSION = 222;
constexpr int CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK = 1;
constexpr int CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK = 8;
constexpr int CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR = 75;
constexpr int CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR = 76;
constexpr int CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK = 0;
constexpr int CU_JIT_ERROR_LOG_BUFFER = 5;
constexpr int CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES = 6;
// The oldest compute capability the PTX targets (sm_80, as the build makes it).
constexpr int kMinimumComputeCapability = 80;

// The entry points, resolved from libcuda.so.1 once.
struct Driver {
  CUresult (*cuInit)(unsigned);
  CUresult (*cuDriverGetVersion)(int*);
  CUresult (*cuGetErrorName)(CUresult, const char**);
  CUresult (*cuDeviceGetCount)(int*);
  CUresult (*cuDeviceGet)(CUdevice*, int);
  CUresult (*cuDeviceGetName)(char*, int, CUdevice);
  CUresult (*cuDeviceTotalMem_v2)(size_t*, CUdevice);
  CUresult (*cuDeviceGetAttribute)(int*, int, CUdevice);
  CUresult (*cuDevicePrimaryCtxRetain)(CUcontext*, CUdevice);
  CUresult (*cuDevicePrimaryCtxRelease_v2)(CUdevice);
  CUresult (*cuCtxSetCurrent)(CUcontext);
  CUresult (*cuCtxSynchronize)();
  CUresult (*cuModuleLoadDataEx)(CUmodule*, const void*, unsigned, int*, void**);
  CUresult (*cuModuleUnload)(CUmodule);
  CUresult (*cuModuleGetFunction)(CUfunction*, CUmodule, const char*);
  CUresult (*cuFuncGetAttribute)(int*, int, CUfunction);
  CUresult (*cuMemAlloc_v2)(CUdeviceptr*, size_t);
  CUresult (*cuMemFree_v2)(CUdeviceptr);
  CUresult (*cuMemcpyHtoD_v2)(CUdeviceptr, const void*, size_t);
  CUresult (*cuMemcpyDtoH_v2)(void*, CUdeviceptr, size_t);
  CUresult (*cuMemcpyDtoD_v2)(CUdeviceptr, CUdeviceptr, size_t);
  CUresult (*cuMemsetD8_v2)(CUdeviceptr, unsigned char, size_t);
  CUresult (*cuLaunchKernel)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                             unsigned, CUstream, void**, void**);
};

// The driver, loaded and initialised, or why it could not be: no libcuda.so.1, an entry point
// missing, cuInit failing (no device, or a driver too old or broken).
struct Loaded {
  Driver driver{};
  std::string problem;
};

std::string ErrorName(const Driver& d, CUresult status) {
  const char* name = nullptr;
  if (d.cuGetErrorName != nullptr && d.cuGetErrorName(status, &name) == CUDA_SUCCESS &&
      name != nullptr) {
    return fmt::format("{} ({})", name, status);
  }
  return fmt::format("CUresult {}", status);
}

const Loaded& Load() {
  static const Loaded loaded = [] {
    Loaded l;
    void* library = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (library == nullptr) {
      l.problem = fmt::format("no NVIDIA driver: libcuda.so.1 cannot be loaded ({})", dlerror());
      return l;
    }
    const auto resolve = [&](auto& entry, const char* name) {
      entry = reinterpret_cast<std::remove_reference_t<decltype(entry)>>(dlsym(library, name));
      if (entry == nullptr && l.problem.empty()) {
        l.problem = fmt::format("libcuda.so.1 lacks {}: the driver is too old", name);
      }
    };
    Driver& d = l.driver;
#define LOCKSTEP_RESOLVE(name) resolve(d.name, #name)
    LOCKSTEP_RESOLVE(cuInit);
    LOCKSTEP_RESOLVE(cuDriverGetVersion);
    LOCKSTEP_RESOLVE(cuGetErrorName);
    LOCKSTEP_RESOLVE(cuDeviceGetCount);
    LOCKSTEP_RESOLVE(cuDeviceGet);
    LOCKSTEP_RESOLVE(cuDeviceGetName);
    LOCKSTEP_RESOLVE(cuDeviceTotalMem_v2);
    LOCKSTEP_RESOLVE(cuDeviceGetAttribute);
    LOCKSTEP_RESOLVE(cuDevicePrimaryCtxRetain);
    LOCKSTEP_RESOLVE(cuDevicePrimaryCtxRelease_v2);
    LOCKSTEP_RESOLVE(cuCtxSetCurrent);
    LOCKSTEP_RESOLVE(cuCtxSynchronize);
    LOCKSTEP_RESOLVE(cuModuleLoadDataEx);
    LOCKSTEP_RESOLVE(cuModuleUnload);
    LOCKSTEP_RESOLVE(cuModuleGetFunction);
    LOCKSTEP_RESOLVE(cuFuncGetAttribute);
    LOCKSTEP_RESOLVE(cuMemAlloc_v2);
    LOCKSTEP_RESOLVE(cuMemFree_v2);
    LOCKSTEP_RESOLVE(cuMemcpyHtoD_v2);
    LOCKSTEP_RESOLVE(cuMemcpyDtoH_v2);
    LOCKSTEP_RESOLVE(cuMemcpyDtoD_v2);
    LOCKSTEP_RESOLVE(cuMemsetD8_v2);
    LOCKSTEP_RESOLVE(cuLaunchKernel);
#undef LOCKSTEP_RESOLVE
    if (!l.problem.empty()) return l;
    if (const CUresult status = d.cuInit(0); status != CUDA_SUCCESS) {
      l.problem = status == CUDA_ERROR_NO_DEVICE
                      ? std::string("the NVIDIA driver finds no CUDA device")
                      : fmt::format("the NVIDIA driver failed to start: cuInit gave {}",
                                    ErrorName(d, status));
    }
    // A driver that changed this thread's floating-point environment as it loaded or started
    // would change every later CPU result: the driver is refused, and the process stops before
    // computing with it (RequireIeeeFloatingPoint at each step and parallel loop).
    try {
      RequireIeeeFloatingPoint("loading libcuda.so.1");
    } catch (const Error& e) {
      l.problem = e.what();
    }
    return l;
  }();
  return loaded;
}

void Check(const Driver& d, CUresult status, std::string_view what) {
  if (status != CUDA_SUCCESS) Fail("CUDA: {} failed: {}", what, ErrorName(d, status));
}

// How many devices the driver reports, which must be believable: a count past any machine's
// (a broken or hostile driver reporting 2^31 - 1) is refused instead of described one by one.
int DeviceCount(const Driver& d) {
  constexpr int kMostDevices = 1024;
  int count = 0;
  Check(d, d.cuDeviceGetCount(&count), "cuDeviceGetCount");
  if (count < 0 || count > kMostDevices) {
    Fail(
        "CUDA: the driver reports {} devices, not a count any machine has (at most {} are "
        "believed): a broken driver",
        count, kMostDevices);
  }
  return count;
}

// A device as the driver describes it, and its compute capability as major * 10 + minor.
struct CudaDevice {
  DeviceInfo info;
  int capability = 0;
};

CudaDevice Describe(const Driver& d, int ordinal) {
  CUdevice device = 0;
  Check(d, d.cuDeviceGet(&device, ordinal), "cuDeviceGet");
  const auto attribute = [&](int which) {
    int value = 0;
    Check(d, d.cuDeviceGetAttribute(&value, which, device), "cuDeviceGetAttribute");
    return value;
  };
  DeviceInfo info;
  info.choice = {DeviceChoice::Runtime::kCuda, 0, ordinal};
  char name[256] = {};
  Check(d, d.cuDeviceGetName(name, sizeof name - 1, device), "cuDeviceGetName");
  info.name = name;
  info.platform_name = "CUDA";
  const int major = attribute(CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR);
  const int minor = attribute(CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR);
  info.version = fmt::format("compute capability {}.{}", major, minor);
  const int capability = major * 10 + minor;
  int driver = 0;
  Check(d, d.cuDriverGetVersion(&driver), "cuDriverGetVersion");
  info.driver = fmt::format("CUDA {}.{}", driver / 1000, driver % 1000 / 10);
  info.c_version = "PTX of OpenCL C 1.2 (clang-15, libclc-15)";
  size_t memory = 0;
  Check(d, d.cuDeviceTotalMem_v2(&memory, device), "cuDeviceTotalMem");
  info.global_memory = memory;
  info.max_allocation = memory;
  info.max_work_group = static_cast<uint64_t>(attribute(CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK));
  info.local_memory =
      static_cast<uint64_t>(attribute(CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK));
  info.gpu = true;
  // PTX's .rn float instructions keep subnormals, fuse only where fma is written, and round
  // divide and sqrt correctly (scripts/ptx-check.sh checks every one in the embedded PTX); an
  // older GPU than the PTX's target is refused by OpenCuda.
  info.denorm = info.fma = info.correctly_rounded_divide_sqrt = true;
  info.fp64 = true;
  if (capability < kMinimumComputeCapability) {
    info.refused_because = fmt::format(
        "{}; lockstep's PTX targets sm_80 (compute capability 8.0) or newer", info.version);
  }
  return {info, capability};
}

class CudaRuntime final : public Runtime {
 public:
  CudaRuntime(const Driver& driver, DeviceInfo info) : d_(driver), info_(std::move(info)) {
    Check(d_, d_.cuDeviceGet(&device_, info_.choice.device), "cuDeviceGet");
    Call(d_.cuDevicePrimaryCtxRetain(&context_, device_), "cuDevicePrimaryCtxRetain");
    Call(d_.cuCtxSetCurrent(context_), "cuCtxSetCurrent");
  }
  ~CudaRuntime() override {
    for (auto& [name, module] : modules_) d_.cuModuleUnload(module);
    d_.cuDevicePrimaryCtxRelease_v2(device_);
  }
  const DeviceInfo& info() const override { return info_; }

  Handle Allocate(size_t bytes) override {
    CUdeviceptr address = 0;
    Call(d_.cuMemAlloc_v2(&address, std::max<size_t>(bytes, 4)),
         fmt::format("cuMemAlloc of {} bytes", bytes));
    return address;
  }
  void Release(Handle buffer) noexcept override { d_.cuMemFree_v2(buffer); }
  void Write(Handle buffer, std::span<const std::byte> bytes) override {
    Call(d_.cuMemcpyHtoD_v2(buffer, bytes.data(), bytes.size()), "cuMemcpyHtoD");
  }
  void Read(Handle buffer, std::span<std::byte> bytes) override {
    Call(d_.cuMemcpyDtoH_v2(bytes.data(), buffer, bytes.size()), "cuMemcpyDtoH");
  }
  void FillZeros(Handle buffer, size_t bytes) override {
    Call(d_.cuMemsetD8_v2(buffer, 0, bytes), "cuMemsetD8");  // any size: int8 tensors too
  }
  void Copy(Handle from, Handle to, size_t bytes) override {
    Call(d_.cuMemcpyDtoD_v2(to, from, bytes), "cuMemcpyDtoD");
  }

  bool CanBuild(const ProgramSpec& spec) const override { return Ptx(spec) != nullptr; }
  Handle Program(const ProgramSpec& spec) override {
    if (const auto it = modules_.find(spec.name); it != modules_.end()) {
      return reinterpret_cast<Handle>(it->second);
    }
    const PtxProgram* ptx = Ptx(spec);
    if (ptx == nullptr) {
      Fail(
          "{}: this binary carries no PTX of program {} (the CUDA runtime runs the program "
          "table's programs: src/device/programs.cc)",
          info_.Described(), spec.name);
    }
    std::string log(16384, '\0');
    int options[] = {CU_JIT_ERROR_LOG_BUFFER, CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES};
    void* values[] = {log.data(), reinterpret_cast<void*>(log.size())};
    CUmodule module = nullptr;
    const std::string text(ptx->text);  // NUL-terminated, as the driver reads PTX
    const CUresult status = d_.cuModuleLoadDataEx(&module, text.c_str(), 2, options, values);
    if (status != CUDA_SUCCESS) {
      log.resize(std::strlen(log.c_str()));
      Fail(
          "{}: the driver's PTX compiler rejected program {} ({}){}; the log follows, for a bug "
          "report:\n{}",
          info_.Described(), spec.name, ErrorName(d_, status),
          status == CUDA_ERROR_UNSUPPORTED_PTX_VERSION
              ? ": the driver is older than the PTX ISA version clang-15 writes (7.5, CUDA 11.5); "
                "update the NVIDIA driver, or use --device cpu"
              : "",
          log);
    }
    modules_[spec.name] = module;
    return reinterpret_cast<Handle>(module);
  }
  Handle Kernel(Handle program, const char* name) override {
    const auto key = std::pair{program, std::string(name)};
    if (const auto it = functions_.find(key); it != functions_.end()) {
      return reinterpret_cast<Handle>(it->second);
    }
    CUfunction function = nullptr;
    Call(d_.cuModuleGetFunction(&function, reinterpret_cast<CUmodule>(program), name),
         fmt::format("cuModuleGetFunction {}", name));
    functions_[key] = function;
    return reinterpret_cast<Handle>(function);
  }
  size_t KernelWorkGroupLimit(Handle kernel) override {
    int threads = 0;
    Call(d_.cuFuncGetAttribute(&threads, CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK,
                               reinterpret_cast<CUfunction>(kernel)),
         "cuFuncGetAttribute");
    return static_cast<size_t>(threads);
  }
  std::string ProgramBinary(Handle program) override {
    for (const auto& [name, module] : modules_) {
      if (reinterpret_cast<Handle>(module) == program) {
        for (const PtxProgram& p : kPtxPrograms) {
          if (p.name == name) return std::string(p.text);
        }
      }
    }
    LOCKSTEP_INTERNAL("no PTX of a loaded CUDA module");
  }

  void Launch(Handle kernel, std::span<const KernelArg> args, int dims,
              std::array<size_t, 2> global, std::array<size_t, 2> local) override {
    // A 1-D launch of the runtime's choice: blocks of 256 threads, the global size padded.
    constexpr size_t kBlock = 256;
    if (local[0] == 0) {
      local = {kBlock, 1};
      global[0] = (global[0] + kBlock - 1) / kBlock * kBlock;
    }
    if (dims == 1) global[1] = local[1] = 1;
    std::vector<void*> params;
    params.reserve(args.size());
    for (const KernelArg& a : args) {
      switch (a.kind) {
        case KernelArg::Kind::kBuffer:
          params.push_back(const_cast<uint64_t*>(&a.buffer));
          break;
        case KernelArg::Kind::kLong:
          params.push_back(const_cast<int64_t*>(&a.long_value));
          break;
        case KernelArg::Kind::kInt:
          params.push_back(const_cast<int32_t*>(&a.int_value));
          break;
        case KernelArg::Kind::kFloat:
          params.push_back(const_cast<float*>(&a.float_value));
          break;
      }
    }
    const auto blocks = [](size_t g, size_t l) { return static_cast<unsigned>(g / l); };
    Call(d_.cuLaunchKernel(reinterpret_cast<CUfunction>(kernel), blocks(global[0], local[0]),
                           blocks(global[1], local[1]), 1, static_cast<unsigned>(local[0]),
                           static_cast<unsigned>(local[1]), 1, 0, nullptr, params.data(), nullptr),
         "cuLaunchKernel");
  }
  void Finish() override { Call(d_.cuCtxSynchronize(), "cuCtxSynchronize"); }

 private:
  static const PtxProgram* Ptx(const ProgramSpec& spec) {
    for (const PtxProgram& p : kPtxPrograms) {
      if (!p.name.empty() && p.name == spec.name) return &p;
    }
    return nullptr;
  }
  // A driver call on the open device: running out of memory throws OutOfMemory.
  void Call(CUresult status, std::string_view what) const {
    if (status == CUDA_SUCCESS) return;
    if (status == CUDA_ERROR_OUT_OF_MEMORY) {
      throw OutOfMemory(fmt::format(
          "{} ran out of memory ({} in {}): the device has {:.2f} GiB, other processes may hold "
          "part of it; use a smaller config or microbatch, --recompute-activations, or --device "
          "cpu",
          info_.Described(), ErrorName(d_, status), what,
          static_cast<double>(info_.global_memory) / (1 << 30)));
    }
    Fail("{}: CUDA: {} failed: {}", info_.Described(), what, ErrorName(d_, status));
  }

  const Driver& d_;
  DeviceInfo info_;
  CUdevice device_ = 0;
  CUcontext context_ = nullptr;
  std::map<std::string, CUmodule> modules_;
  std::map<std::pair<Handle, std::string>, CUfunction> functions_;
};

}  // namespace

CudaDevices ListCudaDevices() {
  CudaDevices list;
  if (CudaProgramsBuiltIn() == 0) {
    list.none_because =
        "this lockstep was built without PTX (clang-15 and libclc-15 absent, or cross-compiled)";
    return list;
  }
  const Loaded& loaded = Load();
  if (!loaded.problem.empty()) {
    list.none_because = loaded.problem;
    return list;
  }
  const Driver& d = loaded.driver;
  const int count = DeviceCount(d);
  for (int i = 0; i < count; ++i) list.devices.push_back(Describe(d, i).info);
  if (count == 0) list.none_because = "the NVIDIA driver finds no CUDA device";
  return list;
}

std::unique_ptr<Runtime> OpenCuda(const DeviceChoice& choice) {
  const std::string flag = choice.Flag();
  if (CudaProgramsBuiltIn() == 0) {
    Fail(
        "--device {}: this lockstep was built without PTX for the CUDA runtime (clang-15 and "
        "libclc-15 were absent at build time, or it was cross-compiled: scripts/install-deps.sh, "
        "then build it natively)",
        flag);
  }
  const Loaded& loaded = Load();
  if (!loaded.problem.empty()) {
    Fail("--device {}: {}; `lockstep --version` lists the devices (--device cpu runs without one)",
         flag, loaded.problem);
  }
  const Driver& d = loaded.driver;
  const int count = DeviceCount(d);
  if (choice.device >= count) {
    Fail("--device {}: there are {} CUDA devices (`lockstep --version` lists them)", flag, count);
  }
  CudaDevice device = Describe(d, choice.device);
  if (!device.info.refused_because.empty()) {
    Fail("--device {}: device '{}' has {}", flag, device.info.name, device.info.refused_because);
  }
  return std::make_unique<CudaRuntime>(d, std::move(device.info));
}

}  // namespace lockstep::device
