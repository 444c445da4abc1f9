// The program table: which sources and -D defines make each program a device builds. The OpenCL
// runtime builds from it, the build compiles every entry to PTX for the CUDA runtime
// (tools/device_programs.cc prints it for scripts/ptx-build.sh), and scripts/ptx-check.sh checks
// that PTX.
#include <fmt/format.h>

#include "device/runtime.h"
#include "device/sources.h"
#include "lockstep/kernels.h"

namespace lockstep::device {

std::string_view BuildOptions() { return "-cl-std=CL1.2 -cl-fp32-correctly-rounded-divide-sqrt"; }

std::span<const std::string_view> ForbiddenBuildOptions() {
  static constexpr std::string_view kForbidden[] = {
      "-cl-mad-enable",       "-cl-fast-relaxed-math", "-cl-unsafe-math-optimizations",
      "-cl-denorms-are-zero", "-cl-finite-math-only",  "-cl-no-signed-zeros"};
  return kForbidden;
}

std::span<const KernelSource> KernelSources() { return kKernelSources; }

std::span<const GemmTiling> GemmCandidates() {
  // Each assembles for sm_80 and sm_90 with its register tile in registers (no stack frame, no
  // spills) and at least 8 warps resident per multiprocessor: scripts/ptx-check.sh checks both.
  static constexpr GemmTiling kCandidates[] = {
      {},  // the default: 256 work-items, 4 outputs each
      {64, 64, 4, 4, 16, 0},
      {64, 64, 4, 4, 16, 1},
      {128, 64, 8, 4, 16, 1},
      {64, 128, 4, 8, 16, 1},
      {128, 64, 8, 4, 32, 0},
      {128, 128, 8, 4, 16, 1},
      {128, 128, 8, 8, 8, 1},
      {128, 128, 8, 8, 16, 1},
  };
  return kCandidates;
}

std::string GemmTiling::Name() const {
  return fmt::format("{}x{}/{}x{}/{}{}", tile_m, tile_n, reg_m, reg_n, k_tile,
                     double_buffer != 0 ? "/db" : "");
}

ProgramSpec MainProgram() {
  // dmath.cl first: the others call its exp and log.
  ProgramSpec spec{"main", {"dmath.cl"}, fmt::format("-DI8_TILE={}", kInt8Tile)};
  for (const KernelSource& source : KernelSources()) {
    if (source.name != "dmath.cl" && source.name != "gemm.cl" && source.name != "norm.cl") {
      spec.sources.push_back(source.name);
    }
  }
  return spec;
}

ProgramSpec NormProgram() {
  return {"norm",
          {"norm.cl"},
          fmt::format("-DBLOCK={} -DLANES={}", rk::kNormBlock, rk::kReductionLanes)};
}

ProgramSpec GemmProgram(const GemmTiling& t) {
  return {
      fmt::format("gemm-{}x{}-{}x{}-{}{}", t.tile_m, t.tile_n, t.reg_m, t.reg_n, t.k_tile,
                  t.double_buffer != 0 ? "-db" : ""),
      {"gemm.cl"},
      fmt::format("-DTILE_M={} -DTILE_N={} -DREG_M={} -DREG_N={} -DK_TILE={} -DDOUBLE_BUFFER={}",
                  t.tile_m, t.tile_n, t.reg_m, t.reg_n, t.k_tile, t.double_buffer)};
}

std::vector<ProgramSpec> ProgramTable() {
  std::vector<ProgramSpec> table = {MainProgram(), NormProgram()};
  for (const GemmTiling& t : GemmCandidates()) table.push_back(GemmProgram(t));
  return table;
}

}  // namespace lockstep::device
