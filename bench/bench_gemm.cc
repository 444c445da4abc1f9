// bench_gemm: lockstep's GEMM vs OpenBLAS sgemm, timed side by side in one process, for the
// three linear-layer forms at 1 and 2 threads. Also reports whether each library's output bits
// change between 1 and 2 threads. With --int8: lockstep's exact int8 GEMM against its fp32 GEMM
// and oneDNN's u8s8s32 GEMM (the anchor). `--json` prints a JSON array; otherwise a table.
#include <cblas-openblas.h>
#include <dnnl.h>
#include <fmt/format.h>
#include <omp.h>

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include "lockstep/core.h"
#include "lockstep/kernels.h"

namespace {

using lockstep::rk::GemmDytX;
using lockstep::rk::GemmDyW;
using lockstep::rk::GemmXWt;

struct Shape {
  int64_t m, n, k;
};

enum class Form { kXWt, kDyW, kDytX };
const char* FormName(Form f) { return f == Form::kXWt ? "xwt" : f == Form::kDyW ? "dyw" : "dytx"; }

std::vector<float> Fill(int64_t n, uint32_t seed) {
  std::vector<float> v(static_cast<size_t>(n));
  uint32_t s = seed * 2654435761u + 1;
  for (float& x : v) {
    s = s * 1664525u + 1013904223u;
    x = static_cast<float>(static_cast<int32_t>(s >> 8) - (1 << 23)) * 0x1.0p-23f;
  }
  return v;
}

// Operands of a form: in1, in2 and the output size, as the public API takes them.
struct Operands {
  std::vector<float> in1, in2, out;
};

Operands MakeOperands(Form f, const Shape& s) {
  switch (f) {
    case Form::kXWt: return {Fill(s.m * s.k, 1), Fill(s.n * s.k, 2), std::vector<float>(s.m * s.n)};
    case Form::kDyW: return {Fill(s.m * s.n, 3), Fill(s.n * s.k, 4), std::vector<float>(s.m * s.k)};
    case Form::kDytX: return {Fill(s.m * s.n, 5), Fill(s.m * s.k, 6), std::vector<float>(s.n * s.k)};
  }
  return {};
}

void RunLockstep(Form f, const Shape& s, Operands& o) {
  switch (f) {
    case Form::kXWt: GemmXWt(o.in1, o.in2, o.out, s.m, s.n, s.k); break;
    case Form::kDyW: GemmDyW(o.in1, o.in2, o.out, s.m, s.n, s.k); break;
    case Form::kDytX: GemmDytX(o.in1, o.in2, o.out, s.m, s.n, s.k); break;
  }
}

void RunOpenblas(Form f, const Shape& s, Operands& o) {
  const int m = static_cast<int>(s.m), n = static_cast<int>(s.n), k = static_cast<int>(s.k);
  switch (f) {
    case Form::kXWt:  // y[m,n] = x[m,k] w[n,k]^T
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, m, n, k, 1.0f, o.in1.data(), k,
                  o.in2.data(), k, 0.0f, o.out.data(), n);
      break;
    case Form::kDyW:  // dx[m,k] = dy[m,n] w[n,k]
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, m, k, n, 1.0f, o.in1.data(), n,
                  o.in2.data(), k, 0.0f, o.out.data(), k);
      break;
    case Form::kDytX:  // dw[n,k] = dy[m,n]^T x[m,k]
      cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, n, k, m, 1.0f, o.in1.data(), n,
                  o.in2.data(), k, 0.0f, o.out.data(), k);
      break;
  }
}

// Best of `reps` timed runs after one warm-up, in GFLOP/s.
template <class F>
double Gflops(const Shape& s, int reps, F run) {
  run();
  double best = 1e30;
  for (int r = 0; r < reps; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    run();
    best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  return 2.0 * static_cast<double>(s.m) * static_cast<double>(s.n) * static_cast<double>(s.k) /
         best * 1e-9;
}

bool SameBits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// The register ceiling of one core: the int8 form's multiply-add step (GroupStep in
// src/kernels/simd/int8_tile-inl.h) and fp32's FMA, each on 12 independent accumulators held in
// registers with no load, in GOP/s = GFLOP/s (2 per product). It bounds what any GEMM built on
// the instruction can reach, so int8_over_f32 of the GEMMs reads against int8_over_f32 here.
// x86 only; the operands (registers 12 and 14) are zeros: no denormal in the FMAs.
struct Ceiling {
  double int8_gops = 0, f32_gflops = 0;
};

#if defined(__x86_64__)
// Best of 5 runs of `iterations` × 12 steps, each step `products` multiply-adds, in G/s × 2.
template <class F>
double RegisterRate(F loop, double products) {
  constexpr long kIterations = 20'000'000;
  double best = 1e30;
  for (int r = 0; r < 5; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    loop(kIterations);
    best = std::min(best,
                    std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  return 2.0 * products * 12.0 * static_cast<double>(kIterations) / best * 1e-9;
}

#define LOCKSTEP_TWELVE(S) S(0) S(1) S(2) S(3) S(4) S(5) S(6) S(7) S(8) S(9) S(10) S(11)
#define LOCKSTEP_CEILING_LOOP(R, STEP)                                                            \
  [](long iterations) {                                                                           \
    asm volatile(                                                                                 \
        "vpxor %%xmm12, %%xmm12, %%xmm12\n vpxor %%xmm14, %%xmm14, %%xmm14\n"                     \
        "1:\n" LOCKSTEP_TWELVE(STEP) "dec %0\n jnz 1b\n"                                          \
        : "+r"(iterations)::R "0", R "1", R "2", R "3", R "4", R "5", R "6", R "7", R "8", R "9", \
          R "10", R "11", R "12", R "14", R "15", "cc");                                          \
  }
#define LOCKSTEP_MADD_Y(i) \
  "vpmaddwd %%ymm12, %%ymm14, %%ymm15\n vpaddd %%ymm15, %%ymm" #i ", %%ymm" #i "\n"
#define LOCKSTEP_MADD_Z(i) \
  "vpmaddwd %%zmm12, %%zmm14, %%zmm15\n vpaddd %%zmm15, %%zmm" #i ", %%zmm" #i "\n"
#define LOCKSTEP_DOT_Y(i) "%{vex%} vpdpbusd %%ymm12, %%ymm14, %%ymm" #i "\n"
#define LOCKSTEP_DOT_Z(i) "vpdpbusd %%zmm12, %%zmm14, %%zmm" #i "\n"
#define LOCKSTEP_FMA_Y(i) "vfmadd231ps %%ymm12, %%ymm14, %%ymm" #i "\n"
#define LOCKSTEP_FMA_Z(i) "vfmadd231ps %%zmm12, %%zmm14, %%zmm" #i "\n"

// The ceiling of lockstep's variant `isa` (its int8 form, its vector width); nullopt for a
// variant without an x86 int8 form.
std::optional<Ceiling> RegisterCeiling(const std::string& isa) {
  if (isa == "AVX3_DL" || isa == "AVX3") {  // 16 lanes
    return Ceiling{isa == "AVX3_DL"
                       ? RegisterRate(LOCKSTEP_CEILING_LOOP("xmm", LOCKSTEP_DOT_Z), 16 * 4)
                       : RegisterRate(LOCKSTEP_CEILING_LOOP("xmm", LOCKSTEP_MADD_Z), 16 * 2),
                   RegisterRate(LOCKSTEP_CEILING_LOOP("xmm", LOCKSTEP_FMA_Z), 16)};
  }
  if (isa == "AVX2_VNNI" || isa == "AVX2") {  // 8 lanes
    return Ceiling{isa == "AVX2_VNNI"
                       ? RegisterRate(LOCKSTEP_CEILING_LOOP("xmm", LOCKSTEP_DOT_Y), 8 * 4)
                       : RegisterRate(LOCKSTEP_CEILING_LOOP("xmm", LOCKSTEP_MADD_Y), 8 * 2),
                   RegisterRate(LOCKSTEP_CEILING_LOOP("xmm", LOCKSTEP_FMA_Y), 8)};
  }
  return std::nullopt;
}
#else
std::optional<Ceiling> RegisterCeiling(const std::string&) { return std::nullopt; }
#endif

// --int8: y[m, n] = x[m, k]·w[n, k]ᵀ three ways, timed side by side at 1 and 2 threads: lockstep's
// fp32 GemmXWt, lockstep's GemmI8XWt on the rows QuantizeRows makes of the same x and w (int8 in,
// fp32 out, the dequantization included), and oneDNN's dnnl_gemm_u8s8s32 on the same int8 values
// (x + 128 as u8, int32 out), which OpenMP threads. Rates in GFLOP/s = GOP/s (2·m·n·k).
std::vector<std::string> Int8Rows(const std::vector<Shape>& shapes, int reps, bool json,
                                  const std::string& isa) {
  using lockstep::rk::GemmI8XWt;
  using lockstep::rk::QuantizeRows;
  std::vector<std::string> rows;
  if (!json) {
    fmt::print("lockstep variant {}; oneDNN {}.{}; best of {} runs\n", isa, dnnl_version()->major,
               dnnl_version()->minor, reps);
  }
  if (const std::optional<Ceiling> c = RegisterCeiling(isa)) {
    if (json) {
      rows.push_back(fmt::format(
          "{{\"form\": \"register_ceiling\", \"threads\": 1, \"int8_gops\": {:.2f}, "
          "\"f32_gflops\": {:.2f}, \"int8_over_f32\": {:.3f}, \"lockstep_variant\": \"{}\"}}",
          c->int8_gops, c->f32_gflops, c->int8_gops / c->f32_gflops, isa));
    } else {
      fmt::print(
          "register ceiling, one core: int8 {:.1f} GOP/s, f32 {:.1f} GFLOP/s, i8/f32 {:.2f}\n",
          c->int8_gops, c->f32_gflops, c->int8_gops / c->f32_gflops);
    }
  }
  if (!json) {
    fmt::print("{:>5} {:>5} {:>5} {:>3} {:>9} {:>9} {:>9} {:>8} {:>8} {:>6}\n", "m", "n", "k",
               "thr", "f32", "int8", "onednn", "i8/f32", "i8/dnnl", "same");
  }
  for (const Shape& s : shapes) {
    const std::vector<float> x = Fill(s.m * s.k, 1), w = Fill(s.n * s.k, 2);
    std::vector<int8_t> qx(x.size()), qw(w.size());
    std::vector<float> sx(static_cast<size_t>(s.m)), sw(static_cast<size_t>(s.n));
    QuantizeRows(x, qx, sx, s.m, s.k);
    QuantizeRows(w, qw, sw, s.n, s.k);
    std::vector<uint8_t> xu(qx.size());
    for (size_t i = 0; i < qx.size(); ++i) xu[i] = static_cast<uint8_t>(qx[i] + 128);
    std::vector<float> y(static_cast<size_t>(s.m * s.n));
    std::vector<int32_t> c(y.size());
    const int32_t co = 0;
    std::vector<std::vector<float>> int8_out;
    for (int threads : {1, 2}) {
      lockstep::SetThreads(threads);
      omp_set_num_threads(threads);
      const double f32 = Gflops(s, reps, [&] { GemmXWt(x, w, y, s.m, s.n, s.k); });
      const double int8 = Gflops(s, reps, [&] { GemmI8XWt(qx, sx, qw, sw, y, s.m, s.n, s.k); });
      int8_out.push_back(y);
      const double onednn = Gflops(s, reps, [&] {
        if (dnnl_gemm_u8s8s32('N', 'T', 'F', s.m, s.n, s.k, 1.0f, xu.data(), s.k, 0, qw.data(), s.k,
                              0, 0.0f, c.data(), s.n, &co) != dnnl_success) {
          fmt::print(stderr, "bench_gemm: dnnl_gemm_u8s8s32 failed\n");
          std::exit(1);
        }
      });
      const bool same = threads == 1 || SameBits(int8_out[0], int8_out[1]);
      if (json) {
        rows.push_back(fmt::format(
            "{{\"form\": \"int8_xwt\", \"m\": {}, \"n\": {}, \"k\": {}, \"threads\": {}, "
            "\"lockstep_f32_gflops\": {:.2f}, \"lockstep_int8_gops\": {:.2f}, "
            "\"onednn_u8s8s32_gops\": {:.2f}, \"int8_over_f32\": {:.3f}, "
            "\"int8_over_onednn\": {:.3f}, \"int8_bitwise_same_as_1_thread\": {}, "
            "\"lockstep_variant\": \"{}\"}}",
            s.m, s.n, s.k, threads, f32, int8, onednn, int8 / f32, int8 / onednn, same, isa));
      } else {
        fmt::print("{:>5} {:>5} {:>5} {:>3} {:>9.1f} {:>9.1f} {:>9.1f} {:>8.2f} {:>8.2f} {:>6}\n",
                   s.m, s.n, s.k, threads, f32, int8, onednn, int8 / f32, int8 / onednn, same);
        std::fflush(stdout);
      }
    }
  }
  return rows;
}

void PrintUsage() {
  fmt::print(stderr,
             "usage: bench_gemm [--json] [--int8] [--variant NAME] [--reps N] [--quick]\n"
             "                  [--shape MxNxK]...\n"
             "  Times lockstep GEMM and OpenBLAS sgemm (best of N runs, default 3) for the\n"
             "  forms xwt (Y=X·Wᵀ), dyw (dX=dY·W), dytx (dW=dYᵀ·X) at 1 and 2 threads, for\n"
             "  a linear layer of M rows, N outputs and K inputs (--shape, repeatable;\n"
             "  default: four large shapes). --int8: instead, lockstep's exact int8 GEMM\n"
             "  (GemmI8XWt) against its fp32 GemmXWt and oneDNN's u8s8s32 GEMM, y = x·wᵀ.\n"
             "  It first prints the register ceiling of one core: the int8 form's multiply-add\n"
             "  step and fp32's FMA on registers alone (x86 variants).\n"
             "  --variant: lockstep's SIMD variant (as lockstep --version lists them; default\n"
             "  the best this CPU runs).\n");
}

}  // namespace

int main(int argc, char** argv) {
  // OpenBLAS picks its kernel when it loads: from OPENBLAS_CORETYPE when that is set (this
  // environment sets Haswell, half of OpenBLAS's speed on an AVX-512 CPU), else the best for the
  // CPU. The comparison is against the best, so run again without it; the kernel is printed.
  if (std::getenv("OPENBLAS_CORETYPE") != nullptr) {
    ::unsetenv("OPENBLAS_CORETYPE");
    ::execv("/proc/self/exe", argv);
    fmt::print(stderr, "bench_gemm: cannot re-run itself without OPENBLAS_CORETYPE\n");
    return 1;
  }
  bool json = false, int8 = false;
  std::string variant;
  int reps = 3;
  std::vector<Shape> shapes = {{4096, 2048, 2048}, {4096, 5632, 2048}, {4096, 2048, 5632},
                               {1024, 1024, 1024}};
  std::vector<Shape> chosen;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--json") {
      json = true;
    } else if (arg == "--int8") {
      int8 = true;
    } else if (arg == "--variant" && i + 1 < argc) {
      variant = argv[++i];
    } else if (arg == "--quick") {  // one small shape, for smoke-testing the program
      shapes = {{1024, 1024, 1024}};
      reps = 1;
    } else if (arg == "--reps" && i + 1 < argc) {
      reps = std::max(1, std::atoi(argv[++i]));
    } else if (arg == "--shape" && i + 1 < argc) {
      Shape s{};
      char end = 0;
      if (std::sscanf(argv[++i], "%ldx%ldx%ld%c", &s.m, &s.n, &s.k, &end) != 3 || s.m < 1 ||
          s.n < 1 || s.k < 1) {
        fmt::print(stderr, "bench_gemm: --shape {}: expected MxNxK with positive sizes\n", argv[i]);
        return 2;
      }
      chosen.push_back(s);
    } else {
      PrintUsage();
      return 2;
    }
  }
  if (!chosen.empty()) shapes = chosen;
  lockstep::RequireIeeeFloatingPoint();
  if (!variant.empty()) {
    bool found = false;
    for (const lockstep::rk::Isa& usable : lockstep::rk::UsableIsas()) {
      if (usable.name == variant) {
        lockstep::rk::SetIsa(usable);
        found = true;
      }
    }
    if (!found) {
      fmt::print(stderr, "bench_gemm: --variant {}: not a variant this CPU runs\n", variant);
      return 2;
    }
  }
  const std::string isa = lockstep::rk::ActiveIsa().name;
  const std::string corename = openblas_get_corename();
  std::vector<std::string> rows;
  if (int8) {
    rows = Int8Rows(shapes, reps, json, isa);
    shapes.clear();
  } else if (!json) {
    fmt::print("lockstep variant {}; OpenBLAS kernel {}; best of {} runs\n", isa, corename,
               reps);
    fmt::print("{:>5} {:>5} {:>5} {:>5} {:>3} {:>10} {:>10} {:>6} {:>9} {:>9}\n", "form", "m", "n",
               "k", "thr", "lockstep", "openblas", "ratio", "ls-same", "ob-same");
  }
  for (const Shape& s : shapes) {
    for (Form f : {Form::kXWt, Form::kDyW, Form::kDytX}) {
      Operands ls = MakeOperands(f, s), ob = MakeOperands(f, s);
      std::vector<std::vector<float>> ls_out, ob_out;
      std::vector<double> ls_gf, ob_gf;
      for (int threads : {1, 2}) {
        lockstep::SetThreads(threads);
        openblas_set_num_threads(threads);
        ls_gf.push_back(Gflops(s, reps, [&] { RunLockstep(f, s, ls); }));
        ob_gf.push_back(Gflops(s, reps, [&] { RunOpenblas(f, s, ob); }));
        ls_out.push_back(ls.out);
        ob_out.push_back(ob.out);
      }
      const bool ls_same = SameBits(ls_out[0], ls_out[1]);
      const bool ob_same = SameBits(ob_out[0], ob_out[1]);
      for (int t = 0; t < 2; ++t) {
        const double ratio = ls_gf[t] / ob_gf[t];
        if (json) {
          rows.push_back(fmt::format(
              "{{\"form\": \"{}\", \"m\": {}, \"n\": {}, \"k\": {}, \"threads\": {}, "
              "\"lockstep_gflops\": {:.2f}, \"openblas_gflops\": {:.2f}, \"ratio\": {:.3f}, "
              "\"lockstep_bitwise_same_across_threads\": {}, "
              "\"openblas_bitwise_same_across_threads\": {}, \"lockstep_variant\": \"{}\", "
              "\"openblas_kernel\": \"{}\"}}",
              FormName(f), s.m, s.n, s.k, t + 1, ls_gf[t], ob_gf[t], ratio, ls_same, ob_same,
              isa, corename));
        } else {
          fmt::print("{:>5} {:>5} {:>5} {:>5} {:>3} {:>10.2f} {:>10.2f} {:>6.3f} {:>9} {:>9}\n",
                     FormName(f), s.m, s.n, s.k, t + 1, ls_gf[t], ob_gf[t], ratio, ls_same,
                     ob_same);
          std::fflush(stdout);
        }
      }
    }
  }
  if (json) {
    fmt::print("[\n");
    for (size_t i = 0; i < rows.size(); ++i) fmt::print("  {}{}\n", rows[i], i + 1 < rows.size() ? "," : "");
    fmt::print("]\n");
  }
  return 0;
}
