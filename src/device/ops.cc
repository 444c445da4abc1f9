// The device layer above the runtimes (src/device/runtime.h): the op recipes of the op table,
// the residency of kept tensors, the size checks, the GEMM's tilings and their measurement, the
// memory plan, and --device's parsing and opening. Written once for every runtime.
#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <bit>
#include <chrono>
#include <cmath>
#include <cstring>
#include <deque>
#include <limits>
#include <map>
#include <tuple>

#include "device/runtime.h"
#include "lockstep/device.h"

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

std::string DeviceInfo::Described() const {
  return fmt::format("--device {} ({})", choice.Flag(), name);
}

std::string DeviceChoice::Flag() const {
  return runtime == Runtime::kCuda ? fmt::format("cuda:{}", device)
                                   : fmt::format("opencl:{}:{}", platform, device);
}

std::optional<DeviceChoice> ParseDeviceFlag(std::string_view text) {
  if (text == "cpu") return std::nullopt;
  // An index as docs/cli.md's Numbers rule reads one: digits only, no leading zero ("cuda:01").
  const auto number = [](std::string_view s, int& out) {
    const std::optional<uint64_t> v = ParseDecimalU64(s);
    if (!v || *v > static_cast<uint64_t>(std::numeric_limits<int>::max())) return false;
    out = static_cast<int>(*v);
    return true;
  };
  DeviceChoice choice;
  if (text == "opencl") return choice;
  if (text.starts_with("opencl:")) {
    const std::string_view rest = text.substr(7);
    const size_t colon = rest.find(':');
    if (colon != std::string_view::npos && number(rest.substr(0, colon), choice.platform) &&
        number(rest.substr(colon + 1), choice.device)) {
      return choice;
    }
  }
  choice.runtime = DeviceChoice::Runtime::kCuda;
  if (text == "cuda") return choice;
  if (text.starts_with("cuda:") && number(text.substr(5), choice.device)) return choice;
  Fail(
      "--device {}: expected cpu, opencl, opencl:P:D (platform and device indices), cuda or "
      "cuda:N (a CUDA device index), as `lockstep --version` lists them",
      text);
}

std::vector<GemmTiming> TuneGemm(Device& device, int64_t n, int repeats) {
  std::vector<GemmTiming> timings;
  for (const GemmTiling& t : GemmCandidates()) {
    if (!device.Fits(t)) continue;
    device.set_gemm_tiling(t);
    timings.push_back({t, device.TimeGemm(n, repeats)});
  }
  if (timings.empty()) Fail("{}: no GEMM tiling fits the device", device.info().name);
  device.set_gemm_tiling(std::ranges::min(timings, {}, &GemmTiming::seconds).tiling);
  return timings;
}

namespace {

// A device buffer of `bytes` bytes, released with its owner.
class Buffer {
 public:
  Buffer() = default;
  Buffer(Runtime& runtime, size_t bytes)
      : runtime_(&runtime), handle_(runtime.Allocate(bytes)), bytes_(bytes) {}
  Buffer(Buffer&& other) noexcept
      : runtime_(other.runtime_), handle_(std::exchange(other.handle_, 0)), bytes_(other.bytes_) {}
  Buffer& operator=(Buffer&& other) noexcept {
    std::swap(runtime_, other.runtime_);
    std::swap(handle_, other.handle_);
    std::swap(bytes_, other.bytes_);
    return *this;
  }
  ~Buffer() {
    if (handle_ != 0) runtime_->Release(handle_);
  }
  Runtime::Handle get() const { return handle_; }
  size_t bytes() const { return bytes_; }

 private:
  Runtime* runtime_ = nullptr;
  Runtime::Handle handle_ = 0;
  size_t bytes_ = 0;
};

KernelArg Arg(const Buffer& b) { return {KernelArg::Kind::kBuffer, b.get()}; }
KernelArg Arg(int64_t v) { return {KernelArg::Kind::kLong, 0, v}; }
KernelArg Arg(int v) { return {KernelArg::Kind::kInt, 0, 0, v}; }
KernelArg Arg(float v) { return {KernelArg::Kind::kFloat, 0, 0, 0, v}; }

// The sizes an op's tensors must have, checked before anything reaches the device.
void CheckElements(std::string_view op, std::string_view role, int64_t size, int64_t expected) {
  if (expected < 0 || size != expected) {
    Fail("{} on the device: {} has {} elements, expected {}", op, role, size, expected);
  }
}

// Host bytes, of a tensor of any dtype.
using Bytes = std::span<const std::byte>;

// A device copy of a tensor of a kept region (Keep): `bytes` bytes at `host`, which of the two
// holds the current bytes (at least one does), and the device buffer.
struct Copy {
  const std::byte* host = nullptr;
  size_t bytes = 0;
  Buffer buffer;
  bool host_current = true, device_current = false;
  const std::byte* end() const { return host + bytes; }
};

class RuntimeDevice;
class Binding;

// The device's recipe of an op of the op table: the kernels it launches (the RuntimeDevice::Run*
// below). An op without a recipe runs on the CPU, and OpenForRun says so. `fp64`: only on a device
// with binary64.
struct Recipe {
  rk::Op op;
  void (RuntimeDevice::*run)(rk::Op op, Binding& io);
  bool fp64 = false;
};
const Recipe* RecipeOf(rk::Op op);  // null for an op without one

// One op call's tensors on the device: each input's buffer (the kept copy, made current, or a
// temporary with the host's bytes) and each output's (the input's of the same role, updated in
// place; the kept copy; or a zeroed temporary), and where the outputs go when the op is done.
// Tensors of every dtype alike: an output has the dtype its role has in the op table.
class Binding {
 public:
  // The values form: inputs from `in`, outputs into `out` (sized here).
  Binding(RuntimeDevice& device, const rk::OpSpec& spec, const rk::OpValues& in, rk::OpValues& out);
  // The in-place form (OpExecutor::Run).
  Binding(RuntimeDevice& device, const rk::OpSpec& spec, std::span<const OpArg> args,
          std::span<const OpTensor> inputs, std::span<const OpOutput> outputs);
  ~Binding();
  Binding(const Binding&) = delete;
  Binding& operator=(const Binding&) = delete;

  std::string_view name() const { return spec_.name; }
  int64_t Int(std::string_view name) const { return args_->Int(name); }
  int64_t IntOr(std::string_view name, int64_t absent) const { return args_->IntOr(name, absent); }
  float Float(std::string_view name) const { return args_->Float(name); }
  // Argument `name`, which must be at least 1.
  int64_t Positive(std::string_view name) const;
  bool Has(std::string_view role) const { return FindIn(role) != nullptr; }
  // Elements of input `role` (failing when the call has none).
  int64_t Size(std::string_view role) const { return Input(role).view.elements(); }
  std::span<const uint32_t> U(std::string_view role) const {
    return Input(role).view.As<uint32_t>();
  }
  const Buffer& In(std::string_view role);
  // Output `role` of `elements` elements of its dtype.
  const Buffer& Out(std::string_view role, int64_t elements);
  // A zeroed device buffer of `floats` floats for the op's own use.
  const Buffer& Scratch(int64_t floats);
  // Every output to where it goes: the kept copies marked newer than the host, the others read
  // back.
  void Finish();

 private:
  struct InTensor {
    std::string_view role;
    TensorView view;
    Copy* copy = nullptr;            // kept on the device
    const Buffer* buffer = nullptr;  // once bound
  };
  struct OutTensor {
    std::string_view role;
    MutableTensorView target;
    const Buffer* buffer = nullptr;
    Copy* copy = nullptr;   // the kept copy the output ends in
    bool via_temp = false;  // written to a temporary, then copied into `copy`
    bool in_place = false;  // the input of the same role's buffer
  };
  const InTensor* FindIn(std::string_view role) const;
  InTensor& Input(std::string_view role);
  const InTensor& Input(std::string_view role) const;
  MutableTensorView Target(std::string_view role, int64_t elements);

  RuntimeDevice& device_;
  const rk::OpSpec& spec_;
  const rk::OpValues* args_;
  rk::OpValues own_args_;
  rk::OpValues* values_out_ = nullptr;
  std::span<const OpOutput> outputs_;
  std::vector<InTensor> inputs_;
  std::vector<OutTensor> bound_;
  std::deque<Buffer> temporaries_;
};

class RuntimeDevice final : public Device {
 public:
  explicit RuntimeDevice(std::unique_ptr<Runtime> runtime)
      : Device(runtime->info()), runtime_(std::move(runtime)) {
    main_ = runtime_->Program(MainProgram());
    if (info_.fp64) norm_ = runtime_->Program(NormProgram());
  }

  bool Implements(rk::Op op) const override {
    const Recipe* recipe = RecipeOf(op);
    return recipe != nullptr && (!recipe->fp64 || norm_ != 0);
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
    Binding io(*this, rk::Spec(op), in, out);
    RunBound(op, io);
  }
  bool Run(rk::Op op, std::span<const OpArg> args, std::span<const OpTensor> inputs,
           std::span<const OpOutput> outputs) override {
    if (!Implements(op)) return false;
    WithPlan([&] {
      Binding io(*this, rk::Spec(op), args, inputs, outputs);
      RunBound(op, io);
    });
    return true;
  }

  void Keep(TensorView region) override {
    if (!region.empty()) kept_.push_back(region.bytes());
  }
  void Forget(TensorView region) override {
    const Bytes bytes = region.bytes();
    for (const auto& it : Overlapping(bytes)) copies_.erase(it);
    std::erase_if(kept_,
                  [&](Bytes r) { return r.data() == bytes.data() && r.size() == bytes.size(); });
  }
  void ToHost(TensorView data) override {
    WithPlan([&] {
      for (const auto& it : Overlapping(data.bytes())) Refresh(*it->second);
    });
  }
  void HostWrites(TensorView view) override {
    const Bytes data = view.bytes();
    WithPlan([&] {
      for (const auto& it : Overlapping(data)) {
        const Copy& c = *it->second;
        if (c.host < data.data() || c.end() > data.data() + data.size()) Refresh(*it->second);
        copies_.erase(it);
      }
    });
  }
  Traffic traffic() const override {
    Traffic t = traffic_;
    for (const auto& [host, copy] : copies_) t.kept += copy->bytes;
    return t;
  }
  void Plan(uint64_t bytes, uint64_t largest, std::string_view detail) override {
    const auto gib = [](uint64_t b) { return static_cast<double>(b) / (1 << 30); };
    if (bytes > info_.global_memory) {
      Fail(
          "{}: this run needs {:.2f} GiB on the device ({}), the device has {:.2f} GiB "
          "(docs/devices.md, \"Memory\")",
          info_.Described(), gib(bytes), detail, gib(info_.global_memory));
    }
    if (largest > info_.max_allocation) {
      Fail(
          "{}: this run's largest tensor on the device is {:.2f} GiB, the device allocates at "
          "most {:.2f} GiB at once (docs/devices.md, \"Memory\")",
          info_.Described(), gib(largest), gib(info_.max_allocation));
    }
    fmt::print(stderr, "device memory on {}: {:.2f} GiB of {:.2f} GiB ({})\n", info_.choice.Flag(),
               gib(bytes), gib(info_.global_memory), detail);
    planned_ = bytes;
  }

  std::vector<std::pair<std::string, std::string>> ProgramBinaries() override {
    std::vector<std::pair<std::string, std::string>> binaries;
    binaries.emplace_back(MainProgram().name, runtime_->ProgramBinary(main_));
    if (norm_ != 0) binaries.emplace_back(NormProgram().name, runtime_->ProgramBinary(norm_));
    const ProgramSpec gemm = GemmProgram(tiling_);
    binaries.emplace_back(gemm.name, runtime_->ProgramBinary(runtime_->Program(gemm)));
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
      runtime_->Finish();
      const std::chrono::duration<double> took = std::chrono::steady_clock::now() - start;
      if (r > 0) best = std::min(best, took.count());
    }
    return best;
  }

 private:
  friend class Binding;
  friend const Recipe* RecipeOf(rk::Op op);
  using CopyMap = std::map<const std::byte*, std::unique_ptr<Copy>>;

  // Runs `call`; the device running out of memory is told with what this run planned to hold
  // there (Plan), the runtime's message kept.
  template <typename Call>
  void WithPlan(const Call& call) {
    try {
      call();
    } catch (const OutOfMemory& e) {
      if (planned_ == 0) throw;
      throw OutOfMemory(
          fmt::format("{} (this run planned {:.2f} GiB on it: docs/devices.md, "
                      "\"Memory\")",
                      e.what(), static_cast<double>(planned_) / (1 << 30)));
    }
  }

  // Empty when the device can run tiling `t`, else why not: the device's limits, then the
  // runtime's (a program for it) and the compiler's for the GEMM built at `t` (its registers may
  // allow fewer work-items).
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
    // The slices, in one or two buffers, and gemm.cl's copy of `cols` (a long).
    const auto local =
        static_cast<uint64_t>((1 + t.double_buffer) * t.k_tile * (t.tile_m + t.tile_n)) *
            sizeof(float) +
        sizeof(int64_t);
    if (local > info_.local_memory) {
      return fmt::format("its {} bytes of local memory exceed the device's {}", local,
                         info_.local_memory);
    }
    if (!runtime_->CanBuild(GemmProgram(t))) {
      return "the binary carries no program for it (the CUDA runtime runs the candidates' PTX "
             "only: GemmCandidates)";
    }
    const size_t allowed = runtime_->KernelWorkGroupLimit(GemmKernel(t));
    if (items > allowed) {
      return fmt::format(
          "its work-group of {} items exceeds the {} the device's compiler allows its GEMM "
          "kernel",
          items, allowed);
    }
    return "";
  }

  // Runs op's recipe, then moves its outputs to where they go.
  void RunBound(rk::Op op, Binding& io);
  // The recipes (RecipeOf).
  void RunGemm(rk::Op op, Binding& io);
  void RunAddInto(rk::Op op, Binding& io);
  void RunCopyOp(rk::Op op, Binding& io);
  void RunScale(rk::Op op, Binding& io);
  void RunBlockSquares(rk::Op op, Binding& io);
  void RunCanonicalizeNaNs(rk::Op op, Binding& io);
  void RunRoundToBf16(rk::Op op, Binding& io);
  void RunBf16Conversion(rk::Op op, Binding& io);
  void RunAdamW(rk::Op op, Binding& io);
  void RunSwiglu(rk::Op op, Binding& io);
  void RunAttention(rk::Op op, Binding& io);
  void RunCrossEntropy(rk::Op op, Binding& io);
  void RunRowSum(rk::Op op, Binding& io);
  void RunRmsNormFwd(rk::Op op, Binding& io);
  void RunRmsNormBwd(rk::Op op, Binding& io);
  void RunRope(rk::Op op, Binding& io);
  void RunEmbedding(rk::Op op, Binding& io);
  void RunQuantizeRows(rk::Op op, Binding& io);
  void RunQuantizeRowsByScale(rk::Op op, Binding& io);
  void RunGemmI8XWt(rk::Op op, Binding& io);
  void RunDequantizeRows(rk::Op op, Binding& io);
  void RunHadamardQuantizeRows(rk::Op op, Binding& io);

  bool InKeptRegion(Bytes data) const {
    return !data.empty() && std::ranges::any_of(kept_, [&](Bytes r) {
      return data.data() >= r.data() && data.data() + data.size() <= r.data() + r.size();
    });
  }
  // The copies overlapping `data` (they never overlap each other).
  std::vector<CopyMap::iterator> Overlapping(Bytes data) {
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
    Download(c.buffer, {const_cast<std::byte*>(c.host), c.bytes});
    c.host_current = true;
  }
  // The kept copy of `data` (null when it lies in no kept region): the one of exactly its extent,
  // or a new one (host current) after any copy overlapping it is brought back and dropped.
  Copy* Resident(Bytes data) {
    if (!InKeptRegion(data)) return nullptr;
    const std::vector<CopyMap::iterator> overlap = Overlapping(data);
    if (overlap.size() == 1 && overlap[0]->first == data.data() &&
        overlap[0]->second->bytes == data.size()) {
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
    copy->bytes = data.size();
    copy->buffer = Buffer(*runtime_, data.size());
    return (copies_[data.data()] = std::move(copy)).get();
  }
  bool StillKept(const Copy* c) const {
    const auto it = copies_.find(c->host);
    return it != copies_.end() && it->second.get() == c;
  }
  void MakeDeviceCurrent(Copy& c) {
    if (c.device_current) return;
    Write(c.buffer, {c.host, c.bytes});
    c.device_current = true;
  }

  Runtime::Handle GemmKernel(const GemmTiling& t) const {
    return runtime_->Kernel(runtime_->Program(GemmProgram(t)), "gemm");
  }
  // RoPE's cos and sin tables (rk::MakeRopeTable) on the device, made once per shape.
  const std::pair<Buffer, Buffer>& RopeTables(int64_t seq, int64_t head_dim, float theta) {
    const auto key = std::tuple{seq, head_dim, std::bit_cast<uint32_t>(theta)};
    if (const auto it = rope_tables_.find(key); it != rope_tables_.end()) return it->second;
    const rk::RopeTable table = rk::MakeRopeTable(seq, head_dim, theta);
    return rope_tables_[key] = {Upload(table.cos), Upload(table.sin)};
  }

  // Host to device and back; work runs in order, so a read sees every kernel enqueued before.
  void Write(const Buffer& b, std::span<const std::byte> bytes) {
    if (bytes.empty()) return;
    runtime_->Write(b.get(), bytes);
    traffic_.to_device += bytes.size();
  }
  void Download(const Buffer& b, std::span<std::byte> to) {
    if (to.size() != b.bytes()) {
      LOCKSTEP_INTERNAL("reading {} bytes of a device buffer into {}", b.bytes(), to.size());
    }
    if (to.empty()) return;
    runtime_->Read(b.get(), to);
    traffic_.to_host += to.size();
  }
  void Download(const Buffer& b, std::span<float> to) { Download(b, std::as_writable_bytes(to)); }
  Buffer Upload(std::span<const std::byte> bytes) {
    Buffer b(*runtime_, bytes.size());
    Write(b, bytes);
    return b;
  }
  Buffer Upload(std::span<const float> v) { return Upload(std::as_bytes(v)); }
  void FillZeros(const Buffer& b) {
    if (b.bytes() != 0) runtime_->FillZeros(b.get(), b.bytes());
  }
  Buffer ZeroBytes(size_t bytes) {
    Buffer b(*runtime_, bytes);
    FillZeros(b);
    return b;
  }
  Buffer Zeros(int64_t floats) { return ZeroBytes(static_cast<size_t>(floats) * sizeof(float)); }
  void CopyBuffer(const Buffer& from, const Buffer& to) {
    if (from.bytes() != to.bytes()) LOCKSTEP_INTERNAL("copying unequal device buffers");
    if (from.bytes() != 0) runtime_->Copy(from.get(), to.get(), from.bytes());
  }

  // Enqueues kernel `name` of `program` over `items` work-items (one-dimensional, padded up to a
  // multiple of the work-group size; each kernel ignores the items past its end) with `args`.
  template <typename... Args>
  void Launch(Runtime::Handle program, const char* name, int64_t items, const Args&... args) {
    if (items <= 0) return;
    const KernelArg values[] = {Arg(args)...};
    const size_t local = work_group_;
    size_t global = static_cast<size_t>(items);
    if (local > 0) global = (global + local - 1) / local * local;
    runtime_->Launch(runtime_->Kernel(program, name), values, 1, {global, 1}, {local, 1});
  }

  // C[rows, cols] (+)= A·B in the contract's chunk order; strides as in gemm.cl.
  void Gemm(const Buffer& a, int64_t a_i, int64_t a_r, const Buffer& b, int64_t b_r, int64_t b_j,
            const Buffer& c, int64_t rows, int64_t cols, int64_t reduced, bool accumulate);

  std::unique_ptr<Runtime> runtime_;  // first: destroyed after every buffer it made
  Runtime::Handle main_ = 0;
  Runtime::Handle norm_ = 0;  // norm.cl, on a device with fp64
  std::map<std::tuple<int64_t, int64_t, uint32_t>, std::pair<Buffer, Buffer>> rope_tables_;
  GemmTiling tiling_;
  size_t work_group_ = 0;
  std::vector<Bytes> kept_;
  CopyMap copies_;
  std::vector<const Copy*> in_use_;  // by the op call being bound
  Traffic traffic_;
  uint64_t planned_ = 0;  // bytes, by Plan
};

Binding::Binding(RuntimeDevice& device, const rk::OpSpec& spec, const rk::OpValues& in,
                 rk::OpValues& out)
    : device_(device), spec_(spec), args_(&in), values_out_(&out) {
  for (const auto& [role, t] : in.tensors) inputs_.push_back({role, t.view()});
}

Binding::Binding(RuntimeDevice& device, const rk::OpSpec& spec, std::span<const OpArg> args,
                 std::span<const OpTensor> inputs, std::span<const OpOutput> outputs)
    : device_(device), spec_(spec), args_(&own_args_), outputs_(outputs) {
  for (const OpArg& a : args) own_args_.args[std::string(a.name)] = a.value;
  for (const OpTensor& t : inputs) inputs_.push_back({t.role, t.view});
}

Binding::~Binding() { device_.in_use_.clear(); }

int64_t Binding::Positive(std::string_view name) const {
  const int64_t v = Int(name);
  if (v < 1) Fail("{} on the device: {} = {} (must be >= 1)", spec_.name, name, v);
  return v;
}

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
  if ((t.copy = device_.Resident(t.view.bytes())) != nullptr) {
    device_.in_use_.push_back(t.copy);
    device_.MakeDeviceCurrent(*t.copy);
    return *(t.buffer = &t.copy->buffer);
  }
  return *(t.buffer = &temporaries_.emplace_back(device_.Upload(t.view.bytes())));
}

MutableTensorView Binding::Target(std::string_view role, int64_t elements) {
  const auto listed = std::ranges::find(spec_.outputs, role, &rk::OpRole::name);
  if (listed == spec_.outputs.end()) {
    LOCKSTEP_INTERNAL("op {} has no output '{}' in the op table", spec_.name, role);
  }
  if (values_out_ != nullptr) {
    return (values_out_->tensors[std::string(role)] = HostTensor::Zeros(listed->dtype, elements))
        .view();
  }
  const auto it = std::ranges::find(outputs_, role, &OpOutput::role);
  if (it == outputs_.end() || it->view.dtype() != listed->dtype ||
      it->view.elements() != elements) {
    LOCKSTEP_INTERNAL("the op call on the device has no output '{}' of {} {} elements", role,
                      elements, DtypeName(listed->dtype));
  }
  return it->view;
}

const Buffer& Binding::Out(std::string_view role, int64_t elements) {
  OutTensor o{role, Target(role, elements)};
  const Bytes target = o.target.bytes();
  if (Has(role)) {  // in place: the input of the same role, at the same address when kept
    InTensor& in = Input(role);
    o.in_place = true;
    o.buffer = &In(role);
    o.copy = in.copy;
    if (o.copy != nullptr && o.target.data() != in.view.data()) {
      LOCKSTEP_INTERNAL("{} is updated in place on the device but given at another address", role);
    }
  } else if ((o.copy = device_.Resident(target)) != nullptr) {
    device_.in_use_.push_back(o.copy);
    // A kept output that an input of another role also is (an op in place under two names)
    // is written to a temporary first: no kernel reads and writes one buffer under two names,
    // and the input is read whether it is bound before the output or after.
    o.via_temp = std::ranges::any_of(inputs_, [&](const InTensor& t) {
      const Bytes b = t.view.bytes();
      return !b.empty() && b.data() < target.data() + target.size() &&
             target.data() < b.data() + b.size();
    });
    if (o.via_temp) {
      o.buffer = &temporaries_.emplace_back(device_.ZeroBytes(target.size()));
    } else {
      device_.FillZeros(o.copy->buffer);
      o.buffer = &o.copy->buffer;
    }
  } else {
    o.buffer = &temporaries_.emplace_back(device_.ZeroBytes(target.size()));
  }
  return *bound_.emplace_back(o).buffer;
}

const Buffer& Binding::Scratch(int64_t floats) {
  return temporaries_.emplace_back(device_.Zeros(floats));
}

void Binding::Finish() {
  for (const OutTensor& o : bound_) {
    if (o.copy == nullptr) {
      device_.Download(*o.buffer, o.target.bytes());
      continue;
    }
    if (!device_.StillKept(o.copy)) {
      LOCKSTEP_INTERNAL("the device copy of {} was dropped during the op that writes it", o.role);
    }
    if (o.via_temp) device_.CopyBuffer(*o.buffer, o.copy->buffer);
    o.copy->device_current = true;
    o.copy->host_current = false;
  }
}

void RuntimeDevice::Gemm(const Buffer& a, int64_t a_i, int64_t a_r, const Buffer& b, int64_t b_r,
                         int64_t b_j, const Buffer& c, int64_t rows, int64_t cols, int64_t reduced,
                         bool accumulate) {
  if (rows <= 0 || cols <= 0) return;
  const GemmTiling& t = tiling_;
  const KernelArg args[] = {Arg(a),
                            Arg(a_i),
                            Arg(a_r),
                            Arg(b),
                            Arg(b_r),
                            Arg(b_j),
                            Arg(c),
                            Arg(rows),
                            Arg(cols),
                            Arg(reduced),
                            Arg(accumulate ? 1 : 0)};
  const std::array<size_t, 2> local = {static_cast<size_t>(t.tile_n / t.reg_n),
                                       static_cast<size_t>(t.tile_m / t.reg_m)};
  const std::array<size_t, 2> global = {
      static_cast<size_t>((cols + t.tile_n - 1) / t.tile_n) * local[0],
      static_cast<size_t>((rows + t.tile_m - 1) / t.tile_m) * local[1]};
  runtime_->Launch(GemmKernel(t), args, 2, global, local);
}

void RuntimeDevice::RunGemm(rk::Op op, Binding& io) {
  const std::string_view name = io.name();
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
}

void RuntimeDevice::RunAddInto(rk::Op /*op*/, Binding& io) {
  const std::string_view name = io.name();
  const int64_t n = io.Size("x");
  CheckElements(name, "y", io.Size("y"), n);
  Launch(main_, "add_into", n, io.In("x"), io.Out("y", n), n);
}

void RuntimeDevice::RunCopyOp(rk::Op /*op*/, Binding& io) {
  const int64_t n = io.Size("x");
  Launch(main_, "copy", n, io.In("x"), io.Out("y", n), n);
}

void RuntimeDevice::RunScale(rk::Op /*op*/, Binding& io) {
  const std::string_view name = io.name();
  const float factor = io.Float("factor");
  if (!std::isfinite(factor)) Fail("{}: factor = {} (must be finite)", name, factor);
  const int64_t n = io.Size("x");
  Launch(main_, "scale", n, io.Out("x", n), factor, n);
}

void RuntimeDevice::RunBlockSquares(rk::Op /*op*/, Binding& io) {
  const int64_t n = io.Size("x"), blocks = (n + rk::kNormBlock - 1) / rk::kNormBlock;
  const Buffer& lanes = io.Scratch(2 * blocks * rk::kReductionLanes);
  Launch(norm_, "block_square_lanes", blocks * rk::kReductionLanes, io.In("x"), n, lanes, blocks);
  Launch(norm_, "block_square_fold", blocks, lanes, io.Out("sums", blocks), blocks);
}

void RuntimeDevice::RunCanonicalizeNaNs(rk::Op /*op*/, Binding& io) {
  const int64_t n = io.Size("x");
  Launch(main_, "canonicalize_nans", n, io.Out("x", n), n);
}

void RuntimeDevice::RunRoundToBf16(rk::Op /*op*/, Binding& io) {
  const int64_t n = io.Size("x");
  Launch(main_, "round_to_bf16", n, io.In("x"), io.Out("y", n), n);
}

void RuntimeDevice::RunBf16Conversion(rk::Op op, Binding& io) {
  const int64_t n = io.Size("x");
  Launch(main_, op == rk::Op::kToBf16 ? "to_bf16" : "from_bf16", n, io.In("x"), io.Out("y", n), n);
}

void RuntimeDevice::RunAdamW(rk::Op /*op*/, Binding& io) {
  const std::string_view name = io.name();
  const rk::AdamWParams p{io.Float("lr"),  io.Float("beta1"),        io.Float("beta2"),
                          io.Float("eps"), io.Float("weight_decay"), io.Int("step")};
  const rk::AdamWScalars s = rk::AdamWScalarsOf(p);  // validates the arguments
  const int64_t n = io.Size("param");
  for (const char* role : {"grad", "m", "v"}) CheckElements(name, role, io.Size(role), n);
  Launch(main_, "adamw", n, io.Out("param", n), io.In("grad"), io.Out("m", n), io.Out("v", n),
         s.decay, s.beta1, s.one_minus_beta1, s.beta2, s.one_minus_beta2, s.sqrt_bc2, s.eps,
         s.step_size, n);
}

void RuntimeDevice::RunSwiglu(rk::Op op, Binding& io) {
  const std::string_view name = io.name();
  const int64_t rows = io.Positive("rows"), f = io.Positive("f");
  CheckElements(name, "gu", io.Size("gu"), rows * 2 * f);
  if (op == rk::Op::kSwigluFwd) {
    Launch(main_, "swiglu_fwd", rows * f, io.In("gu"), io.Out("act", rows * f), rows, f);
  } else {
    CheckElements(name, "dact", io.Size("dact"), rows * f);
    Launch(main_, "swiglu_bwd", rows * f, io.In("gu"), io.In("dact"), io.Out("dgu", rows * 2 * f),
           rows, f);
  }
}

void RuntimeDevice::RunAttention(rk::Op op, Binding& io) {
  const std::string_view name = io.name();
  const int64_t batch = io.Positive("batch"), seq = io.Positive("seq"),
                q_heads = io.Positive("q_heads"), kv_heads = io.Positive("kv_heads"),
                d = io.Positive("head_dim"), window = io.Int("window"), past = io.IntOr("past", 0);
  const float scale = io.Float("scale");
  if (q_heads % kv_heads != 0) {
    Fail("{}: q_heads = {} is not a multiple of kv_heads = {}", name, q_heads, kv_heads);
  }
  if (window < 0) Fail("{}: window = {} (must be >= 0)", name, window);
  if (past < 0 || (past > 0 && op != rk::Op::kAttentionFwd) || past > rk::kAttentionMaxPast) {
    Fail("{}: past = {} (the forward's keys before the queries: 0 .. 2^40)", name, past);
  }
  if (!(scale > 0) || !std::isfinite(scale)) Fail("{}: scale = {} (must be > 0)", name, scale);
  const int64_t nq = batch * seq * q_heads * d, nkv = batch * (past + seq) * kv_heads * d;
  const int64_t rows = batch * q_heads * seq;
  CheckElements(name, "q", io.Size("q"), nq);
  CheckElements(name, "k", io.Size("k"), nkv);
  CheckElements(name, "v", io.Size("v"), nkv);
  const Buffer &q = io.In("q"), &k = io.In("k"), &v = io.In("v");
  if (op == rk::Op::kAttentionFwd) {
    Launch(main_, "attention_fwd", rows, q, k, v, io.Out("out", nq), io.Out("lse", rows), batch,
           seq, q_heads, kv_heads, d, window, scale, past);
    return;
  }
  CheckElements(name, "out", io.Size("out"), nq);
  CheckElements(name, "dout", io.Size("dout"), nq);
  CheckElements(name, "lse", io.Size("lse"), rows);
  const Buffer &o = io.In("out"), &dout = io.In("dout"), &lse = io.In("lse");
  const Buffer& delta = io.Scratch(rows);
  const Buffer &dq = io.Out("dq", nq), &dk = io.Out("dk", nkv), &dv = io.Out("dv", nkv);
  Launch(main_, "attention_delta", rows, dout, o, delta, batch, seq, q_heads, d);
  Launch(main_, "attention_dq", rows, q, k, v, dout, lse, delta, dq, batch, seq, q_heads, kv_heads,
         d, window, scale);
  Launch(main_, "attention_dkv", batch * seq * kv_heads, q, k, v, dout, lse, delta, dk, dv, batch,
         seq, q_heads, kv_heads, d, window, scale);
}

void RuntimeDevice::RunCrossEntropy(rk::Op op, Binding& io) {
  const std::string_view name = io.name();
  const int64_t rows = io.Positive("rows"), d = io.Positive("d"), vocab = io.Positive("vocab"),
                chunk = io.Positive("vocab_chunk");
  const float z_loss = io.Float("z_loss");
  if (chunk % rk::kGemmKChunk != 0) {
    Fail("{}: vocab_chunk = {} (must be a positive multiple of {})", name, chunk, rk::kGemmKChunk);
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
  const Buffer &h = io.In("h"), &w = io.In("w"), &targets = io.In("targets");
  const Buffer& z = io.Scratch(rows * vocab);
  Gemm(h, d, 1, w, 1, d, z, rows, vocab, d, /*accumulate=*/false);
  if (op == rk::Op::kCrossEntropyFwd) {
    Launch(main_, "cross_entropy_fwd", rows, z, targets, io.Out("loss", rows),
           io.Out("zloss", rows), io.Out("lse", rows), rows, vocab, z_loss);
    return;
  }
  const float grad_scale = io.Float("grad_scale");
  if (!std::isfinite(grad_scale)) Fail("{}: grad_scale = {} (must be finite)", name, grad_scale);
  CheckElements(name, "lse", io.Size("lse"), rows);
  CheckElements(name, "dw", io.Size("dw"), vocab * d);
  Launch(main_, "cross_entropy_dz", rows * vocab, z, targets, io.In("lse"), rows, vocab, z_loss,
         grad_scale);
  // dh = dz · w over the whole vocab (the chunked sequence of the contract is this GEMM);
  // dw += dzᵀ · h.
  Gemm(z, vocab, 1, w, d, 1, io.Out("dh", rows * d), rows, d, vocab, /*accumulate=*/false);
  Gemm(z, 1, vocab, h, d, 1, io.Out("dw", vocab * d), vocab, d, rows, /*accumulate=*/true);
}

void RuntimeDevice::RunRowSum(rk::Op /*op*/, Binding& io) {
  const std::string_view name = io.name();
  const int64_t rows = io.Positive("rows"), cols = io.Int("cols");
  CheckElements(name, "x", io.Size("x"), rows * cols);
  Launch(main_, "row_sum", rows, io.In("x"), io.Out("sum", rows), rows, cols);
}

void RuntimeDevice::RunRmsNormFwd(rk::Op /*op*/, Binding& io) {
  const std::string_view name = io.name();
  const int64_t rows = io.Positive("rows"), cols = io.Positive("cols");
  const float eps = io.Float("eps");
  if (!(eps > 0) || !std::isfinite(eps)) Fail("{}: eps = {} (must be > 0)", name, eps);
  CheckElements(name, "x", io.Size("x"), rows * cols);
  const bool has_gain = io.Has("gain");
  if (has_gain) CheckElements(name, "gain", io.Size("gain"), cols);
  Launch(main_, "rmsnorm_fwd", rows, io.In("x"), has_gain ? io.In("gain") : io.Scratch(0),
         has_gain ? 1 : 0, eps, 1.0f / static_cast<float>(cols), io.Out("y", rows * cols),
         io.Out("rstd", rows), rows, cols);
}

void RuntimeDevice::RunRmsNormBwd(rk::Op /*op*/, Binding& io) {
  const std::string_view name = io.name();
  const int64_t rows = io.Positive("rows"), cols = io.Positive("cols");
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
}

void RuntimeDevice::RunRope(rk::Op op, Binding& io) {
  const std::string_view name = io.name();
  const bool inverse = op == rk::Op::kRopeBwd;
  const std::string_view x_role = inverse ? "dy" : "x", y_role = inverse ? "dx" : "y";
  const int64_t batch = io.Positive("batch"), seq = io.Positive("seq"),
                heads = io.Positive("heads"), head_dim = io.Positive("head_dim"),
                table_seq = io.Positive("table_seq"), first = io.IntOr("position", 0);
  if (first < 0 || first > table_seq - seq) {
    Fail("{}: positions {} .. {} are outside the table's 0 .. {}", name, first, first + seq - 1,
         table_seq - 1);
  }
  const int64_t n = batch * seq * heads * head_dim;
  CheckElements(name, x_role, io.Size(x_role), n);
  const auto& [cos, sin] = RopeTables(table_seq, head_dim, io.Float("theta"));
  Launch(main_, "rope", n / 2, io.In(x_role), io.Out(y_role, n), cos, sin, seq, heads, head_dim / 2,
         n / 2, inverse ? 1 : 0, first);
}

void RuntimeDevice::RunEmbedding(rk::Op op, Binding& io) {
  const std::string_view name = io.name();
  const int64_t vocab = io.Positive("vocab"), d = io.Positive("d");
  const std::span<const uint32_t> ids = io.U("ids");
  for (size_t i = 0; i < ids.size(); ++i) {
    if (ids[i] >= static_cast<uint64_t>(vocab)) {
      Fail("{}: ids[{}] = {} is out of range (vocab = {})", name, i, ids[i], vocab);
    }
  }
  const auto n = static_cast<int64_t>(ids.size());
  if (op == rk::Op::kEmbeddingFwd) {
    CheckElements(name, "table", io.Size("table"), vocab * d);
    Launch(main_, "embedding_fwd", n * d, io.In("table"), io.In("ids"), io.Out("out", n * d), n, d);
  } else {
    CheckElements(name, "dout", io.Size("dout"), n * d);
    CheckElements(name, "dtable", io.Size("dtable"), vocab * d);
    Launch(main_, "embedding_bwd", d, io.In("dout"), io.In("ids"), io.Out("dtable", vocab * d), n,
           d);
  }
}

void RuntimeDevice::RunQuantizeRows(rk::Op /*op*/, Binding& io) {
  const int64_t rows = io.Positive("rows"), cols = io.Int("cols");
  CheckElements(io.name(), "x", io.Size("x"), rows * cols);
  Launch(main_, "quantize_rows", rows, io.In("x"), io.Out("q", rows * cols), io.Out("scale", rows),
         rows, cols);
}

void RuntimeDevice::RunQuantizeRowsByScale(rk::Op /*op*/, Binding& io) {
  const std::string_view name = io.name();
  const int64_t rows = io.Positive("rows"), cols = io.Positive("cols");
  CheckElements(name, "x", io.Size("x"), rows * cols);
  CheckElements(name, "scale", io.Size("scale"), rows);
  Launch(main_, "quantize_rows_by_scale", rows * cols, io.In("x"), io.In("scale"),
         io.Out("q", rows * cols), rows, cols);
}

void RuntimeDevice::RunGemmI8XWt(rk::Op /*op*/, Binding& io) {
  const std::string_view name = io.name();
  const int64_t m = io.Positive("m"), n = io.Positive("n"), k = io.Int("k");
  if (k < 0 || k > rk::kInt8MaxK) Fail("{}: k = {} (must be in [0, {}])", name, k, rk::kInt8MaxK);
  CheckElements(name, "x", io.Size("x"), m * k);
  CheckElements(name, "sx", io.Size("sx"), m);
  CheckElements(name, "w", io.Size("w"), n * k);
  CheckElements(name, "sw", io.Size("sw"), n);
  Launch(main_, "gemm_i8_xwt", (m + kInt8Tile - 1) / kInt8Tile * ((n + kInt8Tile - 1) / kInt8Tile),
         io.In("x"), io.In("sx"), io.In("w"), io.In("sw"), io.Out("y", m * n), m, n, k);
}

void RuntimeDevice::RunDequantizeRows(rk::Op /*op*/, Binding& io) {
  const std::string_view name = io.name();
  const int64_t rows = io.Positive("rows"), cols = io.Int("cols");
  CheckElements(name, "q", io.Size("q"), rows * cols);
  CheckElements(name, "scale", io.Size("scale"), rows);
  Launch(main_, "dequantize_rows", rows * cols, io.In("q"), io.In("scale"),
         io.Out("y", rows * cols), rows, cols);
}

// hadamard_rows into the op's scratch, then quantize_rows from there: the same two steps as the
// CPU's (rk::HadamardQuantizeRows is QuantizeRows of HadamardRows).
void RuntimeDevice::RunHadamardQuantizeRows(rk::Op /*op*/, Binding& io) {
  const std::string_view name = io.name();
  const int64_t rows = io.Positive("rows"), cols = io.Positive("cols");
  const int64_t transpose = io.Int("transpose");
  if (transpose != 0 && transpose != 1)
    Fail("{}: transpose = {} (must be 0 or 1)", name, transpose);
  CheckElements(name, "x", io.Size("x"), rows * cols);
  const int64_t block = rk::HadamardBlock(transpose != 0 ? rows : cols);
  const Buffer& rotated = io.Scratch(rows * cols);
  Launch(main_, "hadamard_rows", rows * cols / block, io.In("x"), rotated, rows, cols,
         static_cast<int>(transpose), block);
  const int64_t lines = transpose != 0 ? cols : rows, len = transpose != 0 ? rows : cols;
  Launch(main_, "quantize_rows", lines, rotated, io.Out("q", rows * cols), io.Out("scale", lines),
         lines, len);
}

const Recipe* RecipeOf(rk::Op op) {
  constexpr bool kFp64 = true;
  static const Recipe kRecipes[] = {
      {rk::Op::kGemmXWt, &RuntimeDevice::RunGemm},
      {rk::Op::kGemmDyW, &RuntimeDevice::RunGemm},
      {rk::Op::kGemmDytX, &RuntimeDevice::RunGemm},
      {rk::Op::kAddInto, &RuntimeDevice::RunAddInto},
      {rk::Op::kCopy, &RuntimeDevice::RunCopyOp},
      {rk::Op::kScale, &RuntimeDevice::RunScale},
      {rk::Op::kBlockSquares, &RuntimeDevice::RunBlockSquares, kFp64},
      {rk::Op::kCanonicalizeNaNs, &RuntimeDevice::RunCanonicalizeNaNs},
      {rk::Op::kRoundToBf16, &RuntimeDevice::RunRoundToBf16},
      {rk::Op::kToBf16, &RuntimeDevice::RunBf16Conversion},
      {rk::Op::kFromBf16, &RuntimeDevice::RunBf16Conversion},
      {rk::Op::kAdamW, &RuntimeDevice::RunAdamW},
      {rk::Op::kSwigluFwd, &RuntimeDevice::RunSwiglu},
      {rk::Op::kSwigluBwd, &RuntimeDevice::RunSwiglu},
      {rk::Op::kAttentionFwd, &RuntimeDevice::RunAttention},
      {rk::Op::kAttentionBwd, &RuntimeDevice::RunAttention},
      {rk::Op::kCrossEntropyFwd, &RuntimeDevice::RunCrossEntropy},
      {rk::Op::kCrossEntropyBwd, &RuntimeDevice::RunCrossEntropy},
      {rk::Op::kRowSum, &RuntimeDevice::RunRowSum},
      {rk::Op::kRmsNormFwd, &RuntimeDevice::RunRmsNormFwd},
      {rk::Op::kRmsNormBwd, &RuntimeDevice::RunRmsNormBwd},
      {rk::Op::kRopeFwd, &RuntimeDevice::RunRope},
      {rk::Op::kRopeBwd, &RuntimeDevice::RunRope},
      {rk::Op::kEmbeddingFwd, &RuntimeDevice::RunEmbedding},
      {rk::Op::kEmbeddingBwd, &RuntimeDevice::RunEmbedding},
      {rk::Op::kQuantizeRows, &RuntimeDevice::RunQuantizeRows},
      {rk::Op::kGemmI8XWt, &RuntimeDevice::RunGemmI8XWt},
      {rk::Op::kDequantizeRows, &RuntimeDevice::RunDequantizeRows},
      {rk::Op::kHadamardQuantizeRows, &RuntimeDevice::RunHadamardQuantizeRows},
      {rk::Op::kQuantizeRowsByScale, &RuntimeDevice::RunQuantizeRowsByScale},
  };
  const auto it = std::ranges::find(kRecipes, op, &Recipe::op);
  return it == std::end(kRecipes) ? nullptr : &*it;
}

void RuntimeDevice::RunBound(rk::Op op, Binding& io) {
  if (!Implements(op)) Fail("op {} does not run on the device", io.name());
  (this->*RecipeOf(op)->run)(op, io);
  io.Finish();
}

}  // namespace

std::unique_ptr<Device> Open(const DeviceChoice& choice) {
  if (choice.runtime == DeviceChoice::Runtime::kCuda) {
    return std::make_unique<RuntimeDevice>(OpenCuda(choice));
  }
  return std::make_unique<RuntimeDevice>(OpenOpenCl(choice, {}));
}

std::unique_ptr<Device> OpenMutated(const DeviceChoice& choice, const Mutation& mutation) {
  if (choice.runtime != DeviceChoice::Runtime::kOpenCl) {
    Fail("--device {}: the mutation test builds OpenCL programs only", choice.Flag());
  }
  return std::make_unique<RuntimeDevice>(OpenOpenCl(choice, mutation));
}

namespace {

// A device proves itself before a run uses it: every op it will run, at the op table's sample
// shape and the tiling and work-group size it will use, must give the CPU's bits (the scalar
// reference's, by the contract the selftest checks). A driver that reports success and computes
// nothing, or computes wrongly, is refused here, naming the device and the op, before any result
// of it is believed.
void CheckKnownAnswers(Device& device, const std::string& name) {
  for (const rk::OpSpec& spec : rk::OpTable()) {
    if (!device.Implements(spec.op)) continue;
    const rk::OpValues in = spec.sample();
    rk::OpValues want, got;
    spec.run(in, want);
    device.Run(spec.op, in, got);
    const std::vector<float> a = rk::OutputWords(spec, want), b = rk::OutputWords(spec, got);
    if (a.size() != b.size() || std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) != 0) {
      Fail(
          "--device {} ({}): op {} does not give the known answer (the CPU's bits at its sample "
          "shape): the device or its driver computes wrongly, and nothing it computes can be "
          "believed; refused (`lockstep selftest --device {}` shows every op)",
          name, device.info().name, spec.name, name);
    }
  }
}

// No device does fp32 GEMM faster than this (an H200 peaks at 67 TFLOP/s): a timing beyond it
// is a device that does not compute what it is timed on.
constexpr double kMaxPlausibleTflops = 1000;

}  // namespace

std::unique_ptr<Device> OpenForRun(std::string_view flag) {
  const std::optional<DeviceChoice> choice = ParseDeviceFlag(flag);
  if (!choice) return nullptr;
  std::unique_ptr<Device> device = Open(*choice);
  int ops = 0;
  std::string on_cpu;
  for (const rk::OpSpec& spec : rk::OpTable()) {
    if (device->Implements(spec.op)) {
      ++ops;
    } else {
      on_cpu += fmt::format("{}{}", on_cpu.empty() ? "" : ", ", spec.name);
    }
  }
  const std::string name = choice->Flag();
  fmt::print(stderr,
             "ops on {} ({}): {} of the op table's {} ops run there; on the CPU: {} "
             "(docs/devices.md)\n",
             name, device->info().name, ops, rk::OpTable().size(),
             on_cpu.empty() ? "none" : on_cpu);
  CheckKnownAnswers(*device, name);
  if (device->info().gpu) {  // seconds: each candidate built once and timed
    constexpr int64_t kTuneN = 2048;
    const std::vector<GemmTiming> timings = TuneGemm(*device, kTuneN, 2);
    const double tflops = 2.0 * std::pow(double(kTuneN), 3) /
                          std::ranges::min(timings, {}, &GemmTiming::seconds).seconds * 1e-12;
    if (!(tflops <= kMaxPlausibleTflops)) {
      Fail(
          "--device {} ({}): its GEMM timed at {:.0f} TFLOP/s, beyond any device's fp32 peak "
          "({:.0f}): a device that does not compute what it is timed on; refused",
          name, device->info().name, tflops, kMaxPlausibleTflops);
    }
    fmt::print(stderr, "GEMM tiling on {}: {}, the fastest of {} at {}³ ({:.2f} TFLOP/s)\n", name,
               device->gemm_tiling().Name(), timings.size(), kTuneN, tflops);
  }
  if (device->info().gpu) CheckKnownAnswers(*device, name);  // and at the tiling chosen
  fmt::print(stderr, "{}: every op placed there gave the known answer\n", name);
  return device;
}

}  // namespace lockstep::device
