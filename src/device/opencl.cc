// The OpenCL runtime of the device layer (include/lockstep/device.h): platforms and devices, the
// contract's FP-config check, program builds with the contract's options, buffers, and the ops of
// the op table run on the device.
#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <bit>
#include <charconv>
#include <chrono>
#include <cmath>
#include <deque>
#include <map>
#include <tuple>

#include "device/sources.h"
#include "lockstep/device.h"

#ifdef LOCKSTEP_WITH_OPENCL
#define CL_TARGET_OPENCL_VERSION 120
#include <CL/cl.h>
#endif

namespace lockstep::device {

std::string DeviceInfo::Missing() const {
  std::string missing;
  const auto need = [&](bool has, const char* bit) {
    if (!has) missing += (missing.empty() ? "" : ", ") + std::string(bit);
  };
  need(denorm, "CL_FP_DENORM");
  need(fma, "CL_FP_FMA");
  need(correctly_rounded_divide_sqrt, "CL_FP_CORRECTLY_ROUNDED_DIVIDE_SQRT");
  return missing;
}

std::optional<DeviceChoice> ParseDeviceFlag(std::string_view text) {
  if (text == "cpu") return std::nullopt;
  if (text == "opencl") return DeviceChoice{};
  const auto number = [](std::string_view s, int& out) {
    const auto [end, error] = std::from_chars(s.data(), s.data() + s.size(), out);
    return !s.empty() && error == std::errc() && end == s.data() + s.size() && out >= 0;
  };
  if (text.starts_with("opencl:")) {
    const std::string_view rest = text.substr(7);
    const size_t colon = rest.find(':');
    DeviceChoice choice;
    if (colon != std::string_view::npos && number(rest.substr(0, colon), choice.platform) &&
        number(rest.substr(colon + 1), choice.device)) {
      return choice;
    }
  }
  Fail("--device {}: expected cpu, opencl or opencl:P:D (platform and device indices as "
       "`lockstep --version` lists them)",
       text);
}

std::string_view BuildOptions() { return "-cl-std=CL1.2 -cl-fp32-correctly-rounded-divide-sqrt"; }

std::span<const std::string_view> ForbiddenBuildOptions() {
  static constexpr std::string_view kForbidden[] = {
      "-cl-mad-enable", "-cl-fast-relaxed-math", "-cl-unsafe-math-optimizations",
      "-cl-denorms-are-zero", "-cl-finite-math-only", "-cl-no-signed-zeros"};
  return kForbidden;
}

std::span<const KernelSource> KernelSources() { return kKernelSources; }

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

std::string GemmTiling::Name() const {
  return fmt::format("{}x{}/{}x{}/{}{}", tile_m, tile_n, reg_m, reg_n, k_tile,
                     double_buffer != 0 ? "/db" : "");
}

std::span<const GemmTiling> GemmCandidates() {
  // Each assembles for sm_80 and sm_90 with its register tile in registers (no stack frame, no
  // spills) and at least 8 warps resident per multiprocessor: scripts/ptx-check.sh checks both.
  static constexpr GemmTiling kCandidates[] = {
      {},  // the default: 256 work-items, 4 outputs each
      {64, 64, 4, 4, 16, 0},   {64, 64, 4, 4, 16, 1},   {128, 64, 8, 4, 16, 1},
      {64, 128, 4, 8, 16, 1},  {128, 128, 8, 4, 16, 1}, {128, 128, 8, 4, 32, 1},
      {128, 128, 8, 8, 8, 1},  {128, 128, 8, 8, 16, 1},
  };
  return kCandidates;
}

std::vector<GemmTiming> TuneGemm(Device& device, int64_t n, int repeats) {
  std::vector<GemmTiming> timings;
  for (const GemmTiling& t : GemmCandidates()) {
    if (!device.Fits(t)) continue;
    device.set_gemm_tiling(t);
    timings.push_back({t, device.TimeGemm(n, repeats)});
  }
  if (timings.empty()) Fail("{}: no GEMM tiling fits the device", device.info().name);
  device.set_gemm_tiling(
      std::ranges::min(timings, {}, &GemmTiming::seconds).tiling);
  return timings;
}

#ifndef LOCKSTEP_WITH_OPENCL

bool OpenClBuiltIn() { return false; }
std::vector<DeviceInfo> ListDevices() { return {}; }
std::unique_ptr<Device> Open(const DeviceChoice&) {
  Fail("--device opencl: this lockstep was built without OpenCL (cmake -DLOCKSTEP_WITH_OPENCL=ON)");
}
std::unique_ptr<Device> OpenMutated(const DeviceChoice& choice, const Mutation&) {
  return Open(choice);
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

// "--device opencl:P:D (NAME)": the device as the user chose it, and as the driver names it.
std::string DeviceFlag(const DeviceInfo& device) {
  return fmt::format("--device opencl:{}:{} ({})", device.platform, device.device, device.name);
}

// The same on an open device, naming it; running out of memory (the executor adds the run's plan:
// tools/lockstep/device_executor.cc) and finding the device unavailable say what to change.
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
          DeviceFlag(device), Described(status), what, gib(device.global_memory)));
    case CL_INVALID_BUFFER_SIZE:
      Fail(
          "{} refused a buffer ({} in {}): the device allocates at most {:.2f} GiB at once "
          "(CL_DEVICE_MAX_MEM_ALLOC_SIZE); use a smaller config or microbatch, or --device cpu",
          DeviceFlag(device), Described(status), what, gib(device.max_allocation));
    case CL_DEVICE_NOT_AVAILABLE:
      Fail(
          "{} is not available ({} in {}): another process may hold it (a GPU in an exclusive "
          "compute mode); choose another device (`lockstep --version` lists them) or --device cpu",
          DeviceFlag(device), Described(status), what);
    default:
      Fail("{}: OpenCL: {} failed: {}", DeviceFlag(device), what, Described(status));
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
  info.platform = p;
  info.device = d;
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

// A device buffer of `bytes` bytes, released with its owner.
class Buffer {
 public:
  Buffer() = default;
  Buffer(cl_context context, size_t bytes, const DeviceInfo& device) : bytes_(bytes) {
    cl_int status = CL_SUCCESS;
    // A zero-byte buffer is invalid in OpenCL: an empty tensor gets one unused word.
    mem_ = clCreateBuffer(context, CL_MEM_READ_WRITE, std::max<size_t>(bytes, 4), nullptr,
                          &status);
    Check(status, fmt::format("clCreateBuffer of {} bytes", bytes), device);
  }
  Buffer(Buffer&& other) noexcept
      : mem_(std::exchange(other.mem_, nullptr)), bytes_(other.bytes_) {}
  Buffer& operator=(Buffer&& other) noexcept {
    std::swap(mem_, other.mem_);
    std::swap(bytes_, other.bytes_);
    return *this;
  }
  ~Buffer() {
    if (mem_ != nullptr) clReleaseMemObject(mem_);
  }
  cl_mem get() const { return mem_; }
  size_t bytes() const { return bytes_; }

 private:
  cl_mem mem_ = nullptr;
  size_t bytes_ = 0;
};

// The sizes an op's tensors must have, checked before anything reaches the device.
void CheckElements(std::string_view op, std::string_view role, int64_t size, int64_t expected) {
  if (expected < 0 || size != expected) {
    Fail("{} on the device: {} has {} elements, expected {}", op, role, size, expected);
  }
}

// A device copy of a tensor of a kept region (Device::Keep): `floats` floats at `host`, which of
// the two holds the current bytes (at least one does), and the device buffer.
struct Copy {
  const float* host = nullptr;
  size_t floats = 0;
  Buffer buffer;
  bool host_current = true, device_current = false;
  const float* end() const { return host + floats; }
};

class OpenClDevice;

// One op call's tensors on the device: each input's buffer (the kept copy, made current, or a
// temporary with the host's bytes) and each output's (the input's of the same role, updated in
// place; the kept copy; or a zeroed temporary), and where the outputs go when the op is done.
class Binding {
 public:
  // The values form: inputs from `in`, outputs into `out` (sized here).
  Binding(OpenClDevice& device, const rk::OpValues& in, rk::OpValues& out);
  // The in-place form (Device::Run on tensors).
  Binding(OpenClDevice& device, const OpArgs& args, std::span<const TensorIn> inputs,
          std::span<const TensorOut> outputs);
  ~Binding();
  Binding(const Binding&) = delete;
  Binding& operator=(const Binding&) = delete;

  int64_t Int(std::string_view name) const { return args_->Int(name); }
  float Float(std::string_view name) const { return args_->Float(name); }
  bool Has(std::string_view role) const { return FindIn(role) != nullptr; }
  // Elements of f32 input `role` (failing when the call has none).
  int64_t Size(std::string_view role) const {
    return static_cast<int64_t>(Input(role).f32.size());
  }
  std::span<const uint32_t> U(std::string_view role) const { return Input(role).u32; }
  const Buffer& In(std::string_view role);
  const Buffer& InU(std::string_view role);
  // Output `role` of `elements` floats, or doubles (never kept: read back when the op is done).
  const Buffer& Out(std::string_view role, int64_t elements);
  const Buffer& OutF64(std::string_view role, int64_t elements);
  // A zeroed device buffer for the op's own use.
  const Buffer& Scratch(int64_t floats);
  // Every output to where it goes: the kept copies marked newer than the host, the others read
  // back.
  void Finish();

 private:
  struct InTensor {
    std::string_view role;
    std::span<const float> f32;
    std::span<const uint32_t> u32;
    Copy* copy = nullptr;          // kept on the device
    const Buffer* buffer = nullptr;  // once bound
  };
  struct OutTensor {
    std::string_view role;
    std::span<float> target;
    std::span<double> f64 = {};  // an fp64 output's target instead
    const Buffer* buffer = nullptr;
    Copy* copy = nullptr;    // the kept copy the output ends in
    bool via_temp = false;   // written to a temporary, then copied into `copy`
    bool in_place = false;   // the input of the same role's buffer
  };
  const InTensor* FindIn(std::string_view role) const;
  InTensor& Input(std::string_view role);
  const InTensor& Input(std::string_view role) const;
  std::span<float> Target(std::string_view role, int64_t elements);

  OpenClDevice& device_;
  const rk::OpValues* args_;
  rk::OpValues own_args_;
  rk::OpValues* values_out_ = nullptr;
  std::span<const TensorOut> outputs_;
  std::vector<InTensor> inputs_;
  std::vector<OutTensor> bound_;
  std::deque<Buffer> temporaries_;
};

class OpenClDevice final : public Device {
 public:
  OpenClDevice(DeviceInfo info, cl_device_id id, Mutation mutation)
      : Device(std::move(info)), id_(id), mutation_(std::move(mutation)) {
    cl_int status = CL_SUCCESS;
    context_ = clCreateContext(nullptr, 1, &id_, nullptr, nullptr, &status);
    Check(status, "clCreateContext", info_);
    queue_ = clCreateCommandQueue(context_, id_, 0, &status);
    Check(status, "clCreateCommandQueue", info_);
    // One program of every source but the GEMM's (built per tiling) and the fp64 norm's (built
    // where the device has fp64), dmath.cl first: the others call its exp and log.
    // scripts/ptx-check.sh compiles the same three programs.
    std::vector<std::string_view> main_sources = {"dmath.cl"};
    for (const KernelSource& source : kKernelSources) {
      if (source.name != "dmath.cl" && source.name != "gemm.cl" && source.name != "norm.cl") {
        main_sources.push_back(source.name);
      }
    }
    main_ = Build(main_sources, "");
    if (info_.fp64) norm_ = Build({"norm.cl"}, NormDefines());
  }
  // norm.cl's constants, the contract's.
  static std::string NormDefines() {
    return fmt::format("-DBLOCK={} -DLANES={}", rk::kNormBlock, rk::kReductionLanes);
  }
  ~OpenClDevice() override {
    copies_.clear();
    rope_tables_.clear();
    for (auto& [key, kernel] : kernels_) clReleaseKernel(kernel);
    for (auto& [key, program] : gemm_) clReleaseProgram(program);
    if (main_ != nullptr) clReleaseProgram(main_);
    if (norm_ != nullptr) clReleaseProgram(norm_);
    if (queue_ != nullptr) clReleaseCommandQueue(queue_);
    if (context_ != nullptr) clReleaseContext(context_);
  }

  bool Implements(rk::Op op) const override {
    switch (op) {
      case rk::Op::kBlockSquares:
        return norm_ != nullptr;
      case rk::Op::kGlobalNorm:
      case rk::Op::kCount:
        return false;
      default:
        return true;
    }
  }

  void set_work_group(size_t size) override {
    if (size > info_.max_work_group) {
      Fail("work-group size {} exceeds the device's maximum, {}", size, info_.max_work_group);
    }
    work_group_ = size;
  }
  bool Fits(const GemmTiling& t) const override { return TilingProblem(t).empty(); }
  const GemmTiling& gemm_tiling() const override { return tiling_; }
  void set_gemm_tiling(const GemmTiling& t) override {
    if (const std::string problem = TilingProblem(t); !problem.empty()) {
      Fail("GEMM tiling {}: {}", t.Name(), problem);
    }
    tiling_ = t;
  }

  void Run(rk::Op op, const rk::OpValues& in, rk::OpValues& out) override {
    Binding io(*this, in, out);
    RunBound(op, io);
  }
  void Run(rk::Op op, const OpArgs& args, std::span<const TensorIn> inputs,
           std::span<const TensorOut> outputs) override {
    Binding io(*this, args, inputs, outputs);
    RunBound(op, io);
  }

  void Keep(std::span<const float> region) override {
    if (!region.empty()) kept_.push_back(region);
  }
  void Forget(std::span<const float> region) override {
    for (const auto& it : Overlapping(region)) copies_.erase(it);
    std::erase_if(kept_, [&](std::span<const float> r) {
      return r.data() == region.data() && r.size() == region.size();
    });
  }
  void ToHost(std::span<const float> data) override {
    for (const auto& it : Overlapping(data)) Refresh(*it->second);
  }
  void HostWrites(std::span<const float> data) override {
    for (const auto& it : Overlapping(data)) {
      const Copy& c = *it->second;
      if (c.host < data.data() || c.end() > data.data() + data.size()) Refresh(*it->second);
      copies_.erase(it);
    }
  }
  Traffic traffic() const override { return traffic_; }
  uint64_t KeptBytes() const override {
    uint64_t bytes = 0;
    for (const auto& [host, copy] : copies_) bytes += copy->floats * sizeof(float);
    return bytes;
  }

  std::vector<std::pair<std::string, std::string>> ProgramBinaries() override {
    std::vector<std::pair<std::string, std::string>> binaries;
    const auto add = [&](cl_program program, std::string name) {
      size_t size = 0;
      Check(clGetProgramInfo(program, CL_PROGRAM_BINARY_SIZES, sizeof size, &size, nullptr),
            "clGetProgramInfo", info_);
      std::string bytes(size, '\0');
      unsigned char* data = reinterpret_cast<unsigned char*>(bytes.data());
      Check(clGetProgramInfo(program, CL_PROGRAM_BINARIES, sizeof data, &data, nullptr),
            "clGetProgramInfo", info_);
      binaries.emplace_back(std::move(name), std::move(bytes));
    };
    add(main_, "main");
    if (norm_ != nullptr) add(norm_, "norm");
    const GemmTiling& t = tiling_;
    add(GemmProgram(t), fmt::format("gemm-{}x{}-{}x{}-{}{}", t.tile_m, t.tile_n, t.reg_m, t.reg_n,
                                    t.k_tile, t.double_buffer != 0 ? "-db" : ""));
    return binaries;
  }

  void ExpAndLog(std::span<const float> x, std::span<float> exp, std::span<float> log) override {
    if (exp.size() != x.size() || log.size() != x.size()) {
      Fail("ExpAndLog: {} inputs, {} and {} outputs", x.size(), exp.size(), log.size());
    }
    const auto n = static_cast<int64_t>(x.size());
    const Buffer in = Upload(x), e = Zeros(n), l = Zeros(n);
    Launch(main_, "dmath_exp_log", n, in, e, l, n);
    Download(e, exp);
    Download(l, log);
  }

  double TimeGemm(int64_t n, int repeats) override {
    if (n < 1 || repeats < 1) Fail("TimeGemm: n = {}, repeats = {} (must be >= 1)", n, repeats);
    const std::vector<float> data = rk::SelftestFloats(n * n, 1, /*specials=*/false);
    const Buffer x = Upload(data), w = Upload(data), y = Zeros(n * n);
    double best = INFINITY;
    for (int r = 0; r <= repeats; ++r) {  // the first run builds and warms up, untimed
      const auto start = std::chrono::steady_clock::now();
      Gemm(x, n, 1, w, 1, n, y, n, n, n, /*accumulate=*/false);
      Check(clFinish(queue_), "clFinish", info_);
      const std::chrono::duration<double> took = std::chrono::steady_clock::now() - start;
      if (r > 0) best = std::min(best, took.count());
    }
    return best;
  }

 private:
  friend class Binding;
  using CopyMap = std::map<const float*, std::unique_ptr<Copy>>;

  // Empty when the device can run tiling `t`, else why not: the device's limits, then the
  // compiler's for the GEMM built at `t` (its registers may allow fewer work-items).
  std::string TilingProblem(const GemmTiling& t) const {
    if (t.tile_m <= 0 || t.tile_n <= 0 || t.reg_m <= 0 || t.reg_n <= 0 || t.k_tile <= 0 ||
        t.tile_m % t.reg_m != 0 || t.tile_n % t.reg_n != 0 || 256 % t.k_tile != 0 ||
        (t.double_buffer != 0 && t.double_buffer != 1)) {
      return "tiles must be positive multiples of the register blocks, the k-slice must divide "
             "256, and double_buffer be 0 or 1";
    }
    const auto items = static_cast<uint64_t>(t.tile_m / t.reg_m * (t.tile_n / t.reg_n));
    if (items > info_.max_work_group) {
      return fmt::format("its work-group of {} items exceeds the device's {}", items,
                         info_.max_work_group);
    }
    const auto local = static_cast<uint64_t>((1 + t.double_buffer) * t.k_tile *
                                             (t.tile_m + t.tile_n)) * sizeof(float);
    if (local > info_.local_memory) {
      return fmt::format("its {} bytes of local memory exceed the device's {}", local,
                         info_.local_memory);
    }
    size_t allowed = 0;
    Check(clGetKernelWorkGroupInfo(Kernel(GemmProgram(t), "gemm"), id_, CL_KERNEL_WORK_GROUP_SIZE,
                                   sizeof allowed, &allowed, nullptr),
          "clGetKernelWorkGroupInfo", info_);
    if (items > allowed) {
      return fmt::format(
          "its work-group of {} items exceeds the {} the device's compiler allows "
          "its GEMM kernel (CL_KERNEL_WORK_GROUP_SIZE)",
          items, allowed);
    }
    return "";
  }

  void RunBound(rk::Op op, Binding& io);

  bool InKeptRegion(std::span<const float> data) const {
    return !data.empty() && std::ranges::any_of(kept_, [&](std::span<const float> r) {
             return data.data() >= r.data() && data.data() + data.size() <= r.data() + r.size();
           });
  }
  // The copies overlapping `data` (they never overlap each other).
  std::vector<CopyMap::iterator> Overlapping(std::span<const float> data) {
    std::vector<CopyMap::iterator> found;
    if (data.empty()) return found;
    auto it = copies_.upper_bound(data.data());
    if (it != copies_.begin() && std::prev(it)->second->end() > data.data()) --it;
    for (; it != copies_.end() && it->first < data.data() + data.size(); ++it) found.push_back(it);
    return found;
  }
  // The host's bytes of `c` made current.
  void Refresh(Copy& c) {
    if (c.host_current) return;
    Download(c.buffer, {const_cast<float*>(c.host), c.floats});
    c.host_current = true;
  }
  // The kept copy of `data` (null when it lies in no kept region): the one of exactly its extent,
  // or a new one (host current) after any copy overlapping it is brought back and dropped.
  Copy* Resident(std::span<const float> data) {
    if (!InKeptRegion(data)) return nullptr;
    const std::vector<CopyMap::iterator> overlap = Overlapping(data);
    if (overlap.size() == 1 && overlap[0]->first == data.data() &&
        overlap[0]->second->floats == data.size()) {
      return overlap[0]->second.get();
    }
    for (const auto& it : overlap) {
      if (std::ranges::find(in_use_, it->second.get()) != in_use_.end()) {
        LOCKSTEP_INTERNAL("two tensors of one op call overlap in part on the device");
      }
      Refresh(*it->second);
      copies_.erase(it);
    }
    auto copy = std::make_unique<Copy>();
    copy->host = data.data();
    copy->floats = data.size();
    copy->buffer = Buffer(context_, data.size_bytes(), info_);
    return (copies_[data.data()] = std::move(copy)).get();
  }
  bool StillKept(const Copy* c) const {
    const auto it = copies_.find(c->host);
    return it != copies_.end() && it->second.get() == c;
  }
  void MakeDeviceCurrent(Copy& c) {
    if (c.device_current) return;
    Write(c.buffer, std::as_bytes(std::span(c.host, c.floats)));
    c.device_current = true;
  }

  cl_program Build(const std::vector<std::string_view>& files, const std::string& defines) const {
    std::vector<std::string> texts;
    for (const std::string_view file : files) {
      const auto it = std::ranges::find(kKernelSources, file, &KernelSource::name);
      if (it == std::end(kKernelSources)) LOCKSTEP_INTERNAL("no kernel source {}", file);
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
    const std::string options = fmt::format("{} {}", BuildOptions(), defines);
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
        Check(status, fmt::format("clBuildProgram of {}", fmt::join(files, ", ")), info_);
      }
      Fail(
          "{}: its OpenCL compiler rejected lockstep's kernels ({}: {}): choose another device "
          "(`lockstep --version` lists them) or --device cpu; the compiler's log follows, for a "
          "bug report:\n{}",
          DeviceFlag(info_), fmt::join(files, ", "), Described(status), log);
    }
    return program;
  }

  // The GEMM's program at tiling `t`, built once.
  cl_program GemmProgram(const GemmTiling& t) const {
    const auto key = std::array{t.tile_m, t.tile_n, t.reg_m, t.reg_n, t.k_tile, t.double_buffer};
    if (const auto it = gemm_.find(key); it != gemm_.end()) return it->second;
    const std::string defines = fmt::format(
        "-DTILE_M={} -DTILE_N={} -DREG_M={} -DREG_N={} -DK_TILE={} -DDOUBLE_BUFFER={}", t.tile_m,
        t.tile_n, t.reg_m, t.reg_n, t.k_tile, t.double_buffer);
    return gemm_[key] = Build({"gemm.cl"}, defines);
  }
  // RoPE's cos and sin tables (rk::MakeRopeTable) on the device, made once per shape.
  const std::pair<Buffer, Buffer>& RopeTables(int64_t seq, int64_t head_dim, float theta) {
    const auto key = std::tuple{seq, head_dim, std::bit_cast<uint32_t>(theta)};
    if (const auto it = rope_tables_.find(key); it != rope_tables_.end()) return it->second;
    const rk::RopeTable table = rk::MakeRopeTable(seq, head_dim, theta);
    return rope_tables_[key] = {Upload(table.cos), Upload(table.sin)};
  }
  // Kernel `name` of `program`, created once.
  cl_kernel Kernel(cl_program program, const char* name) const {
    const auto key = std::pair{program, std::string(name)};
    if (const auto it = kernels_.find(key); it != kernels_.end()) return it->second;
    cl_int status = CL_SUCCESS;
    cl_kernel kernel = clCreateKernel(program, name, &status);
    Check(status, fmt::format("clCreateKernel {}", name), info_);
    return kernels_[key] = kernel;
  }

  // Host to device and back; the queue is in order, so a read sees every kernel enqueued before.
  void Write(const Buffer& b, std::span<const std::byte> bytes) {
    if (bytes.empty()) return;
    Check(clEnqueueWriteBuffer(queue_, b.get(), CL_TRUE, 0, bytes.size(), bytes.data(), 0, nullptr,
                               nullptr),
          "clEnqueueWriteBuffer", info_);
    traffic_.to_device += bytes.size();
  }
  void Download(const Buffer& b, std::span<std::byte> to) {
    if (to.size() != b.bytes()) {
      LOCKSTEP_INTERNAL("reading {} bytes of a device buffer into {}", b.bytes(), to.size());
    }
    if (to.empty()) return;
    Check(
        clEnqueueReadBuffer(queue_, b.get(), CL_TRUE, 0, to.size(), to.data(), 0, nullptr, nullptr),
        "clEnqueueReadBuffer", info_);
    traffic_.to_host += to.size();
  }
  void Download(const Buffer& b, std::span<float> to) { Download(b, std::as_writable_bytes(to)); }
  Buffer Upload(std::span<const std::byte> bytes) {
    Buffer b(context_, bytes.size(), info_);
    Write(b, bytes);
    return b;
  }
  Buffer Upload(std::span<const float> v) { return Upload(std::as_bytes(v)); }
  Buffer Upload(std::span<const uint32_t> v) { return Upload(std::as_bytes(v)); }
  void FillZeros(const Buffer& b) {
    if (b.bytes() == 0) return;
    const float zero = 0.0f;
    Check(
        clEnqueueFillBuffer(queue_, b.get(), &zero, sizeof zero, 0, b.bytes(), 0, nullptr, nullptr),
        "clEnqueueFillBuffer", info_);
  }
  Buffer Zeros(int64_t floats) {
    Buffer b(context_, static_cast<size_t>(floats) * sizeof(float), info_);
    FillZeros(b);
    return b;
  }
  void CopyBuffer(const Buffer& from, const Buffer& to) {
    if (from.bytes() != to.bytes()) LOCKSTEP_INTERNAL("copying unequal device buffers");
    if (from.bytes() == 0) return;
    Check(
        clEnqueueCopyBuffer(queue_, from.get(), to.get(), 0, 0, from.bytes(), 0, nullptr, nullptr),
        "clEnqueueCopyBuffer", info_);
  }

  // Enqueues kernel `name` of `program` over `items` work-items (one-dimensional, padded up to a
  // multiple of the work-group size; each kernel ignores the items past its end) with `args`.
  template <typename... Args>
  void Launch(cl_program program, const char* name, int64_t items, const Args&... args) {
    if (items <= 0) return;
    cl_kernel kernel = Kernel(program, name);
    cl_uint index = 0;
    (SetArg(kernel, index++, args), ...);
    const size_t local = work_group_;
    size_t global = static_cast<size_t>(items);
    if (local > 0) global = (global + local - 1) / local * local;
    Check(clEnqueueNDRangeKernel(queue_, kernel, 1, nullptr, &global, local > 0 ? &local : nullptr,
                                 0, nullptr, nullptr),
          fmt::format("clEnqueueNDRangeKernel {}", name), info_);
  }
  static void SetArg(cl_kernel k, cl_uint i, const Buffer& b) {
    const cl_mem mem = b.get();
    Check(clSetKernelArg(k, i, sizeof mem, &mem), "clSetKernelArg");
  }
  static void SetArg(cl_kernel k, cl_uint i, int64_t v) {
    const cl_long x = v;
    Check(clSetKernelArg(k, i, sizeof x, &x), "clSetKernelArg");
  }
  static void SetArg(cl_kernel k, cl_uint i, int v) {
    const cl_int x = v;
    Check(clSetKernelArg(k, i, sizeof x, &x), "clSetKernelArg");
  }
  static void SetArg(cl_kernel k, cl_uint i, float v) {
    Check(clSetKernelArg(k, i, sizeof v, &v), "clSetKernelArg");
  }

  // C[rows, cols] (+)= A·B in the contract's chunk order; strides as in gemm.cl.
  void Gemm(const Buffer& a, int64_t a_i, int64_t a_r, const Buffer& b, int64_t b_r, int64_t b_j,
            const Buffer& c, int64_t rows, int64_t cols, int64_t reduced, bool accumulate);

  cl_device_id id_;
  Mutation mutation_;
  cl_context context_ = nullptr;
  cl_command_queue queue_ = nullptr;
  cl_program main_ = nullptr;
  cl_program norm_ = nullptr;  // norm.cl, on a device with fp64
  // Caches: built or created at first use, by Fits too.
  mutable std::map<std::array<int, 6>, cl_program> gemm_;
  mutable std::map<std::pair<cl_program, std::string>, cl_kernel> kernels_;
  std::map<std::tuple<int64_t, int64_t, uint32_t>, std::pair<Buffer, Buffer>> rope_tables_;
  GemmTiling tiling_;
  size_t work_group_ = 0;
  std::vector<std::span<const float>> kept_;
  CopyMap copies_;
  std::vector<const Copy*> in_use_;  // by the op call being bound
  Traffic traffic_;
};

Binding::Binding(OpenClDevice& device, const rk::OpValues& in, rk::OpValues& out)
    : device_(device), args_(&in), values_out_(&out) {
  for (const auto& [role, v] : in.f32) inputs_.push_back({role, v, {}});
  for (const auto& [role, v] : in.u32) inputs_.push_back({role, {}, v});
}

Binding::Binding(OpenClDevice& device, const OpArgs& args, std::span<const TensorIn> inputs,
                 std::span<const TensorOut> outputs)
    : device_(device), args_(&own_args_), outputs_(outputs) {
  own_args_.args = args;
  for (const TensorIn& t : inputs) inputs_.push_back({t.role, t.f32, t.u32});
}

Binding::~Binding() { device_.in_use_.clear(); }

const Binding::InTensor* Binding::FindIn(std::string_view role) const {
  const auto it = std::ranges::find(inputs_, role, &InTensor::role);
  return it == inputs_.end() ? nullptr : &*it;
}
const Binding::InTensor& Binding::Input(std::string_view role) const {
  const InTensor* t = FindIn(role);
  if (t == nullptr) LOCKSTEP_INTERNAL("the op call on the device has no input '{}'", role);
  return *t;
}
Binding::InTensor& Binding::Input(std::string_view role) {
  return const_cast<InTensor&>(std::as_const(*this).Input(role));
}

const Buffer& Binding::In(std::string_view role) {
  InTensor& t = Input(role);
  if (t.buffer != nullptr) return *t.buffer;
  if ((t.copy = device_.Resident(t.f32)) != nullptr) {
    device_.in_use_.push_back(t.copy);
    device_.MakeDeviceCurrent(*t.copy);
    return *(t.buffer = &t.copy->buffer);
  }
  return *(t.buffer = &temporaries_.emplace_back(device_.Upload(t.f32)));
}

const Buffer& Binding::InU(std::string_view role) {
  InTensor& t = Input(role);
  if (t.buffer == nullptr) t.buffer = &temporaries_.emplace_back(device_.Upload(t.u32));
  return *t.buffer;
}

std::span<float> Binding::Target(std::string_view role, int64_t elements) {
  if (values_out_ != nullptr) {
    std::vector<float>& v = values_out_->f32[std::string(role)];
    v.resize(static_cast<size_t>(elements));
    return v;
  }
  const auto it = std::ranges::find(outputs_, role, &TensorOut::role);
  if (it == outputs_.end() || it->f32.size() != static_cast<size_t>(elements)) {
    LOCKSTEP_INTERNAL("the op call on the device has no output '{}' of {} floats", role,
         elements);
  }
  return it->f32;
}

const Buffer& Binding::Out(std::string_view role, int64_t elements) {
  OutTensor o{role, Target(role, elements)};
  if (Has(role)) {  // in place: the input of the same role, at the same address when kept
    InTensor& in = Input(role);
    o.in_place = true;
    o.buffer = &In(role);
    o.copy = in.copy;
    if (o.copy != nullptr && o.target.data() != in.f32.data()) {
      LOCKSTEP_INTERNAL("{} is updated in place on the device but given at another address",
           role);
    }
  } else if ((o.copy = device_.Resident(o.target)) != nullptr) {
    device_.in_use_.push_back(o.copy);
    // A kept output that an input of another role also is (an op in place under two names)
    // is written to a temporary first: no kernel reads and writes one buffer under two names,
    // and the input is read whether it is bound before the output or after.
    o.via_temp = std::ranges::any_of(inputs_, [&](const InTensor& t) {
      return !t.f32.empty() && t.f32.data() < o.target.data() + o.target.size() &&
             o.target.data() < t.f32.data() + t.f32.size();
    });
    if (o.via_temp) {
      o.buffer = &Scratch(elements);
    } else {
      device_.FillZeros(o.copy->buffer);
      o.buffer = &o.copy->buffer;
    }
  } else {
    o.buffer = &Scratch(elements);
  }
  return *bound_.emplace_back(o).buffer;
}

const Buffer& Binding::OutF64(std::string_view role, int64_t elements) {
  OutTensor o{role, {}};
  if (values_out_ != nullptr) {
    std::vector<double>& v = values_out_->f64[std::string(role)];
    v.resize(static_cast<size_t>(elements));
    o.f64 = v;
  } else {
    const auto it = std::ranges::find(outputs_, role, &TensorOut::role);
    if (it == outputs_.end() || it->f64.size() != static_cast<size_t>(elements)) {
      LOCKSTEP_INTERNAL("the op call on the device has no fp64 output '{}' of {} values", role,
                        elements);
    }
    o.f64 = it->f64;
  }
  o.buffer = &Scratch(2 * elements);  // a double is two floats' bytes
  return *bound_.emplace_back(o).buffer;
}

const Buffer& Binding::Scratch(int64_t floats) {
  return temporaries_.emplace_back(device_.Zeros(floats));
}

void Binding::Finish() {
  for (const OutTensor& o : bound_) {
    if (!o.f64.empty()) {
      device_.Download(*o.buffer, std::as_writable_bytes(o.f64));
      continue;
    }
    if (o.copy == nullptr) {
      device_.Download(*o.buffer, o.target);
      continue;
    }
    if (!device_.StillKept(o.copy)) {
      LOCKSTEP_INTERNAL("the device copy of {} was dropped during the op that writes it",
           o.role);
    }
    if (o.via_temp) device_.CopyBuffer(*o.buffer, o.copy->buffer);
    o.copy->device_current = true;
    o.copy->host_current = false;
  }
}

void OpenClDevice::Gemm(const Buffer& a, int64_t a_i, int64_t a_r, const Buffer& b, int64_t b_r,
                        int64_t b_j, const Buffer& c, int64_t rows, int64_t cols, int64_t reduced,
                        bool accumulate) {
  if (rows <= 0 || cols <= 0) return;
  const GemmTiling& t = tiling_;
  cl_kernel kernel = Kernel(GemmProgram(t), "gemm");
  cl_uint index = 0;
  SetArg(kernel, index++, a);
  SetArg(kernel, index++, a_i);
  SetArg(kernel, index++, a_r);
  SetArg(kernel, index++, b);
  SetArg(kernel, index++, b_r);
  SetArg(kernel, index++, b_j);
  SetArg(kernel, index++, c);
  SetArg(kernel, index++, rows);
  SetArg(kernel, index++, cols);
  SetArg(kernel, index++, reduced);
  SetArg(kernel, index++, accumulate ? 1 : 0);
  const size_t local[2] = {static_cast<size_t>(t.tile_n / t.reg_n),
                           static_cast<size_t>(t.tile_m / t.reg_m)};
  const size_t global[2] = {static_cast<size_t>((cols + t.tile_n - 1) / t.tile_n) * local[0],
                            static_cast<size_t>((rows + t.tile_m - 1) / t.tile_m) * local[1]};
  Check(clEnqueueNDRangeKernel(queue_, kernel, 2, nullptr, global, local, 0, nullptr, nullptr),
        "clEnqueueNDRangeKernel gemm", info_);
}

void OpenClDevice::RunBound(rk::Op op, Binding& io) {
  const rk::OpSpec& spec = rk::Spec(op);
  if (!Implements(op)) Fail("op {} does not run on the OpenCL device yet", spec.name);
  const std::string_view name = spec.name;
  const auto positive = [&](std::string_view arg) {
    const int64_t v = io.Int(arg);
    if (v < 1) Fail("{} on the device: {} = {} (must be >= 1)", name, arg, v);
    return v;
  };
  switch (op) {
    case rk::Op::kGemmXWt:
    case rk::Op::kGemmDyW:
    case rk::Op::kGemmDytX: {
      const int64_t m = io.Int("m"), n = io.Int("n"), k = io.Int("k");
      if (m < 0 || n < 0 || k < 0) Fail("{}: m, n, k = {}, {}, {} (must be >= 0)", name, m, n, k);
      const bool accumulate = io.Int("accumulate") != 0;
      // (a, b, output role, output rows, columns, reduced length, strides)
      const bool xwt = op == rk::Op::kGemmXWt, dyw = op == rk::Op::kGemmDyW;
      const std::string_view a_role = xwt ? "x" : "dy", b_role = xwt || dyw ? "w" : "x";
      const std::string_view c_role = xwt ? "y" : dyw ? "dx" : "dw";
      const int64_t rows = xwt || dyw ? m : n, cols = xwt ? n : k, reduced = xwt ? k : dyw ? n : m;
      CheckElements(name, a_role, io.Size(a_role), xwt ? m * k : m * n);
      CheckElements(name, b_role, io.Size(b_role), xwt || dyw ? n * k : m * k);
      if (accumulate) CheckElements(name, c_role, io.Size(c_role), rows * cols);
      const Buffer &a = io.In(a_role), &b = io.In(b_role), &c = io.Out(c_role, rows * cols);
      if (xwt) Gemm(a, k, 1, b, 1, k, c, rows, cols, reduced, accumulate);
      if (dyw) Gemm(a, n, 1, b, k, 1, c, rows, cols, reduced, accumulate);
      if (!xwt && !dyw) Gemm(a, 1, n, b, k, 1, c, rows, cols, reduced, accumulate);
      break;
    }
    case rk::Op::kAddInto: {
      const int64_t n = io.Size("x");
      CheckElements(name, "y", io.Size("y"), n);
      Launch(main_, "add_into", n, io.In("x"), io.Out("y", n), n);
      break;
    }
    case rk::Op::kCopy: {
      const int64_t n = io.Size("x");
      Launch(main_, "copy", n, io.In("x"), io.Out("y", n), n);
      break;
    }
    case rk::Op::kScale: {
      const float factor = io.Float("factor");
      if (!std::isfinite(factor)) Fail("{}: factor = {} (must be finite)", name, factor);
      const int64_t n = io.Size("x");
      Launch(main_, "scale", n, io.Out("x", n), factor, n);
      break;
    }
    case rk::Op::kBlockSquares: {
      const int64_t n = io.Size("x"), blocks = (n + rk::kNormBlock - 1) / rk::kNormBlock;
      const Buffer& lanes = io.Scratch(2 * blocks * rk::kReductionLanes);
      Launch(norm_, "block_square_lanes", blocks * rk::kReductionLanes, io.In("x"), n, lanes,
             blocks);
      Launch(norm_, "block_square_fold", blocks, lanes, io.OutF64("sums", blocks), blocks);
      break;
    }
    case rk::Op::kCanonicalizeNaNs: {
      const int64_t n = io.Size("x");
      Launch(main_, "canonicalize_nans", n, io.Out("x", n), n);
      break;
    }
    case rk::Op::kAdamW: {
      const rk::AdamWParams p{io.Float("lr"),  io.Float("beta1"),        io.Float("beta2"),
                              io.Float("eps"), io.Float("weight_decay"), io.Int("step")};
      const rk::AdamWScalars s = rk::AdamWScalarsOf(p);  // validates the arguments
      const int64_t n = io.Size("param");
      for (const char* role : {"grad", "m", "v"}) CheckElements(name, role, io.Size(role), n);
      Launch(main_, "adamw", n, io.Out("param", n), io.In("grad"), io.Out("m", n), io.Out("v", n),
             s.decay, s.beta1, s.one_minus_beta1, s.beta2, s.one_minus_beta2, s.sqrt_bc2, s.eps,
             s.step_size, n);
      break;
    }
    case rk::Op::kSwigluFwd:
    case rk::Op::kSwigluBwd: {
      const int64_t rows = positive("rows"), f = positive("f");
      CheckElements(name, "gu", io.Size("gu"), rows * 2 * f);
      if (op == rk::Op::kSwigluFwd) {
        Launch(main_, "swiglu_fwd", rows * f, io.In("gu"), io.Out("act", rows * f), rows, f);
      } else {
        CheckElements(name, "dact", io.Size("dact"), rows * f);
        Launch(main_, "swiglu_bwd", rows * f, io.In("gu"), io.In("dact"),
               io.Out("dgu", rows * 2 * f), rows, f);
      }
      break;
    }
    case rk::Op::kAttentionFwd:
    case rk::Op::kAttentionBwd: {
      const int64_t batch = positive("batch"), seq = positive("seq"), q_heads = positive("q_heads"),
                    kv_heads = positive("kv_heads"), d = positive("head_dim"),
                    window = io.Int("window");
      const float scale = io.Float("scale");
      if (q_heads % kv_heads != 0) {
        Fail("{}: q_heads = {} is not a multiple of kv_heads = {}", name, q_heads, kv_heads);
      }
      if (window < 0) Fail("{}: window = {} (must be >= 0)", name, window);
      if (!(scale > 0) || !std::isfinite(scale)) Fail("{}: scale = {} (must be > 0)", name, scale);
      const int64_t nq = batch * seq * q_heads * d, nkv = batch * seq * kv_heads * d;
      const int64_t rows = batch * q_heads * seq;
      CheckElements(name, "q", io.Size("q"), nq);
      CheckElements(name, "k", io.Size("k"), nkv);
      CheckElements(name, "v", io.Size("v"), nkv);
      const Buffer &q = io.In("q"), &k = io.In("k"), &v = io.In("v");
      if (op == rk::Op::kAttentionFwd) {
        Launch(main_, "attention_fwd", rows, q, k, v, io.Out("out", nq), io.Out("lse", rows),
               batch, seq, q_heads, kv_heads, d, window, scale);
        break;
      }
      CheckElements(name, "out", io.Size("out"), nq);
      CheckElements(name, "dout", io.Size("dout"), nq);
      CheckElements(name, "lse", io.Size("lse"), rows);
      const Buffer &o = io.In("out"), &dout = io.In("dout"), &lse = io.In("lse");
      const Buffer& delta = io.Scratch(rows);
      const Buffer &dq = io.Out("dq", nq), &dk = io.Out("dk", nkv), &dv = io.Out("dv", nkv);
      Launch(main_, "attention_delta", rows, dout, o, delta, batch, seq, q_heads, d);
      Launch(main_, "attention_dq", rows, q, k, v, dout, lse, delta, dq, batch, seq, q_heads,
             kv_heads, d, window, scale);
      Launch(main_, "attention_dkv", batch * seq * kv_heads, q, k, v, dout, lse, delta, dk, dv,
             batch, seq, q_heads, kv_heads, d, window, scale);
      break;
    }
    case rk::Op::kCrossEntropyFwd:
    case rk::Op::kCrossEntropyBwd: {
      const int64_t rows = positive("rows"), d = positive("d"), vocab = positive("vocab"),
                    chunk = positive("vocab_chunk");
      const float z_loss = io.Float("z_loss");
      if (chunk % rk::kGemmKChunk != 0) {
        Fail("{}: vocab_chunk = {} (must be a positive multiple of {})", name, chunk,
             rk::kGemmKChunk);
      }
      if (!(z_loss >= 0) || !std::isfinite(z_loss)) {
        Fail("{}: z_loss = {} (must be finite and >= 0)", name, z_loss);
      }
      CheckElements(name, "h", io.Size("h"), rows * d);
      CheckElements(name, "w", io.Size("w"), vocab * d);
      const std::span<const uint32_t> target_ids = io.U("targets");
      CheckElements(name, "targets", static_cast<int64_t>(target_ids.size()), rows);
      for (size_t r = 0; r < target_ids.size(); ++r) {
        if (target_ids[r] >= static_cast<uint64_t>(vocab)) {
          Fail("{}: targets[{}] = {} is out of range (vocab = {})", name, r, target_ids[r], vocab);
        }
      }
      // The logits, every chunk at once: each logit's bits do not depend on the chunk.
      const Buffer &h = io.In("h"), &w = io.In("w"), &targets = io.InU("targets");
      const Buffer& z = io.Scratch(rows * vocab);
      Gemm(h, d, 1, w, 1, d, z, rows, vocab, d, /*accumulate=*/false);
      if (op == rk::Op::kCrossEntropyFwd) {
        Launch(main_, "cross_entropy_fwd", rows, z, targets, io.Out("loss", rows),
               io.Out("zloss", rows), io.Out("lse", rows), rows, vocab, z_loss);
        break;
      }
      const float grad_scale = io.Float("grad_scale");
      if (!std::isfinite(grad_scale)) Fail("{}: grad_scale = {} (must be finite)", name, grad_scale);
      CheckElements(name, "lse", io.Size("lse"), rows);
      CheckElements(name, "dw", io.Size("dw"), vocab * d);
      Launch(main_, "cross_entropy_dz", rows * vocab, z, targets, io.In("lse"), rows, vocab,
             z_loss, grad_scale);
      // dh = dz · w over the whole vocab (the chunked sequence of the contract is this GEMM);
      // dw += dzᵀ · h.
      Gemm(z, vocab, 1, w, d, 1, io.Out("dh", rows * d), rows, d, vocab, /*accumulate=*/false);
      Gemm(z, 1, vocab, h, d, 1, io.Out("dw", vocab * d), vocab, d, rows, /*accumulate=*/true);
      break;
    }
    case rk::Op::kRowSum: {
      const int64_t rows = positive("rows"), cols = io.Int("cols");
      CheckElements(name, "x", io.Size("x"), rows * cols);
      Launch(main_, "row_sum", rows, io.In("x"), io.Out("sum", rows), rows, cols);
      break;
    }
    case rk::Op::kRmsNormFwd: {
      const int64_t rows = positive("rows"), cols = positive("cols");
      const float eps = io.Float("eps");
      if (!(eps > 0) || !std::isfinite(eps)) Fail("{}: eps = {} (must be > 0)", name, eps);
      CheckElements(name, "x", io.Size("x"), rows * cols);
      const bool has_gain = io.Has("gain");
      if (has_gain) CheckElements(name, "gain", io.Size("gain"), cols);
      Launch(main_, "rmsnorm_fwd", rows, io.In("x"), has_gain ? io.In("gain") : io.Scratch(0),
             has_gain ? 1 : 0, eps, 1.0f / static_cast<float>(cols), io.Out("y", rows * cols),
             io.Out("rstd", rows), rows, cols);
      break;
    }
    case rk::Op::kRmsNormBwd: {
      const int64_t rows = positive("rows"), cols = positive("cols");
      for (const char* role : {"dy", "x"}) CheckElements(name, role, io.Size(role), rows * cols);
      CheckElements(name, "rstd", io.Size("rstd"), rows);
      const bool has_gain = io.Has("gain");
      if (has_gain) CheckElements(name, "gain", io.Size("gain"), cols);
      const Buffer &dy = io.In("dy"), &x = io.In("x"), &rstd = io.In("rstd");
      const Buffer& gain = has_gain ? io.In("gain") : io.Scratch(0);
      Launch(main_, "rmsnorm_bwd", rows, dy, x, gain, has_gain ? 1 : 0, rstd,
             1.0f / static_cast<float>(cols), io.Out("dx", rows * cols), rows, cols);
      if (has_gain) {
        Launch(main_, "rmsnorm_dgain", cols, dy, x, rstd, io.Out("dgain", cols), rows, cols);
      }
      break;
    }
    case rk::Op::kRopeFwd:
    case rk::Op::kRopeBwd: {
      const bool inverse = op == rk::Op::kRopeBwd;
      const std::string_view x_role = inverse ? "dy" : "x", y_role = inverse ? "dx" : "y";
      const int64_t batch = positive("batch"), seq = positive("seq"), heads = positive("heads"),
                    head_dim = positive("head_dim"), table_seq = positive("table_seq");
      if (seq > table_seq) Fail("{}: seq = {} exceeds table_seq = {}", name, seq, table_seq);
      const int64_t n = batch * seq * heads * head_dim;
      CheckElements(name, x_role, io.Size(x_role), n);
      const auto& [cos, sin] = RopeTables(table_seq, head_dim, io.Float("theta"));
      Launch(main_, "rope", n / 2, io.In(x_role), io.Out(y_role, n), cos, sin, seq, heads,
             head_dim / 2, n / 2, inverse ? 1 : 0);
      break;
    }
    case rk::Op::kEmbeddingFwd:
    case rk::Op::kEmbeddingBwd: {
      const int64_t vocab = positive("vocab"), d = positive("d");
      const std::span<const uint32_t> ids = io.U("ids");
      for (size_t i = 0; i < ids.size(); ++i) {
        if (ids[i] >= static_cast<uint64_t>(vocab)) {
          Fail("{}: ids[{}] = {} is out of range (vocab = {})", name, i, ids[i], vocab);
        }
      }
      const auto n = static_cast<int64_t>(ids.size());
      if (op == rk::Op::kEmbeddingFwd) {
        CheckElements(name, "table", io.Size("table"), vocab * d);
        Launch(main_, "embedding_fwd", n * d, io.In("table"), io.InU("ids"), io.Out("out", n * d),
               n, d);
      } else {
        CheckElements(name, "dout", io.Size("dout"), n * d);
        CheckElements(name, "dtable", io.Size("dtable"), vocab * d);
        Launch(main_, "embedding_bwd", d, io.In("dout"), io.InU("ids"),
               io.Out("dtable", vocab * d), n, d);
      }
      break;
    }
    default:
      LOCKSTEP_INTERNAL("op {} is listed as implemented but has no device code", name);
  }
  io.Finish();
}

std::unique_ptr<Device> OpenChecked(const DeviceChoice& choice, const Mutation& mutation) {
  const std::vector<cl_platform_id> platforms = Platforms();
  if (platforms.empty()) {
    Fail("--device opencl: no OpenCL platform is installed (Debian: pocl-opencl-icd for the CPU, "
         "or the GPU vendor's ICD); `lockstep --version` lists the devices");
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
  return std::make_unique<OpenClDevice>(std::move(info), id, mutation);
}

}  // namespace

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

std::unique_ptr<Device> Open(const DeviceChoice& choice) { return OpenChecked(choice, {}); }
std::unique_ptr<Device> OpenMutated(const DeviceChoice& choice, const Mutation& mutation) {
  return OpenChecked(choice, mutation);
}

#endif  // LOCKSTEP_WITH_OPENCL

}  // namespace lockstep::device
