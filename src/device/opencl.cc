// The OpenCL runtime of the device layer (include/lockstep/device.h): platforms and devices, the
// contract's FP-config check, program builds with the contract's options, buffers, and the ops of
// the op table run on the device.
#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <charconv>
#include <chrono>
#include <cmath>
#include <map>

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

void Check(cl_int status, std::string_view what) {
  if (status != CL_SUCCESS) Fail("OpenCL: {} failed with error {}", what, status);
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
  info.max_work_group = DeviceValue<size_t>(id, CL_DEVICE_MAX_WORK_GROUP_SIZE);
  const auto fp = DeviceValue<cl_device_fp_config>(id, CL_DEVICE_SINGLE_FP_CONFIG);
  info.denorm = (fp & CL_FP_DENORM) != 0;
  info.fma = (fp & CL_FP_FMA) != 0;
  info.correctly_rounded_divide_sqrt = (fp & CL_FP_CORRECTLY_ROUNDED_DIVIDE_SQRT) != 0;
  return info;
}

// A device buffer of `bytes` bytes, released with its owner.
class Buffer {
 public:
  Buffer() = default;
  Buffer(cl_context context, size_t bytes) : bytes_(bytes) {
    cl_int status = CL_SUCCESS;
    // A zero-byte buffer is invalid in OpenCL: an empty tensor gets one unused word.
    mem_ = clCreateBuffer(context, CL_MEM_READ_WRITE, std::max<size_t>(bytes, 4), nullptr,
                          &status);
    Check(status, fmt::format("clCreateBuffer of {} bytes", bytes));
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
void CheckElements(std::string_view op, std::string_view role, size_t size, int64_t expected) {
  if (expected < 0 || size != static_cast<size_t>(expected)) {
    Fail("{} on the device: {} has {} elements, expected {}", op, role, size, expected);
  }
}

class OpenClDevice final : public Device {
 public:
  OpenClDevice(DeviceInfo info, cl_device_id id, Mutation mutation)
      : Device(std::move(info)), id_(id), mutation_(std::move(mutation)) {
    cl_int status = CL_SUCCESS;
    context_ = clCreateContext(nullptr, 1, &id_, nullptr, nullptr, &status);
    Check(status, "clCreateContext");
    queue_ = clCreateCommandQueue(context_, id_, 0, &status);
    Check(status, "clCreateCommandQueue");
    // One program of every source but the GEMM's (built per tiling), dmath.cl first: the others
    // call its exp and log. scripts/ptx-check.sh compiles the same two programs.
    std::vector<std::string_view> main_sources = {"dmath.cl"};
    for (const KernelSource& source : kKernelSources) {
      if (source.name != "dmath.cl" && source.name != "gemm.cl") main_sources.push_back(source.name);
    }
    main_ = Build(main_sources, "");
  }
  ~OpenClDevice() override {
    for (auto& [key, program] : gemm_) clReleaseProgram(program);
    if (main_ != nullptr) clReleaseProgram(main_);
    if (queue_ != nullptr) clReleaseCommandQueue(queue_);
    if (context_ != nullptr) clReleaseContext(context_);
  }

  bool Implements(rk::Op op) const override {
    switch (op) {
      case rk::Op::kBlockSquares:
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
  void set_gemm_tiling(const GemmTiling& t) override {
    const bool valid = t.tile_m > 0 && t.tile_n > 0 && t.reg_m > 0 && t.reg_n > 0 &&
                       t.k_tile > 0 && t.tile_m % t.reg_m == 0 && t.tile_n % t.reg_n == 0 &&
                       256 % t.k_tile == 0 &&
                       static_cast<uint64_t>(t.tile_m / t.reg_m * (t.tile_n / t.reg_n)) <=
                           info_.max_work_group;
    if (!valid) {
      Fail("GEMM tiling {}x{} (registers {}x{}, k-slice {}): tiles must be multiples of the "
           "register blocks, the k-slice must divide 256, and the work-group ({} items) fit the "
           "device's {}",
           t.tile_m, t.tile_n, t.reg_m, t.reg_n, t.k_tile,
           (t.tile_m / std::max(t.reg_m, 1)) * (t.tile_n / std::max(t.reg_n, 1)),
           info_.max_work_group);
    }
    tiling_ = t;
  }

  void Run(rk::Op op, const rk::OpValues& in, rk::OpValues& out) override;

  std::vector<std::pair<std::string, std::string>> ProgramBinaries() override {
    std::vector<std::pair<std::string, std::string>> binaries;
    const auto add = [&](cl_program program, std::string name) {
      size_t size = 0;
      Check(clGetProgramInfo(program, CL_PROGRAM_BINARY_SIZES, sizeof size, &size, nullptr),
            "clGetProgramInfo");
      std::string bytes(size, '\0');
      unsigned char* data = reinterpret_cast<unsigned char*>(bytes.data());
      Check(clGetProgramInfo(program, CL_PROGRAM_BINARIES, sizeof data, &data, nullptr),
            "clGetProgramInfo");
      binaries.emplace_back(std::move(name), std::move(bytes));
    };
    add(main_, "main");
    const GemmTiling& t = tiling_;
    add(GemmProgram(),
        fmt::format("gemm-{}x{}-{}x{}-{}", t.tile_m, t.tile_n, t.reg_m, t.reg_n, t.k_tile));
    return binaries;
  }

  void ExpAndLog(std::span<const float> x, std::span<float> exp, std::span<float> log) override {
    if (exp.size() != x.size() || log.size() != x.size()) {
      Fail("ExpAndLog: {} inputs, {} and {} outputs", x.size(), exp.size(), log.size());
    }
    const auto n = static_cast<int64_t>(x.size());
    const Buffer in = Upload(x), e = Zeros(n), l = Zeros(n);
    Launch(main_, "dmath_exp_log", n, in, e, l, n);
    std::ranges::copy(Download(e), exp.begin());
    std::ranges::copy(Download(l), log.begin());
  }

  double TimeGemm(int64_t n, int repeats) override {
    if (n < 1 || repeats < 1) Fail("TimeGemm: n = {}, repeats = {} (must be >= 1)", n, repeats);
    const std::vector<float> data = rk::SelftestFloats(n * n, 1, /*specials=*/false);
    const Buffer x = Upload(data), w = Upload(data), y = Zeros(n * n);
    double best = INFINITY;
    for (int r = 0; r <= repeats; ++r) {  // the first run builds and warms up, untimed
      const auto start = std::chrono::steady_clock::now();
      Gemm(x, n, 1, w, 1, n, y, n, n, n, /*accumulate=*/false);  // ends with clFinish
      const std::chrono::duration<double> took = std::chrono::steady_clock::now() - start;
      if (r > 0) best = std::min(best, took.count());
    }
    return best;
  }

 private:
  cl_program Build(const std::vector<std::string_view>& files, const std::string& defines) {
    std::vector<std::string> texts;
    for (const std::string_view file : files) {
      const auto it = std::ranges::find(kKernelSources, file, &KernelSource::name);
      if (it == std::end(kKernelSources)) Fail("internal error: no kernel source {}", file);
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
    Check(status, "clCreateProgramWithSource");
    const std::string options = fmt::format("{} {}", BuildOptions(), defines);
    status = clBuildProgram(program, 1, &id_, options.c_str(), nullptr, nullptr);
    if (status != CL_SUCCESS) {
      size_t size = 0;
      clGetProgramBuildInfo(program, id_, CL_PROGRAM_BUILD_LOG, 0, nullptr, &size);
      std::string log(size, '\0');
      clGetProgramBuildInfo(program, id_, CL_PROGRAM_BUILD_LOG, size, log.data(), nullptr);
      clReleaseProgram(program);
      Fail("OpenCL: building {} for {} failed (error {}):\n{}", fmt::join(files, ", "),
           info_.name, status, log);
    }
    return program;
  }

  cl_program GemmProgram() {
    const GemmTiling& t = tiling_;
    const auto key = std::array{t.tile_m, t.tile_n, t.reg_m, t.reg_n, t.k_tile};
    if (const auto it = gemm_.find(key); it != gemm_.end()) return it->second;
    const std::string defines =
        fmt::format("-DTILE_M={} -DTILE_N={} -DREG_M={} -DREG_N={} -DK_TILE={}", t.tile_m,
                    t.tile_n, t.reg_m, t.reg_n, t.k_tile);
    return gemm_[key] = Build({"gemm.cl"}, defines);
  }

  Buffer Upload(std::span<const std::byte> bytes) {
    Buffer b(context_, bytes.size());
    if (!bytes.empty()) {
      Check(clEnqueueWriteBuffer(queue_, b.get(), CL_TRUE, 0, bytes.size(), bytes.data(), 0,
                                 nullptr, nullptr),
            "clEnqueueWriteBuffer");
    }
    return b;
  }
  Buffer Upload(std::span<const float> v) { return Upload(std::as_bytes(v)); }
  Buffer Upload(std::span<const uint32_t> v) { return Upload(std::as_bytes(v)); }
  Buffer Zeros(int64_t floats) {
    return Upload(std::vector<float>(static_cast<size_t>(floats), 0.0f));
  }
  // A float buffer's whole contents.
  std::vector<float> Download(const Buffer& b) {
    std::vector<float> v(b.bytes() / sizeof(float));
    if (!v.empty()) {
      Check(clEnqueueReadBuffer(queue_, b.get(), CL_TRUE, 0, v.size() * sizeof(float), v.data(),
                                0, nullptr, nullptr),
            "clEnqueueReadBuffer");
    }
    return v;
  }

  // Runs kernel `name` of `program` over `items` work-items (one-dimensional, padded up to a
  // multiple of the work-group size; each kernel ignores the items past its end) with `args`.
  template <typename... Args>
  void Launch(cl_program program, const char* name, int64_t items, const Args&... args) {
    if (items <= 0) return;
    cl_int status = CL_SUCCESS;
    cl_kernel kernel = clCreateKernel(program, name, &status);
    Check(status, fmt::format("clCreateKernel {}", name));
    cl_uint index = 0;
    (SetArg(kernel, index++, args), ...);
    const size_t local = work_group_;
    size_t global = static_cast<size_t>(items);
    if (local > 0) global = (global + local - 1) / local * local;
    status = clEnqueueNDRangeKernel(queue_, kernel, 1, nullptr, &global,
                                    local > 0 ? &local : nullptr, 0, nullptr, nullptr);
    clReleaseKernel(kernel);
    Check(status, fmt::format("clEnqueueNDRangeKernel {}", name));
    Check(clFinish(queue_), "clFinish");
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
  std::map<std::array<int, 5>, cl_program> gemm_;
  GemmTiling tiling_;
  size_t work_group_ = 0;
};

void OpenClDevice::Gemm(const Buffer& a, int64_t a_i, int64_t a_r, const Buffer& b, int64_t b_r,
                        int64_t b_j, const Buffer& c, int64_t rows, int64_t cols, int64_t reduced,
                        bool accumulate) {
  if (rows <= 0 || cols <= 0) return;
  const GemmTiling& t = tiling_;
  cl_program program = GemmProgram();
  cl_int status = CL_SUCCESS;
  cl_kernel kernel = clCreateKernel(program, "gemm", &status);
  Check(status, "clCreateKernel gemm");
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
  status = clEnqueueNDRangeKernel(queue_, kernel, 2, nullptr, global, local, 0, nullptr, nullptr);
  clReleaseKernel(kernel);
  Check(status, "clEnqueueNDRangeKernel gemm");
  Check(clFinish(queue_), "clFinish");
}

void OpenClDevice::Run(rk::Op op, const rk::OpValues& in, rk::OpValues& out) {
  const rk::OpSpec& spec = rk::Spec(op);
  if (!Implements(op)) Fail("op {} does not run on the OpenCL device yet", spec.name);
  const std::string_view name = spec.name;
  const auto size = [](const auto& v) { return static_cast<int64_t>(v.size()); };
  const auto positive = [&](std::string_view arg) {
    const int64_t v = in.Int(arg);
    if (v < 1) Fail("{} on the device: {} = {} (must be >= 1)", name, arg, v);
    return v;
  };
  switch (op) {
    case rk::Op::kGemmXWt:
    case rk::Op::kGemmDyW:
    case rk::Op::kGemmDytX: {
      const int64_t m = in.Int("m"), n = in.Int("n"), k = in.Int("k");
      if (m < 0 || n < 0 || k < 0) Fail("{}: m, n, k = {}, {}, {} (must be >= 0)", name, m, n, k);
      const bool accumulate = in.Int("accumulate") != 0;
      // (a, b, output role, output rows, columns, reduced length, strides)
      const bool xwt = op == rk::Op::kGemmXWt, dyw = op == rk::Op::kGemmDyW;
      const std::string_view a_role = xwt ? "x" : "dy", b_role = xwt || dyw ? "w" : "x";
      const std::string_view c_role = xwt ? "y" : dyw ? "dx" : "dw";
      const int64_t rows = xwt || dyw ? m : n, cols = xwt ? n : k, reduced = xwt ? k : dyw ? n : m;
      CheckElements(name, a_role, in.F(a_role).size(), xwt ? m * k : m * n);
      CheckElements(name, b_role, in.F(b_role).size(), xwt || dyw ? n * k : m * k);
      const Buffer a = Upload(in.F(a_role)), b = Upload(in.F(b_role));
      Buffer c;
      if (accumulate) {
        CheckElements(name, c_role, in.F(c_role).size(), rows * cols);
        c = Upload(in.F(c_role));
      } else {
        c = Zeros(rows * cols);
      }
      if (xwt) Gemm(a, k, 1, b, 1, k, c, rows, cols, reduced, accumulate);
      if (dyw) Gemm(a, n, 1, b, k, 1, c, rows, cols, reduced, accumulate);
      if (!xwt && !dyw) Gemm(a, 1, n, b, k, 1, c, rows, cols, reduced, accumulate);
      out.f32[std::string(c_role)] = Download(c);
      return;
    }
    case rk::Op::kAddInto: {
      CheckElements(name, "y", in.F("y").size(), size(in.F("x")));
      const Buffer x = Upload(in.F("x")), y = Upload(in.F("y"));
      Launch(main_, "add_into", size(in.F("x")), x, y, size(in.F("x")));
      out.f32["y"] = Download(y);
      return;
    }
    case rk::Op::kCopy: {
      const Buffer x = Upload(in.F("x")), y = Zeros(size(in.F("x")));
      Launch(main_, "copy", size(in.F("x")), x, y, size(in.F("x")));
      out.f32["y"] = Download(y);
      return;
    }
    case rk::Op::kScale: {
      const float factor = in.Float("factor");
      if (!std::isfinite(factor)) Fail("{}: factor = {} (must be finite)", name, factor);
      const Buffer x = Upload(in.F("x"));
      Launch(main_, "scale", size(in.F("x")), x, factor, size(in.F("x")));
      out.f32["x"] = Download(x);
      return;
    }
    case rk::Op::kCanonicalizeNaNs: {
      const Buffer x = Upload(in.F("x"));
      Launch(main_, "canonicalize_nans", size(in.F("x")), x, size(in.F("x")));
      out.f32["x"] = Download(x);
      return;
    }
    case rk::Op::kAdamW: {
      const rk::AdamWParams p{in.Float("lr"),  in.Float("beta1"),        in.Float("beta2"),
                              in.Float("eps"), in.Float("weight_decay"), in.Int("step")};
      const rk::AdamWScalars s = rk::AdamWScalarsOf(p);  // validates the arguments
      const int64_t n = size(in.F("param"));
      for (const char* role : {"grad", "m", "v"}) CheckElements(name, role, in.F(role).size(), n);
      const Buffer param = Upload(in.F("param")), grad = Upload(in.F("grad")),
                   m = Upload(in.F("m")), v = Upload(in.F("v"));
      Launch(main_, "adamw", n, param, grad, m, v, s.decay, s.beta1, s.one_minus_beta1, s.beta2,
             s.one_minus_beta2, s.sqrt_bc2, s.eps, s.step_size, n);
      out.f32["param"] = Download(param);
      out.f32["m"] = Download(m);
      out.f32["v"] = Download(v);
      return;
    }
    case rk::Op::kSwigluFwd:
    case rk::Op::kSwigluBwd: {
      const bool forward = op == rk::Op::kSwigluFwd;
      const int64_t rows = positive("rows"), f = positive("f");
      CheckElements(name, "gu", in.F("gu").size(), rows * 2 * f);
      const Buffer gu = Upload(in.F("gu"));
      if (forward) {
        const Buffer act = Zeros(rows * f);
        Launch(main_, "swiglu_fwd", rows * f, gu, act, rows, f);
        out.f32["act"] = Download(act);
      } else {
        CheckElements(name, "dact", in.F("dact").size(), rows * f);
        const Buffer dact = Upload(in.F("dact")), dgu = Zeros(rows * 2 * f);
        Launch(main_, "swiglu_bwd", rows * f, gu, dact, dgu, rows, f);
        out.f32["dgu"] = Download(dgu);
      }
      return;
    }
    case rk::Op::kAttentionFwd:
    case rk::Op::kAttentionBwd: {
      const int64_t batch = positive("batch"), seq = positive("seq"), q_heads = positive("q_heads"),
                    kv_heads = positive("kv_heads"), d = positive("head_dim"),
                    window = in.Int("window");
      const float scale = in.Float("scale");
      if (q_heads % kv_heads != 0) {
        Fail("{}: q_heads = {} is not a multiple of kv_heads = {}", name, q_heads, kv_heads);
      }
      if (window < 0) Fail("{}: window = {} (must be >= 0)", name, window);
      if (!(scale > 0) || !std::isfinite(scale)) Fail("{}: scale = {} (must be > 0)", name, scale);
      const int64_t nq = batch * seq * q_heads * d, nkv = batch * seq * kv_heads * d;
      const int64_t rows = batch * q_heads * seq;
      CheckElements(name, "q", in.F("q").size(), nq);
      CheckElements(name, "k", in.F("k").size(), nkv);
      CheckElements(name, "v", in.F("v").size(), nkv);
      const Buffer q = Upload(in.F("q")), k = Upload(in.F("k")), v = Upload(in.F("v"));
      if (op == rk::Op::kAttentionFwd) {
        const Buffer o = Zeros(nq), lse = Zeros(rows);
        Launch(main_, "attention_fwd", rows, q, k, v, o, lse, batch, seq, q_heads, kv_heads, d,
               window, scale);
        out.f32["out"] = Download(o);
        out.f32["lse"] = Download(lse);
        return;
      }
      CheckElements(name, "out", in.F("out").size(), nq);
      CheckElements(name, "dout", in.F("dout").size(), nq);
      CheckElements(name, "lse", in.F("lse").size(), rows);
      const Buffer o = Upload(in.F("out")), dout = Upload(in.F("dout")), lse = Upload(in.F("lse"));
      const Buffer delta = Zeros(rows), dq = Zeros(nq);
      const Buffer dk = Zeros(nkv), dv = Zeros(nkv);
      Launch(main_, "attention_delta", rows, dout, o, delta, batch, seq, q_heads, d);
      Launch(main_, "attention_dq", rows, q, k, v, dout, lse, delta, dq, batch, seq, q_heads,
             kv_heads, d, window, scale);
      Launch(main_, "attention_dkv", batch * seq * kv_heads, q, k, v, dout, lse, delta, dk, dv,
             batch, seq, q_heads, kv_heads, d, window, scale);
      out.f32["dq"] = Download(dq);
      out.f32["dk"] = Download(dk);
      out.f32["dv"] = Download(dv);
      return;
    }
    case rk::Op::kCrossEntropyFwd:
    case rk::Op::kCrossEntropyBwd: {
      const int64_t rows = positive("rows"), d = positive("d"), vocab = positive("vocab"),
                    chunk = positive("vocab_chunk");
      const float z_loss = in.Float("z_loss");
      if (chunk % rk::kGemmKChunk != 0) {
        Fail("{}: vocab_chunk = {} (must be a positive multiple of {})", name, chunk,
             rk::kGemmKChunk);
      }
      if (!(z_loss >= 0) || !std::isfinite(z_loss)) {
        Fail("{}: z_loss = {} (must be finite and >= 0)", name, z_loss);
      }
      CheckElements(name, "h", in.F("h").size(), rows * d);
      CheckElements(name, "w", in.F("w").size(), vocab * d);
      CheckElements(name, "targets", in.U("targets").size(), rows);
      for (int64_t r = 0; r < rows; ++r) {
        const uint32_t target = in.U("targets")[static_cast<size_t>(r)];
        if (target >= static_cast<uint64_t>(vocab)) {
          Fail("{}: targets[{}] = {} is out of range (vocab = {})", name, r, target, vocab);
        }
      }
      // The logits, every chunk at once: each logit's bits do not depend on the chunk.
      const Buffer h = Upload(in.F("h")), w = Upload(in.F("w"));
      const Buffer targets = Upload(std::span<const uint32_t>(in.U("targets")));
      const Buffer z = Zeros(rows * vocab);
      Gemm(h, d, 1, w, 1, d, z, rows, vocab, d, /*accumulate=*/false);
      if (op == rk::Op::kCrossEntropyFwd) {
        const Buffer loss = Zeros(rows), zloss = Zeros(rows);
        const Buffer lse = Zeros(rows);
        Launch(main_, "cross_entropy_fwd", rows, z, targets, loss, zloss, lse, rows, vocab,
               z_loss);
        out.f32["loss"] = Download(loss);
        out.f32["zloss"] = Download(zloss);
        out.f32["lse"] = Download(lse);
        return;
      }
      const float grad_scale = in.Float("grad_scale");
      if (!std::isfinite(grad_scale)) Fail("{}: grad_scale = {} (must be finite)", name, grad_scale);
      CheckElements(name, "lse", in.F("lse").size(), rows);
      CheckElements(name, "dw", in.F("dw").size(), vocab * d);
      const Buffer lse = Upload(in.F("lse")), dw = Upload(in.F("dw"));
      const Buffer dh = Zeros(rows * d);
      Launch(main_, "cross_entropy_dz", rows * vocab, z, targets, lse, rows, vocab, z_loss,
             grad_scale);
      // dh = dz · w over the whole vocab (the chunked sequence of the contract is this GEMM);
      // dw += dzᵀ · h.
      Gemm(z, vocab, 1, w, d, 1, dh, rows, d, vocab, /*accumulate=*/false);
      Gemm(z, 1, vocab, h, d, 1, dw, vocab, d, rows, /*accumulate=*/true);
      out.f32["dh"] = Download(dh);
      out.f32["dw"] = Download(dw);
      return;
    }
    case rk::Op::kRowSum: {
      const int64_t rows = positive("rows"), cols = in.Int("cols");
      CheckElements(name, "x", in.F("x").size(), rows * cols);
      const Buffer x = Upload(in.F("x")), sum = Zeros(rows);
      Launch(main_, "row_sum", rows, x, sum, rows, cols);
      out.f32["sum"] = Download(sum);
      return;
    }
    case rk::Op::kRmsNormFwd: {
      const int64_t rows = positive("rows"), cols = positive("cols");
      const float eps = in.Float("eps");
      if (!(eps > 0) || !std::isfinite(eps)) Fail("{}: eps = {} (must be > 0)", name, eps);
      CheckElements(name, "x", in.F("x").size(), rows * cols);
      const bool has_gain = in.Has("gain");
      if (has_gain) CheckElements(name, "gain", in.F("gain").size(), cols);
      const Buffer x = Upload(in.F("x")), gain = has_gain ? Upload(in.F("gain")) : Zeros(0);
      const Buffer y = Zeros(rows * cols), rstd = Zeros(rows);
      Launch(main_, "rmsnorm_fwd", rows, x, gain, has_gain ? 1 : 0, eps,
             1.0f / static_cast<float>(cols), y, rstd, rows, cols);
      out.f32["y"] = Download(y);
      out.f32["rstd"] = Download(rstd);
      return;
    }
    case rk::Op::kRmsNormBwd: {
      const int64_t rows = positive("rows"), cols = positive("cols");
      for (const char* role : {"dy", "x"}) CheckElements(name, role, in.F(role).size(), rows * cols);
      CheckElements(name, "rstd", in.F("rstd").size(), rows);
      const bool has_gain = in.Has("gain");
      if (has_gain) CheckElements(name, "gain", in.F("gain").size(), cols);
      const Buffer dy = Upload(in.F("dy")), x = Upload(in.F("x")), rstd = Upload(in.F("rstd"));
      const Buffer gain = has_gain ? Upload(in.F("gain")) : Zeros(0);
      const Buffer dx = Zeros(rows * cols);
      Launch(main_, "rmsnorm_bwd", rows, dy, x, gain, has_gain ? 1 : 0, rstd,
             1.0f / static_cast<float>(cols), dx, rows, cols);
      out.f32["dx"] = Download(dx);
      if (has_gain) {
        const Buffer dgain = Zeros(cols);
        Launch(main_, "rmsnorm_dgain", cols, dy, x, rstd, dgain, rows, cols);
        out.f32["dgain"] = Download(dgain);
      }
      return;
    }
    case rk::Op::kRopeFwd:
    case rk::Op::kRopeBwd: {
      const bool inverse = op == rk::Op::kRopeBwd;
      const std::string_view x_role = inverse ? "dy" : "x", y_role = inverse ? "dx" : "y";
      const int64_t batch = positive("batch"), seq = positive("seq"), heads = positive("heads"),
                    head_dim = positive("head_dim"), table_seq = positive("table_seq");
      const rk::RopeTable table = rk::MakeRopeTable(table_seq, head_dim, in.Float("theta"));
      if (seq > table_seq) Fail("{}: seq = {} exceeds table_seq = {}", name, seq, table_seq);
      const int64_t n = batch * seq * heads * head_dim;
      CheckElements(name, x_role, in.F(x_role).size(), n);
      const Buffer x = Upload(in.F(x_role)), y = Zeros(n);
      const Buffer cos = Upload(table.cos), sin = Upload(table.sin);
      Launch(main_, "rope", n / 2, x, y, cos, sin, seq, heads, head_dim / 2, n / 2,
             inverse ? 1 : 0);
      out.f32[std::string(y_role)] = Download(y);
      return;
    }
    case rk::Op::kEmbeddingFwd:
    case rk::Op::kEmbeddingBwd: {
      const bool forward = op == rk::Op::kEmbeddingFwd;
      const int64_t vocab = positive("vocab"), d = positive("d");
      const std::vector<uint32_t>& ids = in.U("ids");
      for (size_t i = 0; i < ids.size(); ++i) {
        if (ids[i] >= static_cast<uint64_t>(vocab)) {
          Fail("{}: ids[{}] = {} is out of range (vocab = {})", name, i, ids[i], vocab);
        }
      }
      const auto n = static_cast<int64_t>(ids.size());
      const Buffer id_buffer = Upload(std::span<const uint32_t>(ids));
      if (forward) {
        CheckElements(name, "table", in.F("table").size(), vocab * d);
        const Buffer table = Upload(in.F("table")), o = Zeros(n * d);
        Launch(main_, "embedding_fwd", n * d, table, id_buffer, o, n, d);
        out.f32["out"] = Download(o);
      } else {
        CheckElements(name, "dout", in.F("dout").size(), n * d);
        CheckElements(name, "dtable", in.F("dtable").size(), vocab * d);
        const Buffer dout = Upload(in.F("dout")), dtable = Upload(in.F("dtable"));
        Launch(main_, "embedding_bwd", d, dout, id_buffer, dtable, n, d);
        out.f32["dtable"] = Download(dtable);
      }
      return;
    }
    default:
      Fail("internal error: op {} is listed as implemented but has no device code", name);
  }
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
