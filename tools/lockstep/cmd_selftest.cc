// `lockstep selftest`: every op on fixed inputs, every usable variant x {1,2,3,4,7} threads,
// compared bit for bit with the scalar reference at one thread.
#include <fmt/format.h>

#include <memory>

#include <bit>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <optional>
#include <cstdint>
#include <iterator>
#include <functional>
#include <string>
#include <vector>

#include "lockstep/core.h"
#include "lockstep/device.h"
#include "lockstep/kernels.h"
#include "lockstep/model.h"
#include "tools/lockstep/commands.h"

namespace lockstep::cli {
namespace {

using Floats = std::vector<float>;

Floats Inputs(int64_t n, uint32_t seed, bool specials = true) {
  return rk::SelftestFloats(n, seed, specials);
}

void Append(Floats& out, const Floats& more) { out.insert(out.end(), more.begin(), more.end()); }

struct Case {
  std::string name;
  std::function<Floats()> run;
};

// docs/numerics.md ("NaN"): only dmath, the global norm and AdamW fix the bits of the NaNs they
// return; in every other op a NaN's sign and payload are not part of the contract (the trainer
// canonicalises what it hashes), so those cases compare NaNs as the canonical NaN.
std::function<Floats()> NaNsCanonical(std::function<Floats()> run) {
  return [run = std::move(run)] {
    Floats out = run();
    rk::CanonicalizeNaNs(out);
    return out;
  };
}

std::vector<Case> Cases() {
  std::vector<Case> cases;
  // Every op of the op table (a training step's ops), on its sample call: all its outputs.
  for (const rk::OpSpec& spec : rk::OpTable()) {
    cases.push_back({fmt::format("op {} ({})", spec.name, spec.kernel), [&spec] {
                       rk::OpValues out;
                       spec.run(spec.sample(), out);
                       return rk::OutputWords(spec, out);
                     }});
  }
  cases.push_back({"row sum / sumsq / max 9x1001", NaNsCanonical([] {
                     Floats x = Inputs(9 * 1001, 7), out(27);
                     rk::RowSum(x, std::span(out).subspan(0, 9), 9, 1001);
                     rk::RowSumSquares(x, std::span(out).subspan(9, 9), 9, 1001);
                     rk::RowMax(x, std::span(out).subspan(18, 9), 9, 1001);
                     return out;
                   })});
  cases.push_back({"global norm + clip 3 tensors (70000, 17, 131073), with and without NaN", [] {
                     Floats out;
                     for (bool specials : {true, false}) {
                       Floats a = Inputs(70000, 26, specials), b = Inputs(17, 27),
                              c = Inputs(131073, 28, specials);
                       const std::span<const float> list[] = {a, b, c};
                       const float norm = rk::GlobalNorm(list);
                       const float factor = rk::ClipFactor(norm, 1.0f);
                       out.push_back(norm);
                       out.push_back(factor);
                       if (!std::isnan(factor)) rk::Scale(b, factor);
                       Append(out, b);
                     }
                     return out;
                   }});
  cases.push_back({"dmath exp/log/sin/cos/pow/erf/erfinv/sqrt/rsqrt", [] {
                     Floats x = Inputs(4099, 29), out;
                     x.insert(x.end(), rk::kSelftestSpecials.begin(), rk::kSelftestSpecials.end());
                     for (float v : x) {
                       const float a = v * 80.0f;
                       for (float r : {dmath::Exp(a), dmath::Log(v * v * 1e3f), dmath::Sin(a),
                                       dmath::Cos(a), dmath::Pow(v * v * 4.0f, a * 0.1f),
                                       dmath::Erf(v * 4.0f), dmath::Erfinv(v),
                                       dmath::Sqrt(v * v), dmath::Rsqrt(v * v)}) {
                         out.push_back(r);
                       }
                     }
                     return out;
                   }});
  cases.push_back({"erfinv over an array (the init's vector form) n=4099+specials", [] {
                     Floats x = Inputs(4099, 31);
                     x.insert(x.end(), rk::kSelftestSpecials.begin(), rk::kSelftestSpecials.end());
                     rk::ErfinvInPlace(x);
                     return x;
                   }});
  cases.push_back({"the init's first erfinv approximation n=4099 (its arguments)", [] {
                     Floats x(4099);
                     for (size_t i = 0; i < x.size(); ++i) {
                       x[i] = rk::InitErfinvArgument(static_cast<uint32_t>(i * 1048573u));
                     }
                     rk::InitErfinvFirstApproximationInPlace(x);
                     return x;
                   }});
  cases.push_back({"philox words n=4099 from word 2^34+3", [] {
                     std::vector<uint32_t> words(4099);
                     rk::PhiloxWords(PhiloxKeyFromSeed(77), (uint64_t{1} << 34) + 3, words);
                     Floats out;
                     for (const uint32_t w : words) out.push_back(std::bit_cast<float>(w));
                     return out;
                   }});
  cases.push_back({"truncated-normal init n=70001 (first draw 5), and 70001 of a matrix large "
                   "enough for the erfinv table",
                   [] {
                     ModelConfig model = LoadRunConfig("tiny").model;
                     Floats out(70001), large(70001);
                     const ParamSpec spec{"w", {70001}, true, true};
                     InitTensorRange(model, 99, spec, 5, 0, out);
                     const ParamSpec matrix{"w", {2, kInitTableDraws}, true, true};
                     InitTensorRange(model, 99, matrix, 5, kInitTableDraws - 20000, large);
                     Append(out, large);
                     return out;
                   }});
  return cases;
}

struct SelftestOptions {
  bool verbose = false;
  std::string device = "cpu";
  std::string dump_programs;  // a directory, with a device
  int64_t time_gemm = 0;      // n, with --device opencl
};

// The ops of the op table on an OpenCL device against the scalar reference at one thread, each
// at several work-group sizes (and the GEMM at several tilings): same bits, or the op fails.
int RunDeviceSelftest(const device::DeviceChoice& choice, const SelftestOptions& options) {
  const std::unique_ptr<device::Device> dev = device::Open(choice);
  const device::DeviceInfo& info = dev->info();
  fmt::print("lockstep selftest: every op on {} vs the scalar reference at 1 thread\n",
             choice.Flag());
  fmt::print("device: {} ({}; {}; driver {})\n\n", info.name, info.platform_name, info.version,
             info.driver);
  std::vector<size_t> work_groups;
  for (const size_t w : {size_t{0}, size_t{1}, size_t{7}, size_t{64}, size_t{256}}) {
    if (w <= info.max_work_group) work_groups.push_back(w);
  }
  // A few small tilings (which the CUDA runtime, running the candidates' PTX only, skips) and
  // every GPU candidate.
  std::vector<device::GemmTiling> tilings = {
      {8, 8, 1, 1, 8, 0}, {32, 32, 2, 2, 16, 1}, {64, 32, 4, 2, 32, 0}};
  tilings.insert(tilings.end(), device::GemmCandidates().begin(), device::GemmCandidates().end());
  int failures = 0, on_device = 0;
  rk::SetIsa(rk::ReferenceIsa());  // the reference's outputs, at one thread
  SetThreads(1);
  for (const rk::OpSpec& spec : rk::OpTable()) {
    const std::string name = fmt::format("op {} ({})", spec.name, spec.kernel);
    if (!dev->Implements(spec.op)) {
      fmt::print("{:<52} on the CPU (docs/devices.md, \"What runs where\")\n", name);
      continue;
    }
    ++on_device;
    const rk::OpValues in = spec.sample();
    rk::OpValues reference;
    spec.run(in, reference);
    const Floats want = rk::OutputWords(spec, reference);
    const bool gemm = spec.op == rk::Op::kGemmXWt || spec.op == rk::Op::kGemmDyW ||
                      spec.op == rk::Op::kGemmDytX;
    std::string row;
    bool ok = true;
    const auto check = [&](const std::string& label) {
      rk::OpValues out;
      dev->Run(spec.op, in, out);
      const Floats got = rk::OutputWords(spec, out);
      const bool equal = got.size() == want.size() &&
                         std::memcmp(got.data(), want.data(), got.size() * sizeof(float)) == 0;
      row += fmt::format(" {}{}", label, equal ? "=" : "≠");
      if (!equal && options.verbose) {
        size_t i = 0;
        while (i < std::min(got.size(), want.size()) &&
               std::bit_cast<uint32_t>(got[i]) == std::bit_cast<uint32_t>(want[i])) {
          ++i;
        }
        row += fmt::format("(first difference at element {} of {})", i, want.size());
      }
      ok &= equal;
    };
    if (gemm) {
      for (const device::GemmTiling& t : tilings) {
        if (dev->Fits(t)) {
          dev->set_gemm_tiling(t);
          check(t.Name());
        }
      }
    } else {
      for (const size_t w : work_groups) {
        dev->set_work_group(w);
        check(w == 0 ? std::string("wg=driver") : fmt::format("wg={}", w));
      }
    }
    fmt::print("{:<52} {:>9} {} {}\n", name, want.size(), row, ok ? "OK" : "MISMATCH");
    failures += ok ? 0 : 1;
  }
  fmt::print("\n{} ops on the device, {} mismatching: {}\n", on_device, failures,
             failures == 0 ? "every result is bit-identical to the reference" : "FAILED");
  dev->set_gemm_tiling({});
  if (!options.dump_programs.empty()) {
    const std::filesystem::path dir = options.dump_programs;
    std::filesystem::create_directories(dir);
    for (const auto& [name, bytes] : dev->ProgramBinaries()) {
      // NVIDIA's drivers return PTX text: named so that scripts/ptx-check.sh finds it.
      const bool ptx = bytes.find(".version") != std::string::npos &&
                       bytes.find(".target") != std::string::npos;
      const std::filesystem::path path = dir / (name + (ptx ? ".ptx" : ".bin"));
      WriteFileSynced(path, bytes);
      fmt::print("program binary: {} ({} bytes{})\n", path.string(), bytes.size(),
                 ptx ? ", PTX" : "");
    }
  }
  if (options.time_gemm > 0) {  // one JSON line: every candidate tiling's time, the fastest
    const int64_t n = options.time_gemm;
    const double flops = 2.0 * static_cast<double>(n) * static_cast<double>(n) *
                         static_cast<double>(n);
    const std::vector<device::GemmTiming> timings = device::TuneGemm(*dev, n, 3);
    std::string tilings;
    for (const device::GemmTiming& t : timings) {
      tilings += fmt::format("{}{{\"tiling\": \"{}\", \"seconds\": {:.6f}, \"tflops\": {:.3f}}}",
                             tilings.empty() ? "" : ", ", t.tiling.Name(), t.seconds,
                             flops / t.seconds * 1e-12);
    }
    const device::GemmTiming& best = std::ranges::min(timings, {}, &device::GemmTiming::seconds);
    fmt::print("{{\"gemm\": \"xwt\", \"m\": {}, \"n\": {}, \"k\": {}, \"tiling\": \"{}\", "
               "\"seconds\": {:.6f}, \"tflops\": {:.3f}, \"tilings\": [{}]}}\n",
               n, n, n, best.tiling.Name(), best.seconds, flops / best.seconds * 1e-12, tilings);
  }
  return failures == 0 ? 0 : 1;
}

int RunSelftest(const SelftestOptions& options) {
  const std::vector<rk::Isa> usable = rk::UsableIsas();
  std::string variants;
  for (const rk::Isa& isa : usable) variants += (variants.empty() ? "" : ", ") + isa.name;
  fmt::print("lockstep selftest: every op vs the scalar reference at 1 thread\n");
  fmt::print("variants: {}; threads: 1 2 3 4 7; {}\n\n", variants, DescribeFloatingPointState());
  fmt::print("{:<52} {:>9}  {}\n", "op", "floats", "variant x threads");
  int failures = 0;
  for (const Case& c : Cases()) {
    const auto results = rk::SweepVariants(c.run, rk::kSweepThreadCounts);
    std::string row;
    bool ok = true;
    for (const rk::Isa& isa : usable) {
      row += fmt::format(" {}:", isa.name);
      for (const rk::SweepResult& r : results) {
        if (r.isa != isa) continue;
        row += r.equal ? fmt::format(" {}=", r.threads) : fmt::format(" {}≠", r.threads);
        if (!r.equal) {
          ok = false;
          if (options.verbose) {
            row += fmt::format("(first difference at element {} of {})", r.first_diff, r.size);
          }
        }
      }
    }
    fmt::print("{:<52} {:>9} {} {}\n", c.name, results.empty() ? 0 : results.front().size, row,
               ok ? "OK" : "MISMATCH");
    failures += ok ? 0 : 1;
  }
  fmt::print("\n{} ops, {} mismatching: {}\n", Cases().size(), failures,
             failures == 0 ? "every result is bit-identical to the reference" : "FAILED");
  return failures == 0 ? 0 : 1;
}

}  // namespace

void AddSelftestCommand(CLI::App& app, int* exit_code) {
  auto options = std::make_shared<SelftestOptions>();
  CLI::App* cmd = app.add_subcommand(
      "selftest",
      "run every kernel on fixed inputs with every usable SIMD variant and the scalar reference "
      "at 1, 2, 3, 4 and 7 threads; exit 0 only if every result equals the reference bit for bit");
  cmd->add_flag("--verbose", options->verbose, "name the first differing element of a mismatch");
  cmd->add_option("--device", options->device,
                  "cpu (every SIMD variant and thread count); or opencl / opencl:P:D, cuda / "
                  "cuda:N: the ops of the op table on that device (`lockstep --version` lists "
                  "them) at several work-group sizes and every GEMM tiling it fits, against the "
                  "scalar reference; ops not on the device are listed as such")
      ->capture_default_str();
  cmd->add_option("--dump-programs", options->dump_programs,
                  "with a device: write the programs as its compiler built them into this "
                  "directory (PTX on NVIDIA, as NAME.ptx, for scripts/ptx-check.sh)")
      ->check(OutputPath(OutputKind::kDirectory));
  cmd->add_option("--time-gemm", options->time_gemm,
                  "with a device: time the device GEMM (y = x·wᵀ, N x N x N, operands on "
                  "the device, best of 3) and print it as a JSON line with TFLOP/s")
      ->check(IntegerIn(1, 32768));
  auto internal = std::make_shared<bool>(false);
  cmd->add_flag("--test-internal-error", *internal,
                "test-only: fail an internal invariant, to show how lockstep reports its own bugs "
                "(exit status 70, never 2)")
      ->group("Test faults");
  cmd->final_callback([options, exit_code, internal] {
    LOCKSTEP_CHECK(!*internal, "--test-internal-error was given");
    const std::optional<device::DeviceChoice> choice = device::ParseDeviceFlag(options->device);
    if (!choice && (!options->dump_programs.empty() || options->time_gemm > 0)) {
      Fail("--dump-programs and --time-gemm need a device: --device opencl[:P:D] or cuda[:N]");
    }
    *exit_code = choice ? RunDeviceSelftest(*choice, *options) : RunSelftest(*options);
  });
}

}  // namespace lockstep::cli
