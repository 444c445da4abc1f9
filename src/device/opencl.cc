// The OpenCL runtime of the device layer (src/device/runtime.h): platforms and devices, the
// contract's FP-config check, program builds from source with the contract's options, buffers
// and launches.
#include <fmt/format.h>

#include <algorithm>
#include <cstdlib>
#include <map>

#include "device/runtime.h"
#include "lockstep/device.h"

#ifdef LOCKSTEP_WITH_OPENCL
#define CL_TARGET_OPENCL_VERSION 120
#include <CL/cl.h>
#endif

namespace lockstep::device {

std::string NoOpenClPlatformBecause() {
  const char* vendors = std::getenv("OCL_ICD_VENDORS");
  if (vendors == nullptr) return "";
  return fmt::format(": OCL_ICD_VENDORS={} names no vendor library that loads", vendors);
}

std::string OpenClErrorName(int code) {
  static constexpr std::pair<int, std::string_view> kNames[] = {
      {0, "CL_SUCCESS"},
      {-1, "CL_DEVICE_NOT_FOUND"},
      {-2, "CL_DEVICE_NOT_AVAILABLE"},
      {-3, "CL_COMPILER_NOT_AVAILABLE"},
      {-4, "CL_MEM_OBJECT_ALLOCATION_FAILURE"},
      {-5, "CL_OUT_OF_RESOURCES"},
      {-6, "CL_OUT_OF_HOST_MEMORY"},
      {-7, "CL_PROFILING_INFO_NOT_AVAILABLE"},
      {-8, "CL_MEM_COPY_OVERLAP"},
      {-9, "CL_IMAGE_FORMAT_MISMATCH"},
      {-10, "CL_IMAGE_FORMAT_NOT_SUPPORTED"},
      {-11, "CL_BUILD_PROGRAM_FAILURE"},
      {-12, "CL_MAP_FAILURE"},
      {-13, "CL_MISALIGNED_SUB_BUFFER_OFFSET"},
      {-14, "CL_EXEC_STATUS_ERROR_FOR_EVENTS_IN_WAIT_LIST"},
      {-15, "CL_COMPILE_PROGRAM_FAILURE"},
      {-16, "CL_LINKER_NOT_AVAILABLE"},
      {-17, "CL_LINK_PROGRAM_FAILURE"},
      {-18, "CL_DEVICE_PARTITION_FAILED"},
      {-19, "CL_KERNEL_ARG_INFO_NOT_AVAILABLE"},
      {-30, "CL_INVALID_VALUE"},
      {-31, "CL_INVALID_DEVICE_TYPE"},
      {-32, "CL_INVALID_PLATFORM"},
      {-33, "CL_INVALID_DEVICE"},
      {-34, "CL_INVALID_CONTEXT"},
      {-35, "CL_INVALID_QUEUE_PROPERTIES"},
      {-36, "CL_INVALID_COMMAND_QUEUE"},
      {-37, "CL_INVALID_HOST_PTR"},
      {-38, "CL_INVALID_MEM_OBJECT"},
      {-39, "CL_INVALID_IMAGE_FORMAT_DESCRIPTOR"},
      {-40, "CL_INVALID_IMAGE_SIZE"},
      {-41, "CL_INVALID_SAMPLER"},
      {-42, "CL_INVALID_BINARY"},
      {-43, "CL_INVALID_BUILD_OPTIONS"},
      {-44, "CL_INVALID_PROGRAM"},
      {-45, "CL_INVALID_PROGRAM_EXECUTABLE"},
      {-46, "CL_INVALID_KERNEL_NAME"},
      {-47, "CL_INVALID_KERNEL_DEFINITION"},
      {-48, "CL_INVALID_KERNEL"},
      {-49, "CL_INVALID_ARG_INDEX"},
      {-50, "CL_INVALID_ARG_VALUE"},
      {-51, "CL_INVALID_ARG_SIZE"},
      {-52, "CL_INVALID_KERNEL_ARGS"},
      {-53, "CL_INVALID_WORK_DIMENSION"},
      {-54, "CL_INVALID_WORK_GROUP_SIZE"},
      {-55, "CL_INVALID_WORK_ITEM_SIZE"},
      {-56, "CL_INVALID_GLOBAL_OFFSET"},
      {-57, "CL_INVALID_EVENT_WAIT_LIST"},
      {-58, "CL_INVALID_EVENT"},
      {-59, "CL_INVALID_OPERATION"},
      {-60, "CL_INVALID_GL_OBJECT"},
      {-61, "CL_INVALID_BUFFER_SIZE"},
      {-62, "CL_INVALID_MIP_LEVEL"},
      {-63, "CL_INVALID_GLOBAL_WORK_SIZE"},
      {-64, "CL_INVALID_PROPERTY"},
      {-65, "CL_INVALID_IMAGE_DESCRIPTOR"},
      {-66, "CL_INVALID_COMPILER_OPTIONS"},
      {-67, "CL_INVALID_LINKER_OPTIONS"},
      {-68, "CL_INVALID_DEVICE_PARTITION_COUNT"},
      {-69, "CL_INVALID_PIPE_SIZE"},
      {-70, "CL_INVALID_DEVICE_QUEUE"},
      {-71, "CL_INVALID_SPEC_ID"},
      {-72, "CL_MAX_SIZE_RESTRICTION_EXCEEDED"},
      {-1001, "CL_PLATFORM_NOT_FOUND_KHR"},  // the ICD loader's (cl_khr_icd)
  };
  const auto it = std::ranges::find(kNames, code, &std::pair<int, std::string_view>::first);
  return it == std::end(kNames) ? std::to_string(code) : std::string(it->second);
}

#ifndef LOCKSTEP_WITH_OPENCL

bool OpenClBuiltIn() { return false; }
std::vector<DeviceInfo> ListDevices() { return {}; }
std::unique_ptr<Runtime> OpenOpenCl(const DeviceChoice&, const Mutation&) {
  Fail("--device opencl: this lockstep was built without OpenCL (cmake -DLOCKSTEP_WITH_OPENCL=ON)");
}

#else

bool OpenClBuiltIn() { return true; }

namespace {

// "CL_OUT_OF_RESOURCES (-5)", or "error -9999" for a code CL/cl.h does not name.
std::string Described(cl_int status) {
  const std::string name = OpenClErrorName(status);
  return name.starts_with("CL_") ? fmt::format("{} ({})", name, status)
                                 : fmt::format("error {}", status);
}

void Check(cl_int status, std::string_view what) {
  if (status != CL_SUCCESS) Fail("OpenCL: {} failed: {}", what, Described(status));
}

// The same on an open device, naming it; running out of memory (the device adds the run's plan)
// and finding the device unavailable say what to change.
void Check(cl_int status, std::string_view what, const DeviceInfo& device) {
  const auto gib = [](uint64_t b) { return static_cast<double>(b) / (1 << 30); };
  switch (status) {
    case CL_SUCCESS:
      return;
    case CL_MEM_OBJECT_ALLOCATION_FAILURE:
    case CL_OUT_OF_RESOURCES:
    case CL_OUT_OF_HOST_MEMORY:
      throw OutOfMemory(fmt::format(
          "{} ran out of memory ({} in {}): the device has {:.2f} GiB, other processes may hold "
          "part of it; use a smaller config or microbatch, --recompute-activations, or --device "
          "cpu",
          device.Described(), Described(status), what, gib(device.global_memory)));
    case CL_INVALID_BUFFER_SIZE:
      Fail(
          "{} refused a buffer ({} in {}): the device allocates at most {:.2f} GiB at once "
          "(CL_DEVICE_MAX_MEM_ALLOC_SIZE); use a smaller config or microbatch, or --device cpu",
          device.Described(), Described(status), what, gib(device.max_allocation));
    case CL_DEVICE_NOT_AVAILABLE:
      Fail(
          "{} is not available ({} in {}): another process may hold it (a GPU in an exclusive "
          "compute mode); choose another device (`lockstep --version` lists them) or --device cpu",
          device.Described(), Described(status), what);
    default:
      Fail("{}: OpenCL: {} failed: {}", device.Described(), what, Described(status));
  }
}

std::string DeviceString(cl_device_id id, cl_device_info param) {
  size_t size = 0;
  Check(clGetDeviceInfo(id, param, 0, nullptr, &size), "clGetDeviceInfo");
  std::string s(size, '\0');
  Check(clGetDeviceInfo(id, param, size, s.data(), nullptr), "clGetDeviceInfo");
  while (!s.empty() && s.back() == '\0') s.pop_back();
  return s;
}

template <typename T>
T DeviceValue(cl_device_id id, cl_device_info param) {
  T value{};
  Check(clGetDeviceInfo(id, param, sizeof value, &value, nullptr), "clGetDeviceInfo");
  return value;
}

std::vector<cl_platform_id> Platforms() {
  cl_uint count = 0;
  const cl_int status = clGetPlatformIDs(0, nullptr, &count);
  constexpr cl_int kPlatformNotFoundKhr = -1001;  // the ICD loader's "no platform installed"
  if (status == kPlatformNotFoundKhr || count == 0) return {};
  Check(status, "clGetPlatformIDs");
  std::vector<cl_platform_id> platforms(count);
  Check(clGetPlatformIDs(count, platforms.data(), nullptr), "clGetPlatformIDs");
  // The ICD loader has loaded every vendor library by now; one that changed this thread's
  // floating-point environment would change every later CPU result.
  RequireIeeeFloatingPoint("loading the OpenCL platforms' libraries");
  return platforms;
}

std::vector<cl_device_id> Devices(cl_platform_id platform) {
  cl_uint count = 0;
  const cl_int status = clGetDeviceIDs(platform, CL_DEVICE_TYPE_ALL, 0, nullptr, &count);
  if (status == CL_DEVICE_NOT_FOUND || count == 0) return {};
  Check(status, "clGetDeviceIDs");
  std::vector<cl_device_id> devices(count);
  Check(clGetDeviceIDs(platform, CL_DEVICE_TYPE_ALL, count, devices.data(), nullptr),
        "clGetDeviceIDs");
  return devices;
}

DeviceInfo Describe(cl_platform_id platform, cl_device_id id, int p, int d) {
  DeviceInfo info;
  info.choice = {DeviceChoice::Runtime::kOpenCl, p, d};
  size_t size = 0;
  Check(clGetPlatformInfo(platform, CL_PLATFORM_NAME, 0, nullptr, &size), "clGetPlatformInfo");
  info.platform_name.resize(size);
  Check(clGetPlatformInfo(platform, CL_PLATFORM_NAME, size, info.platform_name.data(), nullptr),
        "clGetPlatformInfo");
  while (!info.platform_name.empty() && info.platform_name.back() == '\0') {
    info.platform_name.pop_back();
  }
  info.name = DeviceString(id, CL_DEVICE_NAME);
  info.version = DeviceString(id, CL_DEVICE_VERSION);
  info.c_version = DeviceString(id, CL_DEVICE_OPENCL_C_VERSION);
  info.driver = DeviceString(id, CL_DRIVER_VERSION);
  info.global_memory = DeviceValue<cl_ulong>(id, CL_DEVICE_GLOBAL_MEM_SIZE);
  info.max_allocation = DeviceValue<cl_ulong>(id, CL_DEVICE_MAX_MEM_ALLOC_SIZE);
  info.max_work_group = DeviceValue<size_t>(id, CL_DEVICE_MAX_WORK_GROUP_SIZE);
  info.local_memory = DeviceValue<cl_ulong>(id, CL_DEVICE_LOCAL_MEM_SIZE);
  info.gpu = (DeviceValue<cl_device_type>(id, CL_DEVICE_TYPE) &
              (CL_DEVICE_TYPE_GPU | CL_DEVICE_TYPE_ACCELERATOR)) != 0;
  const auto fp = DeviceValue<cl_device_fp_config>(id, CL_DEVICE_SINGLE_FP_CONFIG);
  info.denorm = (fp & CL_FP_DENORM) != 0;
  info.fma = (fp & CL_FP_FMA) != 0;
  info.correctly_rounded_divide_sqrt = (fp & CL_FP_CORRECTLY_ROUNDED_DIVIDE_SQRT) != 0;
  const cl_device_fp_config fp64_needs =
      CL_FP_FMA | CL_FP_DENORM | CL_FP_INF_NAN | CL_FP_ROUND_TO_NEAREST;
  info.fp64 = DeviceString(id, CL_DEVICE_EXTENSIONS).find("cl_khr_fp64") != std::string::npos &&
              (DeviceValue<cl_device_fp_config>(id, CL_DEVICE_DOUBLE_FP_CONFIG) & fp64_needs) ==
                  fp64_needs;
  return info;
}

class OpenClRuntime final : public Runtime {
 public:
  OpenClRuntime(DeviceInfo info, cl_device_id id, Mutation mutation)
      : info_(std::move(info)), id_(id), mutation_(mutation) {
    cl_int status = CL_SUCCESS;
    context_ = clCreateContext(nullptr, 1, &id_, nullptr, nullptr, &status);
    Check(status, "clCreateContext", info_);
    queue_ = clCreateCommandQueue(context_, id_, 0, &status);
    Check(status, "clCreateCommandQueue", info_);
  }
  ~OpenClRuntime() override {
    for (auto& [key, kernel] : kernels_) clReleaseKernel(kernel);
    for (auto& [name, program] : programs_) clReleaseProgram(program);
    if (queue_ != nullptr) clReleaseCommandQueue(queue_);
    if (context_ != nullptr) clReleaseContext(context_);
  }
  const DeviceInfo& info() const override { return info_; }

  Handle Allocate(size_t bytes) override {
    cl_int status = CL_SUCCESS;
    // A zero-byte buffer is invalid in OpenCL: an empty tensor gets one unused word.
    cl_mem mem =
        clCreateBuffer(context_, CL_MEM_READ_WRITE, std::max<size_t>(bytes, 4), nullptr, &status);
    Check(status, fmt::format("clCreateBuffer of {} bytes", bytes), info_);
    return Of(mem);
  }
  void Release(Handle buffer) noexcept override { clReleaseMemObject(Mem(buffer)); }
  void Write(Handle buffer, std::span<const std::byte> bytes) override {
    Check(clEnqueueWriteBuffer(queue_, Mem(buffer), CL_TRUE, 0, bytes.size(), bytes.data(), 0,
                               nullptr, nullptr),
          "clEnqueueWriteBuffer", info_);
  }
  void Read(Handle buffer, std::span<std::byte> bytes) override {
    Check(clEnqueueReadBuffer(queue_, Mem(buffer), CL_TRUE, 0, bytes.size(), bytes.data(), 0,
                              nullptr, nullptr),
          "clEnqueueReadBuffer", info_);
  }
  void FillZeros(Handle buffer, size_t bytes) override {
    const cl_uchar zero = 0;  // a one-byte pattern fills any size (int8 tensors too)
    Check(
        clEnqueueFillBuffer(queue_, Mem(buffer), &zero, sizeof zero, 0, bytes, 0, nullptr, nullptr),
        "clEnqueueFillBuffer", info_);
  }
  void Copy(Handle from, Handle to, size_t bytes) override {
    Check(clEnqueueCopyBuffer(queue_, Mem(from), Mem(to), 0, 0, bytes, 0, nullptr, nullptr),
          "clEnqueueCopyBuffer", info_);
  }

  bool CanBuild(const ProgramSpec&) const override { return true; }
  Handle Program(const ProgramSpec& spec) override {
    if (const auto it = programs_.find(spec.name); it != programs_.end()) return Of(it->second);
    return Of(programs_[spec.name] = Build(spec));
  }
  Handle Kernel(Handle program, const char* name) override {
    const auto key = std::pair{program, std::string(name)};
    if (const auto it = kernels_.find(key); it != kernels_.end()) return Of(it->second);
    cl_int status = CL_SUCCESS;
    cl_kernel kernel = clCreateKernel(reinterpret_cast<cl_program>(program), name, &status);
    Check(status, fmt::format("clCreateKernel {}", name), info_);
    return Of(kernels_[key] = kernel);
  }
  size_t KernelWorkGroupLimit(Handle kernel) override {
    size_t allowed = 0;
    Check(clGetKernelWorkGroupInfo(reinterpret_cast<cl_kernel>(kernel), id_,
                                   CL_KERNEL_WORK_GROUP_SIZE, sizeof allowed, &allowed, nullptr),
          "clGetKernelWorkGroupInfo", info_);
    return allowed;
  }
  std::string ProgramBinary(Handle handle) override {
    const auto program = reinterpret_cast<cl_program>(handle);
    size_t size = 0;
    Check(clGetProgramInfo(program, CL_PROGRAM_BINARY_SIZES, sizeof size, &size, nullptr),
          "clGetProgramInfo", info_);
    std::string bytes(size, '\0');
    unsigned char* data = reinterpret_cast<unsigned char*>(bytes.data());
    Check(clGetProgramInfo(program, CL_PROGRAM_BINARIES, sizeof data, &data, nullptr),
          "clGetProgramInfo", info_);
    return bytes;
  }

  void Launch(Handle handle, std::span<const KernelArg> args, int dims,
              std::array<size_t, 2> global, std::array<size_t, 2> local) override {
    const auto kernel = reinterpret_cast<cl_kernel>(handle);
    for (size_t i = 0; i < args.size(); ++i) {
      const KernelArg& a = args[i];
      const cl_mem mem = Mem(a.buffer);
      const cl_long long_value = a.long_value;
      const cl_int int_value = a.int_value;
      const auto index = static_cast<cl_uint>(i);
      switch (a.kind) {
        case KernelArg::Kind::kBuffer:
          Check(clSetKernelArg(kernel, index, sizeof mem, &mem), "clSetKernelArg");
          break;
        case KernelArg::Kind::kLong:
          Check(clSetKernelArg(kernel, index, sizeof long_value, &long_value), "clSetKernelArg");
          break;
        case KernelArg::Kind::kInt:
          Check(clSetKernelArg(kernel, index, sizeof int_value, &int_value), "clSetKernelArg");
          break;
        case KernelArg::Kind::kFloat:
          Check(clSetKernelArg(kernel, index, sizeof a.float_value, &a.float_value),
                "clSetKernelArg");
          break;
      }
    }
    Check(clEnqueueNDRangeKernel(queue_, kernel, static_cast<cl_uint>(dims), nullptr, global.data(),
                                 local[0] > 0 ? local.data() : nullptr, 0, nullptr, nullptr),
          "clEnqueueNDRangeKernel", info_);
  }
  void Finish() override { Check(clFinish(queue_), "clFinish", info_); }

 private:
  template <typename T>
  static Handle Of(T* object) {
    return reinterpret_cast<Handle>(object);
  }
  static cl_mem Mem(Handle buffer) { return reinterpret_cast<cl_mem>(buffer); }

  cl_program Build(const ProgramSpec& spec) const {
    std::vector<std::string> texts;
    for (const std::string_view file : spec.sources) {
      const auto it = std::ranges::find(KernelSources(), file, &KernelSource::name);
      if (it == KernelSources().end()) LOCKSTEP_INTERNAL("no kernel source {}", file);
      std::string text(it->text);
      if (mutation_.drop_fp_contract_pragma) {
        const std::string pragma = "#pragma OPENCL FP_CONTRACT OFF";
        const size_t at = text.find(pragma);
        if (at != std::string::npos) text.erase(at, pragma.size());
      }
      texts.push_back(std::move(text));
    }
    std::vector<const char*> pointers;
    std::vector<size_t> lengths;
    for (const std::string& t : texts) {
      pointers.push_back(t.data());
      lengths.push_back(t.size());
    }
    cl_int status = CL_SUCCESS;
    cl_program program = clCreateProgramWithSource(context_, static_cast<cl_uint>(texts.size()),
                                                   pointers.data(), lengths.data(), &status);
    Check(status, "clCreateProgramWithSource", info_);
    const std::string options = fmt::format("{} {}", BuildOptions(), spec.defines);
    status = clBuildProgram(program, 1, &id_, options.c_str(), nullptr, nullptr);
    if (status != CL_SUCCESS) {
      size_t size = 0;
      clGetProgramBuildInfo(program, id_, CL_PROGRAM_BUILD_LOG, 0, nullptr, &size);
      std::string log(size, '\0');
      clGetProgramBuildInfo(program, id_, CL_PROGRAM_BUILD_LOG, size, log.data(), nullptr);
      while (!log.empty() && log.back() == '\0') log.pop_back();
      clReleaseProgram(program);
      if (status != CL_BUILD_PROGRAM_FAILURE && status != CL_COMPILER_NOT_AVAILABLE &&
          status != CL_INVALID_BUILD_OPTIONS) {
        Check(status, fmt::format("clBuildProgram of {}", fmt::join(spec.sources, ", ")), info_);
      }
      Fail(
          "{}: its OpenCL compiler rejected lockstep's kernels ({}: {}): choose another device "
          "(`lockstep --version` lists them) or --device cpu; the compiler's log follows, for a "
          "bug report:\n{}",
          info_.Described(), fmt::join(spec.sources, ", "), Described(status), log);
    }
    return program;
  }

  DeviceInfo info_;
  cl_device_id id_;
  Mutation mutation_;
  cl_context context_ = nullptr;
  cl_command_queue queue_ = nullptr;
  std::map<std::string, cl_program> programs_;
  std::map<std::pair<Handle, std::string>, cl_kernel> kernels_;
};

}  // namespace

std::unique_ptr<Runtime> OpenOpenCl(const DeviceChoice& choice, const Mutation& mutation) {
  const std::vector<cl_platform_id> platforms = Platforms();
  if (platforms.empty()) {
    Fail(
        "--device opencl: no OpenCL platform is installed{} (Debian: pocl-opencl-icd for the "
        "CPU, or the GPU vendor's ICD; on an NVIDIA machine without one, --device cuda); "
        "`lockstep --version` lists the devices",
        NoOpenClPlatformBecause());
  }
  if (choice.platform >= static_cast<int>(platforms.size())) {
    Fail("--device opencl:{}:{}: there are {} OpenCL platforms (`lockstep --version` lists them)",
         choice.platform, choice.device, platforms.size());
  }
  const std::vector<cl_device_id> devices = Devices(platforms[static_cast<size_t>(choice.platform)]);
  if (choice.device >= static_cast<int>(devices.size())) {
    Fail("--device opencl:{}:{}: platform {} has {} devices (`lockstep --version` lists them)",
         choice.platform, choice.device, choice.platform, devices.size());
  }
  const cl_device_id id = devices[static_cast<size_t>(choice.device)];
  DeviceInfo info = Describe(platforms[static_cast<size_t>(choice.platform)], id, choice.platform,
                             choice.device);
  if (const std::string missing = info.Missing(); !missing.empty()) {
    Fail("--device opencl:{}:{}: device '{}' ({}) does not meet the numerics contract: its "
         "single-precision config lacks {} (docs/devices.md)",
         choice.platform, choice.device, info.name, info.platform_name, missing);
  }
  return std::make_unique<OpenClRuntime>(std::move(info), id, mutation);
}

std::vector<DeviceInfo> ListDevices() {
  std::vector<DeviceInfo> list;
  const std::vector<cl_platform_id> platforms = Platforms();
  for (size_t p = 0; p < platforms.size(); ++p) {
    const std::vector<cl_device_id> devices = Devices(platforms[p]);
    for (size_t d = 0; d < devices.size(); ++d) {
      list.push_back(Describe(platforms[p], devices[d], static_cast<int>(p), static_cast<int>(d)));
    }
  }
  return list;
}

#endif  // LOCKSTEP_WITH_OPENCL

}  // namespace lockstep::device
